"""The inspection record's writer: predictions in, Parquet batches and kept images out, off the predict path.

Exact semantics (keys, columns and image policy in record/layout.py):

- :meth:`InspectionRecorder.submit` is all the predict path does: it appends one entry per
  image (references to the upload's bytes and the result dict, no copy, no hashing, no I/O) to a
  list under a lock and returns. Everything else runs on one background thread, in two stages:
  within ``MAKE_ROWS_S`` (0.1 s) an entry becomes a row (the image digest, the image policy, the
  kept image written) and the upload's bytes are let go, so memory holds rows, not images; rows
  are then written as Parquet files by the batch rule below.
- A batch is written when ``batch_rows`` rows are pending or the oldest pending row is
  ``flush_s`` old, whichever comes first (so a quiet line still flushes); :meth:`flush` writes
  everything now. One Parquet file per product and UTC day per batch; each kept image is written
  before the file whose row names it.
- **Crash bound.** Rows are durable once their file is written. A crash (SIGKILL) loses the rows
  held in memory: those pending plus the batch being written, together never more than
  ``max_pending_rows`` (a row submitted while that many are held is dropped at once and counted
  in :attr:`dropped`, never waited for). While writes keep up, the rows held are those of the
  last ``flush_s`` seconds (or ``batch_rows`` rows) plus the batch in flight. A clean exit
  (``atexit``, :meth:`close`) writes what is pending.
- A failed write (store unreachable) keeps its rows and retries on the next tick, within the
  same ``max_pending_rows`` bound (the oldest rows beyond it are dropped and counted).
- Retention: at start and then hourly, dates older than ``retention_days`` (UTC days) are
  deleted under ``inspections/`` and ``inspection-images/`` of every product this writer wrote.
- ``sink(product, rows)`` (optional) sees every row once, on the background thread, before it
  is written (the drift monitor, record/monitor.py); a sink's exception is logged, not raised.
- ``backend=None``: rows are made and handed to the sink, nothing is written (the record off,
  the drift monitor on).
"""

from __future__ import annotations

import atexit
import hashlib
import io
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import ServiceConfig
from ..result import verdict_word
from ..store.base import Backend
from .layout import COLUMNS, IMAGES, INSPECTIONS, day_of, image_key, image_size_of, keep_image, parquet_key

__all__ = ["InspectionRecorder", "RecordSettings", "schema"]

logger = logging.getLogger(__name__)
RETENTION_EVERY_S = 3600.0
RETRY_S = 1.0  # after a failed write
MAKE_ROWS_S = 0.1  # uploads wait at most this long before their row is made (their bytes let go)
MAKE_ROWS_AT = 256  # ... or until this many are pending


@dataclass(frozen=True)
class RecordSettings:
    """The writer's settings (``ServiceConfig.record_*``; the defaults are there)."""

    batch_rows: int
    flush_s: float
    max_pending_rows: int
    pass_sample: float
    image_bytes_per_day: int
    retention_days: int

    @classmethod
    def of(cls, service: ServiceConfig) -> RecordSettings:
        return cls(
            batch_rows=service.record_batch_rows,
            flush_s=service.record_flush_s,
            max_pending_rows=service.record_max_pending_rows,
            pass_sample=service.record_pass_sample,
            image_bytes_per_day=service.record_image_mib_per_day * 2**20,
            retention_days=service.record_retention_days,
        )


def schema() -> Any:
    """The Parquet schema of the record (record/layout.py ``COLUMNS``), explicit so an all-null
    column of a batch keeps its type."""
    import pyarrow as pa

    types = {
        "time": pa.float64(),
        "version": pa.int64(),
        "score": pa.float64(),
        "threshold": pa.float64(),
        "review_threshold": pa.float64(),
        "verdict": pa.string(),
        "is_anomaly": pa.bool_(),
        "expected_rate": pa.float64(),
        "image_digest": pa.string(),
        "image_bytes": pa.int64(),
        "name": pa.string(),
        "request_id": pa.string(),
        "recent_id": pa.string(),
        "image_key": pa.string(),
        "label": pa.string(),
    }
    return pa.schema([(c, types[c]) for c in COLUMNS])


@dataclass
class _Entry:
    product: str
    at: float
    name: str
    data: bytes
    result: dict[str, Any]
    request_id: str
    mono: float  # time.monotonic() at submit: the batch's age


def _verdict(result: dict[str, Any]) -> str:
    """The result record's verdict (hetmm_ray/result.py); one without a verdict judged by ``is_anomaly``."""
    return verdict_word(result.get("verdict")) or ("reject" if result.get("is_anomaly") else "ok")


def _close_at_exit(ref: weakref.ReferenceType[InspectionRecorder]) -> None:
    recorder = ref()
    if recorder is not None:
        recorder.close()


