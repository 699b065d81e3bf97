"""Results on their way to an MQTT broker, kept on disk: nothing lost when the station is
killed, even while the broker is away.

Exact semantics:

- An outbox is a folder. A result handed to the sink is first written as ``<seq>.json`` (its
  topic, its payload and the key of the frame it is the result of), to a temporary name, flushed
  and renamed, then given to the MQTT client. When the broker acknowledges it (QoS 1's PUBACK, 2's
  PUBCOMP) the file is renamed ``<seq>.sent``. So a station killed at any moment finds, at its next
  start, every result it had produced and the broker had not acknowledged, and sends those first,
  in sequence order. A result given at QoS 0 is not kept (at most once, by MQTT's definition).
- The newest ``KEEP_SENT`` sent entries are kept (older ones are deleted as new ones are sent):
  with the unsent ones, their keys are the frames whose results are out (:meth:`Outbox.keys`), so a
  restarted station does not score again a frame its source offers again (a file still in its
  folder, a trigger message the broker delivers again) when that frame's result is already here.
- What this cannot rule out (MQTT QoS 1 is "at least once"): a result the broker received whose
  acknowledgement the station did not live to read is sent again, once, at the next start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .part_queue import write_whole

__all__ = ["KEEP_SENT", "Outbox", "Pending"]

KEEP_SENT = 1000  # sent entries kept for their keys (a restart's offered-again frames are far fewer)


@dataclass(frozen=True)
class Pending:
    seq: int
    topic: str
    payload: bytes
    key: str


class Outbox:
    """One MQTT sink's outbox in ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        for tmp in folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        self._sent = sorted(int(p.stem) for p in folder.glob("*.sent") if p.stem.isdigit())
        unsent = sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())
        self._next = max([0, *self._sent, *unsent]) + 1
        self._keys = {self._read(p)["key"] for p in self._paths(self._sent, ".sent") + self._paths(unsent, ".json")}

    def _paths(self, seqs: list[int], suffix: str) -> list[Path]:
        return [self.folder / f"{seq:012d}{suffix}" for seq in seqs]

    @staticmethod
    def _read(path: Path) -> dict:
        return json.loads(path.read_bytes())

    def keys(self) -> frozenset[str]:
        """The frames whose results were given to the sink before this start (sent or not)."""
        return frozenset(self._keys)

    def unsent(self) -> list[Pending]:
        """What the broker had not acknowledged when the station stopped, oldest first."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            if path.stem.isdigit():
                entry = self._read(path)
                out.append(Pending(int(path.stem), entry["topic"], entry["payload"].encode(), entry["key"]))
        return out

    def add(self, topic: str, payload: bytes, key: str) -> int:
        """Keep one result before it goes out; its sequence number."""
        seq = self._next
        self._next += 1
        entry = {"topic": topic, "payload": payload.decode(), "key": key}
        write_whole(self.folder / f"{seq:012d}.json", json.dumps(entry).encode())
        return seq

    def sent(self, seq: int) -> None:
        """The broker has it: kept as sent (for its key), the oldest sent beyond ``KEEP_SENT`` dropped."""
        path = self.folder / f"{seq:012d}.json"
        if path.exists():
            path.replace(path.with_suffix(".sent"))
            self._sent.append(seq)
        while len(self._sent) > KEEP_SENT:
            (self.folder / f"{self._sent.pop(0):012d}.sent").unlink(missing_ok=True)
