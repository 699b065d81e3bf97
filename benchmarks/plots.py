"""Figures of the benchmarks' ``--json`` files, drawn headless (matplotlib's Agg canvas) into PNG files.

Each kind of :data:`KINDS` reads the JSON one command writes and draws one PNG of
:data:`SIZES` (inches at :data:`DPI`: the pixel size is fixed, never cropped to the drawing):

- ``bank``: the rows of ``bench_bank.py scale --json`` (keys ``run``, ``n_train``, ``sheets``,
  ``images_per_s``, ``fit_s``). Left, the test set's images/s; right, the fit's seconds; both against
  the good images in the bank. One line for the defaults (``run`` ``defaults``), one for ALL: the
  rows of ``run`` ``all`` and the defaults' rows whose ``sheets`` equal ``n_train`` (a bank the
  default selection keeps whole is ALL).
- ``memory``: the rows of ``bench_memory.py --json`` (keys ``tree``, ``command``, ``test_frames``,
  ``peak_rss_mb``): peak RSS against the number of test frames (log axis), one line per command (per
  command and tree when the rows hold more than one tree); the RSS axis starts at 0, so a flat line
  reads as flat.
- ``recall``: one or more ``hetmm evaluate --json`` files (their ``category``, ``image_auroc`` and
  ``images`` rows' ``defect_type``, ``score`` and ``is_anomaly``): recall (defective test images
  flagged) against false alarms (good test images flagged) as the threshold comes down over the
  scores, equal scores crossing together (``hetmm_ray.report.plots.roc_points``: the report's ROC),
  up to ``max_false_alarms`` percent; on each curve a dot where the calibrated threshold's verdicts
  (``is_anomaly``) put the product, and the far rule's target (``rule_target``) as a dotted line.

A file or row without a key its kind reads is refused (``ValueError`` naming the file and the key).

    python benchmarks/plots.py bank bank.json --png docs/figures/bank-scale.png
    python benchmarks/plots.py memory memory.json --png docs/figures/memory.png
    python benchmarks/plots.py recall bottle.json battery_weld.json --png docs/figures/recall.png

``bench_bank.py scale`` and ``bench_memory.py`` take ``--plot PNG`` to draw theirs after a run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DPI", "KINDS", "SIZES", "bank_lines", "bank_png", "draw", "memory_png", "recall_png"]

DPI = 100
SIZES = {"bank": (9.0, 3.6), "memory": (6.6, 3.6), "recall": (6.6, 4.0)}  # inches
_LINES = ("#1f618d", "#c0392b", "#2a7f3f", "#d68910", "#8e44ad", "#17a589")


def _need(rows: Sequence[dict[str, Any]], keys: Sequence[str], source: str) -> None:
    if not rows:
        raise ValueError(f"{source}: no rows to draw")
    for i, row in enumerate(rows):
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"{source}: row {i} has no {', '.join(missing)}")


def _figure(kind: str, panels: int = 1) -> tuple[Any, list[Any]]:
    """A figure of ``kind``'s size and its axes; matplotlib loads here, only where a figure is drawn."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZES[kind], dpi=DPI)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def _save(fig: Any, png: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png", metadata={"Software": None})  # no version stamp: same data, same bytes
    return png


