"""Running a station: frames from its source, scored on its service, results to its sinks.

Exact semantics (built: the folder, MQTT trigger and Aravis camera sources
(``camera.py``), the in-process, HTTP and gRPC services, the log sink, the MQTT, webhook and OPC UA
sinks (``mqtt_sink.py``, ``webhook_sink.py``, ``opcua_sink.py``); the other kinds of
``config.station`` are refused by :func:`build_station` with a line saying they are not built yet):

- **Sources** (``sources.py``): the :class:`~.sources.Source` interface a line's own source
  implements, the watched folder (:class:`~.sources.FolderFrames`: complete files only, in name
  order; keep, move or delete once done) and the MQTT trigger (:class:`~.sources.MqttTriggers`).
  A frame is let go by its source (moved, deleted, acknowledged) only once its result is out or
  it waits in the on-disk queue.
- **Part identity**: the file's name without its suffix (``file_name``, the folder's default), the
  trigger's own (``trigger``, the default of a source whose frames carry one) or a counter from 1
  (``counter``; it goes on from its last number after a restart). A frame that cannot be read is
  an ``error`` result.
- **A killed station** (SIGKILL, power) loses no part. A frame is let go only once its part waits
  in the queue or its final result is out; with an MQTT sink, "out" means in the sink's on-disk
  outbox (``outbox.py``), whose unacknowledged results go out first at the next start. The source
  then offers again (``Frame.replayed``) only frames that were not let go; one whose final result
  is in an outbox already, or whose part waits in the queue, is let go without being scored again
  (said on stderr), and a queued part whose result is in an outbox leaves the queue. So on MQTT
  every part has one final result across a kill (a second copy only when the broker received it
  but the station died before reading the broker's acknowledgement: QoS 1). The log, webhook and
  OPC UA sinks hold no outbox: a station without an MQTT sink scores such a frame again.
- **Deadline**: a part whose verdict has not come ``deadline_ms`` after its frame was taken is
  published with status ``timeout`` (no verdict) at that moment; its real result follows when it
  comes, with ``late`` true. A frame the service could not score is published with status ``error``
  and the reason.
- **Queue**: when the service is away (:class:`ServiceUnavailable`: for HTTP a connection error,
  a timeout or a 429, 502, 503 or 504), the part is published as ``timeout`` at once (it cannot
  make its deadline) and waits in the station's on-disk queue (``part_queue.py``: order kept,
  whole parts across a SIGKILL, at most ``queue.max_parts``); every new part goes behind the
  waiting ones. Queued parts are scored oldest first as soon as the service answers again (asked
  every ``RETRY_S``), their results ``late``. A full queue refuses the new part loudly (an
  ``error`` result naming the bound, a line on stderr) and leaves its file where it is. A
  frame's file is moved or deleted only once its result is out or it is in the queue.
- **Result** (:class:`PartResult`, also the sinks' JSON and log columns): station, part id, the
  part's ``status`` (``scored``, ``timeout`` or ``error``: hetmm_ray/result.py ``PART_STATUSES``),
  product, latency ms (frame taken to verdict), the frame's reference (its path), late, error, and
  the fields of the one result record (hetmm_ray/result.py, docs/result-record.md: ``record_version``,
  ``score``, ``threshold``, ``is_anomaly``, ``verdict`` ``ok | review | reject``, ``review_threshold``,
  the rule fields, ``version``) as the service answered them; all None unless ``scored``. The
  in-process service builds the record with the product's review band, as the service does.
- **In-process service**: the product's detector loaded from the store (the pinned version, or
  HEAD, looked up again before every part so a hot update or a promote is seen by the next part
  without a restart; a new version is loaded once). **HTTP service**: ``POST
  /v1/products/{product}/predict`` with the file's bytes (a raw frame is encoded to PNG first:
  HTTP takes files). **gRPC service**: ``hetmm.v1.Inspection.Predict`` with the file's bytes, or
  a source's raw frame as pixels (never encoded on the station); the service is away when the
  call is refused UNAVAILABLE, DEADLINE_EXCEEDED, NOT_FOUND by Serve's proxy (a restarted service
  whose gRPC application is not deployed yet: ``serve.grpc.client.service_away``), or
  RESOURCE_EXHAUSTED for anything but the request's own size. HTTP and gRPC score the product's
  HEAD, so a pinned version is refused there.
"""

