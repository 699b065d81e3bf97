"""Map post-processing, image scores and threshold calibration (docs/algorithm.md §3)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import THRESHOLD_RULES, THRESHOLD_WARN_OVER_HIGHEST, DetectorConfig
from .calibration import FalseAlarmEstimate, TailModel, check_rate, empirical_min_images
from .geometry import Box, crop

__all__ = [
    "Calibration",
    "OperatingPoint",
    "calibration_json",
    "content_maps",
    "operating_point",
    "gaussian_blur",
    "gaussian_kernel",
    "image_scores",
    "top_mean",
]


def gaussian_kernel(sigma: float, *, device: torch.device | None = None) -> Tensor:
    """1-D kernel of size ``2*ceil(4*sigma)+1`` (truncated at 4 sigma, like scipy), summing to 1."""
    radius = math.ceil(4 * sigma)
    x = torch.arange(-radius, radius + 1, dtype=torch.float32, device=device)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def gaussian_blur(maps: Tensor, sigma: float) -> Tensor:
    """Separable Gaussian blur of (B, H, W) maps with reflect padding; sigma 0 is identity."""
    if sigma <= 0:
        return maps
    k = gaussian_kernel(sigma, device=maps.device).to(maps.dtype)
    r = k.numel() // 2
    x = maps[:, None]
    # Reflect padding needs pad < size: clamp, then fall back to replicate for tiny maps.
    h, w = maps.shape[-2:]
    mode = "reflect" if r < min(h, w) else "replicate"
    x = F.conv2d(F.pad(x, (0, 0, r, r), mode=mode), k.view(1, 1, -1, 1))
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode=mode), k.view(1, 1, 1, -1))
    return x[:, 0]


def _blurred_content(
    maps: Tensor, sigma: float, boxes: Sequence[Box], regions: Sequence[Tensor] | None = None
) -> list[Tensor]:
    """``G_sigma`` of each map with everything outside its content box set to 0, cropped to the box.

    Zero outside, not reflect at the content's edge: the pad is "nothing there", so it counts
    as no anomaly. Reflecting would mirror an edge artefact of a good crop into a full-strength
    blob; on products of varied aspect the zero rule scores at least as well as reflect, and
    (by construction) the same on square products; docs/performance.md. The canvas edge itself keeps the blur's
    reflect padding, as squash does at an image's edge.

    ``regions`` (``core/region.py``: one bool mask of each box's shape): pixels outside the
    inspection region are "nothing there" too, set to 0 before the blur by the same rule.
    """
    inside = torch.zeros_like(maps)
    for i, b in enumerate(boxes):
        rows, cols = slice(b.top, b.top + b.height), slice(b.left, b.left + b.width)
        if regions is None:
            inside[i, rows, cols] = maps[i, rows, cols]
        else:
            inside[i, rows, cols] = torch.where(regions[i].to(maps.device), maps[i, rows, cols], 0.0)
    return crop(gaussian_blur(inside, sigma), boxes)


def _full_boxes(maps: Tensor, boxes: Sequence[Box] | None) -> Sequence[Box]:
    return boxes if boxes is not None else [Box(0, 0, maps.shape[-2], maps.shape[-1])] * maps.shape[0]


def top_mean(values: Tensor, k: int) -> Tensor:
    """The mean of the ``k`` highest of ``values`` along the last dimension (all of them where there
    are fewer); ``k`` 1: their maximum, exactly."""
    if k == 1:
        return values.amax(dim=-1)
    return values.topk(min(k, values.shape[-1]), dim=-1).values.mean(dim=-1)


def image_scores(
    maps: Tensor,
    sigma: float,
    boxes: Sequence[Box] | None = None,
    regions: Sequence[Tensor] | None = None,
    *,
    top_k: int = 1,
) -> Tensor:
    """``max(G_sigma(S))`` per image: (B,); with ``top_k`` above 1, the mean of the ``top_k`` highest
    pixels of ``G_sigma(S)`` (all the counted pixels where there are fewer): a defect that spans
    many pixels, a long crack, counts by its extent and not only by its strongest pixel.

    ``boxes`` (letterboxed images, ``core.geometry``, in the maps' pixels): the map is blurred
    with the pad set to 0 and the max runs over each image's content only
    (:func:`_blurred_content`), so padded pixels never count.

    ``regions`` (an inspection region, ``core/region.py``: per image a bool mask of its box's
    shape, the whole map for squash): pixels outside are set to 0 before the blur and the max
    (or the top pixels) runs over the region's pixels only; an image whose region holds no map
    pixel scores 0 ("nothing there"). None: the arithmetic above, unchanged.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if regions is not None:
        blurred = _blurred_content(maps, sigma, _full_boxes(maps, boxes), regions)
        zero = maps.new_zeros(())
        return torch.stack(
            [
                top_mean(c[r.to(c.device)], top_k) if bool(r.any()) else zero
                for c, r in zip(blurred, regions, strict=True)
            ]
        )
    if boxes is None or all(b.is_full(maps.shape[-1]) for b in boxes):
        return top_mean(gaussian_blur(maps, sigma).flatten(1), top_k)
    return torch.stack([top_mean(c.flatten(), top_k) for c in _blurred_content(maps, sigma, boxes)])


def content_maps(
    maps: Tensor, sigma: float, boxes: Sequence[Box] | None = None, regions: Sequence[Tensor] | None = None
) -> list[Tensor]:
    """Localisation maps ``G_sigma(S)`` of each image's content (blurred as the score is).

    With ``regions``: blurred with the outside set to 0, as the score is, and the outside set to 0
    again after the blur (it never counts: heat-maps grey it, ``evaluate`` leaves it out).
    """
    if regions is not None:
        blurred = _blurred_content(maps, sigma, _full_boxes(maps, boxes), regions)
        return [torch.where(r.to(c.device), c, 0.0) for c, r in zip(blurred, regions, strict=True)]
    if boxes is None:
        return list(gaussian_blur(maps, sigma))
    return _blurred_content(maps, sigma, boxes)


@dataclass(frozen=True)
class OperatingPoint:
    """A verdict threshold, the rule that set it, and the estimated share of good parts above it.

    ``false_alarm_rate`` is a fraction (0.01 = 1 %) estimated from the out-of-fold scores with
    :class:`~hetmm_ray.core.calibration.TailModel`; ``target`` is the rule's own parameter
    (the asked rate for ``far``, k for ``sigmas``, None for ``validation``).
    """

    threshold: float
    rule: str
    false_alarm_rate: float | None
    target: float | None = None
    # What the threshold was set from, for :meth:`warning` (not part of the point's identity or JSON):
    # the highest out-of-fold good score and how many there were. None: a rule not read off them.
    highest_good: float | None = field(default=None, compare=False)
    n_good: int = field(default=0, compare=False)
    # The estimate behind ``false_alarm_rate``: its interval and how many good scores lie above.
    estimate: FalseAlarmEstimate | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "threshold_rule": self.rule,
            "rule_target": self.target,
            "estimated_false_alarm_rate": self.false_alarm_rate,
        }

    def warning(self) -> str | None:
        """Why this threshold may flag few defects, or None: it lies more than
        ``THRESHOLD_WARN_OVER_HIGHEST`` times above the highest good score the rule saw.

        Then the rule put it where no good image ever scored: the far rule's tail model, with too
        few images for its rank to exist (``calibration.empirical_min_images``), or a large
        ``sigmas``; every defect scoring between the good images and the threshold passes. The
        threshold stands; this says so and what would change it. Labelled thresholds (``validation``) are not judged."""
        highest = self.highest_good
        if highest is None or highest <= 0 or self.threshold <= THRESHOLD_WARN_OVER_HIGHEST * highest:
            return None
        ratio = self.threshold / highest
        where = f"the threshold {self.threshold:.4f} is {ratio:.1f}x the highest out-of-fold good score"
        if self.rule == "far" and self.target is not None:
            need = empirical_min_images(self.target)
            why = (
                f"with {self.n_good} good images a {100 * self.target:g}% false-alarm point lies beyond every good "
                f"score, so it is the tail model's extrapolation (the scores give it directly from {need} images)"
            )
            fix = (
                "add good images, allow a higher rate (threshold.false_alarm_rate; 0.05 is read off the "
                f"scores from {empirical_min_images(0.05)} images)"
            )
        else:
            why = f"the {self.rule} rule put it above all {self.n_good} good scores"
            fix = "use the far rule or fewer sigmas"
        return (
            f"{where} ({highest:.4f}): {why}; a defect scoring between the two passes. To flag more, {fix}, "
            "or set the threshold on labelled images (hetmm calibrate --val DIR)"
        )


@dataclass(frozen=True)
class Calibration:
    """Out-of-fold image scores of good training images, and the threshold rules on them.

    ``validation``: what a labelled validation set chose (``hetmm calibrate``): at least
    ``{"threshold": t, "objective": ...}``; the ``validation`` rule uses it.
    """

    scores: tuple[float, ...]
    validation: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scores", tuple(float(s) for s in self.scores))

    # --- storage: a plain list of scores (the original format) unless a validation result rides along
    def to_json(self) -> list[float] | dict[str, Any]:
        if self.validation is None:
            return list(self.scores)
        return {"scores": list(self.scores), "validation": self.validation}

    @classmethod
    def from_json(cls, data: Any) -> Calibration | None:
        if data is None:
            return None
        if isinstance(data, dict):
            return cls(tuple(data["scores"]), validation=data.get("validation"))
        return cls(tuple(data))

    def operating_point(self, rule: str, *, sigmas: float = 3.0, false_alarm_rate: float = 0.01) -> OperatingPoint:
        """The threshold of ``rule`` and its estimated false-alarm rate."""
        tail = TailModel(self.scores)
        seen: dict[str, Any] = {"highest_good": tail.sorted[-1], "n_good": tail.n}  # for OperatingPoint.warning
        if rule == "far":
            rate = check_rate(false_alarm_rate)
            t = tail.threshold(rate)
            est = tail.estimate(t)
            return OperatingPoint(t, "far", est.rate, rate, **seen, estimate=est)
        if rule == "sigmas":
            if not (math.isfinite(sigmas) and sigmas >= 0):
                raise ValueError(f"sigmas must be a finite number >= 0, got {sigmas!r}")
            t = self.threshold(sigmas)
            est = tail.estimate(t)
            return OperatingPoint(t, "sigmas", est.rate, float(sigmas), **seen, estimate=est)
        if rule == "validation":
            if not self.validation:
                raise ValueError(
                    "threshold rule 'validation' needs a labelled validation result: run hetmm calibrate --val DIR"
                )
            t = float(self.validation["threshold"])
            est = tail.estimate(t)
            return OperatingPoint(t, "validation", est.rate, None, estimate=est)
        raise ValueError(f"unknown threshold rule {rule!r}; choose one of {', '.join(THRESHOLD_RULES)}")

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores)

    @property
    def std(self) -> float:
        m = self.mean
        n = len(self.scores)
        return math.sqrt(sum((s - m) ** 2 for s in self.scores) / max(n - 1, 1))

    def threshold(self, sigmas: float) -> float:
        """``mean + sigmas * std`` of the good images' scores."""
        return self.mean + sigmas * self.std


