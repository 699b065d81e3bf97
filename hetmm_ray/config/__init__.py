"""Typed, validated configuration: the one place where defaults live.

Exact semantics: every setting is a field of a frozen dataclass, built from keyword arguments or
from a plain mapping (JSON/YAML); unknown keys and bad values raise :class:`ConfigError` with a
message that names the setting and what is allowed. Each setting's default and constraints
(range, choices, list, nullable, run-time) are declared once, on its field, and read by one
validator (:mod:`._constraints`). Settings live by who owns them:

- :mod:`.product`: the product's stored sections (backbone, scoring, templates, threshold) and
  the tables they choose from (backbones, packaged weights, selection kinds, threshold rules);
- :mod:`.detector`: :class:`DetectorConfig`, those sections plus ``bank_dtype`` (stored in every
  manifest) and this run's settings (declared ``run_time=True``: never stored), and how a
  manifest's config is read back (:func:`stored_config`);
- :mod:`.run_time`: the choices and machine-wide constants of a run (backbone runtimes, the
  model cache, Ray tasks' CPU share and PTS chunk);
- :mod:`.service`: the HTTP service's settings (:class:`ServiceConfig`, ``deploy.yaml`` args);
- :mod:`.replica`: the detector replicas' live settings (:class:`ReplicaSettings`, ``user_config``);
- :mod:`.station`: a line file's stations (sources, sinks, service, queue; ``hetmm station check``);
- :mod:`.limits`: input limits checked before any pixel is decoded, and image file suffixes;
- :mod:`.numeric`: :data:`NUMERIC_RANGES`, every numeric setting's range by its dotted name,
  derived from the fields, and :func:`check_number` for values that arrive outside a config
  (``--sigmas``, HTTP).
"""

from __future__ import annotations

from ._constraints import ConfigError, is_finite_number
from .detector import RUN_TIME_SETTINGS, DetectorConfig, load_config, merge_product_config, stored_config
from .limits import IMAGE_SUFFIXES, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MIN_IMAGE_SIDE
from .numeric import NUMERIC_RANGES, check_number
from .product import (
    BACKBONE_PRECISIONS,
    BACKBONES,
    DEFAULT_LAYERS,
    DTYPES,
    GEOMETRIES,
    OUTLIER_MADS,
    PACKAGED_WEIGHTS,
    PUBLISH_MODES,
    RATE_CHOICES,
    SCORE_TOP_K,
    TEMPLATE_KINDS,
    THRESHOLD_RULES,
    THRESHOLD_WARN_OVER_HIGHEST,
    BackboneConfig,
    GeometryConfig,
    PackagedWeights,
    ScoringConfig,
    TemplateConfig,
    ThresholdConfig,
    publishes_candidate,
)
from .replica import ReplicaSettings
from .run_time import (
    BACKBONE_RUNTIMES,
    FEATURE_TASKS_PER_SLOT,
    MODEL_CACHE_ENV,
    PTS_CHUNK_PIXELS,
    REPORT_GALLERY_NEAR,
    REPORT_THUMBNAIL_PX,
    STREAM_FRAMES,
    TASK_CPUS,
    model_cache_dir,
)
from .service import (
    DEFAULT_GRPC_PORT,
    DEFAULT_STORE,
    GRPC_APP_NAME,
    GRPC_CLIENT_IMAGES_PER_REQUEST,
    GRPC_CLIENT_IN_FLIGHT,
    GRPC_CLIENT_REQUEST_MIB,
    GRPC_CLIENT_RETRY_PAUSE_S,
    GRPC_CLIENT_WAIT_S,
    GRPC_ROUTE_PREFIX,
    GRPC_SERVICER,
    HEATMAP_VMAX_OVER_THRESHOLD,
    HTTP_APP_NAME,
    SERVE_BY_VALUE_MAX_BYTES,
    SERVE_ENVIRONMENT,
    ServiceConfig,
)

__all__ = [
    "BACKBONES",
    "BACKBONE_PRECISIONS",
    "BACKBONE_RUNTIMES",
    "DEFAULT_LAYERS",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_STORE",
    "GRPC_APP_NAME",
    "GRPC_CLIENT_IMAGES_PER_REQUEST",
    "GRPC_CLIENT_IN_FLIGHT",
    "GRPC_CLIENT_REQUEST_MIB",
    "GRPC_CLIENT_RETRY_PAUSE_S",
    "GRPC_CLIENT_WAIT_S",
    "GRPC_ROUTE_PREFIX",
    "GRPC_SERVICER",
    "DTYPES",
    "GEOMETRIES",
    "HEATMAP_VMAX_OVER_THRESHOLD",
    "HTTP_APP_NAME",
    "IMAGE_SUFFIXES",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MIN_IMAGE_SIDE",
    "MODEL_CACHE_ENV",
    "NUMERIC_RANGES",
    "PACKAGED_WEIGHTS",
    "PTS_CHUNK_PIXELS",
    "REPORT_GALLERY_NEAR",
    "REPORT_THUMBNAIL_PX",
    "STREAM_FRAMES",
    "PUBLISH_MODES",
    "publishes_candidate",
    "RUN_TIME_SETTINGS",
    "SERVE_BY_VALUE_MAX_BYTES",
    "SERVE_ENVIRONMENT",
    "FEATURE_TASKS_PER_SLOT",
    "TASK_CPUS",
    "TEMPLATE_KINDS",
    "SCORE_TOP_K",
    "THRESHOLD_RULES",
    "THRESHOLD_WARN_OVER_HIGHEST",
    "OUTLIER_MADS",
    "RATE_CHOICES",
    "BackboneConfig",
    "GeometryConfig",
    "ConfigError",
    "DetectorConfig",
    "PackagedWeights",
    "ReplicaSettings",
    "ScoringConfig",
    "ServiceConfig",
    "TemplateConfig",
    "ThresholdConfig",
    "check_number",
    "is_finite_number",
    "load_config",
    "merge_product_config",
    "model_cache_dir",
    "stored_config",
]