from __future__ import annotations

import csv
import itertools
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ..config import ConfigError
from ..config.station import FolderSource, LogSink, MqttSink, MqttSource, OpcUaSink, ServiceTarget, WebhookSink
from ..data.raw_frame import RawFrame
from ..errors import HetmmError
from ..result import RECORD_FIELDS, result_records, review_threshold_of
from .check import Station
from .metrics import StationMetrics
from .part_queue import PartQueue, QueueFull
from .sources import FolderFrames, Frame, MqttTriggers, Source

__all__ = [
    "FolderFrames",
    "GrpcService",
    "HttpService",
    "InProcessService",
    "LogWriter",
    "PartResult",
    "Scored",
    "ServiceUnavailable",
    "StationRunner",
    "build_station",
]

POLL_S = 0.05  # how often a folder is listed
RETRY_S = 1.0  # how often a station with parts queued asks an absent service again
RETRY_STATUS = frozenset({429, 502, 503, 504})  # answers that mean "later", not "never"
RECENT_RESULTS = 1000  # results a runner keeps in memory (the sinks have them all)


class ServiceUnavailable(HetmmError):
    """The service could not be reached, or refused with a status worth retrying: the part waits
    in the station's queue."""


Scored = dict[str, Any]
"""What a service answered for one frame: its result record (``result.RECORD_FIELDS``)."""


@dataclass(frozen=True)
class PartResult:
    station: str
    part_id: str
    status: str  # scored | timeout | error (result.PART_STATUSES)
    product: str
    latency_ms: float
    frame: str
    late: bool = False
    error: str | None = None
    # The result record (hetmm_ray/result.py) of a scored part, as its service answered; None otherwise.
    record_version: int | None = None
    score: float | None = None
    threshold: float | None = None
    is_anomaly: bool | None = None
    verdict: str | None = None  # ok | review | reject
    review_threshold: float | None = None
    threshold_rule: str | None = None
    rule_target: float | None = None
    estimated_false_alarm_rate: float | None = None
    version: int | None = None
    # Not part of the payload: which frame of its source this is the result of (the frame's
    # reference and its trigger's own part id), for the MQTT sink's outbox (``outbox.py``).
    key: str = field(default="", repr=False, compare=False)

    @property
    def outcome(self) -> str:
        """What the part is counted as (``result.PART_OUTCOMES``): its verdict once scored, else its status."""
        return self.verdict if self.status == "scored" and self.verdict is not None else self.status

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["key"]
        return out


FIELDS = tuple(name for name in PartResult.__dataclass_fields__ if name != "key")


class Service(Protocol):
    def score(self, frame: bytes | RawFrame) -> Scored: ...


class Sink(Protocol):
    """Where results go; a sink that shows the station's state also has ``show_state(state)``,
    called when it changes (``ok``, ``degraded``, ``offline``)."""

    def publish(self, result: PartResult) -> None: ...

    def close(self) -> None: ...


# --- services ----------------------------------------------------------------------------
class InProcessService:
    """The product's detector in this process (see the module docstring)."""

    def __init__(self, store_uri: str, product: str, version: int | None) -> None:
        from ..store import open_store

        self.store = open_store(store_uri)
        self.product = product
        self.pinned = version
        self._loaded: tuple[int, Any, float | None] | None = None  # version, its detector, its review band
        self._lock = threading.Lock()

    def _detector(self) -> tuple[Any, float | None]:
        from ..detection.detector_choice import load_detector

        version = self.pinned if self.pinned is not None else self.store.head(self.product)
        if self._loaded is None or self._loaded[0] != version:
            detector = load_detector(self.store, self.product, version, progress=False)
            self._loaded = (version, detector, review_threshold_of(detector))
        return self._loaded[1], self._loaded[2]

    def score(self, frame: bytes | RawFrame) -> Scored:
        image = frame.to_rgb() if isinstance(frame, RawFrame) else frame
        with self._lock:  # one part at a time per station: parts are scored in order
            detector, review = self._detector()
            p = detector.predict([image])
        return result_records(p, review_threshold=review)[0]


