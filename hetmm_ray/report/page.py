"""The report page: ``DIR/index.html``, its figures and its gallery (package docstring).

Exact semantics of :func:`write_report`: ``DIR`` is the collector's (whose ``DIR/gallery/`` holds
two PNGs per kept entry, written as the frames came); ``index.html``, ``histogram.png``,
``roc.png`` and (with masks) ``pro.png`` are written over any earlier ones. The page refers to
nothing outside ``DIR`` and loads no script, font or style from anywhere: it opens offline.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from ..config import HEATMAP_VMAX_OVER_THRESHOLD
from ..core.calibration import TailModel
from ..visualize import MASK_OUTLINE_RGB
from ..workflows.evaluation import EvaluationResult
from .collect import GALLERY_KINDS, GalleryEntry, ReportCollector
from .plots import pro_curve_png, roc_curve_png, score_histogram

__all__ = ["write_report"]

_TITLES = {
    "false alarm": ("False alarms", "good frames flagged, highest score first"),
    "miss": ("Missed defects", "defective frames passed, lowest score first"),
    "good near": ("Highest-scoring good frames passed", "the good frames closest to the threshold"),
    "defect near": ("Lowest-scoring defects caught", "the defects closest to the threshold"),
}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; }
.sub { color: #666; font-size: 13px; }
table.op { border-collapse: collapse; font-size: 14px; }
table.op td { padding: 3px 14px 3px 0; vertical-align: top; } table.op td:first-child { color: #555; }
.warn { color: #a04000; background: #fff4e5; border-left: 4px solid #e67e22; padding: 8px 12px; max-width: 1100px; }
.figs img { max-width: 100%; border: 1px solid #ddd; background: white; margin: 4px 8px 4px 0; }
.gallery { display: flex; flex-wrap: wrap; gap: 12px; }
.entry { background: white; border: 1px solid #ddd; padding: 6px; font-size: 12px; }
.entry.error { border-color: #c0392b; }
.entry img { max-width: 100%; vertical-align: top; margin-right: 4px; }
.entry .path { color: #555; word-break: break-all; }
.score { font-weight: 600; font-size: 13px; }
.none { color: #666; font-style: italic; }
"""


def _rule_text(result: EvaluationResult) -> str:
    rule = result.threshold_rule
    if rule == "far" and result.rule_target is not None:
        return f"far (estimated false-alarm rate {100 * result.rule_target:g}%)"
    if rule == "sigmas" and result.rule_target is not None:
        return f"sigmas (mean + {result.rule_target:g} std of the out-of-fold good scores)"
    return rule


def _percent(value: float | None) -> str:
    return "absent (no ground-truth masks)" if value is None else f"{value:.1f}"


def _operating_rows(result: EvaluationResult) -> list[tuple[str, str]]:
    est = result.estimated_false_alarm_rate
    return [
        ("product", f"{result.category}: {result.backbone} ({result.weights}), {result.templates} templates"),
        ("images", f"{result.n_train} train (good) / {result.n_test} test"),
        ("threshold", f"{result.threshold:.6g}"),
        ("rule", _rule_text(result)),
        ("estimated false alarms", "not estimated" if est is None else f"{est:.2f}% (out-of-fold training scores)"),
        ("measured false alarms", f"{result.false_alarm_rate:.1f}% of good test images flagged"),
        ("recall", f"{result.recall:.1f}% of defective test images flagged"),
        (
            "verdicts",
            f"TP {result.true_positives} · FP {result.false_positives} · "
            f"TN {result.true_negatives} · FN {result.false_negatives}",
        ),
        ("image AUROC", f"{result.image_auroc:.1f}"),
        ("pixel AUROC", _percent(result.pixel_auroc)),
        ("PRO", _percent(result.pro)),
        ("best F1", f"{result.best_f1:.1f} (at the test set's own best threshold)"),
        ("recall @1% / @5% FA", f"{result.recall_at_1pct_false_alarms:.1f} / {result.recall_at_5pct_false_alarms:.1f}"),
    ]


