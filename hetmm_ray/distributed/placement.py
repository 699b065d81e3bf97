"""Which template host holds a (product, layer) shard: rendezvous hashing over host slots.

Hosts are numbered slots ``0 .. n-1`` (distributed/hosts.py). A shard's host is the slot
with the highest score ``sha256("<product>/<layer>#<slot>")`` (its first 8 bytes as an
unsigned integer) among the slots that are up. This rule is

- stable: the same shard goes to the same slot in every registry incarnation, on every
  machine (no Python ``hash``, which is salted per process);
- spreading: scores are uniform, so shards, and the layers of one product, land on each
  slot with probability 1/n (3 slots, 1,000 products x 3 layers: about 1,000 shards each);
- minimal on loss: when a slot goes down only its own shards move, each to its next-best
  slot, so they spread over all the survivors instead of piling onto one; every other
  shard stays where it is. When the slot comes back, new placements use it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["place", "score"]


def score(product: str, layer: str, slot: int) -> int:
    """The rendezvous score of ``slot`` for the shard ``(product, layer)``."""
    digest = hashlib.sha256(f"{product}/{layer}#{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def place(product: str, layer: str, slots: Iterable[int]) -> int:
    """The slot that holds ``(product, layer)`` among the ``slots`` that are up."""
    up = list(slots)
    if not up:
        raise RuntimeError(f"no template host is up to hold {product}/{layer}")
    return max(up, key=lambda slot: (score(product, layer, slot), -slot))