class HttpService:
    """``POST /v1/products/{product}/predict`` on the service at ``url``."""

    def __init__(self, url: str, product: str, timeout_s: float) -> None:
        import httpx

        self.product = product
        self.client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s)

    def score(self, frame: bytes | RawFrame) -> Scored:
        import httpx

        try:
            r = self.client.post(
                f"/v1/products/{self.product}/predict",
                content=frame.to_png() if isinstance(frame, RawFrame) else frame,
                headers={"content-type": "application/octet-stream"},
            )
        except httpx.TransportError as exc:  # refused, reset, timed out: the service is away
            raise ServiceUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code in RETRY_STATUS:
            raise ServiceUnavailable(f"HTTP {r.status_code}")
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        body = r.json()
        return {k: body.get(k) for k in RECORD_FIELDS}


class GrpcService:
    """``hetmm.v1.Inspection.Predict`` on the service at ``target`` (see the module docstring)."""

    SIZE_CODES = frozenset({"too_large", "too_many_images"})  # RESOURCE_EXHAUSTED that waiting never cures

    def __init__(self, target: str, product: str, timeout_s: float) -> None:
        from ..serve.grpc.client import InspectionClient

        self.product = product
        self.client = InspectionClient(target, timeout=timeout_s, wait_s=0)  # the station's queue waits

    def score(self, frame: bytes | RawFrame) -> Scored:
        import grpc

        from ..serve.grpc.client import error_code, service_away
        from ..serve.grpc.messages import record_of

        try:
            reply = self.client.predict(self.product, [("frame", frame)])
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            away = service_away(exc) or code == grpc.StatusCode.DEADLINE_EXCEEDED
            away = away or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and error_code(exc) not in self.SIZE_CODES)
            if away:
                raise ServiceUnavailable(f"gRPC {code.name}: {exc.details()}") from exc  # type: ignore[attr-defined]
            raise RuntimeError(f"gRPC {code.name}: {exc.details()}") from None  # type: ignore[attr-defined]
        return record_of(reply.results[0])


# --- sinks -------------------------------------------------------------------------------
class LogWriter:
    """Results appended to a CSV file, one row each, written through at once (a header when new)."""

    def __init__(self, cfg: LogSink, base: Path) -> None:
        fmt = cfg.format or Path(cfg.path).suffix.lower().lstrip(".")
        if fmt != "csv":
            raise ConfigError(f"sink log: {fmt} logs are not built yet; use a .csv path")
        self.path = base / cfg.path
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = self.path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=FIELDS)
        if new:
            self._csv.writeheader()
            self._file.flush()
        self._lock = threading.Lock()

    def publish(self, result: PartResult) -> None:
        with self._lock:
            self._csv.writerow(result.to_dict())
            self._file.flush()

    def close(self) -> None:
        self._file.close()


# --- the station -------------------------------------------------------------------------
def _service(target: ServiceTarget, station: Station, base: Path) -> Service:
    if target.in_process is not None:
        uri = target.in_process if "://" in target.in_process else str(base / target.in_process)
        return InProcessService(uri, station.head.product, station.head.version)
    kind = "HTTP" if target.http is not None else "gRPC"
    if station.head.version is not None:
        raise ConfigError(
            f"station {station.head.name!r}: the {kind} service scores the product's live version; "
            "a pinned version needs service in_process"
        )
    if target.http is not None:
        return HttpService(target.http, station.head.product, target.timeout_ms / 1000)
    assert target.grpc is not None  # ServiceTarget: exactly one of the three
    return GrpcService(target.grpc, station.head.product, target.timeout_ms / 1000)


