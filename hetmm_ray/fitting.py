"""The fit pipeline of :class:`~hetmm_ray.detector.HETMM`: extract -> select -> calibrate.

``fit`` extracts the good images' features into the bank, selects the tiny set
(``config.templates``: ALL, PTS or a baseline; ``sheets: auto`` measures K) and calibrates the
verdict threshold on out-of-fold scores; ``update`` appends images (hot update) and
``compress`` re-selects. The extract and PTS steps are injected (``hetmm_ray/steps.py``):
in this process by default, as Ray tasks with ``distributed.steps.ray_steps()``; this module
never imports Ray. Scoring (backbone, ATMM over prepared templates) is the scorer's
(:class:`Scorer`, the detector in ``detector.py``): the pipeline is a separate object that
holds its scorer, reads its configuration and features, scores the out-of-fold images with
it and installs the template sets it builds into it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import DetectorConfig, TemplateConfig
from .core.auto_sheets import Rung, agreement, choose_sheets
from .core.calibration import OutOfFold, fold_plan
from .core.device import TORCH_DTYPES, image_digest
from .core.geometry import Box, boxes_from_features
from .core.pts import select_layers
from .core.scoring import Calibration, image_scores
from .core.templates import TemplateSet, unseen_positions
from .data.decode import decode_image
from .steps import FitSteps

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .core.backbone import Backbone

__all__ = ["FitPipeline", "ImageInput", "Scorer"]

ImageInput = str | Path | bytes | np.ndarray
"""A path, encoded bytes, or a decoded RGB uint8 array (H, W, 3)."""

_DTYPES = TORCH_DTYPES
_digest = image_digest


class Scorer(Protocol):
    """What the fit pipeline needs of the scorer it fits (the detector, ``detector.py``)."""

    config: DetectorConfig  # the pipeline fixes K here (``sheets: auto``) and changes it in compress
    device: torch.device
    templates: TemplateSet | None
    backbone: Backbone

    def _batches(
        self, images: Sequence[ImageInput], desc: str
    ) -> Iterator[tuple[list[np.ndarray], Tensor, list[Box] | None]]: ...
    def features(self, batch: Tensor, boxes: Sequence[Box] | None) -> dict[str, Tensor]: ...
    def _score_features(
        self, feats: dict[str, Tensor], templates_pm: dict[str, Tensor], boxes: Sequence[Box] | None = None
    ) -> Tensor: ...
    def _prepare(self, ts: TemplateSet, held_out: Sequence[int] | None = None) -> dict[str, Tensor]: ...
    def _map_boxes(self, boxes: Sequence[Box] | None) -> list[Box] | None: ...
    def _install(self, ts: TemplateSet, version: int | None) -> None: ...
    def _require_templates(self) -> TemplateSet: ...


class FitPipeline:
    """Extract -> select -> calibrate for one :class:`Scorer`, with injectable steps."""

    def __init__(self, scorer: Scorer, *, steps: FitSteps | None = None, progress: bool = False) -> None:
        self.scorer = scorer
        self.steps = steps or FitSteps()
        self.progress = progress

    def extract(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False
    ) -> tuple[dict[str, Tensor], list[str]]:
        """Features of ``images`` (layer -> (N, C, h, w)) and their digests.

        ``bank=True`` moves each batch to the CPU in ``bank_dtype`` as it comes, so a large
        bank never exists twice (device float32 and CPU storage) at once.
        """
        feats, digests, _ = self._extract(images, desc=desc, bank=bank)
        return feats, digests

    def _extract(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False
    ) -> tuple[dict[str, Tensor], list[str], list[Box] | None]:
        """:meth:`extract` plus the images' canvas boxes (None: squash, or not known)."""
        if len(images) == 0:
            raise ValueError("no images given")
        if bank and self.steps.extract is not None:
            with tqdm(total=len(images), desc=desc, unit="img", disable=not self.progress, leave=False) as bar:
                feats, digests = self.steps.extract(
                    self.scorer.config, _as_items(images), progress=lambda done, _total: bar.update(done - bar.n)
                )
            bank_feats = {k: torch.from_numpy(v).to(_DTYPES[self.scorer.config.bank_dtype]) for k, v in feats.items()}
            return bank_feats, digests, None
        parts: dict[str, list[Tensor]] = {}
        digests: list[str] = []
        all_boxes: list[Box] | None = None if self.scorer.config.backbone.geometry == "squash" else []
        for decoded, batch, boxes in self.scorer._batches(images, desc):
            digests.extend(_digest(x) for x in decoded)
            if all_boxes is not None and boxes is not None:
                all_boxes.extend(boxes)
            for k, v in self.scorer.features(batch, boxes).items():
                parts.setdefault(k, []).append(v.to("cpu", _DTYPES[self.scorer.config.bank_dtype]) if bank else v)
        return {k: torch.cat(v) for k, v in parts.items()}, digests, all_boxes

    def _bank_boxes(self, ts: TemplateSet, images: Sequence[int]) -> list[Box] | None:
        """Canvas boxes of bank images: kept in ``meta["image_boxes"]`` by fit/update, else
        recovered from the bank's zeroed pad cells (sets built by the service's feature tasks)."""
        if self.scorer.config.backbone.geometry == "squash":
            return None
        kept = ts.meta.get("image_boxes")
        if kept is not None and len(kept) == ts.n_images:
            return [Box(*kept[i]) for i in images]
        idx = list(images)
        return boxes_from_features({k: v[idx] for k, v in ts.bank.items()}, self.scorer.config.backbone.image_size)

    # --- fit / update / compress -----------------------------------------------------
    def fit(self, images: Sequence[ImageInput]) -> None:
        """Build the template set from good images, select the tiny set, calibrate the threshold."""
        if len(images) < 2:
            raise ValueError(f"fit needs at least 2 good images, got {len(images)}")
        feats, digests, boxes = self._extract(images, desc="fit: features", bank=True)
        meta: dict[str, Any] = {"created": time.time()}
        if boxes is not None:
            meta["image_boxes"] = [list(b) for b in boxes]
        ts = TemplateSet(
            bank=feats,
            config=self.scorer.config,
            weights_id=self.scorer.backbone.weights_id,
            image_digests=tuple(digests),
            meta=meta,
        )
        self.scorer._install(self.calibrated(self._selected(ts)), version=None)

    def update(self, images: Sequence[ImageInput]) -> int:
        """Hot update: append good images' features, re-select the tiny set, recalibrate.

        Images already in the bank (same content digest) are skipped, so a retried update
        changes nothing; returns how many were skipped.
        """
        ts = self.scorer._require_templates()
        feats, digests, boxes = self._extract(images, desc="update: features", bank=True)
        keep = unseen_positions(ts.image_digests, digests)
        skipped = len(digests) - len(keep)
        if not keep:
            return skipped
        if len(keep) < len(digests):
            feats = {k: v[keep] for k, v in feats.items()}
            digests = [digests[i] for i in keep]
            boxes = None if boxes is None else [boxes[i] for i in keep]
        old_boxes = ts.meta.get("image_boxes")
        meta = {k: v for k, v in ts.meta.items() if k != "image_boxes"}
        if boxes is not None and old_boxes is not None and len(old_boxes) == ts.n_images:
            meta["image_boxes"] = [*old_boxes, *(list(b) for b in boxes)]
        grown = ts.appended(feats, tuple(digests), meta=meta)
        self.scorer._install(self.calibrated(self._selected(grown)), version=None)
        return skipped

    def compress(self, kind: str | None = None, sheets: int | None = None, *, seed: int | None = None) -> None:
        """Re-select the tiny set from the bank (PTS or an ablation baseline) and recalibrate."""
        ts = self.scorer._require_templates()
        changes = {"kind": kind, "sheets": sheets, "seed": seed}
        tc = replace(self.scorer.config.templates, **{k: v for k, v in changes.items() if v is not None})
        self.scorer.config = replace(self.scorer.config, templates=tc)
        self.scorer._install(self.calibrated(self._selected(replace(ts, config=self.scorer.config))), version=None)

    def _selected(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with the selection of ``config.templates`` (docs/algorithm.md §4) computed per layer;
        ``sheets: auto`` measures K first (:meth:`_auto_selected`) and fixes it in ``self.scorer.config``."""
        tc = self.scorer.config.templates
        if tc.kind == "all":
            return replace(ts, indices=None, centres=None)
        if tc.sheets == "auto":
            return self._auto_selected(ts)
        indices, centres = self._select(ts, tc)
        meta = {k: v for k, v in ts.meta.items() if k != "sheets_auto"}  # a fixed K: no ladder to report
        return replace(ts, config=self.scorer.config, indices=indices, centres=centres, meta=meta)

    def _select(self, ts: TemplateSet, tc: TemplateConfig) -> tuple[dict[str, Tensor] | None, dict[str, Tensor] | None]:
        """Per-layer (indices, centres) of selection ``tc`` (a fixed K) on ``ts``'s bank."""
        total = sum(v.shape[2] * v.shape[3] for v in ts.bank.values())
        pts = self._pts_fanout()
        with tqdm(total=total, desc=f"{tc.kind}: {tc.sheets} sheets", unit="px", disable=not self.progress) as bar:
            indices, centres = select_layers(
                ts.bank,
                tc.kind,
                tc.sheets,
                tc.seed,
                device=self.scorer.device,
                progress=lambda done, _total: bar.update(done - bar.n),
                **pts,
            )
        return indices, centres

    # --- sheets: auto (core/auto_sheets.py) ---------------------------------------------
    def _oof_scores(self, ts: TemplateSet, templates: TemplateConfig) -> tuple[list[float], float]:
        """Out-of-fold scores of ``ts``'s good images under selection ``templates`` (the same
        :meth:`out_of_fold` the threshold uses) and the ATMM scoring ms per image they took."""
        oof = self.out_of_fold(ts, templates=templates)
        return list(oof.scores), 1000 * oof.scoring_seconds / max(len(oof.scores), 1)

    def _verdict_threshold(self, scores: Sequence[float]) -> float:
        """The verdict threshold the product's rule sets on out-of-fold ``scores`` (a labelled
        ``validation`` threshold does not exist yet while templates are being chosen: ``far``)."""
        th = self.scorer.config.threshold
        rule = "far" if th.rule == "validation" else th.rule
        op = Calibration(scores=tuple(scores)).operating_point(
            rule, sigmas=th.sigmas, false_alarm_rate=th.false_alarm_rate
        )
        return op.threshold

    def _auto_selected(self, ts: TemplateSet) -> TemplateSet:
        """The selection at the smallest ladder K that agrees with ALL (``core.auto_sheets``)."""
        tc = self.scorer.config.templates
        reference, all_ms = self._oof_scores(replace(ts, indices=None, centres=None), replace(tc, kind="all"))
        reference_threshold = self._verdict_threshold(reference)
        made: dict[int, TemplateSet] = {}

        def evaluate(k: int) -> Rung:
            fixed = replace(tc, sheets=k)
            indices, centres = self._select(ts, fixed)
            made[k] = replace(ts, config=replace(self.scorer.config, templates=fixed), indices=indices, centres=centres)
            scores, ms = self._oof_scores(made[k], fixed)
            return agreement(
                k,
                scores,
                self._verdict_threshold(scores),
                reference,
                reference_threshold,
                ms,
                min_rank_corr=tc.auto_min_rank_corr,
                max_rel_diff=tc.auto_max_rel_diff,
                min_verdict_agreement=tc.auto_min_verdict_agreement,
            )

        def report(rung: Rung) -> None:
            if self.progress:
                tqdm.write(
                    f"sheets {rung.sheets:>5}: rank corr {rung.rank_corr:.4f}  max rel diff {rung.max_rel_diff:.4f}  "
                    f"verdicts {100 * rung.verdict_agreement:.1f}%  {rung.ms_per_image:.1f} ms/img  "
                    f"{'agrees' if rung.agrees else '-'}"
                )

        k, rungs, why = choose_sheets(ts.n_images, evaluate, max_ms_per_image=tc.auto_max_ms_per_image, report=report)
        self.scorer.config = replace(self.scorer.config, templates=replace(tc, sheets=k))
        if k not in made:
            indices, centres = self._select(ts, self.scorer.config.templates)
            made[k] = replace(ts, indices=indices, centres=centres)
        meta = {
            **ts.meta,
            "sheets_auto": {
                "chosen": k,
                "images": ts.n_images,
                "why": why,
                "all_ms_per_image": round(all_ms, 3),
                "ladder": [r.to_dict() for r in rungs],
                "tolerance": {
                    "min_rank_corr": tc.auto_min_rank_corr,
                    "max_rel_diff": tc.auto_max_rel_diff,
                    "min_verdict_agreement": tc.auto_min_verdict_agreement,
                    "max_ms_per_image": tc.auto_max_ms_per_image,
                },
            },
        }
        return replace(made[k], config=self.scorer.config, meta=meta)

    def out_of_fold(self, ts: TemplateSet, *, templates: TemplateConfig | None = None) -> OutOfFold:
        """Out-of-fold scores of ``ts``'s training images, each scored as a new part would be.

        The folds come from ``threshold`` (:func:`~hetmm_ray.core.calibration.fold_plan`: up to
        ``max_images`` images in ``folds`` folds). For each fold the templates are selected
        afresh from the *other* training images only, with ``templates`` (default: this
        detector's ``config.templates``): ALL is the kept images' bank; a compressed selection
        (PTS, IR, PR, PC_K) re-runs on the kept images, so a held-out image never contributes a
        sheet. The held-out features come from the bank (no backbone pass).
        Cost: one selection per fold (none for ALL) + one ATMM scoring per held-out image.
        """
        tc = self.scorer.config.threshold
        sel = templates or self.scorer.config.templates
        n = ts.n_images
        images: list[int] = []
        scores: list[float] = []
        scoring_seconds = 0.0
        plan = fold_plan(n, folds=tc.folds, max_images=tc.max_images, seed=tc.seed, keys=ts.image_digests)
        for held in plan:
            held_set = set(held)
            kept = [i for i in range(n) if i not in held_set]
            kept_bank = {k: v[kept] for k, v in ts.bank.items()}
            fold_ts = TemplateSet(
                bank=kept_bank,
                config=self.scorer.config,
                weights_id=ts.weights_id,
                image_digests=tuple(ts.image_digests[i] for i in kept),
            )
            if sel.kind != "all":
                indices, centres = select_layers(
                    kept_bank, sel.kind, sel.sheets, sel.seed, device=self.scorer.device, **self._pts_fanout()
                )
                fold_ts = replace(fold_ts, indices=indices, centres=centres)
            held_feats = {k: v[held].to(self.scorer.device) for k, v in ts.bank.items()}
            held_boxes = self._bank_boxes(ts, held)  # letterbox: the pad never counts in a score
            start = time.perf_counter()
            maps = self.scorer._score_features(held_feats, self.scorer._prepare(fold_ts), held_boxes)
            fold_scores = image_scores(maps, self.scorer.config.scoring.score_sigma, self.scorer._map_boxes(held_boxes))
            scoring_seconds += time.perf_counter() - start
            images.extend(held)
            scores.extend(float(x) for x in fold_scores.tolist())
        return OutOfFold(images=tuple(images), scores=tuple(scores), folds=len(plan), scoring_seconds=scoring_seconds)

    def _pts_fanout(self) -> dict[str, Any]:
        """``select_layers`` keyword: the injected PTS step, if any (``FitSteps.pts``)."""
        return {} if self.steps.pts is None else {"pts": self.steps.pts}

    def calibrated(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with its threshold calibration recomputed from its own bank (no backbone needed):
        the out-of-fold scores of :meth:`out_of_fold` under ``ts``'s own template selection."""
        oof = self.out_of_fold(ts, templates=ts.config.templates)
        return replace(ts, calibration=Calibration(scores=oof.scores))


def _as_items(images: Sequence[ImageInput]) -> list[bytes | np.ndarray]:
    """What an injected extract step takes: encoded bytes or RGB arrays (a path is read here,
    in the caller's process, where the file is)."""
    out: list[bytes | np.ndarray] = []
    for x in images:
        if isinstance(x, str | Path):
            out.append(as_rgb(x))  # decoded here: the same checks and errors as in process
        else:
            out.append(x)
    return out


def as_rgb(x: ImageInput) -> np.ndarray:
    """``x`` as an RGB uint8 array (H, W, 3): arrays are checked, anything else decoded."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[2] != 3:
            raise ValueError(f"image arrays must be RGB uint8 (H, W, 3), got {x.dtype} {x.shape}")
        return x
    return decode_image(x)
