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
from .core.backbone import Backbone
from .core.calibration import OutOfFold, fold_plan
from .core.pts import select_layers
from .core.scoring import Calibration, OperatingPoint, gaussian_blur, image_scores, operating_point
from .core.templates import TemplateError, TemplateSet, unseen_positions
from .data.decode import decode_image, images_to_tensor

__all__ = ["HETMM", "ImageInput", "Prediction", "operating_point"]

ImageInput = str | Path | bytes | np.ndarray
"""A path, encoded bytes, or a decoded RGB uint8 array (H, W, 3)."""

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Prediction:
    """Scores and maps of a batch of images, and the template version that made them."""

    scores: np.ndarray  # (N,) image scores
    maps: np.ndarray  # (N, S, S) float32 localisation maps (blurred with map_sigma)
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

    def _batches(self, images: Sequence[ImageInput], desc: str) -> Iterator[tuple[list[np.ndarray], Tensor]]:
        size = self.config.backbone.image_size
        bs = self.config.batch_size
        bar = tqdm(total=len(images), desc=desc, unit="img", disable=not self.progress, leave=False)
        with bar:
            for i in range(0, len(images), bs):
                decoded = [_as_rgb(x) for x in images[i : i + bs]]
                yield decoded, images_to_tensor(decoded, size).to(self.device)
                bar.update(len(decoded))

    def extract(
        self, images: Sequence[ImageInput], *, desc: str = "features", bank: bool = False
    ) -> tuple[dict[str, Tensor], list[str]]:
        """Features of ``images`` (layer -> (N, C, h, w)) and their digests.

        ``bank=True`` moves each batch to the CPU in ``bank_dtype`` as it comes, so a large
        bank never exists twice (device float32 and CPU storage) at once.
        """
        if len(images) == 0:
            raise ValueError("no images given")
        if bank and self.cluster:
            from .distributed.extract import extract_features_ray

            with tqdm(total=len(images), desc=desc, unit="img", disable=not self.progress, leave=False) as bar:
                feats, digests = extract_features_ray(
                    self.config, images, progress=lambda done, _total: bar.update(done - bar.n)
                )
            return {k: torch.from_numpy(v).to(_DTYPES[self.config.bank_dtype]) for k, v in feats.items()}, digests
        parts: dict[str, list[Tensor]] = {}
        digests: list[str] = []
        for decoded, batch in self._batches(images, desc):
            digests.extend(_digest(x) for x in decoded)
            for k, v in self.backbone(batch).items():
                parts.setdefault(k, []).append(v.to("cpu", _DTYPES[self.config.bank_dtype]) if bank else v)
        return {k: torch.cat(v) for k, v in parts.items()}, digests

    def _score_features(self, feats: dict[str, Tensor], templates_pm: dict[str, Tensor]) -> Tensor:
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
        feats, digests = self.extract(images, desc="fit: features", bank=True)
        ts = TemplateSet(
            bank=feats,
            config=self.config,
            weights_id=self.backbone.weights_id,
            image_digests=tuple(digests),
            meta={"created": time.time()},
        )
        self._install(self.calibrated(self._selected(ts)), version=None)
        return self

    def update(self, images: Sequence[ImageInput]) -> HETMM:
        """Hot update: append good images' features, re-select the tiny set, recalibrate.

        Images already in the bank (same content digest) are skipped, so a retried update
        changes nothing; ``self.skipped_duplicates`` says how many were skipped.
        """
        ts = self._require_templates()
        feats, digests = self.extract(images, desc="update: features", bank=True)
        keep = unseen_positions(ts.image_digests, digests)
        self.skipped_duplicates = len(digests) - len(keep)
        if not keep:
            return self
        if len(keep) < len(digests):
            feats = {k: v[keep] for k, v in feats.items()}
            digests = [digests[i] for i in keep]
        grown = ts.appended(feats, tuple(digests))
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
        """``ts`` with the selection of ``config.templates`` (ALGORITHM.md §4) computed per layer."""
        tc = self.config.templates
        if tc.kind == "all":
            return replace(ts, indices=None, centres=None)
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
        return replace(ts, config=self.config, indices=indices, centres=centres)

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
            maps = self._score_features(held_feats, self._prepare(fold_ts))
            images.extend(held)
            scores.extend(float(x) for x in image_scores(maps, self.config.scoring.score_sigma).tolist())
        return OutOfFold(images=tuple(images), scores=tuple(scores), folds=len(plan))

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
        for _, batch in self._batches(images, "predict"):
            feats = self.backbone(batch)
            m = self._score_features(feats, self._prepared)
            scores.append(image_scores(m, sc.score_sigma).cpu())
            maps.append(gaussian_blur(m, sc.map_sigma).cpu())
        thr = op.threshold if op else float("inf")
        s = torch.cat(scores).numpy()
        return Prediction(
            scores=s,
            maps=torch.cat(maps).numpy(),
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
