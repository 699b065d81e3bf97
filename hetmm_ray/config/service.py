"""The HTTP service's settings (``deploy.yaml`` application ``args``, ``hetmm serve`` flags).

Exact semantics: a :class:`ServiceConfig` is read once when the application is built; its
settings are named ``service.<field>`` in messages and in the configuration reference, each range
declared on its field. ``product_defaults`` is checked as a :class:`~hetmm_ray.config.DetectorConfig`
at start-up, so a bad default fails then, not at the first create. Also here: the default store,
the Serve environment of a Ray this package starts, and the served heat-maps' colour scale.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any, ClassVar

from ._constraints import Check, OneOf, Range, Settings, setting
from .detector import DetectorConfig
from .product import PUBLISH_MODES

__all__ = [
    "DEFAULT_GRPC_PORT",
    "DEFAULT_STORE",
    "GRPC_APP_NAME",
    "GRPC_CLIENT_IMAGES_PER_REQUEST",
    "GRPC_CLIENT_IN_FLIGHT",
    "GRPC_CLIENT_REQUEST_MIB",
    "GRPC_CLIENT_RETRY_PAUSE_S",
    "GRPC_CLIENT_WAIT_S",
    "HTTP_APP_NAME",
    "GRPC_MAX_MESSAGE_MIB",
    "GRPC_ROUTE_PREFIX",
    "GRPC_SERVICER",
    "HEATMAP_VMAX_OVER_THRESHOLD",
    "SERVE_BY_VALUE_MAX_BYTES",
    "SERVE_ENVIRONMENT",
    "ServiceConfig",
]

DEFAULT_STORE = "hetmm-store"
"""The template store when none is named: a folder in the working directory (CLI and service)."""

HEATMAP_VMAX_OVER_THRESHOLD = 2.0
"""Served heat-maps colour anomaly values from 0 to this multiple of the product's threshold, the
same fixed scale for every image of a product version (the threshold sits mid-scale: cyan to
green; above it yellow to red). Values beyond the top are drawn as the top colour."""

# The gRPC endpoint (hetmm.v1.Inspection, serve/grpc/): Serve's gRPC proxy port (deploy.yaml
# grpc_options.port; ``hetmm serve --grpc-port``), the application it routes to (clients send it as
# the ``application`` metadata) and the servicer function Serve's proxy registers.
DEFAULT_GRPC_PORT = 9000
GRPC_APP_NAME = "hetmm-grpc"
GRPC_ROUTE_PREFIX = "/hetmm-grpc"  # Serve's gRPC proxy routes only to applications with a route prefix
GRPC_SERVICER = "hetmm_ray.serve.grpc.inspection_pb2_grpc.add_InspectionServicer_to_server"
GRPC_MAX_MESSAGE_MIB = 65  # max_body_mib's default (64) and the message's framing
# A client with many images (InspectionClient.predict_all, ``hetmm predict --grpc``) sends requests of
# at most this many images and MiB (the service's default limits are 16 images and 64 MiB; a request
# refused as too large for a service with lower ones is split and sent again), this many at a time,
# so that a second detector replica, where the service has one, scores too (the sizes compared:
# benchmarks/bench_serve.py client, docs/performance.md).
GRPC_CLIENT_IMAGES_PER_REQUEST = 16
GRPC_CLIENT_REQUEST_MIB = 32
GRPC_CLIENT_IN_FLIGHT = 2
# A call refused UNAVAILABLE (no listener yet, the gRPC application still starting, a replica going) is
# sent again after 0.25 s, doubling to at most 2 s, until this many seconds have passed since the first
# try (``hetmm predict --grpc --wait-s``); 0 sends once. The default covers a gRPC application that is
# still starting after ``hetmm serve`` returns on a small machine.
GRPC_CLIENT_WAIT_S = 60.0
GRPC_CLIENT_RETRY_PAUSE_S = (0.25, 2.0)  # first and longest pause; also the channel's reconnect backoff
# The HTTP application (deploy.yaml's ``hetmm``): its Ingress holds the metrics, the inspection record
# and the drift monitor, which the gRPC replicas feed too (serve/grpc/service.py).
HTTP_APP_NAME = "hetmm"

# Ray Serve settings for the processes of a Ray this package starts (distributed.runtime.connect;
# a cluster sets them in its own environment, cluster/rayservice.yaml). Deployment handle calls go
# over gRPC, not as Ray actor calls through the object store, which takes less CPU per request in
# the raylet, the ingress and the proxy (benchmarks/bench_serve.py floor; docs/performance.md).
# A value already in the environment wins.
# RAY_SERVE_GRPC_MAX_MESSAGE_SIZE bounds what Serve's gRPC proxy (the hetmm.v1.Inspection endpoint)
# receives or sends in one message: a larger request is refused (RESOURCE_EXHAUSTED) before the proxy
# holds it, as HTTP refuses an over-long Content-Length; the replica then checks max_body_mib.
# RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH: the proxy hands that message to the replica over the
# replica's own gRPC server, whose default is 4 MiB: without it a Predict of more than 4 MiB of images
# (eight 900 x 900 PNGs) failed inside Serve although the proxy had taken it.
# The last four cut Serve's own CPU per request and while idle (benchmarks/bench_serve.py
# --by-process, docs/performance.md), none a weaker guarantee; all but the
# control loop are switches Ray's own RAY_SERVE_THROUGHPUT_OPTIMIZED=1 turns (ray/serve/_private/constants.py):
# - RAY_SERVE_LOG_TO_STDERR=0: Serve's logs (an access line per request in the proxy and each
#   replica) go to Serve's own log files only, not also to each worker's stderr, which Ray's log
#   monitor tails and publishes through the GCS line by line (nothing here reads it: log_to_driver
#   is off). The same lines stay in logs/serve/.
# - RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.25 (Serve's default 0.1): the controller's reconcile loop,
#   which asks the GCS for every node's resources on each pass, was the largest idle process of the
#   service. Autoscaling delays are counted in wall time, not passes,
#   so deploy.yaml's upscale/downscale delays mean the same; Serve reacts to a dead replica or a
#   scaling decision up to 0.15 s later.
# - RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0 and RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0: the
#   handle's router (proxy, ingress) and the deployments' code run on the replica's own event loop,
#   without two thread hops per request. Every route and method here is async and sends blocking
#   work (decoding, scoring, store reads, handle lookups) to threads, which this requires.
# RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S=30 (Serve's default 5): how long the controller lets a new
# proxy take to start (a Python worker importing Serve, FastAPI and uvicorn) before it kills it as
# unhealthy. On a loaded small machine that can take longer than 5 s, and Serve then kills the proxy
# and ``serve.start`` fails with ActorDiedError. Only a proxy that is starting waits longer; a running
# one's health checks are unchanged.
SERVE_ENVIRONMENT: dict[str, str] = {
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE": str(GRPC_MAX_MESSAGE_MIB * 2**20),
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(GRPC_MAX_MESSAGE_MIB * 2**20),
    "RAY_SERVE_LOG_TO_STDERR": "0",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.25",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
}


# Images of one handle call to a detector replica larger than this (decoded bytes) go through the
# object store instead of by value over gRPC: a replica's gRPC server takes messages of at most
# 4 MiB (Ray Serve's RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH default), which a tiled product's whole
# frames pass (a 2048 x 2048 RGB frame is 12 MiB). Canvas-sized images stay far under it.
SERVE_BY_VALUE_MAX_BYTES = 3 * 2**20

_STRINGS = Check(lambda v: all(isinstance(s, str) and s for s in v), "must be a list of non-empty strings")


@dataclass(frozen=True, kw_only=True)
class ServiceConfig(Settings):
    """The HTTP service (``deploy.yaml`` application ``args``, ``hetmm serve`` flags)."""

    _prefix: ClassVar[str] = "service."
    _mapping_prefix: ClassVar[str | None] = ""  # unknown args are named as deploy.yaml writes them

    # local directory or s3://bucket/prefix[?endpoint=...]
    store: str = setting(
        f"./{DEFAULT_STORE}",
        Check(bool, "give a local directory or s3://bucket/prefix"),
        description="The template store: a local directory or `s3://bucket/prefix[?endpoint=http://host:9000]`.",
    )
    admin_token_env: str = setting(
        "HETMM_ADMIN_TOKEN",
        description=(
            "Environment variable holding the admin bearer token; admin routes need `Authorization: Bearer <token>` "
            "when it is set."
        ),
    )  # environment variable holding the admin bearer token
    # tiny sets a detector replica keeps (LRU beyond that)
    max_products_per_replica: int = setting(
        4,
        Range(1, 1024, int),
        description="Products whose templates one detector replica keeps loaded (least recently used beyond that).",
    )
    # largest request body; larger uploads get 413 before being read
    max_body_mib: int = setting(
        64, Range(1, 4096, int), description="Largest request body in MiB; larger uploads get 413 before being read."
    )
    max_images_per_request: int = setting(
        16, Range(1, 1024, int), description="Images in one multipart predict (or gRPC Predict) at most; more get 413."
    )  # images in one multipart predict
    max_images_per_job: int = setting(
        2000, Range(1, 100_000, int), description="Good images in one create or normals job at most."
    )  # good images in one create / normals job
    # Longest ``?wait=true`` on an admin job before answering 202 with the running job; keep it
    # under the proxy's http_options.request_timeout_s (deploy.yaml: 120 s).
    job_wait_s: float = setting(
        100.0,
        Range(0.1, 3600.0),
        description=(
            "Longest `?wait=true` on an admin job before answering 202 with the running job; keep it under the proxy's"
            " `request_timeout_s`."
        ),
    )
    # Settings of products created over HTTP that the request leaves out
    # (e.g. {"backbone": {"name": "mobilenet_v2", "weights": "/weights/mnv2.pth"}}).
    product_defaults: dict[str, Any] = setting(  # noqa: RUF009 - a field specifier, as dataclasses.field
        MISSING,
        Check(lambda v: isinstance(v, dict), "must be a mapping"),
        factory=dict,
        description=(
            'Settings of products created over HTTP that a request leaves out, e.g. `{"backbone": {"name": '
            '"mobilenet_v2"}}`; checked at start-up.'
        ),
    )
    # How often the registry re-reads the HEAD of every product it serves, so a rollback,
    # delete or new version written by another writer (the CLI, another cluster) is served
    # within about 2 * store_poll_s plus the time to load the new version.
    store_poll_s: float = setting(
        2.0,
        Range(0.1, 60.0),
        description=(
            "How often the registry re-reads each served product's HEAD: a rollback, delete or new version by another "
            "writer is served within about twice this plus the load time."
        ),
    )
    body_timeout_s: float = setting(
        60.0,
        Range(0.5, 600.0),
        description="Longest time to receive a request body; a slower client gets a JSON 408 and its slot back.",
    )
    # Where a create request's server-side ``source`` may read: local folders and/or
    # s3://bucket/prefix[?endpoint=...] roots. None by default (sources refused); an S3
    # endpoint comes only from here, never from the client's URI.
    source_roots: tuple[str, ...] = setting(
        (),
        _STRINGS,
        many=True,
        description=(
            "Local folders and `s3://` roots that a request's server-side `source` may read; empty: server-side "
            "sources are refused. An S3 endpoint comes only from here."
        ),
    )
    # Origins (scheme://host[:port]) besides the service's own that may send non-GET requests
    # from a browser; every other cross-origin write is refused (403).
    allowed_origins: tuple[str, ...] = setting(
        (),
        _STRINGS,
        many=True,
        description=(
            "Browser origins (`scheme://host[:port]`) besides the service's own that may send non-GET requests; every "
            "other cross-origin write is refused with 403."
        ),
    )
    # Template host processes holding the (product, layer) shards (distributed/hosts.py), e.g.
    # one per GPU or node: processes grow with this, not with the number of products.
    template_hosts: int = setting(
        2,
        Range(1, 1024, int),
        description="Template host processes holding the (product, layer) shards, e.g. one per GPU or node.",
    )
    # Warm set (serve/warm_set.py): once this many predicts of one product are in flight at an
    # ingress, its further requests cycle over model-id aliases, so Serve spreads them over
    # several replicas (each loads the product once) instead of pinning it to one.
    hot_product_inflight: int = setting(
        8,
        Range(1, 100_000, int),
        description=(
            "Once this many predicts of one product are in flight at an ingress, its further requests are spread over "
            "several replicas (the warm set)."
        ),
    )
    # Model ids (the product's own and aliases) a hot product cycles over: replicas it can spread
    # over (set it to the Detector's autoscaling max_replicas); 1 pins every product to one replica.
    hot_product_spread: int = setting(
        4,
        Range(1, 1024, int),
        description=(
            "Replicas a hot product may spread over (set it to the Detector's autoscaling `max_replicas`); 1 pins "
            "every product to one replica."
        ),
    )
    # While a product is hot its aliases are renamed this often, so replicas that autoscaling adds
    # get a share (Serve keeps an alias on the replica that loaded it first; serve/warm_set.py).
    hot_product_rotate_s: float = setting(
        10.0,
        Range(1.0, 3600.0),
        description="How often a hot product's aliases are renamed, so replicas that autoscaling adds get a share.",
    )
    # The console's recent predictions (serve/recent.py): the last this many per product, kept in
    # the ingress process's memory (lost on restart), the uploaded images and heat-maps within
    # recent_max_mib in all (the oldest go first).
    recent_per_product: int = setting(
        200,
        Range(1, 100_000, int),
        description="The console's recent predictions kept per product, in the ingress's memory.",
    )
    recent_max_mib: int = setting(
        128,
        Range(1, 65_536, int),
        description="Memory for the recent predictions' images and heat-maps in all, MiB (the oldest go first).",
    )
    # The host Serve's HTTP proxies bind, as the application is started (``hetmm serve`` sets it
    # from --host): the ingress then refuses a non-loopback bind without an admin token. A
    # ``serve run`` of a Serve config file should set it to its ``http_options.host``; left
    # unset, the ingress cannot know the bind and logs that it did not check it.
    http_host: str | None = setting(
        None,
        Check(lambda v: isinstance(v, str) and v != "", "a host name or address"),
        description=(
            "The host Serve's HTTP proxies bind (`hetmm serve` sets it from `--host`); the ingress then refuses a "
            "non-loopback bind without an admin token. Set it to `http_options.host` with `serve run`."
        ),
    )

    # The peers the gRPC endpoint answers (serve/grpc/): a loopback address (the default) answers
    # loopback peers only, PERMISSION_DENIED to others (Ray 2.60's gRPC proxy listens on every
    # interface whatever is asked); another address answers every peer and, like a non-loopback
    # HTTP bind, needs the admin token set.
    grpc_host: str = setting(
        "127.0.0.1",
        Check(lambda v: isinstance(v, str) and v != "", "a host name or address"),
        description=(
            "The peers the gRPC endpoint answers: a loopback address answers loopback peers only; another address "
            "answers every peer and needs the admin token."
        ),
    )
    # --- the inspection record and drift alarms (hetmm_ray/record/, core/drift.py) ------------------
    # The inspection record: every prediction as a row of Parquet files in the store beside the
    # versions ({product}/inspections/date=YYYY-MM-DD/*.parquet). Off by default: it writes to the
    # template store, whose size and retention an operator should choose; the console's Recent view
    # then reads the in-memory ring only, as before.
    record: bool = setting(
        False,
        description=(
            "Write every prediction to the inspection record (Parquet in the template store, beside the versions). Off"
            " by default: choose the store's size and retention first."
        ),
    )
    # A batch is written once it holds this many rows, or once its oldest row is this old (so a quiet
    # line still flushes). A crash (SIGKILL) loses at most the rows not yet in a written file: fewer
    # than record_max_pending_rows (rows beyond that are dropped and counted, never block predict).
    record_batch_rows: int = setting(
        1000, Range(1, 1_000_000, int), description="The record writes a file once this many rows are pending."
    )
    record_flush_s: float = setting(
        30.0,
        Range(0.05, 3600.0),
        description=(
            "The record writes a file once its oldest pending row is this many seconds old, so a quiet line still "
            "flushes."
        ),
    )
    record_max_pending_rows: int = setting(
        8000,
        Range(2, 10_000_000, int),
        description=(
            "Rows waiting to be written at most; beyond, rows are dropped and counted (predict never blocks). A crash "
            "loses fewer than this."
        ),
    )
    # Images kept ({product}/inspection-images/YYYY-MM-DD/): every flagged or review part, this share
    # of passed parts (chosen by image digest: the same image always gets the same answer), at most
    # record_image_mib_per_day per product and UTC day; rows and images older than
    # record_retention_days are deleted by the writer (checked hourly).
    record_pass_sample: float = setting(
        0.02,
        Range(0.0, 1.0),
        description=(
            "Share of passed parts whose images the record keeps (chosen by image digest); every flagged and review "
            "image is kept."
        ),
    )
    record_image_mib_per_day: int = setting(
        1024, Range(0, 1_048_576, int), description="Record images kept per product and UTC day at most, MiB."
    )
    record_retention_days: int = setting(
        90, Range(1, 36_500, int), description="Record rows and images older than this are deleted (checked hourly)."
    )
    # Drift alarms (core/drift.py): windows of the last N parts of one version (a short and a long
    # one: drift_parts_short, drift_parts_long), and of the last S
    # seconds; a test fires below drift_alpha; the flagged share is tested against
    # drift_rate_tolerance x the calibrated rate; a score shift counts from KS distance drift_min_shift;
    # windows with fewer than drift_min_parts parts stay ok.
    drift_parts_short: int = setting(
        200,
        Range(10, 100_000, int),
        description="Drift alarms: the short window, the last this many parts of a version.",
    )
    drift_parts_long: int = setting(
        2000,
        Range(10, 100_000, int),
        description="Drift alarms: the long window, the last this many parts of a version.",
    )
    drift_window_s: float = setting(
        3600.0,
        Range(10.0, 7 * 86400.0),
        description="Drift alarms: the time window, the parts of the last this many seconds.",
    )
    drift_alpha: float = setting(
        0.0001, Range(1e-12, 0.5), description="Drift alarms: a test fires when its p-value is below this."
    )
    drift_rate_tolerance: float = setting(
        2.0,
        Range(1.0, 1000.0),
        description=(
            "Drift alarms: the flagged share is tested against this multiple of the calibrated false-alarm rate."
        ),
    )
    drift_min_shift: float = setting(
        0.2, Range(0.0, 1.0), description="Drift alarms: a score shift counts from this Kolmogorov-Smirnov distance."
    )
    drift_min_parts: int = setting(
        50, Range(1, 100_000, int), description="Drift alarms: a window with fewer parts stays `ok`."
    )

    # How the admin routes publish a new version of a product whose own ``publish`` is unset
    # (config.PUBLISH_MODES). ``live`` by default: the routes answer as they always did (a
    # finished job's version is HEAD), so existing clients and the console's one-click "good part"
    # keep working; a line that wants every change compared first sets ``candidate`` here or per
    # product. A request's ``?publish=`` overrides both.
    publish: str = setting(
        "live",
        OneOf(PUBLISH_MODES, "publish mode"),
        description=(
            "How the admin routes publish a new version of a product whose own `publish` is unset: `live` or "
            "`candidate`. A request's `?publish=` overrides both."
        ),
    )

    def _check(self) -> None:
        DetectorConfig.from_dict(self.product_defaults)  # fail at start-up, not at the first create
