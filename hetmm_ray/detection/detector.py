"""Single-process detector API: ``HETMM(config).fit(images).predict(images)``.

``HETMM`` is a thin front over three parts in three modules: the scorer (``scorer.py``:
prepared templates, the backbone's features, ATMM, image scores and maps, verdicts), the fit
pipeline (``fitting.FitPipeline``: extract -> select -> calibrate, with injectable steps; it
returns template sets) and persistence (``persistence.py``: save / load through a store,
serving copies). ``fit``, ``update`` and ``compress`` run the pipeline on the installed set and
install what it returns; ``predict`` is the scorer's. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Self

import numpy as np
from torch import Tensor

from ..config import ConfigError, DetectorConfig, TemplateConfig
from ..core.backbone import Backbone
from ..core.calibration import OutOfFold
from ..core.region import check_visible
from ..core.scoring import Calibration, OperatingPoint, operating_point
from ..core.templates import TemplateError, TemplateSet
from ..data.decode import resize_to_geometry
from . import persistence
from .fit_steps import FitSteps, Report
from .fitting import FitPipeline
from .frame_cost import FrameCost
from .geometry_rule import choose_geometry
from .interface import Detector, Layout
from .pipeline import keep_memory_mapped
from .scorer import ImageInput, Prediction, Scorer, as_rgb

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = ["HETMM", "ImageInput", "Prediction", "operating_point"]


class HETMM(Detector):
    """A HETMM detector for one product, a frame on one canvas (:class:`~hetmm_ray.detection.interface.Detector`).

    ``fit`` extracts the good images' features into the bank and calibrates the
    verdict threshold; ``predict`` scores new images; ``update`` adds good
    images without refitting the rest (hot update). ``save`` publishes to a
    template store; ``detector_choice.load_detector`` loads any stored product.
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        *,
        progress: bool = False,
        steps: FitSteps | None = None,
        report: Report | None = None,
        tiles: int = 1,
        scored: int | None = None,
    ) -> None:
        """``steps``: where fit/update/compress extract features and run PTS (``hetmm_ray/detection/fit_steps.py``);
        default in this process, ``hetmm_ray.distributed.ray_steps.ray_steps()`` on a Ray cluster.
        ``report``: where the fit's stages and counts go besides the progress bar (``fit_steps.Report``:
        a job's progress; None: nowhere).
        ``tiles`` / ``scored``: when this detector is one tile position of a tiled product
        (``tiled.py``), the positions per frame and how many of them are scored (None: all), so that
        ``sheets: auto``'s time budget is judged per frame with all its tiles."""
        self.scorer = Scorer(config, progress=progress)
        self.progress = progress
        if self.scorer.device.type == "cpu":
            keep_memory_mapped(self.config.malloc_keep_mib)
        self.pipeline = FitPipeline(  # extract -> select -> calibrate
            self.scorer, steps=steps, progress=progress, report=report, tiles=tiles, scored=scored
        )

    # --- the scorer's state ----------------------------------------------------------
    @property
    def config(self) -> DetectorConfig:
        return self.scorer.config

    @config.setter
    def config(self, config: DetectorConfig) -> None:
        self.scorer.config = config

    @property
    def device(self) -> Any:
        return self.scorer.device

    @property
    def templates(self) -> TemplateSet | None:
        return self.scorer.templates

    @property
    def version(self) -> int | None:
        return self.scorer.version

    @version.setter
    def version(self, version: int | None) -> None:
        self.scorer.version = version

    @property
    def backbone(self) -> Backbone:
        return self.scorer.backbone

    @property
    def steps(self) -> FitSteps:
        return self.pipeline.steps

    # --- the fit pipeline (fitting.py) and persistence (persistence.py) ----------------------
    def fit(self, images: Sequence[ImageInput]) -> Self:
        """Build the template set from good images, select the tiny set, calibrate the threshold.

        The geometry is resolved from the images first, by the rule of every fit path
        (``geometry_rule.choose_geometry``): ``geometry.canvas: "aspect"`` (the default) gives an
        elongated frame the canvas size of its aspect, and what was chosen is stored with the
        template set (``meta["geometry_choice"]``). A configuration the rule resolves to tiles
        (``min_defect_px``, ``tiles: "auto"``) is refused (ConfigError) before any work: this
        detector is one canvas, and ``detector_choice.new_detector(config, images)`` builds the tiled one.
        """
        choice = choose_geometry(self.config, images)
        if choice.tiles != (1, 1):
            raise ConfigError(
                f"geometry: for these frames the fit's rule chooses {choice.describe()}, and HETMM is one canvas; "
                "fit with detector_choice.new_detector(config, frames), which builds the tiled detector"
            )
        self.config = choice.config  # the backbone is the same at any canvas size (replicas share one)
        self.scorer.install(choice.stored_with(self.pipeline.fit(images)))
        return self

    def update(self, images: Sequence[ImageInput]) -> Self:
        """Hot update: append good images' features, re-select the tiny set, recalibrate.

        Images already in the bank (same content digest) are skipped, so a retried update
        changes nothing: the bank grows by the new images only.
        """
        ts, _ = self.pipeline.update(self.scorer.require_templates(), images)
        if ts is not None:
            self.scorer.install(ts)
        return self

    def drop(self, digests: Sequence[str]) -> Self:
        """The bank without the frames of ``digests``, re-selected and recalibrated (:meth:`FitPipeline.without`)."""
        self.scorer.install(self.pipeline.without(self.scorer.require_templates(), digests))
        return self

    def compress(self, kind: str | None = None, sheets: int | str | None = None, *, seed: int | None = None) -> Self:
        """Re-select the tiny set from the bank (PTS or an ablation baseline) and recalibrate."""
        self.scorer.install(self.pipeline.compress(self.scorer.require_templates(), kind, sheets, seed=seed))
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

    def _with_region(self, region: dict[str, Any] | None) -> HETMM:
        """The same templates (bank and selection) under ``region``, recalibrated (its out-of-fold
        scores count the region's pixels only); ConfigError for a region that counts no map pixel."""
        ts = self.scorer.require_templates()
        config = replace(self.config, region=region)
        check_visible(config)
        new = HETMM(config, progress=self.progress, steps=self.steps)
        new.scorer.backbone = self.backbone  # no second build
        new.scorer.install(new.calibrated(replace(ts, config=replace(ts.config, region=region))))
        return new

    def template_set(self) -> TemplateSet:
        return self.scorer.require_templates()

    def layout(self, height: int, width: int) -> Layout:
        return Layout(1, 1, height, width, height, width)

    def frame_cost(self, frame: ImageInput) -> FrameCost:
        """:class:`~hetmm_ray.detection.frame_cost.FrameCost` of ``frame`` brought to the canvas, as
        ``predict`` brings it (callers reach it through ``detector_choice.frame_cost_of``)."""
        return FrameCost(self.scorer, [self.input_view(as_rgb(frame))])

    @classmethod
    def from_store(cls, store: Store, product: str, version: int, **options: Any) -> Self:
        """An untiled product's detector from a stored template set (:func:`persistence.load`):
        ``progress=``, ``steps=``, and overrides of run-time settings (``device=``, ``dtype=``...).
        :func:`hetmm_ray.detection.detector_choice.load_detector` is the loader callers use (it chooses the class)."""
        tiles = store.record(product, version).config.geometry.tiles
        if tiles != (1, 1):  # one set per tile position inside (hetmm_ray/detection/tiled.py)
            raise TemplateError(f"product {product!r} v{version} is tiled ({tiles}): load it with load_detector")
        return persistence.load(cls, store, product, version, **options)

    @classmethod
    def serving(cls, config: DetectorConfig, templates: dict[str, Tensor], **provenance: Any) -> Self:
        """A predict-only detector over a tiny set (layer -> (K, C, H, W)), as replicas hold it
        (:func:`persistence.serving`): ``weights_id=``, ``calibration=``, ``version=`` and an
        optional shared ``backbone=``."""
        return persistence.serving(cls, config, templates, **provenance)

    # --- scoring (scorer.py) ------------------------------------------------------------
    @property
    def calibration(self) -> Calibration | None:
        """The out-of-fold calibration of the templates in use (None before a fit)."""
        return self.templates.calibration if self.templates is not None else None

    def input_view(self, image: np.ndarray) -> np.ndarray:
        """``image`` as ``predict`` is given it and as its maps are drawn over: fitted to the canvas
        (``backbone.geometry``). :class:`~hetmm_ray.detection.tiled.TiledHETMM` has the same method (whole frames)."""
        bb = self.config.backbone
        return resize_to_geometry(image, bb.image_size, bb.geometry)

    def operating_point(
        self, *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> OperatingPoint | None:
        """The verdict threshold under the product's rule (``threshold.rule``), or under the
        ``sigmas`` / ``false_alarm_rate`` rule when one is given; None before calibration."""
        return self.scorer.operating_point(sigmas=sigmas, false_alarm_rate=false_alarm_rate)

    def features(self, batch: Tensor, boxes: Any = None) -> dict[str, Tensor]:
        """Backbone features of a canvas batch, pad cells zeroed (:meth:`Scorer.features`)."""
        return self.scorer.features(batch, boxes)

    def score_workers(self) -> int:
        """How many single-threaded workers ``predict`` splits each batch among (:meth:`Scorer.score_workers`)."""
        return self.scorer.score_workers()

    def predict(
        self, images: Sequence[ImageInput], *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> Prediction:
        """Scores, maps and verdicts for ``images`` (:meth:`Scorer.predict`).

        ``sigmas`` (mean + k std) or ``false_alarm_rate`` (estimated share of good parts
        flagged) overrides the product's threshold rule for this call; both are refused.
        """
        return self.scorer.predict(images, sigmas=sigmas, false_alarm_rate=false_alarm_rate)
