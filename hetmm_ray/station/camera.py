"""A GigE Vision / USB3 Vision camera as a station's source, through Aravis.

Exact semantics:

- **Aravis** is reached through GObject introspection (``gi``, namespace ``Aravis`` 0.8): Debian's
  ``gir1.2-aravis-0.8`` and ``python3-gi``. Where ``gi`` cannot be imported in this Python (a
  virtual environment), the system's ``gi`` is used if it was built for this Python's version
  (:func:`aravis`); otherwise the source is refused, naming the packages to install.
- **Opening**: ``camera`` is an Aravis device id (``arv-tool-0.8`` lists them: a name such as
  ``Aravis-Fake-TEST1``, a serial number or an IP address); null opens the first camera found.
  The pixel format is set (one the camera does not offer is refused, naming those it offers),
  then ``exposure_us`` when given.
- **Trigger**: ``software``: one frame per software trigger. With ``rate_hz`` the station fires
  one that many times a second (a thread of its own, on schedule whatever the scoring does);
  without, one whenever no frame is awaited, so frames come as fast as parts are scored.
  ``hardware``: one frame per rising edge of the camera's ``Line0``. ``mqtt``: a message on
  ``topic`` (at ``broker``; QoS 1, a persistent session) names a part (``{"part_id": ...}``, the
  bare text, or else the topic's last level) and the station fires one software trigger for it;
  the frames come in trigger order, so each is the part of the oldest message still waiting. A
  trigger with no frame after ``AWAIT_S`` is fired again. A message is acknowledged to the broker
  only once its part is safe (scored or queued), so a station killed first gets it again.
  ``opcua``: each call of the ``Trigger()`` method of the station's OPC UA object (its ``opcua``
  sink, which it needs) fires one software trigger; the parts are counted.
- **Frames**: a thread takes the stream's buffers. A complete buffer becomes a :class:`Frame`
  whose data is a :class:`~hetmm_ray.data.raw_frame.RawFrame` of its pixels (copied; the buffer
  goes back to the stream at once: a frame is never encoded on the station), whose ``name`` is
  the camera's frame id and whose ``ref`` is ``aravis:<device id>#<frame id>@<timestamp ns>``
  (the camera's own id and timestamp). A part's id is its message's with ``trigger: mqtt``, else a
  counter by default (a camera's frame id restarts with the camera). An incomplete buffer (packets
  lost) is no part: it is counted in ``frames_dropped``, as is a frame that finds ``MAX_WAITING``
  frames already waiting (a camera outpacing the scoring is bounded, never memory that grows) and,
  with ``trigger: mqtt``, a frame no message asked for; each drop is a line on stderr.
- **Loss**: when the camera stops answering (its control lost: unplugged, powered off, the
  network gone; or a call to it fails), ``problem`` says why, :meth:`poll` returns nothing, and
  the camera is opened again every ``REOPEN_S`` until it answers (then ``problem`` is None). The
  station shows ``offline`` meanwhile; the other stations go on.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..config import ConfigError
from ..config.station import AravisSource
from ..data.raw_frame import RawFrame
from .sources import Frame

__all__ = ["MAX_WAITING", "REOPEN_S", "AravisFrames", "aravis"]

MAX_WAITING = 64  # frames taken but not yet handed to the station
REOPEN_S = 1.0  # how often a lost camera is opened again
BUFFERS = 8  # buffers the stream holds for the camera to fill
POP_S = 0.1  # how long the frame thread waits for a buffer before it looks at its state again
AWAIT_S = 2.0  # a software trigger with no frame after this long is given up (its frame was lost)
SYSTEM_GI = Path("/usr/lib/python3/dist-packages/gi")  # Debian's python3-gi
PACKAGES = "apt-get install gir1.2-aravis-0.8 python3-gi (Debian; aravis-tools for arv-tool-0.8)"


def aravis() -> Any:
    """The ``Aravis`` 0.8 namespace (module doc); ``ConfigError`` naming the packages when absent."""
    try:
        gi = importlib.import_module("gi")
    except ImportError:
        gi = _system_gi()
    try:
        gi.require_version("Aravis", "0.8")
        return importlib.import_module("gi.repository.Aravis")
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"source aravis: Aravis 0.8 is not installed ({exc}): {PACKAGES}") from None


def _system_gi() -> ModuleType:
    """The system's ``gi`` when it was built for this Python (same major and minor version)."""
    tag = sys.implementation.cache_tag  # e.g. cpython-311
    if not list(SYSTEM_GI.glob(f"_gi.{tag}-*.so")):
        raise ConfigError(f"source aravis: no GObject introspection (gi) for this Python ({tag}): {PACKAGES}")
    spec = importlib.util.spec_from_file_location(
        "gi", SYSTEM_GI / "__init__.py", submodule_search_locations=[str(SYSTEM_GI)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gi"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules["gi"]
        raise
    return module


def _pixel_formats(arv: Any) -> dict[int, str]:
    """Aravis's pixel format codes -> the names ``RawFrame`` reads."""
    return {
        arv.PIXEL_FORMAT_MONO_8: "Mono8",
        arv.PIXEL_FORMAT_MONO_16: "Mono16",
        arv.PIXEL_FORMAT_RGB_8_PACKED: "RGB8",
        arv.PIXEL_FORMAT_BAYER_RG_8: "BayerRG8",
        arv.PIXEL_FORMAT_BAYER_GR_8: "BayerGR8",
        arv.PIXEL_FORMAT_BAYER_GB_8: "BayerGB8",
        arv.PIXEL_FORMAT_BAYER_BG_8: "BayerBG8",
    }


class AravisFrames:
    """A camera's frames as a station's :class:`~.sources.Source` (see the module docstring)."""

    def __init__(self, cfg: AravisSource, station: str, *, client_id: str | None = None) -> None:
        self.cfg = cfg
        self.station = station
        self.arv = aravis()
        self.formats = _pixel_formats(self.arv)
        self.frames_dropped = 0
        self.problem: str | None = None
        self._waiting: deque[Frame] = deque()
        self._lock = threading.Lock()
        self._awaited_since: float | None = None  # a software trigger fired, its frame not yet here
        self._stop = threading.Event()
        self._camera: Any = None
        self._stream: Any = None
        self.device_id = ""
        self.default_part_id = "trigger" if cfg.trigger == "mqtt" else "counter"
        self.trigger_calls: Callable[[], int] | None = None  # trigger opcua: the calls so far (the runner's)
        self._calls_fired = 0
        self._asked: deque[Any] = deque()  # trigger messages not yet fired (trigger mqtt)
        self._fired: deque[tuple[float, Any]] = deque()  # (when, message) fired, their frame not yet here
        self._open()  # a camera that cannot be opened at the start is refused: the line file is wrong
        self._mqtt: Any = None
        if cfg.trigger == "mqtt":
            self._mqtt = self._subscribe(client_id or f"hetmm-{station}-camera-trigger")
        self._thread = threading.Thread(target=self._take_frames, name=f"camera-{station}", daemon=True)
        self._thread.start()
        self._trigger_thread: threading.Thread | None = None
        if cfg.trigger == "software" and cfg.rate_hz is not None:
            self._trigger_thread = threading.Thread(
                target=self._trigger_at_rate, name=f"trigger-{station}", daemon=True
            )
            self._trigger_thread.start()

    # --- the camera -------------------------------------------------------------------------
    def _open(self) -> None:
        arv, cfg = self.arv, self.cfg
        try:
            camera = arv.Camera.new(cfg.camera)
        except Exception as exc:  # noqa: BLE001 - GLib.Error: no such camera, no answer
            which = repr(cfg.camera) if cfg.camera else "(the first found)"
            raise ConfigError(f"source aravis: camera {which} cannot be opened: {_message(exc)}") from None
        offered = list(camera.dup_available_pixel_formats_as_strings())
        if cfg.pixel_format not in offered:
            which = camera.get_device_id()
            raise ConfigError(
                f"source aravis: camera {which!r} offers no {cfg.pixel_format}; it offers {', '.join(offered)}"
            )
        camera.set_pixel_format_from_string(cfg.pixel_format)
        if cfg.exposure_us is not None:
            camera.set_exposure_time(cfg.exposure_us)
        camera.set_trigger("Line0" if cfg.trigger == "hardware" else "Software")
        camera.get_device().connect("control-lost", self._control_lost)
        stream = camera.create_stream(None, None)
        size = camera.get_payload()
        for _ in range(BUFFERS):
            stream.push_buffer(arv.Buffer.new_allocate(size))
        camera.start_acquisition()
        self._camera, self._stream, self.device_id = camera, stream, camera.get_device_id()

    def _control_lost(self, *_: Any) -> None:  # Aravis's heartbeat thread
        self._lose("the camera's control was lost (unplugged, powered off or unreachable)")

    def _lose(self, why: str) -> None:
        if self.problem is None:
            self.problem = why
            print(f"hetmm station {self.station}: camera {self.device_id!r}: {why}", file=sys.stderr, flush=True)

    def _close_camera(self) -> None:
        camera, self._camera, self._stream = self._camera, None, None
        if camera is not None:
            try:
                camera.stop_acquisition()
            except Exception:  # noqa: BLE001 - a lost camera cannot be told to stop
                pass

    def _reopen(self) -> None:
        self._close_camera()
        try:
            self._open()
        except ConfigError:
            return  # still away: tried again after REOPEN_S
        self.problem = None
        self._awaited_since = None
        print(f"hetmm station {self.station}: camera {self.device_id!r} is back", file=sys.stderr, flush=True)

    def _subscribe(self, client_id: str) -> Any:
        from .mqtt_sink import trigger_subscriber

        who = f"the camera trigger's client {client_id}"
        client, self.subscribed, _ = trigger_subscriber(client_id, self.cfg, self._on_message, who)
        return client

    def _on_message(self, _client: Any, _userdata: Any, msg: Any) -> None:  # paho's network thread
        with self._lock:
            self._asked.append(msg)

    # --- the frame thread -------------------------------------------------------------------
    def _take_frames(self) -> None:
        while not self._stop.is_set():
            if self.problem is not None:
                self._reopen()
                if self.problem is not None:
                    self._stop.wait(REOPEN_S)
                continue
            stream = self._stream
            buffer = stream.timeout_pop_buffer(int(POP_S * 1e6)) if stream is not None else None
            if buffer is None:
                continue
            try:
                self._take(buffer)
            finally:
                stream.push_buffer(buffer)

    def _take(self, buffer: Any) -> None:
        frame_id = buffer.get_frame_id()
        if buffer.get_status() != self.arv.BufferStatus.SUCCESS:
            self._drop(f"frame {frame_id} incomplete ({buffer.get_status().value_nick})")
            return
        fmt = self.formats.get(buffer.get_image_pixel_format())
        if fmt is None:
            self._drop(f"frame {frame_id} in pixel format {buffer.get_image_pixel_format():#x}, which is not read")
            return
        raw = RawFrame(buffer.get_image_width(), buffer.get_image_height(), fmt, bytes(buffer.get_data()))
        ref = f"aravis:{self.device_id}#{frame_id}@{buffer.get_timestamp()}"
        with self._lock:
            self._awaited_since = None
            message = None
            if self._mqtt is not None:
                if not self._fired:  # a frame no message asked for
                    self.frames_dropped += 1
                    print(f"hetmm station {self.station}: {ref} dropped: no trigger asked for it", file=sys.stderr)
                    return
                message = self._fired.popleft()[1]
            if len(self._waiting) >= MAX_WAITING:
                self.frames_dropped += 1
                full = True
            else:
                part = None if message is None else _part_of(message)
                self._waiting.append(Frame(ref=ref, name=str(frame_id), part_id=part, data=raw, token=message))
                full = False
        if full:
            print(f"hetmm station {self.station}: {ref} dropped: {MAX_WAITING} frames wait already", file=sys.stderr)

    def _drop(self, why: str) -> None:
        with self._lock:
            self.frames_dropped += 1
            self._awaited_since = None
        print(f"hetmm station {self.station}: camera {self.device_id!r}: {why}; dropped", file=sys.stderr)

    def _trigger(self) -> None:
        camera = self._camera
        if camera is None or self.problem is not None:
            return
        try:
            camera.software_trigger()
        except Exception as exc:  # noqa: BLE001 - GLib.Error: the camera is gone
            self._lose(f"the software trigger failed: {_message(exc)}")

    def _trigger_at_rate(self) -> None:
        assert self.cfg.rate_hz is not None
        period, start = 1.0 / self.cfg.rate_hz, time.monotonic()
        for k in itertools.count(1):
            self._trigger()
            if self._stop.wait(max(0.0, start + k * period - time.monotonic())):
                return

    # --- the Source interface ---------------------------------------------------------------
    def poll(self) -> list[Frame]:
        if self._mqtt is not None:
            self._fire_asked()
        if self.trigger_calls is not None:
            calls = self.trigger_calls()
            for _ in range(calls - self._calls_fired):
                self._trigger()
            self._calls_fired = calls
        with self._lock:
            ready = list(self._waiting)
            self._waiting.clear()
            now = time.monotonic()
            expired = self._awaited_since is not None and now - self._awaited_since > AWAIT_S
            fire = self.cfg.trigger == "software" and self.cfg.rate_hz is None and not ready
            fire = fire and (self._awaited_since is None or expired)
            if fire:
                self._awaited_since = now
        if fire:
            self._trigger()
        return ready

    def _fire_asked(self) -> None:
        """One software trigger per new message, and again for one whose frame is overdue."""
        now = time.monotonic()
        with self._lock:
            asked, self._asked = list(self._asked), deque()
            overdue = bool(self._fired) and now - self._fired[0][0] > AWAIT_S
            if overdue:  # its frame was lost: fired again, still first in line
                self._fired[0] = (now, self._fired[0][1])
            self._fired.extend((now, m) for m in asked)
        for _ in range(len(asked) + overdue):
            self._trigger()

    def read(self, frame: Frame) -> RawFrame:
        assert isinstance(frame.data, RawFrame)
        return frame.data

    def done(self, frame: Frame) -> None:
        if frame.token is not None:  # its trigger message: acknowledged once the part is safe
            self._mqtt.ack(frame.token.mid, frame.token.qos)

    def refused(self, frame: Frame) -> None:
        pass  # a camera cannot keep a frame: the station's error result says the part was refused

    def close(self) -> None:
        if self._mqtt is not None:
            self._mqtt.disconnect()
            self._mqtt.loop_stop()
        self._stop.set()
        self._thread.join(timeout=5)
        if self._trigger_thread is not None:
            self._trigger_thread.join(timeout=5)
        self._close_camera()


def _part_of(msg: Any) -> str:
    """A trigger message's part id: ``{"part_id": ...}``, the bare text, else the topic's last level."""
    text = bytes(msg.payload).decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("part_id") is not None:
        return str(body["part_id"])
    return text if text and not isinstance(body, dict) else msg.topic.rsplit("/", 1)[-1]


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)
