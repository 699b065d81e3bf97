"""Single-process detector API: ``HETMM(config).fit(images).predict(images)``."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import DetectorConfig, TemplateConfig, check_number
from .core.atmm import anomaly_maps, pixel_major
from .core.auto_sheets import Rung, agreement, choose_sheets
from .core.backbone import Backbone
from .core.calibration import OutOfFold, fold_plan
from .core.geometry import Box, boxes_from_features, canvas_box, scale_box, zero_padding
from .core.pts import select_layers
from .core.scoring import Calibration, OperatingPoint, content_maps, image_scores, operating_point
from .core.templates import TemplateError, TemplateSet, unseen_positions
from .data.decode import decode_image, images_to_tensor, resize_to_geometry
from .pipeline import keep_memory_mapped, load_batch, prefetched

__all__ = ["HETMM", "ImageInput", "Prediction", "operating_point"]

ImageInput = str | Path | bytes | np.ndarray
"""A path, encoded bytes, or a decoded RGB uint8 array (H, W, 3)."""

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Prediction:
    """Scores and maps of a batch of images, and the template version that made them."""

    scores: np.ndarray  # (N,) image scores
    # Localisation maps (blurred with map_sigma), float32, at each image's own aspect: the
    # (N, S, S) array for squash; for letterbox one (h_i, w_i) map per image (long side S),
    # stacked into an (N, h, w) array when all images have the same shape, else a list.
    maps: np.ndarray | list[np.ndarray]
    threshold: float
    is_anomaly: np.ndarray  # (N,) bool
    version: int | None
    seconds: float
    # The rule that set ``threshold`` and its estimated false-alarm rate (None before calibration).
    operating_point: OperatingPoint | None = None

    def __len__(self) -> int:
        return len(self.scores)


def _digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:32]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class HETMM:
    """A HETMM detector for one product.

    ``fit`` extracts the good images' features into the bank and calibrates the
    verdict threshold; ``predict`` scores new images; ``update`` adds good
    images without refitting the rest (hot update). ``save``/``load`` go
    through a template store.
    """

    def __init__(self, config: DetectorConfig | None = None, *, progress: bool = False, cluster: bool = False) -> None:
        """``cluster=True``: fit/update/compress extract features and run PTS as tasks on the
        connected Ray cluster (see :func:`hetmm_ray.distributed.runtime.connect`)."""
        self.config = config or DetectorConfig()
        self.progress = progress
        self.cluster = cluster
        self.device = resolve_device(self.config.device)
        self.templates: TemplateSet | None = None
        self.version: int | None = None
        self._backbone: Backbone | None = None
        self._prepared: dict[str, Tensor] | None = None
        self.skipped_duplicates = 0  # images the last update() skipped: already in the bank
        if self.device.type == "cpu":
            keep_memory_mapped(self.config.malloc_keep_mib)

    # --- pieces ------------------------------------------------------------------
    @property
    def backbone(self) -> Backbone:
        if self._backbone is None:
            self._backbone = Backbone(self.config.backbone).to(self.device)
        return self._backbone

    @property
    def threshold(self) -> float:
        """Current verdict threshold (``inf`` before calibration)."""
        op = self.operating_point()
        return op.threshold if op else float("inf")

    def operating_point(
        self, *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> OperatingPoint | None:
        """The verdict threshold under the product's rule (``threshold.rule``), or under the
        ``sigmas`` / ``false_alarm_rate`` rule when one is given; None before calibration."""
        cal = self.templates.calibration if self.templates else None
        return operating_point(cal, self.config, sigmas=sigmas, false_alarm_rate=false_alarm_rate)

    def _batches(
        self, images: Sequence[ImageInput], desc: str
    ) -> Iterator[tuple[list[np.ndarray], Tensor, list[Box] | None]]:
        """Decoded images, the backbone's input and, for letterbox, each image's canvas box."""
        size = self.config.backbone.image_size
        geometry = self.config.backbone.geometry
        bs = self.config.batch_size
        bar = tqdm(total=len(images), desc=desc, unit="img", disable=not self.progress, leave=False)
        with bar:
            for i in range(0, len(images), bs):
                decoded = [_as_rgb(x) for x in images[i : i + bs]]
                boxes = None
                if geometry != "squash":
                    boxes = [canvas_box(x.shape[0], x.shape[1], size, geometry) for x in decoded]
                yield decoded, images_to_tensor(decoded, size, geometry).to(self.device), boxes
                bar.update(len(decoded))

    def _predict_batches(self, images: Sequence[ImageInput]) -> Iterator[tuple[Tensor, list[Box] | None]]:
        """The backbone's input batches of :meth:`_batches` (same pixels), produced ``prefetch``
        batches ahead in a background thread, each image read, decoded and resized to the canvas
        in one of ``decode_threads`` threads (``hetmm_ray.pipeline``)."""
        size = self.config.backbone.image_size
        geometry = self.config.backbone.geometry
        bs = self.config.batch_size

        def load(x: ImageInput) -> tuple[np.ndarray, Box | None]:
            rgb = _as_rgb(x)
            box = None if geometry == "squash" else canvas_box(rgb.shape[0], rgb.shape[1], size, geometry)
            return resize_to_geometry(rgb, size, geometry), box

        def produce() -> Iterator[tuple[Tensor, list[Box] | None]]:
            for i in range(0, len(images), bs):
                loaded = load_batch(images[i : i + bs], load, self.config.decode_threads)
                fitted = [a for a, _ in loaded]
                boxes = None if geometry == "squash" else [b for _, b in loaded]  # type: ignore[misc]
                yield images_to_tensor(fitted, size, geometry).to(self.device), boxes

        return prefetched(produce(), self.config.prefetch)

    def features(self, batch: Tensor, boxes: Sequence[Box] | None) -> dict[str, Tensor]:
        """Backbone features of a canvas batch, pad cells zeroed (``core.geometry``)."""
        feats = self.backbone(batch)
        return feats if boxes is None else zero_padding(feats, boxes, self.config.backbone.image_size)

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
        if bank and self.cluster:
            from .distributed.extract import extract_features_ray

            with tqdm(total=len(images), desc=desc, unit="img", disable=not self.progress, leave=False) as bar:
                feats, digests = extract_features_ray(
                    self.config, images, progress=lambda done, _total: bar.update(done - bar.n)
                )
            bank_feats = {k: torch.from_numpy(v).to(_DTYPES[self.config.bank_dtype]) for k, v in feats.items()}
            return bank_feats, digests, None
        parts: dict[str, list[Tensor]] = {}
        digests: list[str] = []
        all_boxes: list[Box] | None = None if self.config.backbone.geometry == "squash" else []
        for decoded, batch, boxes in self._batches(images, desc):
            digests.extend(_digest(x) for x in decoded)
            if all_boxes is not None and boxes is not None:
                all_boxes.extend(boxes)
            for k, v in self.features(batch, boxes).items():
                parts.setdefault(k, []).append(v.to("cpu", _DTYPES[self.config.bank_dtype]) if bank else v)
        return {k: torch.cat(v) for k, v in parts.items()}, digests, all_boxes

    def _bank_boxes(self, ts: TemplateSet, images: Sequence[int]) -> list[Box] | None:
        """Canvas boxes of bank images: kept in ``meta["image_boxes"]`` by fit/update, else
        recovered from the bank's zeroed pad cells (sets built by the service's feature tasks)."""
        if self.config.backbone.geometry == "squash":
            return None
        kept = ts.meta.get("image_boxes")
        if kept is not None and len(kept) == ts.n_images:
            return [Box(*kept[i]) for i in images]
        idx = list(images)
        return boxes_from_features({k: v[idx] for k, v in ts.bank.items()}, self.config.backbone.image_size)

    def _score_features(
        self, feats: dict[str, Tensor], templates_pm: dict[str, Tensor], boxes: Sequence[Box] | None = None
    ) -> Tensor:
        """Fused anomaly maps (N, S, S) on the canvas; ``boxes``: the images' canvas boxes (letterbox)."""
        sc = self.config.scoring
        dtype = _DTYPES[self.config.dtype]
        out = sc.output_size or self.config.backbone.image_size
        chunk = self.config.chunk_mib * 2**20 if self.config.chunk_mib else None
        maps = []
        n = next(iter(feats.values())).shape[0]
        for i in range(0, n, self.config.batch_size):
            q = {k: v[i : i + self.config.batch_size].to(self.device, dtype) for k, v in feats.items()}
            maps.append(
                anomaly_maps(
                    q,
                    templates_pm,
                    sc.forward_windows,
                    sc.backward_windows,
                    sc.alphas,
                    sc.layer_weights,
                    out,
                    chunk_bytes=chunk,
                    boxes=None if boxes is None else boxes[i : i + self.config.batch_size],
                    canvas=self.config.backbone.image_size,
                )
            )
        return torch.cat(maps)

    def _prepare(self, ts: TemplateSet, held_out: Sequence[int] | None = None) -> dict[str, Tensor]:
        """Pixel-major templates on the device; ``held_out`` images are left out (calibration).

        Leaving images out of a selection zeroes the sheets they supplied at each pixel
        (similarity 0 never beats a real match), instead of re-running the selection per
        fold: exact for ALL, a close approximation for PTS, and no exclusion at all for
        ``pc_k`` centres, which blend every image.
        """
        dtype = _DTYPES[self.config.dtype]
        out = {}
        for layer in ts.layers:
            if held_out is None:
                t = ts.templates(layer)
            elif ts.indices is None and ts.centres is None:
                keep = torch.ones(ts.n_images, dtype=torch.bool)
                keep[list(held_out)] = False
                t = ts.bank[layer][keep]
            else:
                t = ts.templates(layer).clone()
                if ts.indices is not None:
                    left_out = torch.isin(ts.indices[layer], torch.tensor(list(held_out)))
                    t.masked_fill_(left_out[:, None], 0.0)
            out[layer] = pixel_major(t.to(self.device, dtype))
        return out

    # --- fit / update / compress -----------------------------------------------------
    def fit(self, images: Sequence[ImageInput]) -> HETMM:
        """Build the template set from good images, select the tiny set, calibrate the threshold."""
        if len(images) < 2:
            raise ValueError(f"fit needs at least 2 good images, got {len(images)}")
        feats, digests, boxes = self._extract(images, desc="fit: features", bank=True)
        meta: dict[str, Any] = {"created": time.time()}
        if boxes is not None:
            meta["image_boxes"] = [list(b) for b in boxes]
        ts = TemplateSet(
            bank=feats,
            config=self.config,
            weights_id=self.backbone.weights_id,
            image_digests=tuple(digests),
            meta=meta,
        )
        self._install(self.calibrated(self._selected(ts)), version=None)
        return self

    def update(self, images: Sequence[ImageInput]) -> HETMM:
        """Hot update: append good images' features, re-select the tiny set, recalibrate.

        Images already in the bank (same content digest) are skipped, so a retried update
        changes nothing; ``self.skipped_duplicates`` says how many were skipped.
        """
        ts = self._require_templates()
        feats, digests, boxes = self._extract(images, desc="update: features", bank=True)
        keep = unseen_positions(ts.image_digests, digests)
        self.skipped_duplicates = len(digests) - len(keep)
        if not keep:
            return self
        if len(keep) < len(digests):
            feats = {k: v[keep] for k, v in feats.items()}
            digests = [digests[i] for i in keep]
            boxes = None if boxes is None else [boxes[i] for i in keep]
        old_boxes = ts.meta.get("image_boxes")
        meta = {k: v for k, v in ts.meta.items() if k != "image_boxes"}
        if boxes is not None and old_boxes is not None and len(old_boxes) == ts.n_images:
            meta["image_boxes"] = [*old_boxes, *(list(b) for b in boxes)]
        grown = ts.appended(feats, tuple(digests), meta=meta)
        self._install(self.calibrated(self._selected(grown)), version=None)
        return self

    def compress(self, kind: str | None = None, sheets: int | None = None, *, seed: int | None = None) -> HETMM:
        """Re-select the tiny set from the bank (PTS or an ablation baseline) and recalibrate."""
        ts = self._require_templates()
        changes = {"kind": kind, "sheets": sheets, "seed": seed}
        tc = replace(self.config.templates, **{k: v for k, v in changes.items() if v is not None})
        self.config = replace(self.config, templates=tc)
        self._install(self.calibrated(self._selected(replace(ts, config=self.config))), version=None)
        return self

    def _selected(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with the selection of ``config.templates`` (ALGORITHM.md §4) computed per layer;
        ``sheets: auto`` measures K first (:meth:`_auto_selected`) and fixes it in ``self.config``."""
        tc = self.config.templates
        if tc.kind == "all":
            return replace(ts, indices=None, centres=None)
        if tc.sheets == "auto":
            return self._auto_selected(ts)
        indices, centres = self._select(ts, tc)
        meta = {k: v for k, v in ts.meta.items() if k != "sheets_auto"}  # a fixed K: no ladder to report
        return replace(ts, config=self.config, indices=indices, centres=centres, meta=meta)

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
                device=self.device,
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
        th = self.config.threshold
        rule = "far" if th.rule == "validation" else th.rule
        op = Calibration(scores=tuple(scores)).operating_point(
            rule, sigmas=th.sigmas, false_alarm_rate=th.false_alarm_rate
        )
        return op.threshold

    def _auto_selected(self, ts: TemplateSet) -> TemplateSet:
        """The selection at the smallest ladder K that agrees with ALL (``core.auto_sheets``)."""
        tc = self.config.templates
        reference, all_ms = self._oof_scores(replace(ts, indices=None, centres=None), replace(tc, kind="all"))
        reference_threshold = self._verdict_threshold(reference)
        made: dict[int, TemplateSet] = {}

        def evaluate(k: int) -> Rung:
            fixed = replace(tc, sheets=k)
            indices, centres = self._select(ts, fixed)
            made[k] = replace(ts, config=replace(self.config, templates=fixed), indices=indices, centres=centres)
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
        self.config = replace(self.config, templates=replace(tc, sheets=k))
        if k not in made:
            indices, centres = self._select(ts, self.config.templates)
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
        return replace(made[k], config=self.config, meta=meta)

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
        tc = self.config.threshold
        sel = templates or self.config.templates
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
                config=self.config,
                weights_id=ts.weights_id,
                image_digests=tuple(ts.image_digests[i] for i in kept),
            )
            if sel.kind != "all":
                indices, centres = select_layers(
                    kept_bank, sel.kind, sel.sheets, sel.seed, device=self.device, **self._pts_fanout()
                )
                fold_ts = replace(fold_ts, indices=indices, centres=centres)
            held_feats = {k: v[held].to(self.device) for k, v in ts.bank.items()}
            held_boxes = self._bank_boxes(ts, held)  # letterbox: the pad never counts in a score
            start = time.perf_counter()
            maps = self._score_features(held_feats, self._prepare(fold_ts), held_boxes)
            fold_scores = image_scores(maps, self.config.scoring.score_sigma, self._map_boxes(held_boxes))
            scoring_seconds += time.perf_counter() - start
            images.extend(held)
            scores.extend(float(x) for x in fold_scores.tolist())
        return OutOfFold(images=tuple(images), scores=tuple(scores), folds=len(plan), scoring_seconds=scoring_seconds)

    def _pts_fanout(self) -> dict[str, Any]:
        """``select_layers`` keyword: PTS pixel chunks as Ray tasks when on a cluster."""
        if not self.cluster:
            return {}
        from .distributed.pts_fanout import pts_indices_ray

        return {"pts": pts_indices_ray}

    def calibrated(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with its threshold calibration recomputed from its own bank (no backbone needed):
        the out-of-fold scores of :meth:`out_of_fold` under ``ts``'s own template selection."""
        oof = self.out_of_fold(ts, templates=ts.config.templates)
        return replace(ts, calibration=Calibration(scores=oof.scores))

    def _map_boxes(self, boxes: Sequence[Box] | None) -> list[Box] | None:
        """Canvas boxes in the fused maps' pixels (``scoring.output_size``)."""
        if boxes is None:
            return None
        size = self.config.backbone.image_size
        out = self.config.scoring.output_size or size
        return [scale_box(b, size, out) for b in boxes]

    def _install(self, ts: TemplateSet, version: int | None) -> None:
        self.templates = ts
        self.version = version
        self._prepared = self._prepare(ts)

    def _require_templates(self) -> TemplateSet:
        if self.templates is None:
            raise RuntimeError("this detector has no templates yet: call fit() or load() first")
        return self.templates

    # --- predict -------------------------------------------------------------------
    def predict(
        self, images: Sequence[ImageInput], *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> Prediction:
        """Scores, maps and verdicts for ``images``.

        ``sigmas`` (mean + k std) or ``false_alarm_rate`` (estimated share of good parts
        flagged) overrides the product's threshold rule for this call; both are refused.
        """
        if sigmas is not None:
            check_number("threshold.sigmas", sigmas)  # NaN would judge every image "ok"
        if false_alarm_rate is not None:
            check_number("threshold.false_alarm_rate", false_alarm_rate)
        ts = self._require_templates()
        op = operating_point(ts.calibration, self.config, sigmas=sigmas, false_alarm_rate=false_alarm_rate)
        assert self._prepared is not None
        start = time.perf_counter()
        scores, maps = [], []
        sc = self.config.scoring
        for batch, boxes in self._predict_batches(images):
            m = self._score_features(self.features(batch, boxes), self._prepared, boxes)
            in_map = self._map_boxes(boxes)
            scores.append(image_scores(m, sc.score_sigma, in_map).cpu())
            maps.extend(x.cpu().numpy() for x in content_maps(m, sc.map_sigma, in_map))
        thr = op.threshold if op else float("inf")
        s = torch.cat(scores).numpy()
        same_shape = len({x.shape for x in maps}) == 1
        return Prediction(
            scores=s,
            maps=np.stack(maps) if same_shape else maps,
            threshold=thr,
            is_anomaly=s > thr,
            version=self.version,
            seconds=time.perf_counter() - start,
            operating_point=op,
        )

    # --- persistence -----------------------------------------------------------------
    def save(self, store: Any, product: str) -> int:
        """Publish the current template set to ``store``; returns the new version."""
        self.version = store.put(product, self._require_templates())
        return self.version

    @classmethod
    def load(
        cls,
        store: Any,
        product: str,
        version: int | None = None,
        *,
        progress: bool = False,
        cluster: bool = False,
        **overrides: Any,
    ) -> HETMM:
        """A detector from a stored template set; ``overrides`` change run-time settings (device, dtype...)."""
        if version is None:
            version = store.head(product)
        ts = store.get(product, version)
        config = ts.config.replace(**overrides) if overrides else ts.config
        det = cls(config, progress=progress, cluster=cluster)
        if det.backbone.weights_id != ts.weights_id:
            raise TemplateError(
                f"product {product!r} v{version} was built with weights {ts.weights_id}, "
                f"but the backbone now loads {det.backbone.weights_id}"
            )
        det._install(replace(ts, config=config), version=version)
        return det

    @classmethod
    def serving(
        cls,
        config: DetectorConfig,
        templates: dict[str, Tensor],
        *,
        weights_id: str,
        calibration: Any,
        version: int | None,
        backbone: Backbone | None = None,
    ) -> HETMM:
        """A predict-only detector over a tiny set (layer -> (K, C, H, W)), as replicas hold it.

        ``backbone`` shares one already-built backbone between products with the same one.
        """
        det = cls(config)
        if backbone is not None:
            det._backbone = backbone
        if det.backbone.weights_id != weights_id:
            raise TemplateError(
                f"templates were built with weights {weights_id}, the backbone has {det.backbone.weights_id}"
            )
        k = next(iter(templates.values())).shape[0]
        ts = TemplateSet(
            bank=templates,
            config=config,
            weights_id=weights_id,
            image_digests=tuple(f"sheet-{i}" for i in range(k)),  # sheets, not images: nothing to refit from
            calibration=calibration,
            meta={"tiny": True},
        )
        det._install(ts, version=version)
        return det


def _as_rgb(x: ImageInput) -> np.ndarray:
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[2] != 3:
            raise ValueError(f"image arrays must be RGB uint8 (H, W, 3), got {x.dtype} {x.shape}")
        return x
    return decode_image(x)