def calibration_json(calibration: Calibration | None) -> list[float] | dict[str, Any] | None:
    """What every seam stores or sends for a calibration (manifest, template bytes, the registry's
    published record): :meth:`Calibration.to_json`, None for none; :meth:`Calibration.from_json`
    reads it back."""
    return None if calibration is None else calibration.to_json()


def operating_point(
    calibration: Calibration | None,
    config: DetectorConfig,
    *,
    sigmas: float | None = None,
    false_alarm_rate: float | None = None,
) -> OperatingPoint | None:
    """The threshold of ``config.threshold.rule`` on ``calibration`` (None without one).

    ``sigmas`` switches to the sigmas rule, ``false_alarm_rate`` to the far rule, for this
    call only; giving both, or a non-finite / out-of-range value, is a ValueError.
    """
    if sigmas is not None and false_alarm_rate is not None:
        raise ValueError("give sigmas or false_alarm_rate, not both")
    if calibration is None:
        return None
    tc = config.threshold
    if sigmas is not None:
        return calibration.operating_point("sigmas", sigmas=sigmas)
    if false_alarm_rate is not None:
        return calibration.operating_point("far", false_alarm_rate=false_alarm_rate)
    return calibration.operating_point(tc.rule, sigmas=tc.sigmas, false_alarm_rate=tc.false_alarm_rate)
