"""Greedy batching for the detector replica: never wait when idle, take what queued when busy.

Serve's ``@serve.batch`` waits up to ``batch_wait_timeout_s`` for a batch to fill before it
starts: a lone request pays that window, and a zero window makes every batch one image under
concurrent load. This batcher
runs one batch at a time; whenever it is free it takes what is queued (up to
``max_batch_size`` images) for the product whose oldest request waited longest and scores it at
once. Under load the next batch is as full as the load makes it, and an idle replica answers a
lone request immediately. (Several batches side by side, a worker per core, are not used:
replicas hung inside OpenVINO's infer; docs/performance.md.)

``wait_s`` > 0 restores a fill window (the batcher, once it has a request, waits up to that long
for its batch to fill); the default 0 is the greedy rule above.

Requests announced as arriving (:meth:`GreedyBatcher.arriving`: the gRPC replica announces each
request while it decodes it, serve/grpc/service.py) are waited for: a free batcher whose chosen
product's queue is not full waits until every request announced for that product is queued (or
withdrawn: its decode failed) before it takes the batch. Why: under concurrent load the greedy
rule alone settles into a large batch and a one-image one (the lone request queued while the others
were still decoding), and a one-image batch costs more CPU per image than a share of a larger one
(the ATMM kernels on one image; docs/performance.md). The wait holds no core idle that decoding does not
use: the requests waited for are being decoded in this process meanwhile. Requests that are not
announced (HTTP: decoded in the ingress) are batched by the greedy rule alone.

A batch right after a larger one waits briefly for the rest (the refill rule): for up to
``REFILL_FRACTION`` of the last batch's time (at most ``REFILL_MAX_S``), counted from its end, a
batch of the same product holding fewer images than the last one (and fewer than
``max_batch_size``) waits for more to queue or be announced. Why: in a closed loop of ``n``
clients the greedy rule settles into a stable split, ``n - 1`` + 1, over both HTTP and gRPC: while
``n - 1`` images score, the last client's next request queues; the free batcher then scores it
alone while the other answers travel and come back. Clients that were just answered send again
within a round trip, so the split closes into batches of ``n`` at the cost of at most one
short wait; a lone client is never held (its batch is not smaller than the last), and a batcher
idle for longer than the window starts at once.

Requests of different products are never mixed in one batch; every request is taken whole
(at least one per batch); a batch's failure is every one of its requests' error; a request
whose caller went away is dropped from its batch's answers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

__all__ = ["REFILL_FRACTION", "REFILL_MAX_S", "GreedyBatcher"]

REFILL_FRACTION = 0.25  # of the last batch's time: how long a smaller next batch waits for the rest
REFILL_MAX_S = 0.1

Item = TypeVar("Item")


@dataclass
class _Pending(Generic[Item]):
    item: Item
    size: int
    seq: int
    future: asyncio.Future = field(repr=False)


class GreedyBatcher(Generic[Item]):
    """``await submit(key, item, size)`` -> ``run(key, [items])[i]``, batched greedily per key,
    one batch at a time."""

    def __init__(
        self,
        run: Callable[[str, list[Item]], Awaitable[list[Any]]],
        *,
        max_batch_size: int = 8,
        wait_s: float = 0.0,
    ) -> None:
        self._run = run
        self.configure(max_batch_size=max_batch_size, wait_s=wait_s)
        self._queues: dict[str, deque[_Pending[Item]]] = {}
        self._seq = itertools.count()
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._arriving: dict[str, int] = {}  # key -> requests announced and not yet queued (arriving)
        self._last: tuple[str, int, float] = ("", 0, 0.0)  # last batch: key, images, refill deadline
        self.batches = 0  # batches run so far (for tests and metrics)

    def configure(self, *, max_batch_size: int, wait_s: float) -> None:
        """Live change (the replica's ``reconfigure``); applies from the next batch on."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s

    async def submit(self, key: str, item: Item, size: int = 1) -> Any:
        """Queue ``item`` (``size`` images) for ``key``; its result once its batch has run."""
        loop = asyncio.get_running_loop()
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if self._task is None or self._task.done():  # started lazily, on the replica's event loop
            self._task = loop.create_task(self._loop(), name="hetmm-greedy-batcher")
        pending = _Pending(item, max(1, size), next(self._seq), loop.create_future())
        self._queues.setdefault(key, deque()).append(pending)
        self._arrived.set()
        return await pending.future

    @contextmanager
    def arriving(self, key: str) -> Iterator[None]:
        """Announce a request for ``key`` that is on its way (being decoded) for the block's duration:
        a free batcher waits for it before taking ``key``'s next batch, unless that batch is full.
        Call :meth:`submit` right after the block, with no ``await`` between (the batcher then finds
        the request queued when it looks again); an error inside the block withdraws it."""
        self._arriving[key] = self._arriving.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._arriving[key] - 1
            if left:
                self._arriving[key] = left
            else:
                del self._arriving[key]
            if self._arrived is not None:
                self._arrived.set()  # a batcher waiting for this request looks again

    def announced(self) -> int:
        """Requests announced (:meth:`arriving`) and not yet queued or withdrawn, over every key."""
        return sum(self._arriving.values())

    def _oldest_key(self) -> str:
        return min((k for k, q in self._queues.items() if q), key=lambda k: self._queues[k][0].seq)

    def _take(self, key: str) -> list[_Pending[Item]]:
        """``key``'s requests in order, up to ``max_batch_size`` images (always at least one request)."""
        queue = self._queues[key]
        batch = [queue.popleft()]
        total = batch[0].size
        while queue and total + queue[0].size <= self.max_batch_size:
            total += queue[0].size
            batch.append(queue.popleft())
        if not queue:
            del self._queues[key]
        return batch

    def _queued(self, key: str) -> int:
        return sum(p.size for p in self._queues.get(key, ()))

    async def _wait_for(self, enough: Callable[[], bool], deadline: float) -> None:
        """Wait until ``enough()`` holds or the loop's clock passes ``deadline`` (it is looked at again
        on every arrival or withdrawal)."""
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while not enough() and (left := deadline - loop.time()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return

    async def _refill(self, key: str) -> None:
        """The refill rule (module doc): right after a larger batch of ``key``, wait until as many images
        are queued or announced as it held (at most ``max_batch_size``), or its window is over."""
        last_key, last_images, deadline = self._last
        if key != last_key:
            return
        target = min(last_images, self.max_batch_size)
        await self._wait_for(lambda: self._queued(key) + self._arriving.get(key, 0) >= target, deadline)

    def _full(self, key: str) -> bool:
        return self._queued(key) >= self.max_batch_size

    async def _loop(self) -> None:
        assert self._arrived is not None
        while True:
            if not any(self._queues.values()):
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if self.wait_s > 0:  # optional fill window, counted from now (the batcher is free)
                key = self._oldest_key()
                await self._wait_for(partial(self._full, key), asyncio.get_running_loop().time() + self.wait_s)
            key = self._oldest_key()
            await self._refill(key)
            key = self._oldest_key()
            while self._arriving.get(key) and not self._full(key):  # announced requests: wait for them
                self._arrived.clear()
                await self._arrived.wait()
                key = self._oldest_key()
            batch = self._take(key)
            live = [p for p in batch if not p.future.done()]  # callers that went away are skipped
            if not live:
                continue
            self.batches += 1
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                results = await self._run(key, [p.item for p in live])
            except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            finally:
                ended = loop.time()
                window = min(REFILL_MAX_S, REFILL_FRACTION * (ended - started))
                self._last = (key, sum(p.size for p in live), ended + window)
            for p, r in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)
