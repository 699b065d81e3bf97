"""Labelled validation: set a stored product's threshold for a stated objective (``hetmm calibrate``).

Never the default: a product's threshold comes from its good images (the ``far``
rule). Where a user has labelled samples, :func:`calibrate_with_labels` scores
them with the product's stored version and picks the threshold for

* ``f1``: the best F1 on the labelled set (ties: the higher threshold), or
* ``recall``: the best recall with at most ``max_false_alarm_rate`` of the good
  labelled images flagged (ties: the higher threshold).

Tiled products are calibrated the same way on their frame scores (``hetmm_ray/detection/tiled.py``).
It returns a new template set (same bank and selection) whose configuration
says ``threshold.rule = "validation"`` and whose calibration carries the chosen
threshold and how it was chosen; the out-of-fold scores are kept, so the
estimated false-alarm rate of that threshold is still reported, and switching
back (``--set threshold.rule=far`` or a predict-time rate) needs no refit.

The record also carries ``rates``: the far rule at ``config.RATE_CHOICES`` on the out-of-fold
scores, each with the labelled defects and good images it flags (``core.calibration.rate_choices``),
so the labelled threshold is seen beside what each far rate would cost and catch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..config import RATE_CHOICES, STREAM_FRAMES
from ..core.calibration import OBJECTIVES, best_f1_cut, check_rate, labelled_cuts, rate_choices, recall_cut
from ..core.scoring import Calibration
from ..core.templates import TemplateSet
from ..detection.interface import Detector, stream_chunk
from ..detection.scorer import ImageInput

__all__ = ["calibrate_with_labels", "choose_threshold"]


def choose_threshold(
    scores: Sequence[float], labels: Sequence[int], *, objective: str = "f1", max_false_alarm_rate: float = 0.01
) -> dict[str, Any]:
    """The labelled-validation record for ``objective`` (threshold, objective and the cut's counts)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: choose one of {', '.join(OBJECTIVES)}, got {objective!r}")
    cuts = labelled_cuts(scores, labels)
    if objective == "f1":
        cut = best_f1_cut(cuts)
        rule: dict[str, Any] = {"objective": "f1"}
    else:
        rule = {"objective": "recall", "max_false_alarm_rate": check_rate(max_false_alarm_rate)}
        cut = recall_cut(cuts, max_false_alarm_rate)
    n_bad = sum(1 for v in labels if v)
    return {**rule, **cut.to_json(), "good": len(labels) - n_bad, "defective": n_bad, "created": time.time()}


def calibrate_with_labels(
    detector: Detector,
    images: Sequence[ImageInput],
    labels: Sequence[int],
    *,
    objective: str = "f1",
    max_false_alarm_rate: float = 0.01,
) -> tuple[TemplateSet, dict[str, Any]]:
    """``detector``'s template set with the labelled-validation threshold; and the record.

    A tiled product (:class:`~hetmm_ray.detection.tiled.TiledHETMM`) is calibrated at the frame level: its
    frame scores (the maximum of the tiles' normalised scores) on the labelled frames choose the
    threshold, kept with its frame calibration (the per-frame out-of-fold maxima); the tile sets
    and their scales are unchanged."""
    ts = detector.template_set()  # a tiled product's holds its frame calibration
    if ts.calibration is None:
        raise ValueError("the product has no out-of-fold calibration to keep; refit it first")
    if len(images) != len(labels):
        raise ValueError("give one label per image")
    # a chunk of frames at a time (a multiple of what predict batches: the scores of one call), so
    # only scores accumulate, never every frame's map
    chunk = stream_chunk(detector.config, STREAM_FRAMES)
    scores = [float(s) for i in range(0, len(images), chunk) for s in detector.predict(images[i : i + chunk]).scores]
    record = choose_threshold(scores, labels, objective=objective, max_false_alarm_rate=max_false_alarm_rate)
    config = detector.config.replace(**{"threshold.rule": "validation"})
    calibration = Calibration(ts.calibration.scores, validation=record)
    op = calibration.operating_point("validation")
    record["estimated_false_alarm_rate"] = op.false_alarm_rate
    record["false_alarm_estimate"] = None if op.estimate is None else op.estimate.to_json()
    bad = [s for s, v in zip(scores, labels, strict=True) if v]
    good = [s for s, v in zip(scores, labels, strict=True) if not v]
    choices = rate_choices(ts.calibration.scores, RATE_CHOICES, defective_scores=bad, good_scores=good)
    record["rates"] = [c.to_json() for c in choices]
    return replace(ts, config=config, calibration=calibration), record
