"""The scorer: one product's prepared templates and how images are scored against them.

A :class:`Scorer` holds a configuration, the backbone (built on first use), the installed
template set (:meth:`Scorer.install`) and those templates prepared for ATMM (pixel-major, on
the device, in ``dtype``). It scores in three granularities, each the same arithmetic:

- :meth:`Scorer.predict`: images in, :class:`Prediction` out (scores, maps, verdicts);
- :meth:`Scorer.features` of a canvas batch, then :meth:`Scorer.score_maps` /
  :meth:`Scorer.score` of features against any prepared templates;
- :meth:`Scorer.prepare` with ``held_out`` images left out: what out-of-fold calibration
  scores each fold against (``fitting.py``).

A product's inspection region (``config.region``, ``core/region.py``) enters in one place,
:meth:`Scorer.region_masks`, used by every image score (predict, out-of-fold calibration,
sheets auto) and every localisation map: pixels outside never count.

The fit pipeline (``fitting.py``) uses these public members to build template sets and never
installs them; :class:`~hetmm_ray.detection.detector.HETMM` installs what the pipeline returns.
Nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self, cast

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import RUN_TIME_SETTINGS, DetectorConfig, check_number
from ..core.atmm import anomaly_maps, pixel_major
from ..core.backbone import Backbone
from ..core.device import TORCH_DTYPES, resolve_device
from ..core.geometry import Box, canvas_box, scale_box, zero_padding
from ..core.pts import select_rows_pixel_major
from ..core.region import map_masks
from ..core.scoring import OperatingPoint, content_maps, image_scores, operating_point
from ..core.templates import TemplateSet
from ..data.decode import decode_image, images_to_tensor, resize_to_geometry
from .pipeline import load_batch, map_in_workers, prefetched, worker_shares

__all__ = ["ImageInput", "Prediction", "Scorer", "as_rgb"]

ImageInput = str | Path | bytes | np.ndarray
"""A path, encoded bytes, or a decoded RGB uint8 array (H, W, 3)."""


def as_rgb(x: ImageInput) -> np.ndarray:
    """``x`` as an RGB uint8 array (H, W, 3): arrays are checked, anything else decoded."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[2] != 3:
            raise ValueError(f"image arrays must be RGB uint8 (H, W, 3), got {x.dtype} {x.shape}")
        return x
    return decode_image(x)


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
    # The product's inspection region on each map (bool, True = counts; the maps' layout: an
    # array when the maps are one, else a list); None when the product has no region.
    regions: np.ndarray | list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @classmethod
    def judged(
        cls,
        scores: np.ndarray,
        maps: list[np.ndarray],
        op: OperatingPoint | None,
        *,
        version: int | None,
        start: float,
        regions: list[np.ndarray] | None = None,
        **extra: Any,
    ) -> Self:
        """Scores and maps with their verdicts at ``op``'s threshold (``inf`` before calibration);
        maps (and regions) stacked when all have one shape; ``seconds`` since ``start``."""
        thr = op.threshold if op else float("inf")
        same_shape = len({x.shape for x in maps}) == 1
        return cls(
            scores=scores,
            maps=np.stack(maps) if same_shape else maps,
            threshold=thr,
            is_anomaly=scores > thr,
            version=version,
            seconds=time.perf_counter() - start,
            operating_point=op,
            regions=None if regions is None else (np.stack(regions) if same_shape else regions),
            **extra,
        )


