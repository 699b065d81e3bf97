"""The inspection record (record/) on both store backends: a local folder and a real S3 endpoint
(moto's server), written through the store's backend and read through ``pyarrow.dataset``."""

from __future__ import annotations

import time
from typing import Any

from hetmm_ray.record.layout import IMAGES
from hetmm_ray.record.reader import read_rows, recent_rows, recorded_images, row_of
from hetmm_ray.record.writer import InspectionRecorder, RecordSettings
from hetmm_ray.store import open_store
from hetmm_ray.store.labels import LabelSet

WAIT_S = 60.0


def _result(i: int, flagged: bool) -> dict[str, Any]:
    return {
        "score": 2.0 if flagged else 0.1 * (i % 7),
        "threshold": 1.0,
        "is_anomaly": flagged,
        "verdict": "reject" if flagged else "ok",
        "version": 3,
        "estimated_false_alarm_rate": 0.01,
        "recent_id": f"b-{i}",
    }


def test_record_written_and_read_back(location: str) -> None:
    store = open_store(location)
    settings = RecordSettings(
        batch_rows=25, flush_s=3600.0, max_pending_rows=10_000, pass_sample=0.0, image_bytes_per_day=2**20,
        retention_days=30,
    )  # fmt: skip
    rec = InspectionRecorder(store.backend, settings)
    t0 = time.time()
    for i in range(0, 100, 4):  # 4 images per request, every 10th part flagged
        uploads = [(f"{j}.png", f"image-{j}".encode() * 10) for j in range(i, i + 4)]
        rec.submit("line", uploads, [_result(j, j % 10 == 0) for j in range(i, i + 4)], f"req-{i}")
    assert rec.flush(WAIT_S)
    assert rec.written == 100 and rec.files >= 4 and rec.dropped == 0

    rows = read_rows(store.backend, "line")
    assert rows.num_rows == 100
    assert rows.column("name").to_pylist() == [f"{j}.png" for j in range(100)]
    flagged = [r for r in rows.to_pylist() if r["is_anomaly"]]
    assert len(flagged) == 10 and all(r["image_key"] for r in flagged)  # every flagged image kept
    assert sum(1 for r in rows.to_pylist() if r["image_key"]) == 10  # no passed one (pass_sample 0)
    assert store.backend.read(flagged[1]["image_key"])[0] == b"image-10" * 10
    assert len(list(store.backend.list(f"line/{IMAGES}"))) == 10
    # a time range, the newest rows, one row by the console's id, a label given later
    assert read_rows(store.backend, "line", since=t0 - 5, until=time.time() + 5).num_rows == 100
    assert read_rows(store.backend, "line", since=time.time() + 60).num_rows == 0
    assert [r["recent_id"] for r in recent_rows(store.backend, "line", 2)] == ["b-99", "b-98"]
    assert row_of(store.backend, "line", "b-42")["request_id"] == "req-40"
    kept = recorded_images(store.backend, "line", since=t0 - 5)  # compare's image set (item 2's seam)
    assert [(r["name"], data) for r, data in kept] == [
        (f"{j}.png", f"image-{j}".encode() * 10) for j in range(0, 100, 10)
    ]
    LabelSet(store.backend).add("line", b"image-20" * 10, "defective")
    assert read_rows(store.backend, "line").to_pylist()[20]["label"] == "defective"
    rec.close()
    # the record lives with the product: deleting the product's keys deletes it
    store.backend.delete(list(store.backend.list("line/")))
    assert read_rows(store.backend, "line").num_rows == 0