def _entry_html(entry: GalleryEntry) -> str:
    frame, overlay = entry.frame_file, entry.overlay_file
    error = entry.kind in ("false alarm", "miss")
    verdict = "reject" if entry.is_anomaly else "ok"  # the result record's words (result.py)
    name = Path(entry.path).name
    return (
        f'<div class="entry{" error" if error else ""}" data-kind="{html.escape(entry.kind)}">'
        f'<img src="gallery/{frame}" alt="frame {html.escape(name)}">'
        f'<img src="gallery/{overlay}" alt="overlay {html.escape(name)}"><br>'
        f'<span class="score">score {entry.score:.6g}</span> · {verdict} · {html.escape(entry.defect_type)}<br>'
        f'<span class="path">{html.escape(entry.path)}</span></div>'
    )


def _gallery_html(collector: ReportCollector) -> str:
    parts = []
    for kind in GALLERY_KINDS:
        title, sub = _TITLES[kind]
        kept, total = collector.entries(kind), collector.counts[kind]
        shown = f"{total}" if len(kept) == total else f"{len(kept)} shown of {total}"
        parts.append(f'<h3>{html.escape(title)} ({shown})</h3><p class="sub">{html.escape(sub)}</p>')
        if not kept:
            parts.append('<p class="none">none</p>')
            continue
        items = [_entry_html(entry) for entry in kept]
        parts.append(f'<div class="gallery" data-kind="{html.escape(kind)}">{"".join(items)}</div>')
    return "\n".join(parts)


def write_report(
    directory: str | Path,
    result: EvaluationResult,
    collector: ReportCollector,
    *,
    train_scores: Sequence[float] = (),
) -> Path:
    """Write the report of ``result`` into ``directory`` (module docstring); returns ``index.html``.

    ``train_scores``: the out-of-fold good training scores the threshold rule read (the ``far``
    rule's tail model is drawn from them on the histogram)."""
    out = Path(directory)
    if out.resolve() != collector.directory.resolve():
        raise ValueError(f"the report goes where its gallery is: {collector.directory}, not {out}")
    by_class: dict[str, list[float]] = {"good": []}
    for row in result.images:
        by_class.setdefault(row["defect_type"], []).append(float(row["score"]))
    tail = None
    if result.threshold_rule == "far" and len(train_scores) > 0:
        tail = TailModel(train_scores).false_alarm_rate
    label = f"threshold {result.threshold:.4g} ({result.threshold_rule})"
    score_histogram(out / "histogram.png", by_class, threshold=result.threshold, threshold_label=label,
                    estimated_false_alarms=tail)  # fmt: skip
    labels = [0 if r["defect_type"] == "good" else 1 for r in result.images]
    roc_curve_png(out / "roc.png", [r["score"] for r in result.images], labels, auroc_percent=result.image_auroc)
    figures = ['<img src="histogram.png" alt="score histogram">', '<img src="roc.png" alt="ROC curve">']
    if collector.pro_fpr is not None and collector.pro_values is not None and result.pro is not None:
        assert collector.pro_fpr_limit is not None
        pro_curve_png(out / "pro.png", collector.pro_fpr, collector.pro_values,
                      fpr_limit=collector.pro_fpr_limit, pro_percent=result.pro)  # fmt: skip
        figures.append('<img src="pro.png" alt="PRO curve">')
    else:
        stale = out / "pro.png"
        stale.unlink(missing_ok=True)
        figures.append('<p class="none">No PRO curve: the set has no ground-truth masks.</p>')
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in _operating_rows(result))
    warning = f'<p class="warn">{html.escape(result.threshold_warning)}</p>' if result.threshold_warning else ""
    outline = "#{:02x}{:02x}{:02x}".format(*MASK_OUTLINE_RGB)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>hetmm evaluate: {html.escape(result.category)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>Evaluation of {html.escape(result.category)}</h1>
<p class="sub">hetmm evaluate --report: fitted on the good training images, measured on test/.</p>
<h2>Operating point</h2>
<table class="op" id="operating-point">{rows}</table>
{warning}
<h2>Scores and curves</h2>
<div class="figs">{"".join(figures)}</div>
<h2>Gallery</h2>
<p class="sub">Each frame as the detector saw it, and its heat-map (0 to {HEATMAP_VMAX_OVER_THRESHOLD:g}x the
threshold, the colour scale every picture of this product uses) with the ground-truth outline in
<b style="color:{outline}">magenta</b>.</p>
{_gallery_html(collector)}
</body></html>
"""
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
