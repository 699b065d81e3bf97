"""CPU throughput plumbing for ``predict``: decode ahead, score in single-threaded workers, keep memory
mapped, wait politely.

Four things that matter on a machine of few cores (docs/performance.md has the measurements):

* **Overlap.** :func:`prefetched` runs a batch producer (read, decode, resize, stack) one
  batch ahead in a background thread while the caller runs the backbone and ATMM on the
  current batch. PNG decoding and Pillow's resize release the GIL, so the two really run at
  once. :func:`load_batch` decodes and resizes the images of one batch in ``threads`` threads.
  The batches are exactly those of the sequential path (same pixels, same order), so scores
  are bit-identical (tests/unit/test_throughput.py).
* **Score workers.** :func:`map_in_workers` runs independent shares of a predict in threads
  whose torch ops use one thread each: the default CPU path (``score_workers``), measured
  faster than multi-threaded ops on few cores and graceful next to a busy neighbour. Equal to
  the one-thread path to float32 rounding (another summation order in one-thread kernels).
* **Memory kept mapped.** glibc hands every free of a block larger than its mmap threshold back
  to the kernel, and the next batch faults every page in again (a large share of a predict's
  CPU). :func:`keep_memory_mapped` raises glibc's mmap and trim
  thresholds (``mallopt``), so the large per-batch buffers are reused from the heap instead.
  It is process-wide and idempotent, and a no-op where glibc is not the allocator.
* **Polite waiting.** OpenMP threads that spin while they wait collapse when a neighbour holds
  a core (ATMM many times slower with one core taken). hetmm_ray sets
  ``OMP_WAIT_POLICY=PASSIVE`` before torch is first imported (``hetmm_ray/__init__.py``; a
  value already in the environment wins), so a busy neighbour slows the service in proportion
  instead of tenfold. (The thread count a process uses is ``core.device.compute_threads``.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = [
    "keep_memory_mapped",
    "load_batch",
    "map_in_workers",
    "prefetched",
    "worker_shares",
]

T = TypeVar("T")
R = TypeVar("R")

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_mapped_bytes = 0
_mapped_lock = threading.Lock()


def keep_memory_mapped(mib: int) -> bool:
    """Let the heap keep up to ``mib`` MiB of freed memory mapped (glibc ``mallopt``); True if set.

    Blocks below the mmap threshold come from the heap, and the heap is trimmed back to the
    kernel only when more than the trim threshold is free at its top: both are set to ``mib``
    (the top pad to a quarter of it), so buffers of one batch are reused by the next without a
    page fault per 4 KiB. Raising the limit again is allowed, lowering is not (another caller
    may rely on it). ``mib`` 0 does nothing.
    """
    global _mapped_bytes
    size = int(mib) * 2**20
    if size <= 0:
        return False
    with _mapped_lock:
        if size <= _mapped_bytes:
            return True
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to tune
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        # mallopt takes an int: glibc caps the mmap threshold at HEAP_MAX/2 (32 MiB on 64-bit)
        # and refuses larger values, so that one is clamped; the trim threshold has no cap.
        ok = bool(mallopt(_M_MMAP_THRESHOLD, min(size, 32 * 2**20)))
        ok &= bool(mallopt(_M_TRIM_THRESHOLD, min(size, 2**31 - 1)))
        ok &= bool(mallopt(_M_TOP_PAD, min(size // 4, 2**31 - 1)))
        if ok:
            _mapped_bytes = size
        return ok


def load_batch(items: Sequence[T], load: Callable[[T], R], threads: int) -> list[R]:
    """``[load(x) for x in items]``, in ``threads`` threads when more than one (order kept).

    The first error raised by ``load`` (in item order) propagates, as in the plain loop.
    """
    if threads <= 1 or len(items) <= 1:
        return [load(x) for x in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="hetmm-decode") as pool:
        return list(pool.map(load, items))


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _single_threaded_pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads, each running torch ops on one intra-op thread.

    torch's thread count is per thread for OpenMP and MKL (``omp_set_num_threads`` and
    ``mkl_set_num_threads_local``), but ``torch.set_num_threads`` also stores a process-wide
    default that threads take at their first parallel op. So each worker first runs an op (its
    lazy initialisation), then sets one thread for itself; once every worker has, the caller's
    count is set again, which restores the default for everyone else.
    """
    import torch

    with _pools_lock:
        pool = _pools.get(workers)
        if pool is not None:
            return pool
        caller_threads = torch.get_num_threads()
        ready = threading.Barrier(workers + 1)

        def init() -> None:
            torch.get_num_threads()  # the thread's lazy init (at its first parallel op otherwise)
            torch.set_num_threads(1)
            ready.wait()

        pool = ThreadPoolExecutor(workers, thread_name_prefix="hetmm-score", initializer=init)
        for _ in range(workers):  # each submission starts a thread while none is idle
            pool.submit(lambda: None)
        ready.wait()
        torch.set_num_threads(caller_threads)
        _pools[workers] = pool
        return pool


def map_in_workers(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` run by ``workers`` threads whose torch ops use one thread each.

    Why (docs/performance.md): on a CPU, ``workers`` independent single-threaded
    pipelines (decode, backbone, ATMM of their own images) keep every core busy without the
    synchronisation of ``workers``-thread parallel ops, which with passive OpenMP waiting is slow
    on ATMM's many short parallel regions and with spinning waits collapses when a
    neighbour takes a core. Order is kept; the first error in item order is raised. ``workers``
    <= 1 runs the plain loop in the caller's thread.
    """
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    return list(_single_threaded_pool(workers).map(fn, items))


def worker_shares(items: Sequence[T], *, workers: int, batch_size: int) -> list[Sequence[T]]:
    """``items`` cut into consecutive shares for ``workers`` workers, none over the batch size
    each worker would take (``ceil(batch_size / workers)``), sizes differing by at most one
    within each round of ``workers`` shares.

    Why balanced: one batch waits for its slowest share, so a replica's greedy batch of 5 cut
    as 4 + 1 (shares of a fixed ``batch_size / workers``) left one worker idle three quarters of
    the time; 3 + 2 keeps both busy. Many items still go in shares of the full per-worker size,
    the last round balanced.
    """
    if workers < 1 or batch_size < 1:
        raise ValueError(f"workers and batch_size must be >= 1, got {workers} and {batch_size}")
    cap = -(-batch_size // workers)
    shares: list[Sequence[T]] = []
    start = 0
    while start < len(items):
        left = len(items) - start
        if left >= workers * cap:  # a full round at the largest size
            sizes = [cap] * workers
        else:  # the last round: as even as the count allows
            n = min(workers, left)
            sizes = [left // n + (1 if i < left % n else 0) for i in range(n)]
        for size in sizes:
            shares.append(items[start : start + size])
            start += size
    return shares


_DONE = object()


def prefetched(produce: Iterable[T], depth: int = 1) -> Iterator[T]:
    """Items of ``produce``, computed up to ``depth`` items ahead in a background thread.

    ``depth`` 0 is the plain iteration. An exception raised while producing is raised here,
    at the item where it happened (items before it are delivered first). Closing the iterator
    early (``break``, an error in the consumer) stops the producer after the item it is on.
    """
    if depth <= 0:
        yield from produce
        return
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in produce:
                while not stop.is_set():
                    try:
                        slots.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            slots.put((_DONE, exc))

    worker = threading.Thread(target=run, name="hetmm-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, exc = slots.get()
            if item is _DONE:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get_nowait()
            except queue.Empty:
                pass
            worker.join(timeout=0.05)