class Scorer:
    """Prepared templates + scoring for one product (see the module docstring)."""

    def __init__(self, config: DetectorConfig | None = None, *, progress: bool = False) -> None:
        self.config = config or DetectorConfig()
        self.progress = progress
        self.device = resolve_device(self.config.device)
        self.templates: TemplateSet | None = None
        self.version: int | None = None
        self._backbone: Backbone | None = None
        self._prepared: dict[str, Tensor] | None = None

    # --- the backbone and the installed template set ----------------------------------------
    @property
    def backbone(self) -> Backbone:
        if self._backbone is None:
            self._backbone = Backbone(self.config.backbone, runtime=self.config.backbone_runtime).to(self.device)
        return self._backbone

    @backbone.setter
    def backbone(self, backbone: Backbone) -> None:
        """Share an already-built backbone (replicas: one per backbone, not per product)."""
        self._backbone = backbone

    def install(self, ts: TemplateSet, version: int | None = None, *, config: DetectorConfig | None = None) -> None:
        """Score with ``ts`` from now on (``version``: its stored version, None if unsaved).

        This scorer's configuration becomes ``config``, by default ``ts``'s product settings with
        this scorer's run-time settings (``config.RUN_TIME_SETTINGS``: device, dtype, batch sizes).
        """
        self.config = config or self.settings_of(ts)
        self.templates = ts
        self.version = version
        self._prepared = self.prepare(ts)

    def settings_of(self, ts: TemplateSet) -> DetectorConfig:
        """What :meth:`install` makes this scorer's configuration for ``ts``: its product settings with
        this scorer's run-time settings (a caller scoring ``ts``'s own bank, the out-of-fold
        calibration, sets it without preparing templates it does not match against)."""
        return replace(ts.config, **{k: getattr(self.config, k) for k in RUN_TIME_SETTINGS})

    @property
    def prepared(self) -> dict[str, Tensor]:
        """The installed templates as ATMM matches against them (:meth:`prepare`)."""
        if self._prepared is None:
            raise RuntimeError("this detector has no templates yet: call fit() or load() first")
        return self._prepared

    def require_templates(self) -> TemplateSet:
        """The installed template set; RuntimeError before fit() or load()."""
        if self.templates is None:
            raise RuntimeError("this detector has no templates yet: call fit() or load() first")
        return self.templates

    def operating_point(
        self, *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> OperatingPoint | None:
        """The verdict threshold under the product's rule (``threshold.rule``), or under the
        ``sigmas`` / ``false_alarm_rate`` rule when one is given; None before calibration."""
        cal = self.templates.calibration if self.templates else None
        return operating_point(cal, self.config, sigmas=sigmas, false_alarm_rate=false_alarm_rate)

    # --- images -> canvas batches --------------------------------------------------------------
    def decoded_batches(
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
        # letterbox: every loaded image has its box (only squash loads without one)
        boxes = None if geometry == "squash" else cast("list[Box]", [b for _, b in loaded])
        return images_to_tensor(fitted, size, geometry).to(self.device), boxes

    def _predict_batches(self, images: Sequence[ImageInput]) -> Iterator[tuple[Tensor, list[Box] | None]]:
        """The backbone's input batches of :meth:`decoded_batches` (same pixels), produced ``prefetch``
        batches ahead in a background thread, each image read, decoded and resized to the canvas
        in one of ``decode_threads`` threads (``hetmm_ray.detection.pipeline``)."""
        bs = self.config.batch_size

        def produce() -> Iterator[tuple[Tensor, list[Box] | None]]:
            for i in range(0, len(images), bs):
                yield self._canvas_batch(
                    load_batch(images[i : i + bs], self._load_to_canvas, self.config.decode_threads)
                )

        return prefetched(produce(), self.config.prefetch)

    # --- scoring --------------------------------------------------------------------------------
    def features(self, batch: Tensor, boxes: Sequence[Box] | None) -> dict[str, Tensor]:
        """Backbone features of a canvas batch, pad cells zeroed (``core.geometry``)."""
        feats = self.backbone(batch)
        return feats if boxes is None else zero_padding(feats, boxes, self.config.backbone.image_size)

    def prepare(self, ts: TemplateSet, held_out: Sequence[int] | None = None) -> dict[str, Tensor]:
        """Pixel-major templates on the device; ``held_out`` images are left out (calibration).

        Leaving images out of a selection zeroes the sheets they supplied at each pixel
        (similarity 0 never beats a real match), instead of re-running the selection per
        fold: exact for ALL, a close approximation for PTS, and no exclusion at all for
        ``pc_k`` centres, which blend every image.
        """
        dtype = TORCH_DTYPES[self.config.dtype]
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

    def pixel_major_bank(self, ts: TemplateSet) -> dict[str, Tensor]:
        """Every layer's whole bank pixel-major (``(H*W, N, C)``) on the device, in the bank's dtype:
        what :meth:`prepare_rows` gathers a fold's templates from, laid out once for all folds."""
        return {layer: pixel_major(ts.bank[layer].to(self.device)) for layer in ts.layers}

    def prepare_rows(
        self, bank_pm: dict[str, Tensor], rows: Sequence[int], indices: dict[str, Tensor] | None
    ) -> dict[str, Tensor]:
        """:meth:`prepare` of the set of the bank's ``rows`` under ``indices`` (``(K, H, W)`` per layer,
        into ``rows``; None: every one of them), gathered from ``bank_pm`` (:meth:`pixel_major_bank`):
        the same tensors, bit for bit, without laying the bank out again for each fold."""
        dtype = TORCH_DTYPES[self.config.dtype]
        kept = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        out = {}
        for layer, pm in bank_pm.items():
            t = select_rows_pixel_major(pm, kept, None if indices is None else indices[layer])
            out[layer] = t.to(dtype)
        return out

    def score_maps(
        self,
        feats: dict[str, Tensor],
        prepared: dict[str, Tensor],
        boxes: Sequence[Box] | None = None,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Tensor:
        """Fused anomaly maps (N, S, S) on the canvas of features against ``prepared`` templates
        (:meth:`prepare`); ``boxes``: the images' canvas boxes (letterbox); ``progress(done, n)``
        after each ``batch_size`` images."""
        sc = self.config.scoring
        dtype = TORCH_DTYPES[self.config.dtype]
        out = sc.output_size or self.config.backbone.image_size
        chunk = self.config.chunk_mib * 2**20 if self.config.chunk_mib else None
        maps = []
        n = next(iter(feats.values())).shape[0]
        bs = self.config.batch_size
        for i in range(0, n, bs):
            q = {k: v[i : i + bs].to(self.device, dtype) for k, v in feats.items()}
            maps.append(
                anomaly_maps(
                    q,
                    prepared,
                    sc.forward_windows,
                    sc.backward_windows,
                    sc.alphas,
                    sc.layer_weights,
                    out,
                    chunk_bytes=chunk,
                    boxes=None if boxes is None else boxes[i : i + bs],
                    canvas=self.config.backbone.image_size,
                )
            )
            if progress is not None:
                progress(min(i + bs, n), n)
        return torch.cat(maps)

    def score(
        self,
        feats: dict[str, Tensor],
        prepared: dict[str, Tensor],
        boxes: Sequence[Box] | None = None,
        *,
        progress: Callable[[int, int], None] | None = None,
        region_of: DetectorConfig | None = None,
    ) -> Tensor:
        """Image scores (N,) of features against ``prepared`` templates (:meth:`score_maps`);
        ``region_of``: the product whose inspection region counts (default: this scorer's)."""
        maps = self.score_maps(feats, prepared, boxes, progress=progress)
        in_map = self.map_boxes(boxes)
        regions = self.region_masks(in_map, len(maps), region_of=region_of)
        return image_scores(maps, self.config.scoring.score_sigma, in_map, regions, top_k=self.config.score_pixels)

    def region_masks(
        self, in_map: Sequence[Box] | None, n: int, *, region_of: DetectorConfig | None = None
    ) -> list[Tensor] | None:
        """The inspection region of each of ``n`` images on the fused map (``core.region.map_masks``):
        a bool mask of each content box ``in_map`` (map pixels; None: squash, the whole map);
        None when the product has no region (every pixel counts). ``region_of``: the product
        configuration whose region it is (default: this scorer's)."""
        region = (region_of or self.config).region
        if region is None:
            return None
        size = self.config.backbone.image_size
        out = self.config.scoring.output_size or size
        boxes = list(in_map) if in_map is not None else [Box(0, 0, out, out)] * n
        return map_masks(region, boxes, canvas=size, out=out, geometry=self.config.backbone.geometry)

    def _map_regions(self, maps: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """:meth:`region_masks` of returned content maps (a map's shape is its content box's)."""
        if self.config.region is None:
            return None
        boxes = [Box(0, 0, m.shape[0], m.shape[1]) for m in maps]
        return [r.numpy().copy() for r in self.region_masks(boxes, len(maps)) or []]  # the masks are cached

    def map_boxes(self, boxes: Sequence[Box] | None) -> list[Box] | None:
        """Canvas boxes in the fused maps' pixels (``scoring.output_size``)."""
        if boxes is None:
            return None
        size = self.config.backbone.image_size
        out = self.config.scoring.output_size or size
        return [scale_box(b, size, out) for b in boxes]

    def score_batch(self, batch: Tensor, boxes: list[Box] | None) -> tuple[Tensor, list[np.ndarray]]:
        """Image scores and content maps of a canvas batch against the installed templates."""
        sc = self.config.scoring
        m = self.score_maps(self.features(batch, boxes), self.prepared, boxes)
        in_map = self.map_boxes(boxes)
        regions = self.region_masks(in_map, len(m))
        return image_scores(m, sc.score_sigma, in_map, regions, top_k=self.config.score_pixels).cpu(), [
            x.cpu().numpy() for x in content_maps(m, sc.map_sigma, in_map, regions)
        ]

    def _score_images(self, images: Sequence[ImageInput]) -> tuple[Tensor, list[np.ndarray]]:
        """Image scores and content maps of ``images``, one batch in this thread: decode, resize,
        backbone, ATMM, score."""
        batch, boxes = self._canvas_batch([self._load_to_canvas(x) for x in images])
        return self.score_batch(batch, boxes)

    def score_workers(self) -> int:
        """How many single-threaded workers ``predict`` splits each batch among (``score_workers``;
        0: this thread's torch thread count on a CPU, 1 on GPUs)."""
        if self.device.type != "cpu":
            return 1
        return self.config.score_workers or torch.get_num_threads()

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
        ts = self.require_templates()
        op = operating_point(ts.calibration, self.config, sigmas=sigmas, false_alarm_rate=false_alarm_rate)
        start = time.perf_counter()
        scores, maps = [], []
        workers = self.score_workers()
        if workers > 1 and len(images) >= workers:
            # Each batch split among single-threaded workers that decode, resize and score their
            # share (hetmm_ray.detection.pipeline.map_in_workers: measured faster than parallel ops on a CPU).
            # Scores do not depend on which images share a batch, and the workers take the next
            # share as soon as they are free.
            self.backbone  # built once here, not by the first workers at the same time  # noqa: B018
            parts = worker_shares(images, workers=workers, batch_size=self.config.batch_size)
            for part_scores, part_maps in map_in_workers(self._score_images, parts, workers):
                scores.append(part_scores)
                maps.extend(part_maps)
        else:
            for batch, boxes in self._predict_batches(images):
                part_scores, part_maps = self.score_batch(batch, boxes)
                scores.append(part_scores)
                maps.extend(part_maps)
        s = torch.cat(scores).numpy()
        return Prediction.judged(s, maps, op, version=self.version, start=start, regions=self._map_regions(maps))
