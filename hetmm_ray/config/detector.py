"""One product's detector configuration: its stored settings and this run's settings.

Exact semantics:

- A :class:`DetectorConfig` is the product's stored sections (``backbone``, ``scoring``,
  ``templates``, ``threshold``: :mod:`.product`) and ``bank_dtype``, plus the run-time settings,
  each declared with ``run_time=True`` on its field. :data:`RUN_TIME_SETTINGS` is derived from
  those markers, in declaration order.
- Run-time settings change how fast a product is computed, not what it is: they are never written
  to a manifest (:meth:`DetectorConfig.stored_dict`) and a stored value is ignored on load
  (:func:`stored_config`: this host's defaults apply, so a product compressed on a GPU host loads
  on a CPU-only one).
- Built from keyword arguments or a plain mapping (JSON/YAML, ``--set dotted.name=VALUE`` through
  :meth:`DetectorConfig.replace`); unknown keys and bad values raise ConfigError naming the setting.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

from ._constraints import Check, ConfigError, OneOf, Range, Settings, is_run_time, setting
from .product import (
    DTYPES,
    PUBLISH_MODES,
    RETIRED_SETTINGS,
    SCORE_TOP_K,
    SCORE_TOP_K_SIDE,
    BackboneConfig,
    GeometryConfig,
    ScoringConfig,
    TemplateConfig,
    ThresholdConfig,
)
from .region import check_region
from .run_time import BACKBONE_RUNTIMES, is_device

__all__ = ["RUN_TIME_SETTINGS", "DetectorConfig", "load_config", "merge_product_config", "stored_config"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectorConfig(Settings):
    """Everything that defines one product's detector.

    A field is the product's (stored in every version's manifest) unless it is declared
    ``run_time=True``. The field order is the key order of :meth:`to_dict` and of the manifest
    (:meth:`stored_dict`), so ``bank_dtype`` stays where it always was, among the run-time settings.
    """

    _prefix: ClassVar[str] = ""

    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    scoring: ScoringConfig = dataclasses.field(default_factory=ScoringConfig)
    templates: TemplateConfig = dataclasses.field(default_factory=TemplateConfig)
    threshold: ThresholdConfig = dataclasses.field(default_factory=ThresholdConfig)
    # --- inspection region (config/region.py, core/region.py): the pixels that count ---------
    # None: every pixel. Stored with the product (a changed region is a new, recalibrated
    # version); left out of to_dict/stored_dict when None, so products without one (all those
    # stored before regions existed) keep their manifests and scores exactly. Kept in the
    # canonical form of config.region.check_region (a plain mapping: treat it as read-only).
    region: dict[str, Any] | None = setting(  # noqa: RUF009 - a field specifier, as dataclasses.field
        None,
        description=(
            'The inspection region: the pixels that count (`{"size": [h, w], "include": [...], "exclude": [...]}` or a'
            " PNG mask through `--region`). Null: every pixel. A changed region is a new, recalibrated version."
        ),
    )
    # "auto" = cuda when available, else cpu
    device: str = setting(
        "auto",
        Check(is_device, "use auto, cpu, cuda or cuda:N"),
        run_time=True,
        description=(
            "Where a run computes: `auto` (CUDA when available, else CPU), `cpu`, `cuda`, `cuda:N` or `mps`. A "
            "run-time setting, never stored."
        ),
    )
    dtype: str = setting(
        "float32", OneOf(DTYPES, "dtype"), run_time=True, description="Compute dtype of ATMM. A run-time setting."
    )  # compute dtype of ATMM
    # storage dtype of the feature bank (measured lossless on bottle): the product's, stored
    bank_dtype: str = setting(
        "float16",
        OneOf(DTYPES, "dtype"),
        description=(
            "Storage dtype of the feature bank (stored with the product): float16 halves memory and store size."
        ),
    )
    batch_size: int = setting(
        8, Range(1, 4096, int), run_time=True, description="Images per backbone and ATMM batch. A run-time setting."
    )  # images per backbone/ATMM batch
    # ATMM working block; None: 4 MiB on CPU (cache-sized), 256 MiB on CUDA
    chunk_mib: int | None = setting(
        None,
        Range(1, 65_536, int),
        run_time=True,
        description=(
            "ATMM's working block in MiB; null: 4 MiB on a CPU (cache-sized), 256 MiB on CUDA. A run-time setting."
        ),
    )
    # predict's input pipeline (hetmm_ray/detection/pipeline.py): batches read, decoded and resized ahead in
    # a background thread while the current one runs the backbone and ATMM (0: one after another;
    # the scores are identical), each batch's images decoded in decode_threads threads.
    prefetch: int = setting(
        1,
        Range(0, 16, int),
        run_time=True,
        description=(
            "`predict`'s input pipeline: batches read, decoded and resized ahead while the current one is scored (0: "
            "one after another; the scores are identical). A run-time setting."
        ),
    )
    decode_threads: int = setting(
        2, Range(1, 64, int), run_time=True, description="Threads that decode one batch's images. A run-time setting."
    )
    # Freed memory the process keeps mapped for the next batch (glibc mallopt), MiB; 0: leave the
    # allocator alone. Fresh multi-MiB buffers per batch cost a page fault per 4 KiB otherwise.
    malloc_keep_mib: int = setting(
        1024,
        Range(0, 65_536, int),
        run_time=True,
        description=(
            "Freed memory the process keeps mapped for the next batch (glibc), MiB; 0 leaves the allocator alone. A "
            "run-time setting."
        ),
    )
    # What runs the backbone's network (core/backbone.py resolve_runtime): "auto" is OpenVINO for
    # float32 on a CPU (faster than torch there, features equal within float32 rounding:
    # docs/performance.md), torch on GPUs and for bfloat16; "torch" or "openvino" force one.
    backbone_runtime: str = setting(
        "auto",
        OneOf(BACKBONE_RUNTIMES, "runtime"),
        run_time=True,
        description=(
            "What runs the backbone's network: `auto` (OpenVINO for float32 on a CPU, torch on GPUs and for bfloat16),"
            " `torch` or `openvino`. A run-time setting."
        ),
    )
    # predict on a CPU: each batch split among this many worker threads that decode, resize and
    # score their share with single-threaded ops (hetmm_ray.detection.pipeline.map_in_workers; measured
    # faster than multi-threaded ops and graceful next to a busy neighbour: docs/performance.md).
    # 0: the calling thread's torch thread count; 1: one worker running
    # multi-threaded ops with the prefetch pipeline above. GPUs always use 1.
    score_workers: int = setting(
        0,
        Range(0, 256, int),
        run_time=True,
        description=(
            "`predict` on a CPU splits each batch among this many worker threads running single-threaded ops; 0: the "
            "torch thread count; 1: one worker with multi-threaded ops and the prefetch pipeline. GPUs always use 1. A"
            " run-time setting."
        ),
    )
    # Tiles (product.GeometryConfig): stored, but left out of a manifest at its default, so
    # every manifest written before it existed, and every untiled one since, stays byte for byte alike.
    geometry: GeometryConfig = dataclasses.field(default_factory=GeometryConfig)
    # How this product's new versions are published (config.PUBLISH_MODES): None = the
    # surface's default (CLI ``live``, service ``ServiceConfig.publish``). Stored, but left out of a
    # manifest when None, so every manifest written before it existed stays byte for byte alike.
    publish: str | None = setting(
        None,
        OneOf(PUBLISH_MODES, "publish mode"),
        description=(
            "How this product's new versions are published: `live` (HEAD at once) or `candidate` (stored beside HEAD "
            "until promoted). Null: the surface's default (`live` for the CLI, `service.publish` for the service)."
        ),
    )

    def _check(self) -> None:
        if self.region is not None:
            object.__setattr__(self, "region", check_region(self.region))
        n_layers = len(self.backbone.taps)
        if len(self.scoring.forward_windows) != n_layers:
            raise ConfigError(
                f"scoring: the backbone taps {n_layers} layers {self.backbone.taps} but scoring has "
                f"{len(self.scoring.forward_windows)} entries per list"
            )

    # --- (de)serialisation --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = json.loads(json.dumps(dataclasses.asdict(self)))
        if data["region"] is None:  # no region: the dict every product had before regions existed
            del data["region"]
        if (
            data["threshold"].get("review_false_alarm_rate") is None
        ):  # no review band: stored as before the band existed
            data["threshold"].pop("review_false_alarm_rate", None)
        if data["publish"] is None:  # the surface's default: the dict of a product stored before publish existed
            del data["publish"]
        return data

    def stored_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the run-time settings: what a manifest keeps of a product
        (``geometry`` only for a tiled product or one whose geometry was chosen from
        ``min_defect_px``: other untiled manifests are what they always were, whatever overlap an
        untiled configuration names)."""
        out = {k: v for k, v in self.product_only().to_dict().items() if k not in RUN_TIME_SETTINGS}
        del out["geometry"]["canvas"]  # always "fixed" in a product: the dict products always had
        del out["geometry"]["tile_large_frames"]  # a fit's rule, resolved: a product holds its grid
        if out["geometry"].get("min_defect_px") is None:  # unset: written as products were before it
            del out["geometry"]["min_defect_px"]
            if not self.geometry.tiled:
                del out["geometry"]
        # else kept, untiled too: the fit chose the geometry from it (geometry_rule.choose_geometry)
        return out

    @property
    def score_pixels(self) -> int:
        """How many map pixels the image score averages: ``scoring.score_top_k``; unset (a
        configuration no fit resolved, ``geometry_rule.choose_geometry``), :data:`~.product.SCORE_TOP_K`
        scaled from a :data:`~.product.SCORE_TOP_K_SIDE`-px map to this one's area (``scoring.output_size``,
        else ``backbone.image_size``), at least 1: the fit's own choice without ``min_defect_px``."""
        if self.scoring.score_top_k is not None:
            return self.scoring.score_top_k
        side = self.scoring.output_size or self.backbone.image_size
        return max(1, round(SCORE_TOP_K * (side / SCORE_TOP_K_SIDE) ** 2))

    @property
    def decode_canvas(self) -> tuple[int, str] | None:
        """What a frame may be decoded and resized to before it reaches the detector: ``(image_size,
        geometry)`` for a frame on one canvas; None for a tiled product, whose frames travel whole
        (the detector cuts its tiles from the frame at its own resolution)."""
        return None if self.geometry.tiled else (self.backbone.image_size, self.backbone.geometry)

    def product_only(self) -> DetectorConfig:
        """This configuration with every run-time setting at its default and its canvas ``fixed`` (a
        built product's canvas is its ``image_size``; ``aspect`` is a fit's choice, made once): the
        product as stored."""
        defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(DetectorConfig) if is_run_time(f)}
        if self.geometry.canvas != "fixed" or self.geometry.tile_large_frames:
            defaults["geometry"] = dataclasses.replace(self.geometry, canvas="fixed", tile_large_frames=False)
        same = all(getattr(self, k) == v for k, v in defaults.items())
        return self if same else dataclasses.replace(self, **defaults)

    def replace(self, **changes: Any) -> DetectorConfig:
        """Copy with top-level or dotted changes: ``replace(**{"backbone.name": "resnet18"})``."""
        data = self.to_dict()
        for key, value in changes.items():
            node = data
            *parents, leaf = key.split(".")
            for p in parents:
                if p not in node or not isinstance(node[p], dict):
                    raise ConfigError(f"unknown configuration section {p!r} in {key!r}")
                node = node[p]
            node[leaf] = value
        return DetectorConfig.from_dict(data)


