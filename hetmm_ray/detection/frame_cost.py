"""What one frame costs to score on this host: the cost model behind ``hetmm fit``'s cost line, a
create job's ``estimated_ms_per_frame`` and ``sheets: auto``'s time budget
(``templates.auto_max_ms_per_image``).

Exact semantics are :class:`FrameCost`'s: ``ms_per_frame(K) = fixed_ms + scored x atmm_ms(K)``, each
term a median of timed passes on this host with its settings. :func:`estimate_ms_per_frame` is the
one-call form (a detector's own frame: ``detector_choice.frame_cost_of``, which each implementation
answers); :func:`blank_frame_crops` stands in for a frame where none is at hand;
:func:`over_budget` says, and warns (:class:`TimeBudgetWarning`), what a budget that cannot be met
would take. The fit pipeline (``fitting.py``) uses it and is not needed by it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ..config import DetectorConfig
from ..core.geometry import Box
from ..core.templates import TemplateSet
from .scorer import ImageInput, Scorer

__all__ = ["FrameCost", "TimeBudgetWarning", "blank_frame_crops", "estimate_ms_per_frame", "over_budget"]


class TimeBudgetWarning(UserWarning):
    """``templates.auto_max_ms_per_image`` cannot be met on this host: even the cheapest selection
    is estimated over it (the reason and what it would take are in the message)."""


class FrameCost:
    """What one frame costs to score on this host (the one estimate behind ``hetmm fit``'s cost
    line, the create job's ``estimated_ms_per_frame`` and ``sheets: auto``'s time budget).

    ``ms_per_frame(K) = fixed_ms + scored x atmm_ms(K)``, ``fixed_ms = backbone_ms + post_ms``:

    - ``backbone_ms``: the backbone pass of all the frame's canvases (its tiles, or the image
      itself) in one batch, decode to canvas included: the median of ``repeats`` timed passes after
      one untimed pass (which builds the backbone and its runtime's network);
    - ``post_ms``: other per-frame work the caller names (``post``; a tiled frame's stitching of its
      tiles' maps at the frame's resolution, ``tiled.py``), timed the same way; 0 without;
    - ``atmm_ms(K)``: ATMM of one canvas against K copies of its own features (ATMM's cost depends on
      K and the feature shapes, not on the values), the median of ``repeats`` timed calls;
    - ``scored``: canvases scored per frame (a tile position the region leaves out is not).

    Not counted: decoding the frame itself, cutting it into tiles and the transport of a request.
    """

    def __init__(
        self,
        scorer: Scorer,
        crops: Sequence[ImageInput],
        *,
        scored: int | None = None,
        post: Callable[[], object] | None = None,
        repeats: int = 3,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if len(crops) == 0:
            raise ValueError("a frame needs at least one canvas")
        self.clock = clock  # seconds (tests give a clock that counts the work instead)
        self.scorer = scorer
        self.canvases = len(crops)
        self.scored = len(crops) if scored is None else scored
        self.repeats = max(1, repeats)
        self._features(crops)  # untimed: builds the backbone and its runtime's network
        out: list[tuple[dict[str, Tensor], list[Box] | None]] = []
        self.backbone_ms = self._timed(lambda: out.append(self._features(crops)))
        feats, boxes = out[-1]
        self.post_ms = 0.0
        if post is not None:
            post()  # untimed, as the backbone's first pass
            self.post_ms = self._timed(post)
        self._one = {name: v[:1] for name, v in feats.items()}
        self._box = None if boxes is None else boxes[:1]
        self._atmm: dict[int, float] = {}

    def _timed(self, work: Callable[[], object]) -> float:
        """Median ms of ``repeats`` calls of ``work``."""
        times = []
        for _ in range(self.repeats):
            t0 = self.clock()
            work()
            times.append(self.clock() - t0)
        return 1000 * float(np.median(times))

    @property
    def fixed_ms(self) -> float:
        """The frame's cost that no template count changes: backbone + ``post``."""
        return self.backbone_ms + self.post_ms

    def _features(self, crops: Sequence[ImageInput]) -> tuple[dict[str, Tensor], list[Box] | None]:
        scorer = self.scorer
        parts: dict[str, list[Tensor]] = {}
        boxes: list[Box] | None = None if scorer.config.backbone.geometry == "squash" else []
        for _, batch, b in scorer.decoded_batches(crops, "estimate"):
            if boxes is not None and b is not None:
                boxes.extend(b)
            for k, v in scorer.features(batch, b).items():
                parts.setdefault(k, []).append(v)
        return {k: torch.cat(v) for k, v in parts.items()}, boxes

    def atmm_ms(self, sheets: int) -> float:
        """ATMM ms of one canvas against ``sheets`` templates (measured once per ``sheets``)."""
        if sheets < 1:
            raise ValueError(f"sheets must be >= 1, got {sheets}")
        if sheets not in self._atmm:
            fake = TemplateSet(
                bank={name: v.repeat(sheets, 1, 1, 1).cpu() for name, v in self._one.items()},
                config=self.scorer.config,
                weights_id="estimate",
                image_digests=tuple(str(i) for i in range(sheets)),
            )
            prepared = self.scorer.prepare(fake)
            # .cpu(): waits for a GPU to finish
            self._atmm[sheets] = self._timed(lambda: self.scorer.score_maps(self._one, prepared, self._box).cpu())
        return self._atmm[sheets]

    def ms_per_frame(self, sheets: int | Sequence[int]) -> float:
        """Estimated ms per frame with ``sheets`` templates at every scored canvas, or one count per
        scored canvas (a tiled product's positions may hold different counts)."""
        if isinstance(sheets, int):
            return self.fixed_ms + self.scored * self.atmm_ms(sheets)
        return self.fixed_ms + sum(self.atmm_ms(k) for k in sheets)


def estimate_ms_per_frame(
    scorer: Scorer,
    crops: Sequence[ImageInput],
    sheets: int,
    *,
    scored: int | None = None,
    post: Callable[[], object] | None = None,
) -> float:
    """Milliseconds to score one frame whose canvases are ``crops`` (its tiles, or the image itself)
    against ``sheets`` templates per canvas: :class:`FrameCost` (the backbone pass of all ``crops`` in
    one batch, plus ATMM of one crop against ``sheets`` templates times ``scored``, default every
    crop; a tile the region leaves out is not scored; and ``post``, other per-frame work), on this
    host's settings; ``hetmm fit`` prints it before the long work, for tiled and untiled products alike."""
    return FrameCost(scorer, crops, scored=scored, post=post).ms_per_frame(sheets)


def blank_frame_crops(config: DetectorConfig, tiles: int = 1) -> list[np.ndarray]:
    """``tiles`` mid-grey canvases of the backbone's size: a frame's canvases for :class:`FrameCost`
    where no frame is at hand (``hetmm compress``, the service's sheets-auto task); the cost of
    resizing a larger frame to the canvas is then left out."""
    size = config.backbone.image_size
    return [np.full((size, size, 3), 128, dtype=np.uint8) for _ in range(tiles)]


def over_budget(why: str, cost: FrameCost, budget: float, k: int, estimate: float, config: DetectorConfig) -> str:
    """The reason when the chosen selection is over the time budget, also warned
    (:class:`TimeBudgetWarning`): a budget that cannot be met is never silent. A warning, not an
    error: the figures are timings of this host now (another load, another figure), and a hot
    update on the service must not fail for them; the cheapest selection is the closest to it."""
    bb = config.backbone
    tiles = f"{cost.canvases} canvas{'es' if cost.canvases > 1 else ''} of {bb.image_size} px"
    stitched = " and the stitching of their maps" if cost.post_ms > 0 else ""
    takes = "take" if stitched else "takes"
    if cost.fixed_ms >= budget:
        need = (
            f"the backbone{stitched} alone {takes} {cost.fixed_ms:.1f} ms per frame ({tiles}, {bb.name}), so no "
            f"template count meets it: raise the budget above {estimate:.1f} ms, or use fewer tiles (geometry.tiles) "
            f"or a smaller backbone or canvas (backbone.name, backbone.image_size)"
        )
    else:
        need = (
            f"the backbone{stitched} {takes} {cost.fixed_ms:.1f} ms per frame ({tiles}, {bb.name}) and {k} sheets "
            f"per scored canvas bring it to {estimate:.1f} ms: raise the budget to at least {estimate:.1f} ms, or "
            f"use fewer tiles or a smaller backbone"
        )
    message = f"templates.auto_max_ms_per_image {budget:g} ms per frame cannot be met on this host: {need}"
    warnings.warn(message, TimeBudgetWarning, stacklevel=3)
    return f"{why}; {message}"
