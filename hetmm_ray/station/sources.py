"""Where a station's frames come from: the :class:`Source` interface and the sources built on it.

Exact semantics of the interface (a line's own source implements these four calls; the runner
calls them from one thread):

- :meth:`Source.poll` returns the frames that are ready now (possibly none), oldest first, each
  once, without blocking for long (the runner polls every ``runner.POLL_S``).
- :meth:`Source.read` returns a frame's encoded bytes (a source may hold them, or read them from
  where the frame's ``ref`` says), or a camera's pixels as a ``data.raw_frame.RawFrame``: those go
  to a gRPC service as they are, never encoded on the station.
- :meth:`Source.done` is called once the frame is safe: its result is out, or it waits in the
  station's on-disk queue. Only then may the source let it go (move or delete a file,
  acknowledge a message).
- :meth:`Source.refused` is called instead when the station cannot take the frame (its queue is
  full): the source must keep it where it came from.
- :meth:`Source.close` releases what the source holds.

The folder source (:class:`FolderFrames`) is the worked example; :class:`MqttTriggers` takes frames
named by MQTT messages.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..config.station import FolderSource, MqttSource
from ..data.raw_frame import RawFrame

__all__ = ["FolderFrames", "Frame", "MqttTriggers", "Source"]


@dataclass(frozen=True)
class Frame:
    """One frame a source offers: ``ref`` says where it came from (a path; ``mqtt:<topic>``),
    ``name`` is its part id under the ``file_name`` rule, ``part_id`` the trigger's own (None: it
    has none), ``data`` its bytes (or raw pixels) when the source holds them, ``token`` the
    source's own handle; ``replayed``: offered again after a restart of the station (a file that
    was in the folder when it started, a message the broker delivers again), so it may be a frame
    whose result was already out (the runner checks its :attr:`key`)."""

    ref: str
    name: str
    part_id: str | None = None
    data: bytes | RawFrame | None = None
    token: Any = None
    replayed: bool = False

    @property
    def key(self) -> str:
        """Which frame of its source this is: its reference and its trigger's own part id."""
        return f"{self.ref}#{self.part_id or ''}"


class Source(Protocol):
    def poll(self) -> list[Frame]: ...

    def read(self, frame: Frame) -> bytes | RawFrame: ...

    def done(self, frame: Frame) -> None: ...

    def refused(self, frame: Frame) -> None: ...

    def close(self) -> None: ...


class FolderFrames:
    """New, complete files of a folder.

    A file whose name matches one of ``patterns`` and whose size and modification time have not
    changed for ``settle_ms`` is complete (a file still being written is not read). With ``after:
    keep`` only files that appear after the station started are new (a restart does not score a
    folder's history again); with ``move`` or ``delete`` every file there is new, since a file left
    there was not handled. Complete files are taken in name order. Once done, a file is kept,
    moved to ``move_to`` (an existing name there gets a numbered suffix: nothing is overwritten)
    or deleted; a refused file stays where it is (and is offered again after a restart).
    """

    def __init__(self, cfg: FolderSource, base: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.folder = base / cfg.path
        self.move_to = None if cfg.move_to is None else base / cfg.move_to
        self.clock = clock
        self._pending: dict[Path, tuple[tuple[int, int], float]] = {}  # path -> (size, mtime_ns), since
        at_start = set(self._listing())
        # keep: what was there is history; move or delete: what is there was not handled (or its
        # result was out when the station was killed before moving it: offered as replayed)
        self._seen: set[Path] = at_start if cfg.after == "keep" else set()
        self._at_start = set() if cfg.after == "keep" else at_start

    def _listing(self) -> list[Path]:
        return sorted(
            p
            for p in self.folder.iterdir()
            if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in self.cfg.patterns)
        )

    def poll(self) -> list[Frame]:
        """The files that became complete since the last call, in name order."""
        now = self.clock()
        ready = []
        for path in self._listing():
            if path in self._seen:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            mark = (st.st_size, st.st_mtime_ns)
            last = self._pending.get(path)
            if last is None or last[0] != mark:
                self._pending[path] = (mark, now)
                if self.cfg.settle_ms > 0:
                    continue
            elif 1000 * (now - last[1]) < self.cfg.settle_ms:
                continue
            ready.append(path)
        for path in ready:
            self._pending.pop(path, None)
            self._seen.add(path)
        return [Frame(ref=str(p), name=p.stem, token=p, replayed=p in self._at_start) for p in ready]

    def read(self, frame: Frame) -> bytes:
        return frame.token.read_bytes()

    def done(self, frame: Frame) -> None:
        """What ``after`` says, once the file's result is out (or it is queued)."""
        path: Path = frame.token
        if self.cfg.after == "delete":
            path.unlink(missing_ok=True)
        elif self.cfg.after == "move" and self.move_to is not None:
            target = self.move_to / path.name
            for n in itertools.count(1):
                if not target.exists():
                    break
                target = self.move_to / f"{path.stem}.{n}{path.suffix}"
            path.replace(target)
        if self.cfg.after != "keep":
            self._seen.discard(path)
            self._at_start.discard(path)  # a new file of that name is a new part

    def refused(self, frame: Frame) -> None:
        """The file stays; it is not offered again until the station restarts."""

    def close(self) -> None:
        pass


