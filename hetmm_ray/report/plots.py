"""The report's figures, drawn headless with matplotlib's Agg canvas into PNG files.

Exact semantics: :func:`score_histogram` (common bins over every test score and the threshold;
one step-filled histogram per class: ``good`` and each defect type; the threshold a dashed line;
with a tail model, its estimated false-alarm rate in percent on a log second axis),
:func:`roc_curve_png` (image ROC from scores and labels, ties crossing together, with its AUROC)
and :func:`pro_curve_png` (the PRO curve over FPR 0 to 1, the integration limit a dotted line).
Each writes one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["pro_curve_png", "roc_points", "roc_curve_png", "score_histogram"]

_SIZE = (6.6, 4.0)  # inches; at _DPI the page shows them unscaled, two side by side
_DPI = 100
_GOOD_COLOUR = "#2a7f3f"


def _figure() -> tuple[Any, Any]:
    """A figure and its axes; matplotlib is imported here so that only the report loads it."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, dpi=_DPI)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig: Any, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def score_histogram(
    path: Path,
    scores: Mapping[str, Sequence[float]],
    *,
    threshold: float,
    threshold_label: str,
    estimated_false_alarms: Callable[[float], float] | None = None,
    bins: int = 40,
) -> Path:
    """``scores``: class name (``good`` first, then defect types) -> that class's test scores."""
    fig, ax = _figure()
    every = np.concatenate([np.asarray(v, dtype=np.float64) for v in scores.values()] + [np.array([])])
    lo, hi = float(every.min()), float(every.max())
    if np.isfinite(threshold):
        lo, hi = min(lo, threshold), max(hi, threshold)
    if hi <= lo:
        hi = lo + 1e-6
    edges = np.linspace(lo, hi + (hi - lo) * 1e-9, bins + 1)
    palette = iter(["#c0392b", "#2e86c1", "#d68910", "#8e44ad", "#17a589", "#7f8c8d", "#cb4335", "#1f618d"] * 4)
    for name, values in scores.items():
        colour = _GOOD_COLOUR if name == "good" else next(palette)
        ax.hist(values, bins=edges, histtype="stepfilled", alpha=0.35, color=colour, label=f"{name} ({len(values)})")
        ax.hist(values, bins=edges, histtype="step", color=colour, linewidth=1.2)
    if np.isfinite(threshold):
        ax.axvline(threshold, color="black", linestyle="--", linewidth=2, label=threshold_label)
    ax.set_xlabel("image score")
    ax.set_ylabel("test images")
    margin = 0.03 * (edges[-1] - edges[0])  # a threshold at the end of the range stays in sight
    ax.set_xlim(edges[0] - margin, edges[-1] + margin)
    handles, labels = ax.get_legend_handles_labels()
    if estimated_false_alarms is not None:
        right = ax.twinx()
        xs = np.linspace(edges[0] - margin, edges[-1] + margin, 200)
        right.plot(xs, [100 * estimated_false_alarms(float(x)) for x in xs], color="#555555", linewidth=1.2)
        right.set_yscale("log")
        right.set_ylabel("estimated false alarms (%)")
        (line,) = right.plot([], [], color="#555555", linewidth=1.2)
        handles.append(line)
        labels.append("estimated false alarms (far rule)")
    # above the axes: inside, it would hide the bars, the threshold or the second axis's curve
    ax.legend(handles, labels, fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=3, frameon=False)
    return _save(fig, path)


def _save_unit_curve(fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str) -> Path:
    """A curve on the unit square (rates against rates), labelled, legend low right, saved."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right", fontsize=9)
    return _save(fig, path)


def roc_points(scores: Sequence[float], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) from the highest score down, from (0, 0); equal scores cross together."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.flatnonzero(np.append(s[1:] != s[:-1], True))
    tp = np.cumsum(y)[last] / max(int(y.sum()), 1)
    fp = np.cumsum(~y)[last] / max(int((~y).sum()), 1)
    return np.concatenate(([0.0], fp)), np.concatenate(([0.0], tp))


def roc_curve_png(path: Path, scores: Sequence[float], labels: Sequence[int], *, auroc_percent: float) -> Path:
    fig, ax = _figure()
    fpr, tpr = roc_points(scores, labels)
    ax.plot(fpr, tpr, color="#1f618d", linewidth=1.8, label=f"image ROC (AUROC {auroc_percent:.1f})")
    ax.plot([0, 1], [0, 1], color="#aaaaaa", linestyle=":", linewidth=1)
    return _save_unit_curve(
        fig, ax, path, "false-positive rate (good images flagged)", "true-positive rate (defective images flagged)"
    )


def pro_curve_png(path: Path, fpr: np.ndarray, pro: np.ndarray, *, fpr_limit: float, pro_percent: float) -> Path:
    fig, ax = _figure()
    ax.plot(
        fpr,
        pro,
        color="#8e44ad",
        linewidth=1.8,
        label=f"per-region overlap (PRO {pro_percent:.1f} to FPR {fpr_limit:g})",
    )
    ax.axvline(fpr_limit, color="#555555", linestyle=":", linewidth=1.2)
    return _save_unit_curve(fig, ax, path, "pixel false-positive rate", "per-region overlap")
