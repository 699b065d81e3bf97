"""The inspection record on a local folder: batches by size and by time, the image policy, retention,
the pending bound, and the crash bound under SIGKILL (record/writer.py's module docstring)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from helpers import REPO, until

from hetmm_ray.record.layout import IMAGES, INSPECTIONS, day_of, image_size_of, keep_image
from hetmm_ray.record.monitor import DriftMonitor, DriftSettings, series
from hetmm_ray.record.reader import read_rows, recent_rows, row_of
from hetmm_ray.record.writer import InspectionRecorder, RecordSettings
from hetmm_ray.store import open_store
from hetmm_ray.store.labels import LabelSet
from hetmm_ray.store.local import LocalBackend

WAIT_S = 60.0  # a condition on a loaded 2-core machine


def settings(**kw: Any) -> RecordSettings:
    base = {
        "batch_rows": 1000,
        "flush_s": 3600.0,
        "max_pending_rows": 100_000,
        "pass_sample": 0.0,
        "image_bytes_per_day": 2**30,
        "retention_days": 30,
    }
    return RecordSettings(**{**base, **kw})


def result(i: int, *, flagged: bool = False, version: int = 1) -> dict[str, Any]:
    return {
        "score": 0.5 + (1.0 if flagged else 0.0) + i * 1e-6,
        "threshold": 1.0,
        "is_anomaly": flagged,
        "verdict": "reject" if flagged else "ok",
        "version": version,
        "estimated_false_alarm_rate": 0.01,
        "recent_id": f"boot-{i}",
    }


def image(i: int, size: int = 64) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


def parquet_files(root: Path, product: str = "p") -> list[Path]:
    return sorted((root / product / INSPECTIONS).rglob("*.parquet"))


def test_rows_round_trip_with_time_range_labels_and_recent(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    rec = InspectionRecorder(store.backend, settings(pass_sample=1.0))
    t0 = time.time()
    for i in range(30):
        rec.submit("p", [(f"img{i}.png", image(i))], [result(i, flagged=i % 10 == 0)], f"req{i}")
    assert rec.flush(WAIT_S)
    rows = read_rows(store.backend, "p")
    assert rows.num_rows == 30
    assert rows.column("name").to_pylist() == [f"img{i}.png" for i in range(30)]  # sorted by time, in order
    row = rows.slice(10, 1).to_pylist()[0]
    assert row["verdict"] == "reject" and row["is_anomaly"] and row["version"] == 1
    assert row["image_bytes"] == 64 and len(row["image_digest"]) == 64 and row["request_id"] == "req10"
    assert store.backend.read(row["image_key"])[0] == image(10)  # pass_sample 1: every image kept
    # a time range: nothing before t0, everything in [t0, now]
    assert read_rows(store.backend, "p", until=t0 - 1).num_rows == 0
    assert read_rows(store.backend, "p", since=t0 - 1, until=time.time() + 1, columns=["score"]).num_rows == 30
    # a label given later shows on the row of that image
    LabelSet(store.backend).add("p", image(3), "defective")
    labelled = read_rows(store.backend, "p").to_pylist()
    assert [r["label"] for r in labelled if r["label"]] == ["defective"] and labelled[3]["label"] == "defective"
    # recent: newest first, flagged only
    assert [r["recent_id"] for r in recent_rows(store.backend, "p", 3)] == ["boot-29", "boot-28", "boot-27"]
    assert [r["recent_id"] for r in recent_rows(store.backend, "p", 5, flagged_only=True)] == [
        "boot-20",
        "boot-10",
        "boot-0",
    ]
    assert row_of(store.backend, "p", "boot-7")["name"] == "img7.png"
    assert row_of(store.backend, "p", "nope") is None
    assert read_rows(store.backend, "other").num_rows == 0  # no record yet: empty, not an error
    rec.close()


def test_a_batch_is_written_by_size_and_a_quiet_line_by_time(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    by_size = InspectionRecorder(backend, settings(batch_rows=5))
    for i in range(5):
        by_size.submit("p", [("x", image(i))], [result(i)], "r")
    until(lambda: by_size.written == 5, "a full batch written without flush()", WAIT_S, every_s=0.02)
    by_size.close()
    by_time = InspectionRecorder(backend, settings(batch_rows=1000, flush_s=0.3))
    by_time.submit("q", [("x", image(1))], [result(1)], "r")
    until(lambda: by_time.written == 1, "one row written after flush_s", WAIT_S, every_s=0.02)
    by_time.close()
    assert len(parquet_files(tmp_path, "p")) == 1 and len(parquet_files(tmp_path, "q")) == 1


def test_image_policy_flagged_all_passed_sampled_capped_per_day(tmp_path: Path) -> None:
    digest_low, digest_high = "00000000" + "0" * 56, "ffffffff" + "0" * 56
    assert keep_image("reject", digest_high, 0.0, 0, 100) and keep_image("review", digest_high, 0.0, 0, 100)
    assert keep_image("ok", digest_low, 0.1, 0, 100) and not keep_image("ok", digest_high, 0.1, 0, 100)
    assert not keep_image("reject", digest_low, 1.0, 100, 100)  # the day's cap reached
    # the writer: a cap of 3 images of 64 bytes a day; flagged ones all kept until then
    backend = LocalBackend(tmp_path)
    rec = InspectionRecorder(backend, settings(image_bytes_per_day=3 * 64))
    for i in range(6):
        rec.submit("p", [("x", image(i))], [result(i, flagged=True)], "r")
    rec.submit("p", [("x", image(99))], [result(99)], "r")  # passed, pass_sample 0: never kept
    assert rec.flush(WAIT_S)
    keys = [r["image_key"] for r in read_rows(backend, "p").to_pylist()]
    assert sum(k is not None for k in keys) == 3 and keys[-1] is None
    assert sum(image_size_of(k) for k in backend.list(f"p/{IMAGES}")) == 3 * 64
    rec.close()
    # a restarted writer counts what the day already holds (from the keys' sizes): nothing more kept
    again = InspectionRecorder(backend, settings(image_bytes_per_day=3 * 64))
    again.submit("p", [("x", image(50))], [result(50, flagged=True)], "r")
    assert again.flush(WAIT_S)
    assert len(list(backend.list(f"p/{IMAGES}"))) == 3
    again.close()


def test_retention_deletes_old_days_only(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    now = time.time()
    old = InspectionRecorder(backend, settings(pass_sample=1.0), clock=lambda: now - 40 * 86400)
    old.submit("p", [("x", image(1))], [result(1)], "r")
    assert old.flush(WAIT_S)
    old.close()
    assert day_of(now - 40 * 86400) in str(parquet_files(tmp_path)[0])
    new = InspectionRecorder(backend, settings(pass_sample=1.0, retention_days=30))
    new.submit("p", [("x", image(2))], [result(2)], "r")
    assert new.flush(WAIT_S)  # the first write runs the retention pass
    new.close()
    files = parquet_files(tmp_path)
    assert len(files) == 1 and day_of(now) in str(files[0])
    assert [k for k in backend.list(f"p/{IMAGES}")] == [k for k in backend.list(f"p/{IMAGES}") if day_of(now) in k]
    assert read_rows(backend, "p").num_rows == 1


class _GatedBackend(LocalBackend):
    """A local folder whose writes wait for a gate: a store that is slow to answer."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()

    def write(self, key: str, data: bytes, **kw: Any) -> str:
        self.gate.wait(WAIT_S)
        return super().write(key, data, **kw)