class MqttTriggers:
    """Frames named by MQTT messages on ``cfg.topic`` (a topic filter; QoS 1, persistent session).

    ``payload: path``: the message is ``{"part_id": ..., "path": ...}`` (JSON) or a bare path; the
    frame is that file (a relative path is read from the line file's folder). ``payload: image``:
    the message *is* the encoded frame, and the part id is the topic's last level (publish to
    ``.../parts/<part id>``). A message is acknowledged to the broker only when the station is
    done with its frame (paho's manual acknowledgement), so a station that dies first gets it
    again from the broker. ``payload: none`` carries no frame: a camera takes it, so that is a
    camera source with ``trigger: mqtt`` (``camera.py``), and refused here saying so.
    """

    def __init__(self, cfg: MqttSource, base: Path, *, client_id: str) -> None:
        from ..config import ConfigError
        from .mqtt_sink import trigger_subscriber

        if cfg.payload == "none":
            raise ConfigError(
                "source mqtt: payload none needs a camera to take the frame: "
                "use source {kind: aravis, trigger: mqtt, topic: ...}"
            )
        self.cfg = cfg
        self.base = base
        self._messages: deque[Any] = deque()
        self._lock = threading.Lock()
        who = f"the trigger messages' client {client_id}"
        self.client, self.subscribed, self.refusals = trigger_subscriber(client_id, cfg, self._on_message, who)

    def _on_message(self, _client: Any, _userdata: Any, msg: Any) -> None:
        with self._lock:
            self._messages.append(msg)

    def poll(self) -> list[Frame]:
        with self._lock:
            messages = list(self._messages)
            self._messages.clear()
        return [self._frame(m) for m in messages]

    def _frame(self, msg: Any) -> Frame:
        ref = f"mqtt:{msg.topic}"
        if self.cfg.payload == "image":
            name = msg.topic.rsplit("/", 1)[-1]
            return Frame(ref=ref, name=name, part_id=name, data=bytes(msg.payload), token=msg, replayed=bool(msg.dup))
        text = bytes(msg.payload).decode("utf-8", errors="replace").strip()
        part_id = None
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if isinstance(body, dict):
            part_id = None if body.get("part_id") is None else str(body["part_id"])
            text = str(body.get("path", ""))
        path = Path(text) if Path(text).is_absolute() else self.base / text
        return Frame(ref=str(path), name=path.stem, part_id=part_id, token=msg, replayed=bool(msg.dup))

    def read(self, frame: Frame) -> bytes | RawFrame:
        if frame.data is not None:
            return frame.data
        return Path(frame.ref).read_bytes()

    def done(self, frame: Frame) -> None:
        self.client.ack(frame.token.mid, frame.token.qos)

    def refused(self, frame: Frame) -> None:
        """Not acknowledged: the broker offers it again when the station reconnects."""

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