def bank_lines(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The ``bank`` figure's lines: label -> its rows by bank size (module docstring)."""
    lines = {
        "defaults": [r for r in rows if r["run"] == "defaults"],
        "ALL (every good image a template)": [
            r for r in rows if r["run"] == "all" or (r["run"] == "defaults" and r["sheets"] == r["n_train"])
        ],
    }
    return {label: sorted(line, key=lambda r: r["n_train"]) for label, line in lines.items()}


def bank_png(rows: Sequence[dict[str, Any]], png: Path, *, source: str = "rows") -> Path:
    """The ``bank`` figure (module docstring) of ``bench_bank.py scale``'s rows."""
    _need(rows, ("run", "n_train", "sheets", "images_per_s", "fit_s"), source)
    lines = bank_lines(rows)
    fig, (speed, fit) = _figure("bank", panels=2)
    labelled: set[int] = set()  # a row on both lines (a bank kept whole) is labelled once, above
    for (label, line), colour, marker, dy in zip(lines.items(), _LINES, ("o", "s"), (6, -13), strict=False):
        if not line:
            continue
        x = [r["n_train"] for r in line]
        speed.plot(x, [r["images_per_s"] for r in line], marker=marker, color=colour, label=label)
        fit.plot(x, [r["fit_s"] for r in line], marker=marker, color=colour, label=label)
        for r in line:
            if id(r) not in labelled:
                labelled.add(id(r))
                speed.annotate(f"{r['images_per_s']:.3g}", (r["n_train"], r["images_per_s"]), xytext=(0, dy),
                               textcoords="offset points", ha="center", fontsize=8, color=colour)  # fmt: skip
    speed.set_ylabel("test images/s")
    fit.set_ylabel("fit seconds")
    for ax, key in ((speed, "images_per_s"), (fit, "fit_s")):
        ax.set_xlabel("good images in the bank")
        ax.set_ylim(0, 1.15 * max(r[key] for r in rows))  # room for the labels above the highest point
        ax.grid(alpha=0.3)
    speed.legend(fontsize=8, loc="lower left")
    return _save(fig, png)


def memory_png(rows: Sequence[dict[str, Any]], png: Path, *, source: str = "rows") -> Path:
    """The ``memory`` figure (module docstring) of ``bench_memory.py``'s rows."""
    _need(rows, ("tree", "command", "test_frames", "peak_rss_mb"), source)
    several_trees = len({r["tree"] for r in rows}) > 1
    lines: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = f"hetmm {r['command']}" + (f" ({Path(r['tree']).name})" if several_trees else "")
        lines.setdefault(label, []).append(r)
    fig, (ax,) = _figure("memory")
    for (label, line), colour in zip(lines.items(), _LINES * len(lines), strict=False):
        line = sorted(line, key=lambda r: r["test_frames"])
        ax.plot([r["test_frames"] for r in line], [r["peak_rss_mb"] for r in line], marker="o", color=colour,
                label=label)  # fmt: skip
    frames = sorted({r["test_frames"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(frames, [f"{f:,}" for f in frames])
    ax.minorticks_off()
    ax.set_xlabel("test frames")
    ax.set_ylabel("peak RSS (MB)")
    ax.set_ylim(0, 1.2 * max(r["peak_rss_mb"] for r in rows))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, png)


def recall_png(
    evaluations: Sequence[dict[str, Any]],
    png: Path,
    *,
    max_false_alarms: float = 20.0,
    sources: Sequence[str] | None = None,
) -> Path:
    """The ``recall`` figure (module docstring) of ``hetmm evaluate --json`` results, one curve each."""
    from hetmm_ray.report.plots import roc_points

    if not evaluations:
        raise ValueError("no evaluations to draw")
    names = list(sources or [f"evaluation {i}" for i in range(len(evaluations))])
    fig, (ax,) = _figure("recall")
    targets = set()
    for result, source, colour in zip(evaluations, names, _LINES * len(evaluations), strict=False):
        _need([result], ("category", "image_auroc", "images"), source)
        rows = result["images"]
        _need(rows, ("defect_type", "score", "is_anomaly"), f"{source} images")
        defective = np.array([r["defect_type"] != "good" for r in rows])
        if defective.all() or not defective.any():
            raise ValueError(f"{source}: a recall curve needs good and defective test images")
        fpr, tpr = roc_points([r["score"] for r in rows], defective.astype(int).tolist())
        flagged = np.array([bool(r["is_anomaly"]) for r in rows])
        label = f"{result['category']} (image AUROC {result['image_auroc']:.1f})"
        ax.plot(100 * fpr, 100 * tpr, color=colour, linewidth=1.8, label=label)
        ax.plot(100 * flagged[~defective].mean(), 100 * flagged[defective].mean(), "o", color=colour, markersize=7,
                markeredgecolor="black", clip_on=False, zorder=3)  # fmt: skip
        if result.get("threshold_rule") == "far" and result.get("rule_target") is not None:
            targets.add(100 * float(result["rule_target"]))
    for t in sorted(targets):
        ax.axvline(t, color="#555555", linestyle=":", linewidth=1.2)
        ax.annotate(f"far rule {t:g} %", (t, 2), xytext=(3, 0), textcoords="offset points", fontsize=8, color="#555555")
    ax.plot([], [], "o", color="white", markeredgecolor="black", label="at the calibrated threshold")
    ax.set_xlim(-0.015 * max_false_alarms, max_false_alarms)  # a threshold flagging nothing stays in sight
    ax.set_ylim(-1.5, 102)
    ax.set_xlabel("false alarms (% of good test images flagged)")
    ax.set_ylabel("recall (% of defective test images flagged)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, png)


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None


def draw(kind: str, jsons: Sequence[Path], png: Path, *, max_false_alarms: float = 20.0) -> Path:
    """``kind``'s figure of the ``--json`` files ``jsons`` (``bank`` and ``memory``: their rows
    concatenated; ``recall``: one evaluation per file), written to ``png``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not jsons:
        raise ValueError("no --json file to draw from")
    loaded = [_load(Path(p)) for p in jsons]
    if kind == "recall":
        return recall_png(loaded, png, max_false_alarms=max_false_alarms, sources=[str(p) for p in jsons])
    for data, path in zip(loaded, jsons, strict=True):
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a list of rows (the script's --json)")
    rows = [row for data in loaded for row in data]
    return KINDS[kind](rows, png, source=", ".join(map(str, jsons)))


KINDS: dict[str, Callable[..., Path]] = {"bank": bank_png, "memory": memory_png, "recall": recall_png}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=list(KINDS))
    ap.add_argument("json", type=Path, nargs="+", help="the --json file(s) to draw from")
    ap.add_argument("--png", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--max-false-alarms", type=float, default=20.0, help="recall: the x axis' end, percent")
    args = ap.parse_args(argv)
    if not 0 < args.max_false_alarms <= 100:
        ap.error(f"--max-false-alarms must be in (0, 100], got {args.max_false_alarms}")
    try:
        print(f"written {draw(args.kind, args.json, args.png, max_false_alarms=args.max_false_alarms)}")
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