def test_a_slow_store_never_blocks_submit_and_the_pending_bound_holds(tmp_path: Path) -> None:
    backend = _GatedBackend(tmp_path)
    rec = InspectionRecorder(backend, settings(batch_rows=10, max_pending_rows=50))
    start = time.perf_counter()
    for i in range(200):
        rec.submit("p", [("x", image(i))], [result(i)], "r")
    assert time.perf_counter() - start < 5.0  # the store waits; submit does not
    assert rec.pending <= 50 and rec.dropped >= 150 and rec.by_product["p"]["dropped"] == rec.dropped
    backend.gate.set()
    assert rec.flush(WAIT_S)
    assert rec.written + rec.dropped == 200 and read_rows(backend, "p").num_rows == rec.written
    rec.close()


_CHILD = textwrap.dedent(
    """
    import sys, time
    from hetmm_ray.record.writer import InspectionRecorder, RecordSettings
    from hetmm_ray.store.local import LocalBackend

    rec = InspectionRecorder(LocalBackend(sys.argv[1]), RecordSettings(
        batch_rows=40, flush_s=3600.0, max_pending_rows=200, pass_sample=0.0,
        image_bytes_per_day=0, retention_days=30))
    for i in range(10**9):
        r = {"score": 0.5, "threshold": 1.0, "is_anomaly": False, "version": 1, "recent_id": str(i)}
        rec.submit("p", [(f"{i}", i.to_bytes(8, "little"))], [r], "req")
        print(rec.written, rec.dropped, i + 1, flush=True)
        time.sleep(0.001)
    """
)


