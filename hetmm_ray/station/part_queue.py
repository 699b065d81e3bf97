"""Parts waiting for the service, kept on disk: nothing lost while the service is away.

Exact semantics:

- A queue is a folder. A part is two files named by its sequence number: ``<seq>.frame`` (the
  frame's bytes: the encoded file, or a camera's raw pixels) and ``<seq>.json`` (part id, the
  frame's reference, the wall time it was taken and, for a raw frame, its width, height and pixel
  format: ``data/raw_frame.py``; and the frame's key in its source, ``runner.PartResult.key``).
  Each is written to a temporary name, flushed to disk and renamed, the frame first: a part is in
  the queue exactly when its ``.json`` exists, so a station killed at any moment (SIGKILL, power)
  leaves whole parts or none; a frame without its ``.json`` is removed at the next start.
- Order: parts leave in sequence order (the order they were put), also across a restart.
- Bound: at most ``max_parts`` parts; :meth:`PartQueue.put` of one more raises :class:`QueueFull`
  (the station refuses that part loudly; nothing already queued is dropped).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..data.raw_frame import RawFrame
from ..errors import HetmmError

__all__ = ["PartQueue", "QueueFull", "QueuedPart", "write_whole"]


class QueueFull(HetmmError):
    """The station's on-disk queue holds its ``max_parts`` already."""


@dataclass(frozen=True)
class QueuedPart:
    seq: int
    part_id: str
    frame_ref: str
    taken_unix: float  # when the frame was taken (time.time())
    frame: bytes | RawFrame
    key: str = ""  # the frame's key in its source (runner.PartResult.key)


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all: written to a temporary name, flushed to disk, renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class PartQueue:
    """One station's queue in ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path, max_parts: int) -> None:
        self.folder = folder
        self.max_parts = max_parts
        folder.mkdir(parents=True, exist_ok=True)
        for tmp in folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        self._seqs = sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())
        held = set(self._seqs)
        for frame in folder.glob("*.frame"):  # a part cut off before its .json was written
            if not frame.stem.isdigit() or int(frame.stem) not in held:
                frame.unlink(missing_ok=True)
        self._next = (self._seqs[-1] + 1) if self._seqs else 1

    def __len__(self) -> int:
        return len(self._seqs)

    def put(self, part_id: str, frame: bytes | RawFrame, frame_ref: str, taken_unix: float, key: str = "") -> int:
        if len(self._seqs) >= self.max_parts:
            raise QueueFull(f"the station's queue holds {self.max_parts} parts (queue.max_parts)")
        seq = self._next
        self._next += 1
        meta: dict = {"part_id": part_id, "frame_ref": frame_ref, "taken_unix": taken_unix, "key": key}
        if isinstance(frame, RawFrame):
            meta["raw"] = {"width": frame.width, "height": frame.height, "pixel_format": frame.pixel_format}
        write_whole(self.folder / f"{seq:012d}.frame", frame.pixels if isinstance(frame, RawFrame) else frame)
        write_whole(self.folder / f"{seq:012d}.json", json.dumps(meta).encode())
        self._seqs.append(seq)
        return seq

    def head(self) -> QueuedPart | None:
        if not self._seqs:
            return None
        seq = self._seqs[0]
        meta = json.loads((self.folder / f"{seq:012d}.json").read_bytes())
        data = (self.folder / f"{seq:012d}.frame").read_bytes()
        raw = meta.get("raw")
        frame = data if raw is None else RawFrame(raw["width"], raw["height"], raw["pixel_format"], data)
        key = meta.get("key", "")
        return QueuedPart(seq, meta["part_id"], meta["frame_ref"], float(meta["taken_unix"]), frame, key)

    def keys(self) -> set[str]:
        """The keys of the parts waiting (a restarted station does not take their frames again)."""
        return {json.loads((self.folder / f"{seq:012d}.json").read_bytes()).get("key", "") for seq in self._seqs} - {""}

    def pop(self) -> None:
        """Remove the head (once its result is out): its ``.json`` first, so a crash in between
        leaves no half part."""
        seq = self._seqs.pop(0)
        (self.folder / f"{seq:012d}.json").unlink(missing_ok=True)
        (self.folder / f"{seq:012d}.frame").unlink(missing_ok=True)