RUN_TIME_SETTINGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DetectorConfig) if is_run_time(f))
"""The run-time settings' names, read from the fields' markers (``setting(..., run_time=True)``)."""


def stored_config(data: dict[str, Any]) -> DetectorConfig:
    """A product's configuration as stored with its templates.

    Settings added after a product was stored take the value that reproduces how it was
    built, not today's default: ``backbone.geometry`` missing means ``squash``; a missing
    ``geometry`` section means one tile (its default, the frame itself); a ``geometry`` section
    without ``tile_whole_view`` means none (tiled products stored before the whole view); no
    ``geometry.canvas`` means ``fixed`` and no ``geometry.tile_large_frames`` means false (a fit resolves
    the canvas and the grid, and stores only the size and the grid: never written); a ``scoring``
    section without ``score_top_k`` means 1 (the image score was the map's maximum). The
    :data:`RUN_TIME_SETTINGS` an older manifest may hold are ignored (this host's defaults
    apply: a product compressed on a GPU host loads on a CPU-only one). Settings that no longer
    exist (:data:`~.product.RETIRED_SETTINGS`, e.g. ``templates.auto_max_rel_diff``) are dropped.
    """
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in RUN_TIME_SETTINGS}
        for section, key in RETIRED_SETTINGS:
            if isinstance(data.get(section), dict) and key in data[section]:
                data = {**data, section: {k: v for k, v in data[section].items() if k != key}}
    if isinstance(data, dict) and isinstance(data.get("backbone"), dict) and "geometry" not in data["backbone"]:
        data = {**data, "backbone": {**data["backbone"], "geometry": "squash"}}
    if isinstance(data, dict) and isinstance(data.get("geometry"), dict) and "tile_whole_view" not in data["geometry"]:
        data = {**data, "geometry": {**data["geometry"], "tile_whole_view": False}}  # tiled before the whole view
    if isinstance(data, dict) and isinstance(scoring := data.get("scoring", {}), dict) and "score_top_k" not in scoring:
        data = {**data, "scoring": {**scoring, "score_top_k": 1}}  # scored by the maximum before the setting
    if isinstance(data, dict):
        # a stored product's canvas and grid were resolved by its fit (or predate the settings): never chosen again
        resolved = {"canvas": "fixed", "tile_large_frames": False}
        stored = data.get("geometry")
        data = {**data, "geometry": {**resolved, **(stored if isinstance(stored, dict) else {})}}
    return DetectorConfig.from_dict(data)


def load_config(path: str | Path) -> DetectorConfig:
    """Read a JSON or YAML configuration file (partial files fill in defaults)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration ({exc.strerror})") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - parser errors vary by format
        raise ConfigError(f"{p}: not valid {p.suffix.lstrip('.') or 'JSON'}: {exc}") from None
    try:
        return DetectorConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def merge_product_config(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A product's settings as a request gives them (``given``) over the service's
    ``product_defaults``: one level deep per section, validated as a DetectorConfig; a dict."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in defaults.items()}
    for key, value in given.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return DetectorConfig.from_dict(out).to_dict()
