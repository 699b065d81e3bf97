"""Warm set: a hot product is held by several detector replicas, so its load spreads.

Serve's model multiplexing routes a request to the replicas that already hold its model
id and only falls back to others after a matching timeout or when they are full, so one
busy product stays pinned to one replica however many replicas autoscaling adds (Ray
Serve's ray-project/ray#48741 and ray-project/ray#65691). We work with multiplexing, not around it:

- The ingress counts each product's predicts in flight (:class:`WarmSet`). Below
  ``hot_product_inflight`` a request carries the product's own model id (``gear``), as
  before: one replica holds a quiet product, the cheapest in memory.
- At or above it the product is hot: requests cycle over ``hot_product_spread`` model ids,
  the product's own and aliases ``gear~1``, ``gear~2``, ... Each alias is a model id of its
  own to Serve, and Serve places a model id that no replica holds on the replicas holding
  the fewest models, so the aliases land on different replicas; after that each alias
  is routed to its replica like any multiplexed model. The hot product is then warm on up
  to ``hot_product_spread`` replicas (set it to the Detector's max_replicas).
- Serve keeps routing an alias to the replica that first loaded it, so aliases placed while one
  replica ran would pin the hot product there after autoscaling added others (seen in
  tests/integration/serve/test_autoscaling.py). With ``rotate_s`` the aliases are renamed
  every ``rotate_s`` seconds while the product is hot (``gear~1@7``: generation 7): a new name is
  held by no replica, so Serve places it on the replicas holding the fewest models, the new ones
  first. The product's own id never rotates; old names age out of the replicas' LRU.
- A replica maps an alias back to the product (:func:`product_of`) and keeps one copy of a
  product's detector however many of its aliases it serves (serve/replica.py). Batches
  stay per model id, hence per product.

'~' cannot occur in a product name (store/base.py), so aliases never collide with one.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ALIAS_SEPARATOR", "WarmSet", "alias", "product_of"]

ALIAS_SEPARATOR = "~"


def alias(product: str, index: int, generation: int = 0) -> str:
    """The model id of ``product``'s ``index``-th warm copy (0 is the product's own id) in ``generation``."""
    if index == 0:
        return product
    return f"{product}{ALIAS_SEPARATOR}{index}" + (f"@{generation}" if generation else "")


def product_of(model_id: str) -> str:
    """The product a model id (a product name or one of its aliases) stands for."""
    return model_id.split(ALIAS_SEPARATOR, 1)[0]


class WarmSet:
    """Per-product in-flight counts at one ingress, and the model id each new request takes."""

    def __init__(self, *, hot_inflight: int, spread: int, rotate_s: float | None = None) -> None:
        self.hot_inflight = hot_inflight
        self.spread = max(1, spread)
        self.rotate_s = rotate_s  # rename the aliases this often while hot (None: never)
        self.inflight: Counter[str] = Counter()
        self._turn: dict[str, Iterator[int]] = {}

    def model_id(self, product: str) -> str:
        """The product's own id while it is quiet; the next of its ``spread`` ids while it is hot."""
        if self.spread == 1 or self.inflight[product] < self.hot_inflight:
            return product
        turn = self._turn.setdefault(product, itertools.cycle(range(self.spread)))
        generation = int(time.monotonic() // self.rotate_s) if self.rotate_s else 0
        return alias(product, next(turn), generation)

    @contextmanager
    def request(self, product: str) -> Iterator[str]:
        """Count a predict of ``product`` in flight while it runs; yields its model id."""
        model_id = self.model_id(product)
        self.inflight[product] += 1
        try:
            yield model_id
        finally:
            self.inflight[product] -= 1
            if self.inflight[product] <= 0:
                del self.inflight[product]
