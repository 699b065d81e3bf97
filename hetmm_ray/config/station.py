"""A line's stations: the settings of ``line.yaml``, the file ``hetmm station check`` reads.

Exact semantics:

- A line file is a YAML mapping: ``line`` (a name), ``service`` (where its stations score, the
  default for each of them), ``console`` (where they report themselves for the service's console:
  :class:`ConsoleTarget`; absent: the line's ``http`` service, if any) and ``stations`` (a
  non-empty list). Every mapping refuses unknown
  keys with the closest known name; every value is checked by the constraint declared beside it.
- ``service``: exactly one of ``grpc`` (``host:port``), ``http`` (an ``http://`` or ``https://``
  URL) or ``in_process`` (a store URI or folder: one PC, no cluster), and ``timeout_ms``.
- A station: ``name`` (1-64 letters, digits, ``_`` or ``-``; unique in the file), ``product``
  (a product name) and an optional pinned ``version``; an optional ``service`` of its own; a
  ``source``; ``part_id`` (where a part's identity comes from: ``trigger``, ``file_name`` or
  ``counter``; null picks the source's own: a folder's file name, a camera's counter, an MQTT
  trigger's message); ``deadline_ms`` (a verdict later than this is published as ``timeout``);
  a ``queue`` (the bounded on-disk queue of parts waiting for the service); and one or more
  ``sinks``.
- Sources and sinks are mappings with a ``kind``; each kind has its own settings (the classes
  below, :data:`SOURCE_KINDS` and :data:`SINK_KINDS`).
- Folder paths are checked for existence by ``station.check`` (the file's own problems are all
  found here, without touching the machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ._constraints import Check, ConfigError, OneOf, Range, Settings, setting

__all__ = [
    "AFTER_READ",
    "PART_IDS",
    "PIXEL_FORMATS",
    "SINK_KINDS",
    "SOURCE_KINDS",
    "AravisSource",
    "ConsoleTarget",
    "FolderSource",
    "LogSink",
    "MqttLogin",
    "MqttSink",
    "MqttSource",
    "OpcUaSink",
    "STATION_SECTIONS",
    "QueueSettings",
    "ServiceTarget",
    "StationHead",
    "WebhookSink",
]

_STATION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_HOST_PORT = re.compile(r"[A-Za-z0-9_.-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}")
_MQTT_TOPIC = re.compile(r"[^#+\x00]+")  # a topic to publish on: no wildcards, no NUL

PART_IDS = ("trigger", "file_name", "counter")
AFTER_READ = ("keep", "move", "delete")  # what a folder source does with a file it has read
# Aravis pixel formats a camera frame is converted from (Bayer: demosaiced to RGB).
PIXEL_FORMATS = ("Mono8", "Mono16", "RGB8", "BayerRG8", "BayerGR8", "BayerGB8", "BayerBG8")
TRIGGERS = ("software", "hardware", "mqtt", "opcua")
MQTT_PAYLOADS = ("none", "path", "image")  # what a trigger message carries besides the part id
LOG_FORMATS = ("csv", "parquet")


def _port(value: Any) -> bool:
    return (
        isinstance(value, str)
        and _HOST_PORT.fullmatch(value) is not None
        and 1 <= int(value.rsplit(":", 1)[1]) <= 65535
    )


def _url(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", value) is not None


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _subscription(value: Any) -> bool:  # a topic filter to subscribe to: wildcards allowed
    return isinstance(value, str) and value != "" and "\x00" not in value


def _topic(value: Any) -> bool:
    return isinstance(value, str) and _MQTT_TOPIC.fullmatch(value) is not None


def _opc_endpoint(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("opc.tcp://") and _port(value[10:].split("/", 1)[0])


def _station_name(value: Any) -> bool:
    return isinstance(value, str) and _STATION_NAME.fullmatch(value) is not None


@dataclass(frozen=True, kw_only=True)
class ServiceTarget(Settings):
    """Where a station scores: exactly one of ``grpc``, ``http`` or ``in_process``."""

    grpc: str | None = setting(
        None,
        Check(_port, "must be host:port"),
        description="Score over gRPC at `host:port` (`hetmm serve --grpc-port`).",
    )
    http: str | None = setting(
        None,
        Check(_url, "must be an http:// or https:// URL"),
        description="Score over HTTP at this `http://` or `https://` URL.",
    )
    in_process: str | None = setting(
        None,
        Check(_text, "must name a store (a folder or s3:// URI)"),
        description="Score in this process from a store (a folder or `s3://` URI): one PC, no service.",
    )
    timeout_ms: int = setting(
        5000,
        Range(1, 600_000, int),
        description="How long one scoring call may take before the part is queued and retried (not the deadline).",
    )

    def _check(self) -> None:
        given = [k for k in ("grpc", "http", "in_process") if getattr(self, k) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ConfigError(f"give exactly one of grpc, http or in_process (got {got})")


@dataclass(frozen=True, kw_only=True)
class ConsoleTarget(Settings):
    """Where the stations report themselves for the service's console (``PUT /v1/stations/...``)
    every ``every_s`` seconds; ``token_env`` names the environment variable holding the service's
    admin token (a report is a write). Absent from a line file: the line's ``http`` service, if it
    has one."""

    url: str = setting(
        "",
        Check(_url, "must be an http:// or https:// URL"),
        description="The service whose console lists the stations (`PUT /v1/stations/...`).",
    )
    every_s: float = setting(2.0, Range(0.5, 600.0), description="Seconds between two reports of a station.")
    token_env: str | None = setting(
        None,
        Check(_text, "must name an environment variable"),
        description="Environment variable holding the service's admin token (a report is a write).",
    )


@dataclass(frozen=True, kw_only=True)
class FolderSource(Settings):
    """New files in a folder: a file counts once its size has stayed the same for ``settle_ms``
    (a file still being written is not read); ``after`` says what then happens to it."""

    kind: str = setting("folder", OneOf(("folder",), "source kind"), description="`folder`: new files in a folder.")
    path: str = setting("", Check(_text, "must name a folder"), description="The folder watched.")
    patterns: tuple[str, ...] = setting(
        ("*.png", "*.jpg", "*.jpeg", "*.bmp", "*.tif", "*.tiff"), many=True, description="File patterns read."
    )
    settle_ms: int = setting(
        500,
        Range(0, 600_000, int),
        description="A file counts once its size has not changed for this long (a file being written is not read).",
    )
    after: str = setting(
        "keep",
        OneOf(AFTER_READ, "after-read action"),
        description="What happens to a file once its part is safe: `keep`, `move` (to `move_to`) or `delete`.",
    )
    move_to: str | None = setting(
        None,
        Check(_text, "must name a folder"),
        description="The folder read files are moved to (needed exactly with `after: move`).",
    )

    def _check(self) -> None:
        if (self.after == "move") != (self.move_to is not None):
            raise ConfigError("move_to: needed exactly when after is 'move'")
        if not self.patterns or not all(_text(p) for p in self.patterns):
            raise ConfigError(
                f"source.patterns: must be a non-empty list of file patterns, got {list(self.patterns)!r}"
            )


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class MqttLogin(Settings):
    """A broker's login: ``username``, and the environment variable holding the password (a line
    file names it, never holds it). Without a username the client connects anonymously."""

    username: str | None = setting(
        None, Check(_text, "must be a user name"), description="The broker's user name; null: anonymous."
    )
    password_env: str | None = setting(
        None,
        Check(lambda v: isinstance(v, str) and bool(_ENV_NAME.fullmatch(v)), "must be an environment variable's name"),
        description="Environment variable holding the broker's password (a line file never holds it).",
    )

    def _check(self) -> None:
        if self.password_env is not None and self.username is None:
            raise ConfigError("password_env: give the username it is the password of")


@dataclass(frozen=True, kw_only=True)
class AravisSource(MqttLogin):
    """A GigE Vision / USB3 Vision camera through Aravis (``camera``: its Aravis id or a GigE
    camera's IP address; null: the first found). ``trigger``: ``software`` (at ``rate_hz``, or as
    fast as parts are scored), ``hardware`` (the camera's Line0), ``mqtt`` (a message on ``topic``
    at ``broker`` names each part) or ``opcua`` (each call of the station's OPC UA ``Trigger()``);
    station/camera.py says exactly what each does."""

    kind: str = setting(
        "aravis",
        OneOf(("aravis",), "source kind"),
        description="`aravis`: a GigE Vision or USB3 Vision camera through Aravis.",
    )
    camera: str | None = setting(
        None,
        Check(_text, "must be an Aravis camera id"),
        description="An Aravis device id or a GigE camera's IP address; null: the first camera found.",
    )
    trigger: str = setting(
        "software",
        OneOf(TRIGGERS, "trigger"),
        description=(
            "What takes a frame: `software` (at `rate_hz`, or as fast as parts are scored), `hardware` (the camera's "
            "Line0), `mqtt` (a message on `topic`) or `opcua` (each call of the station's OPC UA `Trigger()`)."
        ),
    )
    pixel_format: str = setting(
        "Mono8",
        OneOf(PIXEL_FORMATS, "pixel format"),
        description=(
            "The camera's pixel format; Bayer mosaics travel as they are and are demosaiced where they are scored."
        ),
    )
    exposure_us: float | None = setting(
        None, Range(1, 10_000_000), description="Exposure time in microseconds; null: the camera's own."
    )
    # With a software trigger: frames per second the station triggers at (null: as fast as scored).
    rate_hz: float | None = setting(
        None,
        Range(0.001, 10_000),
        description="With a software trigger: frames per second (null: as fast as parts are scored).",
    )
    # With trigger mqtt: each message on topic names a part, and the camera takes its frame.
    broker: str = setting(
        "127.0.0.1:1883", Check(_port, "must be host:port"), description="With trigger `mqtt`: the broker, `host:port`."
    )
    topic: str | None = setting(
        None,
        Check(_subscription, "must be a topic"),
        description="With trigger `mqtt`: each message on this topic names a part and takes its frame.",
    )

    def _check(self) -> None:
        super()._check()
        if (self.trigger == "mqtt") != (self.topic is not None):
            raise ConfigError("topic: needed exactly when trigger is 'mqtt' (the messages that name the parts)")
        if self.rate_hz is not None and self.trigger != "software":
            raise ConfigError(f"rate_hz: only with trigger 'software', not {self.trigger!r}")


@dataclass(frozen=True, kw_only=True)
class MqttSource(MqttLogin):
    """A trigger message on ``topic`` names the part and may carry the image or a path to it."""

    kind: str = setting(
        "mqtt",
        OneOf(("mqtt",), "source kind"),
        description="`mqtt`: a trigger message names the part and brings its frame.",
    )
    broker: str = setting("127.0.0.1:1883", Check(_port, "must be host:port"), description="The broker, `host:port`.")
    topic: str = setting(
        "", Check(_subscription, "must be a topic"), description="The topic (filter) the trigger messages arrive on."
    )
    payload: str = setting(
        "path",
        OneOf(MQTT_PAYLOADS, "payload"),
        description=(
            "What a message carries besides the part id: `path` (a file to read), `image` (the encoded image) or "
            "`none`."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class MqttSink(MqttLogin):
    """Results published to ``topic`` (QoS 1, a persistent session); the station's state retained
    on ``<topic>/state``."""

    kind: str = setting(
        "mqtt",
        OneOf(("mqtt",), "sink kind"),
        description="`mqtt`: each result published as JSON, QoS 1 on a persistent session.",
    )
    broker: str = setting("127.0.0.1:1883", Check(_port, "must be host:port"), description="The broker, `host:port`.")
    topic: str = setting(
        "",
        Check(_topic, "must be a topic without wildcards"),
        description="The topic results go to; the station's state is retained on `<topic>/state`.",
    )
    qos: int = setting(1, Range(0, 2, int), description="MQTT quality of service of the results.")
    client_id: str | None = setting(
        None,
        Check(_text, "must be a client id"),
        description="The MQTT client id (and the name of its on-disk outbox); null: derived from the station.",
    )


@dataclass(frozen=True, kw_only=True)
class OpcUaSink(Settings):
    """The station's last part, verdict, score, counter and state in an OPC UA server's address
    space (one server per ``endpoint``, shared by the stations that name it)."""

    kind: str = setting(
        "opcua",
        OneOf(("opcua",), "sink kind"),
        description="`opcua`: the station's last result in an OPC UA server's address space.",
    )
    endpoint: str = setting(
        "opc.tcp://127.0.0.1:4840",
        Check(_opc_endpoint, "must be opc.tcp://host:port[/path]"),
        description="The OPC UA server's endpoint (one server per endpoint, shared by the stations that name it).",
    )
    namespace: str = setting(
        "urn:hetmm-ray:station",
        Check(_text, "must be a namespace URI"),
        description="The namespace URI of the station's nodes.",
    )


@dataclass(frozen=True, kw_only=True)
class WebhookSink(Settings):
    """Each result POSTed as JSON to ``url``, retried with exponential backoff."""

    kind: str = setting(
        "webhook", OneOf(("webhook",), "sink kind"), description="`webhook`: each result POSTed as JSON."
    )
    url: str = setting(
        "", Check(_url, "must be an http:// or https:// URL"), description="The URL results are POSTed to."
    )
    retries: int = setting(
        5,
        Range(0, 100, int),
        description=(
            "Retries of a failed POST (408, 429, 5xx, connection errors) before it is given up with a line on stderr."
        ),
    )
    backoff_ms: int = setting(
        500, Range(1, 600_000, int), description="The first retry's pause; each next one doubles it."
    )


@dataclass(frozen=True, kw_only=True)
class LogSink(Settings):
    """Each result appended to a local CSV or Parquet log (``format`` from the suffix when null)."""

    kind: str = setting("log", OneOf(("log",), "sink kind"), description="`log`: each result appended to a local file.")
    path: str = setting("", Check(_text, "must name a file"), description="The log file (`.csv`, or `.parquet`).")
    format: str | None = setting(
        None, OneOf(LOG_FORMATS, "log format"), description="`csv` or `parquet`; null: from the file's suffix."
    )

    def _check(self) -> None:
        if self.format is None and not self.path.lower().endswith((".csv", ".parquet")):
            raise ConfigError(f"path: end it in .csv or .parquet, or give format, got {self.path!r}")


@dataclass(frozen=True, kw_only=True)
class QueueSettings(Settings):
    """The bounded on-disk queue of parts waiting for the service; full: new parts are refused
    loudly (never dropped silently)."""

    path: str | None = setting(
        None,
        Check(_text, "must name a folder"),
        description=(
            "The folder of the bounded on-disk queue of parts waiting for the service; null: `.hetmm-queue/<station>` "
            "beside the line file."
        ),
    )  # null: beside the line file
    max_parts: int = setting(
        10_000,
        Range(1, 10_000_000, int),
        description=(
            "Parts the queue holds at most; a full queue refuses a new part loudly (an `error` result), never silently."
        ),
    )


SOURCE_KINDS: dict[str, type[Settings]] = {"folder": FolderSource, "aravis": AravisSource, "mqtt": MqttSource}
SINK_KINDS: dict[str, type[Settings]] = {"mqtt": MqttSink, "opcua": OpcUaSink, "webhook": WebhookSink, "log": LogSink}


@dataclass(frozen=True, kw_only=True)
class StationHead(Settings):
    """A station's own settings besides its sections (``source``, ``sinks``, ``service``,
    ``queue``), which ``hetmm_ray.station.check`` builds one by one so that each one's problem
    is reported."""

    name: str = setting(
        "",
        Check(_station_name, "must be 1-64 letters, digits, '_' or '-'"),
        description="The station's name: 1-64 letters, digits, `_` or `-`, unique in the file.",
    )
    product: str = setting(
        "", Check(_text, "must name a product"), description="The product that scores the station's parts."
    )
    version: int | None = setting(
        None,
        Range(1, 1_000_000_000, int),
        description="A pinned product version (in-process service only); null: the product's live version.",
    )
    part_id: str | None = setting(
        None,
        OneOf(PART_IDS, "part id source"),
        description="Where a part's identity comes from: `trigger`, `file_name` or `counter`; null: the source's own.",
    )
    deadline_ms: int = setting(
        1000,
        Range(1, 3_600_000, int),
        description="A verdict later than this is published as `timeout`, and the real result follows marked late.",
    )


STATION_SECTIONS = ("source", "sinks", "service", "queue")
