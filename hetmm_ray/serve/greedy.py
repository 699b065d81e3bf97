"""Greedy batching for the detector replica: never wait when idle, take what queued when busy.

Serve's ``@serve.batch`` waits up to ``batch_wait_timeout_s`` for a batch to fill before it
starts. Measured at concurrency 1 (issue 15) that window was a third of every request's time
(54 of 167 ms), and a zero window made every batch one image at concurrency 8. This batcher
has ``workers`` workers per replica; whenever one is free it takes what is queued for the
product whose oldest request waited longest and scores it at once. Under load the next batch
is as full as the load makes it, and an idle replica answers a lone request immediately.

Several workers (``workers``) run batches side by side with no barrier between them: a worker
that finishes early takes the next requests instead of waiting for the slowest share of a
common batch. Each takes at most ``ceil(max_batch_size / workers)`` images, and no more than its
fair part of what is queued (``ceil(queued / idle workers)``). The detector replica uses one
worker: with one per core (~20 % more images/s at concurrency 8) its replicas hung inside
OpenVINO's infer (serve/replica.py).

``wait_s`` > 0 restores a fill window (a worker, once it has a request, waits up to that long
for its batch to fill); the default 0 is the greedy rule above.

Requests of different products are never mixed in one batch; every request is taken whole
(at least one per batch); a batch's failure is every one of its requests' error; a request
whose caller went away is dropped from its batch's answers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["GreedyBatcher"]

Item = TypeVar("Item")


@dataclass
class _Pending(Generic[Item]):
    item: Item
    size: int
    seq: int
    future: asyncio.Future = field(repr=False)


class GreedyBatcher(Generic[Item]):
    """``await submit(key, item, size)`` -> ``run(key, [items])[i]``, batched greedily per key
    by ``workers`` concurrent workers."""

    def __init__(
        self,
        run: Callable[[str, list[Item]], Awaitable[list[Any]]],
        *,
        max_batch_size: int = 8,
        wait_s: float = 0.0,
        workers: int = 1,
    ) -> None:
        self._run = run
        self.configure(max_batch_size=max_batch_size, wait_s=wait_s, workers=workers)
        self._queues: dict[str, deque[_Pending[Item]]] = {}
        self._seq = itertools.count()
        self._arrived: asyncio.Event | None = None
        self._tasks: dict[int, asyncio.Task] = {}
        self._busy = 0  # workers running a batch now
        self.batches = 0  # batches run so far (for tests and metrics)

    def configure(self, *, max_batch_size: int, wait_s: float, workers: int | None = None) -> None:
        """Live change (the replica's ``reconfigure``); applies from the next batch on."""
        if max_batch_size < 1 or (workers is not None and workers < 1):
            raise ValueError(f"max_batch_size and workers must be >= 1, got {max_batch_size} and {workers}")
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        if workers is not None:
            self.workers = workers

    @property
    def worker_batch_size(self) -> int:
        """The most images one worker's batch takes: ``ceil(max_batch_size / workers)``."""
        return -(-self.max_batch_size // self.workers)

    async def submit(self, key: str, item: Item, size: int = 1) -> Any:
        """Queue ``item`` (``size`` images) for ``key``; its result once its batch has run."""
        loop = asyncio.get_running_loop()
        if self._arrived is None:
            self._arrived = asyncio.Event()
        for wid in range(self.workers):  # started lazily, on the replica's event loop
            task = self._tasks.get(wid)
            if task is None or task.done():
                self._tasks[wid] = loop.create_task(self._loop(wid), name=f"hetmm-greedy-batcher-{wid}")
        pending = _Pending(item, max(1, size), next(self._seq), loop.create_future())
        self._queues.setdefault(key, deque()).append(pending)
        self._arrived.set()
        return await pending.future

    def _oldest_key(self) -> str:
        return min((k for k, q in self._queues.items() if q), key=lambda k: self._queues[k][0].seq)

    def _limit(self, key: str) -> int:
        """Images this worker may take of ``key``'s queue: its cap, and its fair part of the queue."""
        idle = max(1, self.workers - self._busy)
        queued = sum(p.size for p in self._queues[key])
        return min(self.worker_batch_size, -(-queued // idle))

    def _take(self, key: str, limit: int) -> list[_Pending[Item]]:
        """``key``'s requests in order, up to ``limit`` images (always at least one request)."""
        queue = self._queues[key]
        batch = [queue.popleft()]
        total = batch[0].size
        while queue and total + queue[0].size <= limit:
            total += queue[0].size
            batch.append(queue.popleft())
        if not queue:
            del self._queues[key]
        return batch

    def _full(self, key: str) -> bool:
        return sum(p.size for p in self._queues.get(key, ())) >= self.worker_batch_size

    async def _loop(self, wid: int) -> None:
        assert self._arrived is not None
        while wid < self.workers:  # a worker beyond a lowered count stops here
            if not any(self._queues.values()):
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if self.wait_s > 0:  # optional fill window, counted from now (the worker is free)
                key = self._oldest_key()
                deadline = asyncio.get_running_loop().time() + self.wait_s
                while not self._full(key) and (left := deadline - asyncio.get_running_loop().time()) > 0:
                    self._arrived.clear()
                    try:
                        await asyncio.wait_for(self._arrived.wait(), left)
                    except TimeoutError:
                        break
                if not any(self._queues.values()):  # another worker took it meanwhile
                    continue
            key = self._oldest_key()
            batch = self._take(key, self._limit(key))
            live = [p for p in batch if not p.future.done()]  # callers that went away are skipped
            if not live:
                continue
            self.batches += 1
            self._busy += 1
            try:
                results = await self._run(key, [p.item for p in live])
            except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            finally:
                self._busy -= 1
            for p, r in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)
