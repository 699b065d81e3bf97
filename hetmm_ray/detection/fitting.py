"""The fit pipeline: extract -> select -> calibrate, returning template sets.

One orchestration of a fit for one process and for the cluster. :class:`FitPipeline` builds
:class:`~hetmm_ray.core.templates.TemplateSet` values and never installs them, nor changes its
scorer's configuration: the caller decides what to do with the set (``HETMM`` installs it,
the service's registry publishes it).

- :meth:`FitPipeline.fit` / :meth:`~FitPipeline.fit_features`: a new set from good images (or
  their features): ``meta.created``, ``meta.image_boxes`` (letterbox, when the boxes are known),
  then :meth:`~FitPipeline.refit`.
- :meth:`FitPipeline.update` / :meth:`~FitPipeline.grown`: images already in the bank (same
  content digest) are skipped; the rest are appended (``meta.image_boxes`` kept only when every
  image's box is known), then :meth:`~FitPipeline.refit`. Nothing new: None.
- :meth:`FitPipeline.compress`: the same bank under another ``templates`` selection, refit.
- :meth:`FitPipeline.without`: the bank without the frames a drop list names (every copy of a
  digest, or a repeat group's later copies only: ``core.good_outliers.drop_positions``), through
  :meth:`~FitPipeline.without_positions` (the one removal: by bank index), then refit.
- :meth:`FitPipeline.refit` = :meth:`~FitPipeline.calibrated` of :meth:`~FitPipeline.selected`.
  ``selected`` dispatches on the set's own ``config.templates``: ``kind: all`` clears the
  selection; ``sheets: auto`` measures K (``core/auto_sheets.py``; the result's config holds the
  chosen K and ``meta.sheets_auto`` the ladder); a fixed K selects every layer (and drops a
  ladder: a K that was given has none to report).

Where the work runs is injected (``hetmm_ray/detection/fit_steps.py``, ``FitSteps``): extraction, PTS, the
fixed-K selection, the sheets-auto measurement and the calibration each default to this
process and may run elsewhere (Ray tasks, the service's template shards) with the same results.
Every stage reports progress: a tqdm bar when ``progress`` is on, and ``report`` (a job's
progress on the service) gets each stage's name and done/total counts. This module never
imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import DetectorConfig, TemplateConfig
from ..core.auto_sheets import Rung, agreement, choose_sheets, scaled_ms
from ..core.calibration import OutOfFold, fold_plan
from ..core.cover import cover_folds
from ..core.device import TORCH_DTYPES, image_digest
from ..core.geometry import Box, boxes_from_features
from ..core.good_outliers import drop_positions
from ..core.pts import select_layers
from ..core.region import check_visible
from ..core.scoring import Calibration
from ..core.templates import SheetsAuto, TemplateMeta, TemplateSet, unseen_positions
from ..data.decode import canvas_digest
from .fit_steps import FitSteps, Progress, Report, Selection
from .frame_cost import FrameCost, blank_frame_crops, over_budget
from .scorer import ImageInput, Scorer, as_rgb

__all__ = ["FitPipeline", "ImageInput"]


class FitPipeline:
    """Extract -> select -> calibrate over a :class:`~hetmm_ray.detection.scorer.Scorer` (see the module docstring).

    The scorer supplies features (its backbone) and out-of-fold scoring, and its configuration
    is read for this run's settings (device, dtype, batch sizes) and as the default product
    configuration of :meth:`fit`; the product settings of every other step are the template
    set's own (``ts.config``).
    """

    def __init__(
        self,
        scorer: Scorer,
        *,
        steps: FitSteps | None = None,
        progress: bool = False,
        report: Report | None = None,
        tiles: int = 1,
        scored: int | None = None,
    ) -> None:
        self.scorer = scorer
        self.steps = steps or FitSteps()
        self.progress = progress
        self.report = report
        # Tiles per frame of the product this pipeline fits one position of (tiled.py), and how many
        # of them are scored (None: all): the sheets-auto time budget is per frame with all its tiles.
        self.tiles = tiles
        self.scored = scored
        # One frame's canvases as predict gets them (its tiles, or the image): what the time budget's
        # backbone term is measured on. fit / update take their first image; tiled.py sets its
        # frame's tiles; None: blank canvases of the backbone's size (blank_frame_crops).
        self.cost_crops: Sequence[ImageInput] | None = None
        # A frame cost already measured (tiled.py: one for all its positions); None: measured here.
        self.cost: FrameCost | None = None

    @contextmanager
    def _stage(self, name: str, total: int, *, unit: str = "img", leave: bool = True) -> Iterator[Progress]:
        """A progress bar (when ``progress`` is on) and a reported stage; yields ``progress(done, total)``."""
        if self.report is not None:
            self.report.stage(name, total)
        with tqdm(total=total, desc=name, unit=unit, disable=not self.progress, leave=leave) as bar:

            def progress(done: int, _total: int) -> None:
                bar.update(done - bar.n)
                if self.report is not None:
                    self.report(done, total)

            yield progress

    # --- extract ----------------------------------------------------------------------
    def extract(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False
    ) -> tuple[dict[str, Tensor], list[str]]:
        """Features of ``images`` (layer -> (N, C, h, w)) and their digests.

        ``bank=True`` moves each batch to the CPU in ``bank_dtype`` as it comes, so a large
        bank never exists twice (device float32 and CPU storage) at once.
        """
        feats, digests, _, _ = self._extract(images, desc=desc, bank=bank)
        return feats, digests

    def extract_with_boxes(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False
    ) -> tuple[dict[str, Tensor], list[str], list[Box] | None]:
        """:meth:`extract` plus the images' canvas boxes (None: squash, or not known)."""
        feats, digests, boxes, _ = self._extract(images, desc=desc, bank=bank)
        return feats, digests, boxes

    def _extract(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False, aliases: bool = False
    ) -> tuple[dict[str, Tensor], list[str], list[Box] | None, list[str] | None]:
        """:meth:`extract` plus the images' canvas boxes (None: squash, or not known) and, with
        ``aliases``, their ``data.decode.canvas_digest`` (the digest older fits stored: a hot update
        compares both with the bank's)."""
        if len(images) == 0:
            raise ValueError("no images given")
        config = self.scorer.config
        if bank and self.steps.extract is not None:
            items = _as_items(images)
            with self._stage(desc, len(images), leave=False) as progress:
                feats, digests = self.steps.extract(config, items, progress=progress)
            bank_feats = {k: torch.from_numpy(v).to(TORCH_DTYPES[config.bank_dtype]) for k, v in feats.items()}
            return bank_feats, digests, None, [self._canvas_digest(as_rgb(x)) for x in items] if aliases else None
        parts: dict[str, list[Tensor]] = {}
        digests = []
        canvas: list[str] | None = [] if aliases else None
        all_boxes: list[Box] | None = None if config.backbone.geometry == "squash" else []
        if self.report is not None:
            self.report.stage(desc, len(images))
        for decoded, batch, boxes in self.scorer.decoded_batches(images, desc):
            digests.extend(image_digest(x) for x in decoded)
            if canvas is not None:
                canvas.extend(self._canvas_digest(x) for x in decoded)
            if all_boxes is not None and boxes is not None:
                all_boxes.extend(boxes)
            for k, v in self.scorer.features(batch, boxes).items():
                parts.setdefault(k, []).append(v.to("cpu", TORCH_DTYPES[config.bank_dtype]) if bank else v)
            if self.report is not None:
                self.report(len(digests), len(images))
        return {k: torch.cat(v) for k, v in parts.items()}, digests, all_boxes, canvas

    def _canvas_digest(self, frame: np.ndarray) -> str:
        bb = self.scorer.config.backbone
        return canvas_digest(frame, bb.image_size, bb.geometry)

    def bank_boxes(self, ts: TemplateSet, images: Sequence[int]) -> list[Box] | None:
        """Canvas boxes of bank images: kept in ``meta.image_boxes`` by fit/update, else
        recovered from the bank's zeroed pad cells (sets built by the service's feature tasks)."""
        if ts.config.backbone.geometry == "squash":
            return None
        kept = ts.meta.image_boxes
        if kept is not None and len(kept) == ts.n_images:
            return [Box(*kept[i]) for i in images]
        idx = list(images)
        return boxes_from_features({k: v[idx] for k, v in ts.bank.items()}, ts.config.backbone.image_size)

    # --- fit / update / compress -----------------------------------------------------
    def fit(self, images: Sequence[ImageInput], config: DetectorConfig | None = None) -> TemplateSet:
        """A template set from good images under ``config`` (default: the scorer's): the bank,
        the tiny set and the threshold calibration."""
        if len(images) < 2:
            raise ValueError(f"fit needs at least 2 good images, got {len(images)}")
        self.cost_crops = list(images[:1])  # sheets auto's time budget: a frame as predict will get it
        feats, digests, boxes, _ = self._extract(images, desc="fit: features", bank=True)
        return self.fit_features(feats, digests, config=config, weights_id=self.scorer.backbone.weights_id, boxes=boxes)

    def fit_features(
        self,
        feats: dict[str, Tensor],
        digests: Sequence[str],
        *,
        weights_id: str,
        config: DetectorConfig | None = None,
        boxes: Sequence[Box] | None = None,
        calibrate: bool = True,
    ) -> TemplateSet:
        """:meth:`fit` from the images' bank features (layer -> (N, C, h, w)) and digests;
        ``calibrate=False``: selected only (:meth:`selectable` then :meth:`selected`), its
        calibration left to the caller (:meth:`out_of_fold` parts, :meth:`calibrated_from`)."""
        meta = TemplateMeta().with_(created=time.time())
        if boxes is not None:
            meta = meta.with_(image_boxes=boxes)
        ts = TemplateSet(
            bank=feats,
            config=config or self.scorer.config,
            weights_id=weights_id,
            image_digests=tuple(digests),
            meta=meta,
        )
        return self.refit(ts) if calibrate else self.selected(self.selectable(ts))

    def update(self, ts: TemplateSet, images: Sequence[ImageInput]) -> tuple[TemplateSet | None, int]:
        """Hot update of ``ts`` with good images: (the refit set, or None when every image was
        already in the bank; how many were skipped as already there)."""
        if len(images) > 0:
            self.cost_crops = list(images[:1])
        feats, digests, boxes, canvas = self._extract(images, desc="update: features", bank=True, aliases=True)
        grown, keep = self.grown(ts, feats, digests, boxes, aliases=canvas)
        return (None if grown is None else self.refit(grown)), len(digests) - len(keep)

    def grown(
        self,
        ts: TemplateSet,
        feats: dict[str, Tensor],
        digests: Sequence[str],
        boxes: Sequence[Box] | None = None,
        *,
        aliases: Sequence[str] | None = None,
    ) -> tuple[TemplateSet | None, list[int]]:
        """``ts`` with the new images' features appended (selection reset, not yet refit; None
        when there is nothing new), and the positions in ``digests`` kept: the others have the
        content digest of a bank image or of an earlier new one, or their ``aliases`` entry
        (``data.decode.canvas_digest``) is a bank image's (a bank stored by an older ``hetmm fit``)."""
        keep = unseen_positions(ts.image_digests, list(digests), aliases)
        if not keep:
            return None, keep
        if len(keep) < len(digests):
            feats = {k: v[keep] for k, v in feats.items()}
            digests = [digests[i] for i in keep]
            boxes = None if boxes is None else [boxes[i] for i in keep]
        old_boxes = ts.meta.image_boxes
        meta = ts.meta.without("image_boxes")
        if boxes is not None and old_boxes is not None and len(old_boxes) == ts.n_images:
            meta = meta.with_(image_boxes=[*old_boxes, *boxes])
        return ts.appended(feats, tuple(digests), meta=meta), keep

    def without(self, ts: TemplateSet, digests: Sequence[str]) -> TemplateSet:
        """``ts`` without the bank frames the drop list ``digests`` names (every copy of a digest;
        only the later copies of a ``LaterCopies`` one: ``core.good_outliers.drop_positions``),
        :meth:`without_positions`. A digest naming no frame, or dropping all but one frame, is a
        ValueError before anything changes."""
        return self.without_positions(ts, drop_positions(ts.image_digests, digests))

    def without_positions(self, ts: TemplateSet, positions: Sequence[int]) -> TemplateSet:
        """``ts`` with the bank frames at ``positions`` removed (selection reset), refit: what a fit on
        the other frames would store, their features reused (``hetmm drop``). A position outside the
        bank, or dropping all but one frame, is a ValueError before anything changes."""
        gone = set(positions)
        outside = sorted(i for i in gone if not 0 <= i < ts.n_images)
        if outside:
            raise ValueError(f"the bank of {ts.n_images} frames has no position {', '.join(map(str, outside))}")
        keep = [i for i in range(ts.n_images) if i not in gone]
        if len(keep) < 2:
            raise ValueError(f"dropping {len(gone)} of {ts.n_images} frames leaves {len(keep)}: a product needs 2")
        boxes = ts.meta.image_boxes
        meta = ts.meta.without("image_boxes")
        if boxes is not None and len(boxes) == ts.n_images:
            meta = meta.with_(image_boxes=[boxes[i] for i in keep])
        kept = replace(
            ts,
            bank={k: v[keep] for k, v in ts.bank.items()},
            image_digests=tuple(ts.image_digests[i] for i in keep),
            indices=None,
            centres=None,
            meta=meta,
        )
        return self.refit(kept)

    def compress(
        self, ts: TemplateSet, kind: str | None = None, sheets: int | str | None = None, *, seed: int | None = None
    ) -> TemplateSet:
        """``ts``'s bank under another selection (``kind``, ``sheets``, ``seed``; None keeps
        the set's own), refit."""
        changes: dict[str, Any] = {"kind": kind, "sheets": sheets, "seed": seed}
        tc = replace(ts.config.templates, **{k: v for k, v in changes.items() if v is not None})
        return self.refit(replace(ts, config=replace(ts.config, templates=tc)))

    def refit(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` selected (:meth:`selected`) and calibrated (:meth:`calibrated`); a region that
        counts no map pixel is refused first (ConfigError)."""
        return self.calibrated(self.selected(self.selectable(ts)))

    def selectable(self, ts: TemplateSet) -> TemplateSet:
        """``ts``, once its region is known to count a map pixel (else ConfigError): the check
        :meth:`refit` makes first."""
        check_visible(ts.config)
        return ts

    # --- select ---------------------------------------------------------------------------
    def selected(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with the selection of its ``config.templates`` (docs/algorithm.md §4) computed
        per layer; ``sheets: auto`` measures K first (the ``auto_select`` step)."""
        tc = ts.config.templates
        if tc.kind == "all":
            return replace(ts, indices=None, centres=None)
        if tc.sheets == "auto":
            if self.steps.auto_select is None:
                return self.auto_selected(ts)
            if self.report is not None:
                self.report.stage(f"select {tc.kind}: sheets auto")
            return self.steps.auto_select(ts)
        indices, centres = self.select(ts, tc)
        meta = ts.meta.without("sheets_auto")  # a fixed K: no ladder to report
        return replace(ts, indices=indices, centres=centres, meta=meta)

    def select(self, ts: TemplateSet, tc: TemplateConfig) -> tuple[dict[str, Tensor] | None, dict[str, Tensor] | None]:
        """Per-layer (indices, centres) of selection ``tc`` (a fixed K) on ``ts``'s bank (the
        ``select`` step; by default ``core.pts.select_layers`` here, PTS by the ``pts`` step)."""
        total = sum(v.shape[2] * v.shape[3] for v in ts.bank.values())
        with self._stage(f"select {tc.kind}: {tc.sheets} sheets", total, unit="px") as progress:
            if self.steps.select is not None:
                return self.steps.select(ts, tc, progress=progress)
            return select_layers(
                ts.bank, tc.kind, tc.sheets, tc.seed, device=self.scorer.device, progress=progress, **self._pts()
            )

    def _pts(self) -> dict[str, Callable[..., Tensor]]:
        """``select_layers`` keyword: the injected PTS step, if any (``FitSteps.pts``)."""
        return {} if self.steps.pts is None else {"pts": self.steps.pts}

    # --- sheets: auto (core/auto_sheets.py) ---------------------------------------------
    def _oof_scores(self, ts: TemplateSet, templates: TemplateConfig) -> tuple[list[float], float]:
        """Out-of-fold scores of ``ts``'s good images under selection ``templates`` (the same
        :meth:`out_of_fold` the threshold uses) and the ATMM scoring ms per image they took,
        scaled to the sheets the final selection holds (``core.auto_sheets.scaled_ms``)."""
        oof = self.out_of_fold(ts, templates=templates)
        measured = 1000 * oof.scoring_seconds / max(len(oof.scores), 1)
        return list(oof.scores), scaled_ms(measured, templates.sheets_of(ts.n_images), self._fold_sheets(ts, templates))

    @staticmethod
    def _fold_sheets(ts: TemplateSet, templates: TemplateConfig) -> float:
        """Sheets a held-out image was scored against in :meth:`out_of_fold`, averaged over images."""
        th = ts.config.threshold
        n = ts.n_images
        plan = fold_plan(n, folds=th.folds, max_images=th.max_images, seed=th.seed, keys=ts.image_digests)
        held = sum(len(h) for h in plan)
        return sum(len(h) * templates.sheets_of(n - len(h)) for h in plan) / max(held, 1)

    @staticmethod
    def _verdict_threshold(config: DetectorConfig, scores: Sequence[float]) -> float:
        """The verdict threshold the product's rule sets on out-of-fold ``scores`` (a labelled
        ``validation`` threshold does not exist yet while templates are being chosen: ``far``)."""
        th = config.threshold
        rule = "far" if th.rule == "validation" else th.rule
        op = Calibration(scores=tuple(scores)).operating_point(
            rule, sigmas=th.sigmas, false_alarm_rate=th.false_alarm_rate
        )
        return op.threshold

    def frame_cost(self) -> FrameCost:
        """:class:`FrameCost` of one frame of this product on this host: :attr:`cost` when given, else
        measured on :attr:`cost_crops` (else ``tiles`` blank canvases), ``scored`` of them scored."""
        if self.cost is not None:
            return self.cost
        crops = self.cost_crops if self.cost_crops is not None else blank_frame_crops(self.scorer.config, self.tiles)
        return FrameCost(self.scorer, crops, scored=self.tiles if self.scored is None else self.scored)

    def auto_selected(self, ts: TemplateSet) -> TemplateSet:
        """The selection at the smallest ladder K that agrees with ALL within the time budget
        (``core.auto_sheets``), in this process; the result's config holds the chosen K,
        ``meta.sheets_auto`` the ladder.

        The budget ``templates.auto_max_ms_per_image`` is the whole frame's scoring cost,
        :meth:`FrameCost.ms_per_frame` (backbone of all its tiles + ATMM of every scored tile),
        estimated on this host for each rung as if every tile position held that rung's K: so a
        tiled product's positions each keep their ATMM within ``(budget - backbone) / scored``
        and the frame with all its tiles meets the budget. When even the cheapest choice is over
        it (the backbone alone, or with the ladder's first rung), that choice is taken and a
        :class:`TimeBudgetWarning` says what it would take; the reason is stored too."""
        config = ts.config
        tc = config.templates
        reference, all_ms = self._oof_scores(replace(ts, indices=None, centres=None), replace(tc, kind="all"))
        reference_threshold = self._verdict_threshold(config, reference)
        budget = tc.auto_max_ms_per_image
        cost = None if budget is None else self.frame_cost()  # no budget: nothing measured, as before
        made: dict[int, TemplateSet] = {}

        def evaluate(k: int) -> Rung:
            fixed = replace(tc, sheets=k)
            indices, centres = self.select(ts, fixed)
            made[k] = replace(ts, config=replace(config, templates=fixed), indices=indices, centres=centres)
            scores, ms = self._oof_scores(made[k], fixed)
            rung = agreement(
                k,
                scores,
                self._verdict_threshold(config, scores),
                reference,
                reference_threshold,
                ms,
                min_rank_corr=tc.auto_min_rank_corr,
                max_norm_diff=tc.auto_max_norm_diff,
                min_verdict_agreement=tc.auto_min_verdict_agreement,
            )
            return rung if cost is None else replace(rung, ms_per_frame=cost.ms_per_frame(k))

        def report(rung: Rung) -> None:
            if self.progress:
                frame = "" if rung.ms_per_frame is None else f"  est. {rung.ms_per_frame:.1f} ms/frame"
                tqdm.write(
                    f"sheets {rung.sheets:>5}: rank corr {rung.rank_corr:.4f}  norm diff {rung.norm_diff:.4f}  "
                    f"verdicts {100 * rung.verdict_agreement:.1f}%  {rung.ms_per_image:.1f} ms/img{frame}  "
                    f"{'agrees' if rung.agrees else '-'}"
                )

        all_frame = None if cost is None else cost.ms_per_frame(ts.n_images)
        k, rungs, why = choose_sheets(
            ts.n_images, evaluate, max_ms_per_frame=budget, all_ms_per_frame=all_frame, report=report
        )
        chosen = replace(config, templates=replace(tc, sheets=k))
        if k not in made:
            indices, centres = self.select(ts, chosen.templates)
            made[k] = replace(ts, indices=indices, centres=centres)
        tolerance: dict[str, float | int | None] = {
            "min_rank_corr": tc.auto_min_rank_corr,
            "max_norm_diff": tc.auto_max_norm_diff,
            "min_verdict_agreement": tc.auto_min_verdict_agreement,
            "max_ms_per_image": tc.auto_max_ms_per_image,
        }
        if self.tiles > 1:
            tolerance["tiles"] = self.tiles
        if cost is not None and budget is not None:
            estimate = cost.ms_per_frame(min(k, ts.n_images))
            tolerance |= {
                "fixed_ms_per_frame": round(cost.fixed_ms, 3),  # backbone (+ a tiled frame's stitching)
                "estimated_ms_per_frame": round(estimate, 3),  # every scored tile at this K
            }
            if estimate > budget:
                why = over_budget(why, cost, budget, k, estimate, config)
        record = SheetsAuto(
            chosen=k,
            images=ts.n_images,
            why=why,
            all_ms_per_image=round(all_ms, 3),
            ladder=tuple(r.to_dict() for r in rungs),
            tolerance=tolerance,  # type: ignore[arg-type]
        )
        return replace(made[k], config=chosen, meta=ts.meta.with_(sheets_auto=record))

    # --- calibrate ------------------------------------------------------------------------
    def fold_plan(self, ts: TemplateSet) -> list[list[int]]:
        """The held-out images of each fold of ``ts``'s out-of-fold calibration
        (:func:`~hetmm_ray.core.calibration.fold_plan` under ``ts.config.threshold``)."""
        th = ts.config.threshold
        return fold_plan(ts.n_images, folds=th.folds, max_images=th.max_images, seed=th.seed, keys=ts.image_digests)

    def out_of_fold(
        self, ts: TemplateSet, *, templates: TemplateConfig | None = None, folds: Sequence[int] | None = None
    ) -> OutOfFold:
        """Out-of-fold scores of ``ts``'s training images, each scored as a new part would be.

        The folds come from ``ts.config.threshold`` (:func:`~hetmm_ray.core.calibration.fold_plan`:
        up to ``max_images`` images in ``folds`` folds). For each fold the templates are selected
        afresh from the *other* training images only, with ``templates`` (default: the set's
        own ``config.templates``): ALL is the kept images' bank; a compressed selection
        (PTS, IR, PR, PC_K) re-runs on the kept images, so a held-out image never contributes a
        sheet. The held-out features come from the bank (no backbone pass).
        Cost: one selection per fold (none for ALL; the ``cover`` kind selects for every fold in
        one pass over the bank, ``core.cover.cover_folds``; other kinds through
        :meth:`fold_selections`, which an injected ``select_folds`` step may run as parallel
        tasks) + one ATMM scoring per held-out image; progress counts the scored images.

        ``folds``: the indices of the folds to score (in increasing order; None: all), so the folds
        can be scored apart: the parts of consecutive fold ranges, joined in order
        (:meth:`calibrated_from`), are the scores of all of them.
        """
        config = ts.config
        sel = templates or config.templates
        n = ts.n_images
        images: list[int] = []
        scores: list[float] = []
        scoring_seconds = 0.0
        device = self.scorer.device
        plan = self.fold_plan(ts)
        if folds is not None:
            if list(folds) != sorted(set(folds)) or any(not 0 <= f < len(plan) for f in folds):
                raise ValueError(f"folds {list(folds)}: increasing indices of the {len(plan)} folds wanted")
            plan = [plan[f] for f in folds]
        total = sum(len(held) for held in plan)
        kept_rows = [np.setdiff1d(np.arange(n), held).tolist() for held in plan]
        selections = self.fold_selections(ts.bank, sel, plan, kept_rows)
        # the bank laid out pixel-major once, each fold's templates gathered from it (not per fold);
        # centres (every fold's, or none) blend the kept images and are made per fold
        bank_pm = self.scorer.pixel_major_bank(ts) if all(c is None for _, c in selections) else None
        with self._stage("calibrate: out-of-fold", total, leave=False) as progress:

            def from_done(done: int) -> Callable[[int, int], None]:
                """A fold's progress: its images counted after the ``done`` of the folds before it."""
                return lambda d, _n: progress(done + d, total)

            for held, kept, (indices, centres) in zip(plan, kept_rows, selections, strict=True):
                if bank_pm is not None:
                    templates_pm = self.scorer.prepare_rows(bank_pm, kept, indices)
                else:
                    fold_ts = TemplateSet(
                        bank={k: v[kept] for k, v in ts.bank.items()},
                        config=config,
                        weights_id=ts.weights_id,
                        image_digests=tuple(ts.image_digests[i] for i in kept),
                        indices=indices,
                        centres=centres,
                    )
                    templates_pm = self.scorer.prepare(fold_ts)
                held_feats = {k: v[held].to(device) for k, v in ts.bank.items()}
                held_boxes = self.bank_boxes(ts, held)  # letterbox: the pad never counts in a score
                start = time.perf_counter()
                done = len(images)
                fold_scores = self.scorer.score(
                    held_feats,
                    templates_pm,
                    held_boxes,
                    progress=from_done(done),
                    region_of=config,  # the set's own region: pixels outside never count
                )
                fold_values = fold_scores.tolist()  # inside the timing: waits for a GPU to finish
                scoring_seconds += time.perf_counter() - start
                images.extend(held)
                scores.extend(float(x) for x in fold_values)
        return OutOfFold(images=tuple(images), scores=tuple(scores), folds=len(plan), scoring_seconds=scoring_seconds)

    def fold_selections(
        self,
        bank: dict[str, Tensor],
        templates: TemplateConfig,
        plan: Sequence[Sequence[int]],
        kept: Sequence[Sequence[int]],
    ) -> list[Selection]:
        """Each fold's (indices, centres) under ``templates``, made from its ``kept`` rows of
        ``bank`` alone (indices into the kept bank): nothing for ALL; the ``cover`` kind for every
        fold in one pass (``core.cover.cover_folds``); any other kind one selection per fold, by
        the injected ``select_folds`` step (the Ray one runs the folds as parallel tasks) or here,
        one after another (each already uses every core of this process)."""
        if templates.kind == "all":
            return [(None, None)] * len(plan)
        device = self.scorer.device
        if templates.kind == "cover" and isinstance(templates.sheets, int):
            return [(c, None) for c in cover_folds(bank, templates.sheets, plan, device=device)]
        with self._stage("select: folds", len(kept), unit="fold", leave=False) as progress:
            if self.steps.select_folds is not None:
                return self.steps.select_folds(bank, templates, kept, progress=progress)
            out = []
            for f, rows in enumerate(kept):
                kept_bank = {k: v[rows] for k, v in bank.items()}
                out.append(
                    select_layers(
                        kept_bank, templates.kind, templates.sheets, templates.seed, device=device, **self._pts()
                    )
                )
                progress(f + 1, len(kept))
            return out

    def calibrated(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with its threshold calibration recomputed from its own bank (no backbone needed):
        the out-of-fold scores of :meth:`out_of_fold` under ``ts``'s own template selection
        (the ``calibrate`` step; by default here)."""
        if self.steps.calibrate is not None:
            if self.report is not None:
                self.report.stage("calibrate")
            return self.steps.calibrate(ts)
        oof = self.out_of_fold(ts, templates=ts.config.templates)
        return replace(ts, calibration=Calibration(scores=oof.scores))

    def calibrated_from(self, ts: TemplateSet, parts: Sequence[OutOfFold]) -> TemplateSet:
        """``ts`` with the calibration of ``parts``: :meth:`out_of_fold` of consecutive ranges of its
        folds under its own selection, in fold order, that together score every held-out image;
        exactly what :meth:`calibrated` computes in one call. A ValueError for parts that do not."""
        images = [i for part in parts for i in part.images]
        held = [i for fold in self.fold_plan(ts) for i in fold]
        if images != held:
            raise ValueError(f"out-of-fold parts score images {images}, the fold plan holds out {held}")
        return replace(ts, calibration=Calibration(scores=tuple(s for part in parts for s in part.scores)))


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