class InspectionRecorder:
    """Rows of inspected images, written in batches by a background thread (module docstring)."""

    def __init__(
        self,
        backend: Backend | None,
        settings: RecordSettings,
        *,
        sink: Callable[[str, list[dict[str, Any]]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.sink = sink
        self.clock = clock
        self.writer = secrets.token_hex(4)
        self.written = 0  # rows in written files
        self.dropped = 0  # rows dropped at the max_pending_rows bound
        self.files = 0
        self.images_kept = 0
        self.by_product: dict[str, dict[str, int]] = {}  # product -> {"written", "dropped"}
        self._pending: list[_Entry] = []
        # made rows whose file is not written yet: (product, row, monotonic time of submit), oldest first
        self._unwritten: list[tuple[str, dict[str, Any], float]] = []
        self._in_flight = 0  # rows a pass holds outside both lists (being made, or being written)
        self._cond = threading.Condition()
        self._flush_now = False
        self._closed = False
        self._accepted = 0  # entries accepted by submit (not dropped)
        self._done = 0  # of those, entries a pass has made rows of (written, or waiting in _unwritten)
        self._seq = 0
        self._kept: dict[tuple[str, str], int] = {}  # (product, day) -> image bytes kept
        self._seen_images: set[str] = set()
        self._products: set[str] = set()
        # None: no pass yet, so the first runs at start (a monotonic clock starts near 0 at boot: a
        # service started within RETENTION_EVERY_S of it skipped its start-up pass with 0.0 here)
        self._last_retention: float | None = None
        self._retry_at = 0.0
        self._thread = threading.Thread(target=self._run, name="inspection-record", daemon=True)
        self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the predict path -------------------------------------------------------------------
    def submit(
        self, product: str, uploads: list[tuple[str, bytes]], results: list[dict[str, Any]], request_id: str
    ) -> None:
        """Hand one request's results over (module docstring: no I/O, never waits on a write)."""
        now = self.clock()
        with self._cond:
            was_empty = not self._pending
            for (name, data), result in zip(uploads, results, strict=True):
                if self._held() >= self.settings.max_pending_rows:
                    self.dropped += 1
                    self._count(product, "dropped")
                    continue
                self._pending.append(_Entry(product, now, name, data, result, request_id, time.monotonic()))
                self._accepted += 1
            if (was_empty and self._pending) or len(self._pending) >= MAKE_ROWS_AT:
                self._cond.notify()  # the thread sets its next wake-up by the oldest entry

    def _count(self, product: str, what: str, n: int = 1) -> None:
        self.by_product.setdefault(product, {"written": 0, "dropped": 0})[what] += n

    def _held(self) -> int:
        return len(self._pending) + self._in_flight + len(self._unwritten)

    @property
    def pending(self) -> int:
        """Rows held in memory (pending, in flight, or waiting for a retried write): what a crash now
        would lose."""
        with self._cond:
            return self._held()

    def flush(self, timeout: float = 60.0) -> bool:
        """Write everything submitted so far; True when done within ``timeout`` seconds."""
        with self._cond:
            target = self._accepted  # entries are taken in order: done once this many passed through
            self._flush_now = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._closed or (self._done >= target and not self._unwritten), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is pending and stop the thread."""
        if self._closed:
            return
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # --- the background thread --------------------------------------------------------------
    # Two stages, so that uploads are not held for a whole batch: entries become rows within
    # MAKE_ROWS_S (the digest, the image kept or not; the upload's bytes are then let go), and rows
    # are written as files by the batch rule (batch_rows or flush_s).
    def _rows_due(self, now: float) -> bool:
        if not self._pending:
            return False
        return self._flush_now or len(self._pending) >= MAKE_ROWS_AT or now - self._pending[0].mono >= MAKE_ROWS_S

    def _write_due(self, now: float) -> bool:
        if not self._unwritten or now < self._retry_at:
            return False
        if self._flush_now or len(self._unwritten) >= self.settings.batch_rows:
            return True
        return now - self._unwritten[0][2] >= self.settings.flush_s

    def _wait_s(self, now: float) -> float:
        waits = [self.settings.flush_s]
        if self._pending:
            waits.append(MAKE_ROWS_S - (now - self._pending[0].mono))
        if self._unwritten:
            waits.append(max(self._retry_at, self._unwritten[0][2] + self.settings.flush_s) - now)
        return max(0.005, min(waits))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._rows_due(now := time.monotonic()) or self._write_due(now)):
                    self._cond.wait(self._wait_s(now))
                if self._closed:
                    return
                batch, self._pending = self._pending, []
                self._in_flight = len(batch)
            try:
                self._pass(batch)
            except Exception:  # the writer must outlive a bad batch; rows stay for the retry
                logger.exception("inspection record: a write failed; retrying in %.0f s", RETRY_S)
                self._retry_at = time.monotonic() + RETRY_S
            with self._cond:
                self._in_flight = 0
                self._done += len(batch)
                if not self._pending and not self._unwritten:
                    self._flush_now = False
                self._cond.notify_all()

    def _pass(self, batch: list[_Entry]) -> None:
        made: dict[str, list[tuple[dict[str, Any], float]]] = {}
        for e in batch:
            made.setdefault(e.product, []).append((self._row(e), e.mono))
        if self.sink is not None:
            for product, rows in made.items():
                try:
                    self.sink(product, [r for r, _ in rows])
                except Exception:  # a monitor's bug must not lose the record
                    logger.exception("inspection record: the sink failed")
        if self.backend is None:
            return  # the record is off: the sink was all
        with self._cond:
            self._unwritten += [(p, r, mono) for p, rows in made.items() for r, mono in rows]
            self._unwritten.sort(key=lambda x: x[2])  # oldest first, whatever the product
            self._in_flight = 0  # now in _unwritten
            overflow = self._held() - self.settings.max_pending_rows
            if overflow > 0:  # failed writes piled up: drop the oldest, counted
                for p, _, _ in self._unwritten[:overflow]:
                    self._count(p, "dropped")
                self.dropped += overflow
                del self._unwritten[:overflow]
        while True:
            with self._cond:
                if not self._write_due(time.monotonic()):
                    break
                n = self.settings.batch_rows
                chunk, self._unwritten = self._unwritten[:n], self._unwritten[n:]
                self._in_flight = len(chunk)  # held while written: counted in the bound
            self._write(chunk)
            with self._cond:
                self._in_flight = 0
        if self._last_retention is None or time.monotonic() - self._last_retention >= RETENTION_EVERY_S:
            self._last_retention = time.monotonic()
            self._retention()

    def _row(self, e: _Entry) -> dict[str, Any]:
        r = e.result
        # the digest names the image in the store; with the record off nothing needs it
        digest = hashlib.sha256(e.data).hexdigest() if self.backend is not None else ""
        verdict = _verdict(r)
        key = None
        if self.backend is not None:
            try:
                key = self._keep_image(e, digest, verdict)
            except Exception:  # the row matters more than its image: kept without it
                logger.warning("inspection record: an image of %s could not be kept", e.product, exc_info=True)
        review = r.get("review_threshold")
        expected = r.get("estimated_false_alarm_rate")
        return {
            "time": e.at,
            "version": int(r["version"]),
            "score": float(r["score"]),
            "threshold": float(r["threshold"]),
            "review_threshold": None if review is None else float(review),
            "verdict": verdict,
            "is_anomaly": bool(r.get("is_anomaly")),
            "expected_rate": None if expected is None else float(expected),
            "image_digest": digest,
            "image_bytes": len(e.data),
            "name": str(e.name),
            "request_id": e.request_id,
            "recent_id": r.get("recent_id"),
            "image_key": key,
            "label": None,
        }

    def _keep_image(self, e: _Entry, digest: str, verdict: str) -> str | None:
        assert self.backend is not None
        day = day_of(e.at)
        key = image_key(e.product, e.at, digest, len(e.data))
        if key in self._seen_images:
            return key  # the same image again that day: kept once
        if (e.product, day) not in self._kept:  # after a restart: what this day already holds
            prefix = f"{e.product}/{IMAGES}/{day}"
            self._kept[(e.product, day)] = sum(image_size_of(k) for k in self.backend.list(prefix))
        kept = self._kept[(e.product, day)]
        if not keep_image(verdict, digest, self.settings.pass_sample, kept, self.settings.image_bytes_per_day):
            return None
        self.backend.write(key, e.data)
        self._kept[(e.product, day)] = kept + len(e.data)
        self._seen_images.add(key)
        if len(self._seen_images) > 100_000:  # a memo, not the truth: a re-write is harmless
            self._seen_images.clear()
        self.images_kept += 1
        return key

    def _write(self, rows: list[tuple[str, dict[str, Any], float]]) -> None:
        """One Parquet file per (product, day) of ``rows``; on a failure the rows not written go
        back to the front of ``_unwritten`` (the retry) and the error is raised."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self.backend is not None
        groups: dict[tuple[str, str], list[tuple[str, dict[str, Any], float]]] = {}
        for item in rows:
            groups.setdefault((item[0], day_of(item[1]["time"])), []).append(item)
        todo = list(groups.items())
        while todo:
            (product, _), group = todo[0]
            try:
                table = pa.Table.from_pylist([r for _, r, _ in group], schema=schema())
                buffer = io.BytesIO()
                pq.write_table(table, buffer, compression="zstd")
                self._seq += 1
                key = parquet_key(product, group[0][1]["time"], self.writer, self._seq)
                self.backend.write(key, buffer.getvalue())
            except Exception:
                with self._cond:  # the groups not written wait for the retry (module docstring)
                    back = sorted((item for _, g in todo for item in g), key=lambda x: x[2])
                    self._unwritten[:0] = back
                    self._in_flight = 0
                raise
            todo.pop(0)
            with self._cond:
                self.written += len(group)
                self.files += 1
                self._count(product, "written", len(group))
                self._in_flight -= len(group)
            self._products.add(product)

    def _retention(self) -> None:
        assert self.backend is not None
        cutoff = day_of(self.clock() - self.settings.retention_days * 86400.0)
        for product in sorted(self._products):
            old: list[str] = []
            for base in (f"{product}/{INSPECTIONS}", f"{product}/{IMAGES}"):
                for key in self.backend.list(base):
                    part = key[len(base) + 1 :].split("/", 1)[0].removeprefix("date=")
                    if part < cutoff:
                        old.append(key)
            if old:
                self.backend.delete(old)
                logger.info("inspection record: %d objects of %s older than %s deleted", len(old), product, cutoff)
