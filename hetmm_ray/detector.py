"""Single-process detector API: ``HETMM(config).fit(images).predict(images)``.

``HETMM`` is three parts in three modules, composed: the scorer over prepared templates
(this class: the backbone's features, ATMM, image scores and maps, verdicts), the fit
pipeline it holds (``fitting.FitPipeline``: extract -> select -> calibrate, with injectable
steps; a separate object over this scorer) and persistence (``persistence.py``: save / load
through a store, serving copies; functions over a detector). ``fit``, ``update``, ``compress``,
``save``, ``load`` and ``serving`` stay methods here, delegating. Nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from . import persistence
from .config import DetectorConfig, TemplateConfig, check_number
from .core.atmm import anomaly_maps, pixel_major
from .core.backbone import Backbone
from .core.calibration import OutOfFold
from .core.device import TORCH_DTYPES, image_digest, resolve_device
from .core.geometry import Box, canvas_box, scale_box, zero_padding
from .core.scoring import OperatingPoint, content_maps, image_scores, operating_point
from .core.templates import TemplateSet
from .data.decode import images_to_tensor, resize_to_geometry
from .fitting import FitPipeline, ImageInput, as_rgb
from .pipeline import keep_memory_mapped, load_batch, map_in_workers, prefetched, worker_shares
from .steps import FitSteps

__all__ = ["HETMM", "ImageInput", "Prediction", "operating_point"]


_DTYPES = TORCH_DTYPES  # the names this module used before core/device.py
_digest = image_digest
_as_rgb = as_rgb  # lives in fitting.py now; the old name keeps callers here working


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


class HETMM:
    """A HETMM detector for one product.

    ``fit`` extracts the good images' features into the bank and calibrates the
    verdict threshold; ``predict`` scores new images; ``update`` adds good
    images without refitting the rest (hot update). ``save``/``load`` go
    through a template store.
    """

    def __init__(
        self, config: DetectorConfig | None = None, *, progress: bool = False, steps: FitSteps | None = None
    ) -> None:
        """``steps``: where fit/update/compress extract features and run PTS (``hetmm_ray/steps.py``);
        default in this process, ``hetmm_ray.distributed.steps.ray_steps()`` on a Ray cluster."""
        self.config = config or DetectorConfig()
        self.progress = progress
        self.device = resolve_device(self.config.device)
        self.templates: TemplateSet | None = None
        self.version: int | None = None
        self._backbone: Backbone | None = None
        self._prepared: dict[str, Tensor] | None = None
        self.skipped_duplicates = 0  # images the last update() skipped: already in the bank
        if self.device.type == "cpu":
            keep_memory_mapped(self.config.malloc_keep_mib)
        self.pipeline = FitPipeline(self, steps=steps, progress=progress)  # extract -> select -> calibrate

    # --- the fit pipeline (fitting.py) and persistence (persistence.py) ----------------------
    @property
    def steps(self) -> FitSteps:
        return self.pipeline.steps

    def fit(self, images: Sequence[ImageInput]) -> Self:
        """Build the template set from good images, select the tiny set, calibrate the threshold."""
        self.pipeline.fit(images)
        return self

    def update(self, images: Sequence[ImageInput]) -> Self:
        """Hot update: append good images' features, re-select the tiny set, recalibrate.

        Images already in the bank (same content digest) are skipped, so a retried update
        changes nothing; ``self.skipped_duplicates`` says how many were skipped.
        """
        self.skipped_duplicates = self.pipeline.update(images)
        return self

    def compress(self, kind: str | None = None, sheets: int | None = None, *, seed: int | None = None) -> Self:
        """Re-select the tiny set from the bank (PTS or an ablation baseline) and recalibrate."""
        self.pipeline.compress(kind, sheets, seed=seed)
        return self

    def extract(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False
    ) -> tuple[dict[str, Tensor], list[str]]:
        """Features of ``images`` (layer -> (N, C, h, w)) and their digests (:meth:`FitPipeline.extract`)."""
        return self.pipeline.extract(images, desc=desc, bank=bank)

    def out_of_fold(self, ts: TemplateSet, *, templates: TemplateConfig | None = None) -> OutOfFold:
        """Out-of-fold scores of ``ts``'s training images (:meth:`FitPipeline.out_of_fold`)."""
        return self.pipeline.out_of_fold(ts, templates=templates)

    def calibrated(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with its threshold calibration recomputed from its own bank (:meth:`FitPipeline.calibrated`)."""
        return self.pipeline.calibrated(ts)

    def save(self, store: Any, product: str) -> int:
        """Publish the current template set to ``store``; returns the new version."""
        return persistence.save(self, store, product)

    @classmethod
    def load(cls, store: Any, product: str, version: int | None = None, **options: Any) -> Self:
        """A detector from a stored template set (:func:`persistence.load`): ``progress=``, ``steps=``,
        and overrides of run-time settings (``device=``, ``dtype=``...)."""
        return persistence.load(cls, store, product, version, **options)

    @classmethod
    def serving(cls, config: DetectorConfig, templates: dict[str, Tensor], **provenance: Any) -> Self:
        """A predict-only detector over a tiny set (layer -> (K, C, H, W)), as replicas hold it
        (:func:`persistence.serving`): ``weights_id=``, ``calibration=``, ``version=`` and an
        optional shared ``backbone=``."""
        return persistence.serving(cls, config, templates, **provenance)

    # --- pieces ------------------------------------------------------------------
    @property
    def backbone(self) -> Backbone:
        if self._backbone is None:
            self._backbone = Backbone(self.config.backbone, runtime=self.config.backbone_runtime).to(self.device)
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
                decoded = [as_rgb(x) for x in images[i : i + bs]]
                boxes = None
                if geometry != "squash":
                    boxes = [canvas_box(x.shape[0], x.shape[1], size, geometry) for x in decoded]
                yield decoded, images_to_tensor(decoded, size, geometry).to(self.device), boxes
                bar.update(len(decoded))

    def _load_to_canvas(self, x: ImageInput) -> tuple[np.ndarray, Box | None]:
        """One image read, decoded and resized for the canvas, and its canvas box (letterbox)."""
        size = self.config.backbone.image_size
        geometry = self.config.backbone.geometry
        rgb = as_rgb(x)
        box = None if geometry == "squash" else canvas_box(rgb.shape[0], rgb.shape[1], size, geometry)
        return resize_to_geometry(rgb, size, geometry), box

    def _canvas_batch(self, loaded: Sequence[tuple[np.ndarray, Box | None]]) -> tuple[Tensor, list[Box] | None]:
        """The backbone's input for loaded images (:meth:`_load_to_canvas`) and their boxes."""
        size = self.config.backbone.image_size
        geometry = self.config.backbone.geometry
        fitted = [a for a, _ in loaded]
        boxes = None if geometry == "squash" else [b for _, b in loaded]  # type: ignore[misc]
        return images_to_tensor(fitted, size, geometry).to(self.device), boxes

    def _predict_batches(self, images: Sequence[ImageInput]) -> Iterator[tuple[Tensor, list[Box] | None]]:
        """The backbone's input batches of :meth:`_batches` (same pixels), produced ``prefetch``
        batches ahead in a background thread, each image read, decoded and resized to the canvas
        in one of ``decode_threads`` threads (``hetmm_ray.pipeline``)."""
        bs = self.config.batch_size

        def produce() -> Iterator[tuple[Tensor, list[Box] | None]]:
            for i in range(0, len(images), bs):
                yield self._canvas_batch(
                    load_batch(images[i : i + bs], self._load_to_canvas, self.config.decode_threads)
                )  # type: ignore[arg-type]

        return prefetched(produce(), self.config.prefetch)

    def score_workers(self) -> int:
        """How many single-threaded workers ``predict`` splits each batch among (``score_workers``;
        0: this thread's torch thread count on a CPU, 1 on GPUs)."""
        if self.device.type != "cpu":
            return 1
        return self.config.score_workers or torch.get_num_threads()

    def _score_images(self, images: Sequence[ImageInput]) -> tuple[Tensor, list[np.ndarray]]:
        """Image scores and content maps of ``images``, one batch in this thread: decode, resize,
        backbone, ATMM, score."""
        batch, boxes = self._canvas_batch([self._load_to_canvas(x) for x in images])
        return self._score_batch(batch, boxes)

    def _score_batch(self, batch: Tensor, boxes: list[Box] | None) -> tuple[Tensor, list[np.ndarray]]:
        sc = self.config.scoring
        assert self._prepared is not None
        m = self._score_features(self.features(batch, boxes), self._prepared, boxes)
        in_map = self._map_boxes(boxes)
        return image_scores(m, sc.score_sigma, in_map).cpu(), [
            x.cpu().numpy() for x in content_maps(m, sc.map_sigma, in_map)
        ]

    def features(self, batch: Tensor, boxes: Sequence[Box] | None) -> dict[str, Tensor]:
        """Backbone features of a canvas batch, pad cells zeroed (``core.geometry``)."""
        feats = self.backbone(batch)
        return feats if boxes is None else zero_padding(feats, boxes, self.config.backbone.image_size)

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
        workers = self.score_workers()
        if workers > 1 and len(images) >= workers:
            # Each batch split among single-threaded workers that decode, resize and score their
            # share (hetmm_ray.pipeline.map_in_workers: measured faster than parallel ops on a CPU).
            # Scores do not depend on which images share a batch, and the workers take the next
            # share as soon as they are free.
            self.backbone  # built once here, not by the first workers at the same time  # noqa: B018
            parts = worker_shares(images, workers=workers, batch_size=self.config.batch_size)
            for part_scores, part_maps in map_in_workers(self._score_images, parts, workers):  # type: ignore[misc]
                scores.append(part_scores)
                maps.extend(part_maps)
        else:
            for batch, boxes in self._predict_batches(images):
                part_scores, part_maps = self._score_batch(batch, boxes)
                scores.append(part_scores)
                maps.extend(part_maps)
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