def _sink(sink: Any, station: Station, base: Path, line: str, queue_folder: Path) -> Sink:
    if isinstance(sink, LogSink):
        return LogWriter(sink, base)
    if isinstance(sink, MqttSink):
        from .mqtt_sink import MqttPublisher

        return MqttPublisher(sink, station=station.head.name, line=line, outbox_in=queue_folder)
    if isinstance(sink, WebhookSink):
        from .webhook_sink import WebhookPoster

        return WebhookPoster(sink)
    if isinstance(sink, OpcUaSink):
        from .opcua_sink import OpcUaStation

        return OpcUaStation(sink, station=station.head.name)
    raise ConfigError(f"station {station.head.name!r}: sink {sink.kind} is not built yet")


def build_station(station: Station, base: Path, *, line: str = "line") -> StationRunner:
    """A runner for ``station`` (a checked line file's, ``base`` its folder, ``line`` its name);
    kinds not built yet are refused here, before anything starts."""
    name = station.head.name
    for sink in station.sinks:
        if not isinstance(sink, LogSink | MqttSink | OpcUaSink | WebhookSink):
            raise ConfigError(f"station {name!r}: sink {sink.kind} is not built yet")
    service = _service(station.service, station, base)
    queue = PartQueue(base / (station.queue.path or f".hetmm-queue/{name}"), station.queue.max_parts)
    sinks: list[Sink] = []
    try:
        for sink in station.sinks:
            sinks.append(_sink(sink, station, base, line, queue.folder))
    except BaseException:
        for made in sinks:  # an MQTT client or an OPC UA server already started
            made.close()
        raise
    source: Source
    try:
        if isinstance(station.source, FolderSource):
            source = FolderFrames(station.source, base)
        elif isinstance(station.source, MqttSource):
            source = MqttTriggers(station.source, base, client_id=f"hetmm-{line}-{name}-trigger")
        else:
            from .camera import AravisFrames  # GObject introspection only where a camera is used
            from .opcua_sink import OpcUaStation

            plc = [s for s in sinks if isinstance(s, OpcUaStation)]
            if station.source.trigger == "opcua" and not plc:
                raise ConfigError(
                    f"station {name!r}: source aravis with trigger opcua needs an opcua sink "
                    "(its Trigger() method fires the camera)"
                )
            source = AravisFrames(station.source, name, client_id=f"hetmm-{line}-{name}-camera-trigger")
            if station.source.trigger == "opcua":
                source.trigger_calls = lambda: plc[0].triggers
    except BaseException:
        for made in sinks:
            made.close()
        raise
    return StationRunner(station, source, service, sinks, queue)


def _error(outcome: Future[Scored]) -> BaseException | None:
    """The scoring's exception once it has finished (None: it scored)."""
    try:
        outcome.result()
    except Exception as exc:  # noqa: BLE001 - the caller decides what each error means
        return exc
    return None