def test_sigkill_loses_at_most_the_unflushed_rows(tmp_path: Path) -> None:
    """A writer killed with SIGKILL mid-stream: every row of a written batch is there (a prefix of
    what was submitted, in order), and fewer than max_pending_rows (200) are lost."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env, bufsize=1
    )
    submitted = written = dropped = 0
    assert child.stdout is not None
    deadline = time.monotonic() + 120
    try:
        for line in child.stdout:
            written, dropped, submitted = (int(x) for x in line.split())
            if written >= 400 and submitted % 40 == 17:  # mid-batch: some rows pending
                break
            assert time.monotonic() < deadline, "the child wrote too slowly"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    kept = [int(x) for x in read_rows(LocalBackend(tmp_path), "p", labels=False).column("recent_id").to_pylist()]
    assert kept == sorted(set(kept))  # whole batches, in submission order, none twice
    if dropped == 0:  # the writer kept up (it does but on a very loaded machine): a prefix of the stream
        assert kept == list(range(len(kept)))
    assert len(kept) >= written  # every row of a batch the child saw written is there
    lost = submitted - dropped - len(kept)  # at least this many; the child may have submitted one more unseen
    assert 0 < lost <= 200, (submitted, dropped, len(kept))


def test_drift_monitor_windows_follow_one_version_and_series_bands() -> None:
    from hetmm_ray.core.scoring import Calibration

    cal = Calibration(tuple(0.5 + 0.001 * i for i in range(400)))  # OOF scores 0.5 .. 0.9
    mon = DriftMonitor(
        DriftSettings(windows=(50, 200), window_s=3600.0, alpha=1e-3, tolerance=2.0, min_shift=0.2, min_parts=20),
        lambda product, version: cal,
    )
    now = time.time()
    rows = [
        {"time": now, "version": 1, "score": 0.5 + 0.002 * i, "threshold": 0.9, "is_anomaly": False} for i in range(200)
    ]
    for r in rows:
        r["expected_rate"] = 0.01
    mon.observe("p", rows)
    mon.evaluate()
    snap = mon.snapshot()["p"]
    assert snap["version"] == 1 and set(snap["windows"]) == {"50", "200", "3600s"}
    assert snap["windows"]["200"].parts == 200 and snap["windows"]["50"].parts == 50
    assert snap["windows"]["200"].state == "ok"
    shifted = [{**r, "score": r["score"] * 0.5} for r in rows]  # darker images: scores down
    mon.observe("p", shifted)
    mon.evaluate()
    assert mon.snapshot()["p"]["windows"]["200"].state == "drift"
    mon.observe("p", [{**rows[0], "version": 2}])  # a new version: windows start afresh
    mon.evaluate()
    assert mon.snapshot()["p"]["windows"]["200"].parts == 1
    assert len(mon.history("p")) == 1  # the history is the version's
    points = series(
        [0.0, 1.0, 2.0, 3.0], [False, True, False, False], [0.1, 2.0, 0.2, 0.3], [0.01] * 4, buckets=2, alpha=0.01
    )
    assert [p["parts"] for p in points] == [2, 2] and points[0]["flagged_share"] == 0.5
    assert points[0]["band"][0] <= 0.01 <= points[0]["band"][1]


def test_kept_image_keys_stream_the_range_by_time(tmp_path: Path) -> None:
    """``kept_image_keys``: the kept images of ``[since, until)`` in time order, across UTC days;
    rows whose image was not kept are left out (hetmm inspect --since/--until lists these)."""
    from hetmm_ray.record.reader import kept_image_keys

    store = open_store(tmp_path)
    now = [86_400.0 * 20_000]  # midnight UTC: rows on two days
    rec = InspectionRecorder(store.backend, settings(pass_sample=0.0), clock=lambda: now[0])
    for i in range(6):
        now[0] = 86_400.0 * 20_000 - 300.0 + 100.0 * i  # -300, -200, -100, 0, 100, 200 s around midnight
        rec.submit("p", [(f"img{i}.png", image(i))], [result(i, flagged=i % 2 == 0)], f"req{i}")  # kept: 0, 2, 4
    assert rec.flush(WAIT_S)
    rec.close()
    keys = list(kept_image_keys(store.backend, "p"))
    assert [store.backend.read(k)[0] for k, _ in keys] == [image(0), image(2), image(4)]
    assert all(size == 64 for _, size in keys)
    ranged = list(kept_image_keys(store.backend, "p", since=86_400.0 * 20_000 - 200.0, until=86_400.0 * 20_000 + 100.0))
    assert [store.backend.read(k)[0] for k, _ in ranged] == [image(2)]  # 4 is at +100: excluded
