"""The console's recent predictions: a bounded ring per product, in the ingress process's memory.

Every image the predict route scores is recorded here (its result, its uploaded bytes and,
when the request asked for one, its heat-map), so the console can show what the line sent
and a person can teach from it. Bounds, both enforced at each record:

* at most ``per_product`` predictions per product (the oldest of that product go first);
* at most ``max_bytes`` of images and heat-maps in all (the oldest predictions of any
  product go first).

Kept where: in the one ``Ingress`` replica's memory (``deploy.yaml`` runs one). Nothing
is written anywhere: on a restart of the ingress (or the service) the ring and its
counters start empty. Counters (``scored``, ``flagged``) count every prediction since the
ingress started, also those the ring no longer holds. With several ingress replicas each
would hold its own ring: the console then shows the one that answered.

Ids are ``{boot}-{n}``: ``boot`` differs between starts, so an id from before a restart
names nothing instead of a different image.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RecentItem", "RecentPredictions", "image_media_type"]


def image_media_type(data: bytes) -> str:
    """The media type of encoded image bytes, from their magic numbers."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data.startswith(b"BM"):
        return "image/bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    return "application/octet-stream"


@dataclass
class RecentItem:
    id: str
    product: str
    at: float  # unix time of the prediction
    name: str
    result: dict[str, Any]  # score, threshold, is_anomaly, version, timing, rule (no heat-map)
    image: bytes
    heatmap_png: bytes | None = None
    heatmap_version: int | None = None  # the version that drew the heat-map (may differ when drawn later)
    heatmap_scale: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        return len(self.image) + len(self.heatmap_png or b"")

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "product": self.product,
            "at": self.at,
            "name": self.name,
            **self.result,
            "has_heatmap": self.heatmap_png is not None,
            "heatmap_version": self.heatmap_version,
            "heatmap_scale": self.heatmap_scale,
        }


@dataclass
class _Counts:
    scored: int = 0
    flagged: int = 0
    last_at: float | None = None


@dataclass
class RecentPredictions:
    per_product: int
    max_bytes: int
    boot: str = field(default_factory=lambda: secrets.token_hex(4))
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self._items: OrderedDict[str, RecentItem] = OrderedDict()  # every held item, oldest first
        self._by_product: dict[str, deque[str]] = {}
        self._counts: dict[str, _Counts] = {}
        self._bytes = 0
        self._next = 0
        self._lock = threading.Lock()  # the ingress records from its event loop and reads from threads

    def record(
        self, product: str, name: str, image: bytes, result: dict[str, Any], heatmap_png: bytes | None = None
    ) -> str:
        """Keep one prediction; returns its id."""
        with self._lock:
            self._next += 1
            item = RecentItem(
                id=f"{self.boot}-{self._next}",
                product=product,
                at=time.time(),
                name=name,
                result={k: v for k, v in result.items() if k not in ("heatmap_png", "heatmap_scale", "name")},
                image=image,
                heatmap_png=heatmap_png,
                heatmap_version=result.get("version") if heatmap_png is not None else None,
                heatmap_scale=result.get("heatmap_scale") if heatmap_png is not None else None,
            )
            counts = self._counts.setdefault(product, _Counts())
            counts.scored += 1
            counts.flagged += int(bool(result.get("is_anomaly")))
            counts.last_at = item.at
            self._items[item.id] = item
            self._bytes += item.nbytes
            ring = self._by_product.setdefault(product, deque())
            ring.append(item.id)
            while len(ring) > self.per_product:
                self._drop(ring[0])
            while self._bytes > self.max_bytes and len(self._items) > 1:
                self._drop(next(iter(self._items)))
            return item.id

    def _drop(self, item_id: str) -> None:
        item = self._items.pop(item_id)
        self._bytes -= item.nbytes
        ring = self._by_product[item.product]
        ring.remove(item_id)  # the oldest of its product: at the left end, O(1) in practice
        if not ring:
            del self._by_product[item.product]

    def get(self, product: str, item_id: str) -> RecentItem | None:
        with self._lock:
            item = self._items.get(item_id)
            return item if item is not None and item.product == product else None

    def set_heatmap(self, item: RecentItem, png: bytes, version: int, scale: dict[str, Any] | None) -> None:
        with self._lock:
            if self._items.get(item.id) is not item:
                return  # dropped meanwhile
            self._bytes += len(png) - len(item.heatmap_png or b"")
            item.heatmap_png, item.heatmap_version, item.heatmap_scale = png, version, scale

    def items(self, product: str, *, flagged_only: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        """Held predictions of ``product``, newest first."""
        with self._lock:
            ids = list(self._by_product.get(product, ()))
            out = []
            for item_id in reversed(ids):
                item = self._items[item_id]
                if flagged_only and not item.result.get("is_anomaly"):
                    continue
                out.append(item.summary())
                if limit is not None and len(out) >= limit:
                    break
            return out

    def counts(self) -> dict[str, dict[str, Any]]:
        """product -> scored and flagged since the ingress started, and how many are held now."""
        with self._lock:
            return {
                p: {
                    "scored": c.scored,
                    "flagged": c.flagged,
                    "flagged_share": c.flagged / c.scored if c.scored else None,
                    "held": len(self._by_product.get(p, ())),
                    "last_at": c.last_at,
                }
                for p, c in self._counts.items()
            }

    def forget(self, product: str) -> None:
        """Drop a deleted product's predictions and counters."""
        with self._lock:
            for item_id in list(self._by_product.get(product, ())):
                self._drop(item_id)
            self._counts.pop(product, None)