class StationRunner:
    """One station's loop: :meth:`step` takes every complete new frame once; :meth:`run` steps
    until ``stop`` is set."""

    def __init__(self, station: Station, source: Source, service: Service, sinks: list[Sink], queue: PartQueue) -> None:
        self.station = station
        self.queue = queue
        self._retry_at = 0.0  # monotonic time of the next try of an absent service
        self.source = source
        self.service = service
        self.sinks = sinks
        # The counter rule's last number, on disk beside the queue: a restarted station goes on
        # counting (a PLC never sees a part id twice).
        self._count_file = queue.folder / "counter"
        last = self._count_file.read_text().strip() if self._count_file.exists() else ""
        self._counter = itertools.count(int(last) + 1 if last.isdigit() else 1)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"station-{station.head.name}")
        # The newest results (bounded: memory does not grow with the parts) and a count per outcome
        # (a scored part's verdict, another's status).
        self.recent: deque[PartResult] = deque(maxlen=RECENT_RESULTS)
        self.counts: Counter[str] = Counter()
        self.on_result: Callable[[PartResult], None] | None = None  # e.g. the CLI's printing
        self.metrics: StationMetrics | None = None  # /metrics (station.metrics), when served
        self._shown_state = "ok"  # what the sinks show (each starts at ok)
        # Frames already handled before this start (a station killed between publishing a result, or
        # queueing its part, and letting its frame go): their final result is out or they wait in the
        # queue, so when their source offers them again they are let go, not scored twice.
        self._out_before: frozenset[str] = frozenset().union(
            *(sink.published_keys() for sink in sinks if hasattr(sink, "published_keys"))
        )
        self._queued_before = frozenset(queue.keys())

    def _part_id(self, frame: Frame) -> str:
        own = getattr(self.source, "default_part_id", None)  # a camera's: a counter
        rule = self.station.head.part_id or own or ("trigger" if frame.part_id is not None else "file_name")
        if rule == "counter":
            n = next(self._counter)
            tmp = self._count_file.with_name("counter.tmp")
            tmp.write_text(str(n))
            tmp.replace(self._count_file)
            return str(n)
        if rule == "trigger" and frame.part_id is not None:
            return frame.part_id
        return frame.name

    def _handled(self, key: str, what: str, *, queued_too: bool) -> bool:
        """True (said on stderr) when ``key``'s frame had its final result out before this start (or,
        ``queued_too``, was waiting in the queue)."""
        if key not in self._out_before and not (queued_too and key in self._queued_before):
            return False
        print(f"hetmm station {self.station.head.name}: {what} was handled before the restart", file=sys.stderr)
        return True

    def _publish(self, result: PartResult) -> None:
        self.recent.append(result)
        self.counts[result.outcome] += 1
        for sink in self.sinks:
            sink.publish(result)
        if self.on_result is not None:  # after the sinks: what is printed is out
            self.on_result(result)
        if self.metrics is not None:
            self.metrics.result(result)
            self.report()

    @property
    def state(self) -> str:
        """``offline`` (the source has a ``problem``: a camera gone), ``degraded`` (parts waiting for
        an absent service, or a sink with a ``problem``: a broker refusing its login) or ``ok``."""
        if getattr(self.source, "problem", None):
            return "offline"
        if len(self.queue) or any(getattr(sink, "problem", None) for sink in self.sinks):
            return "degraded"
        return "ok"

    def report(self, state: str | None = None) -> None:
        """The station's state and queue depth into its metrics (when served), and the state, when it
        changed, to every sink that shows one (``show_state``: the MQTT sink's retained state topic,
        the OPC UA sink's ``State``)."""
        now = state or self.state
        if self.metrics is not None:
            self.metrics.station(self.station.head.name, state=now, queued=len(self.queue))
        if now != self._shown_state:
            self._shown_state = now
            for sink in self.sinks:
                show = getattr(sink, "show_state", None)
                if show is not None:
                    show(now)

    def _result(self, part: str, frame: str, taken: float, outcome: Future[Scored], *, late: bool) -> PartResult:
        head = self.station.head
        base: dict[str, Any] = {
            "station": head.name,
            "part_id": part,
            "product": head.product,
            "frame": frame,
            "late": late,
        }
        try:
            s = outcome.result()
        except Exception as exc:  # noqa: BLE001 - the part is published with the reason, the station goes on
            latency = round(1000 * (time.monotonic() - taken), 3)
            return PartResult(**base, status="error", latency_ms=latency, error=str(exc))
        latency = round(1000 * (time.monotonic() - taken), 3)  # frame taken to verdict
        record: dict[str, Any] = {k: s.get(k) for k in RECORD_FIELDS}
        return PartResult(**base, status="scored", latency_ms=latency, **record)

    def _one(self, item: Frame) -> None:
        head = self.station.head
        if item.replayed and self._handled(item.key, f"frame {item.ref}", queued_too=True):
            self.source.done(item)
            return
        taken, taken_unix = time.monotonic(), time.time()
        part = self._part_id(item)
        try:
            frame = self.source.read(item)
        except OSError as exc:  # gone or unreadable: said, never skipped silently
            self._publish(self._failed(part, item.ref, taken, f"{type(exc).__name__}: {exc}"))
            return
        if len(self.queue):  # parts are waiting: this one goes behind them (order kept)
            self._wait_in_queue(part, frame, item, taken, taken_unix, announced=False)
            return
        outcome = self._pool.submit(self.service.score, frame)
        late = False
        try:
            outcome.result(timeout=head.deadline_ms / 1000)
        except FutureTimeout:
            late = True
            self._publish(self._timeout(part, item.ref, taken))
        except Exception:  # noqa: BLE001 - ServiceUnavailable below, anything else an error result
            pass
        if isinstance(_error(outcome), ServiceUnavailable):
            self._retry_at = time.monotonic() + RETRY_S
            self._wait_in_queue(part, frame, item, taken, taken_unix, announced=late)
            return
        self._publish(replace(self._result(part, item.ref, taken, outcome, late=late), key=item.key))
        self.source.done(item)

    def _failed(self, part: str, ref: str, taken: float, why: str) -> PartResult:
        head = self.station.head
        latency = round(1000 * (time.monotonic() - taken), 3)
        return PartResult(
            station=head.name,
            part_id=part,
            status="error",
            product=head.product,
            latency_ms=latency,
            frame=ref,
            error=why,
        )

    def _timeout(self, part: str, frame: str, taken: float) -> PartResult:
        head = self.station.head
        latency = round(1000 * (time.monotonic() - taken), 3)
        return PartResult(
            station=head.name, part_id=part, status="timeout", product=head.product, latency_ms=latency, frame=frame
        )

    def _wait_in_queue(
        self, part: str, frame: bytes | RawFrame, item: Frame, taken: float, taken_unix: float, *, announced: bool
    ) -> None:
        """Into the on-disk queue (then ``timeout`` is published, unless it was already, and the
        source may let the frame go); a full queue refuses the part loudly instead (an error
        result, a line on stderr) and the source keeps the frame (``Source.refused``)."""
        head = self.station.head
        try:
            self.queue.put(part, frame, item.ref, taken_unix, item.key)
        except QueueFull as exc:
            print(f"hetmm station {head.name}: part {part!r} refused: {exc}", file=sys.stderr, flush=True)
            self._publish(self._failed(part, item.ref, taken, str(exc)))
            self.source.refused(item)
            return
        if not announced:
            self._publish(self._timeout(part, item.ref, taken))
        self.source.done(item)

    def drain(self) -> int:
        """Score queued parts, oldest first, while the service answers; returns how many left."""
        done = 0
        while len(self.queue) and time.monotonic() >= self._retry_at:
            item = self.queue.head()
            assert item is not None
            # its result was out before a restart that came before its pop
            if item.key and self._handled(item.key, f"queued part {item.part_id!r}", queued_too=False):
                self.queue.pop()
                continue
            taken = time.monotonic() - max(0.0, time.time() - item.taken_unix)
            outcome = self._pool.submit(self.service.score, item.frame)
            if isinstance(_error(outcome), ServiceUnavailable):
                self._retry_at = time.monotonic() + RETRY_S
                break
            self._publish(replace(self._result(item.part_id, item.frame_ref, taken, outcome, late=True), key=item.key))
            self.queue.pop()
            self.report()
            done += 1
        return done

    def step(self) -> int:
        """Score queued parts the service can take now, then every frame that became complete;
        returns how many parts were handled."""
        done = self.drain()
        ready = self.source.poll()
        for item in ready:
            self._one(item)
        self.report()
        return done + len(ready)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                if not self.step():
                    stop.wait(POLL_S)
        finally:
            self.close()

    def close(self) -> None:
        self.report("offline")
        self.source.close()
        self._pool.shutdown(wait=True)
        for sink in self.sinks:
            sink.close()
