"""``hetmm inspect --since/--until``: SOURCE is the product's inspection record:
every image the record kept in the range is one row, its path the kept object's URI in
the store, its score equal to ``hetmm predict``'s on the same image; images outside the range are not
scored."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from archive_helpers import PRODUCT, gear_images, read_rows
from PIL import Image

from hetmm_ray.archive import JobOptions, RecordSource, inspect_archive
from hetmm_ray.cli import main
from hetmm_ray.record.writer import InspectionRecorder, RecordSettings
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

T0 = 1_790_000_000.0  # 2026-09-21 UTC: the record's clock, so the range is exact
SETTINGS = RecordSettings(
    batch_rows=1000,
    flush_s=3600.0,
    max_pending_rows=10_000,
    pass_sample=1.0,  # keep every image
    image_bytes_per_day=2**30,
    retention_days=100_000,  # the fixed clock is in the past: retention must not delete it
)


def _png(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def _result(version: int = 1) -> dict:
    return {"score": 0.0, "threshold": 1.0, "is_anomaly": False, "verdict": "ok", "version": version}


def test_record_range_is_scored_like_predict(gear_store: str, tmp_path: Path, local_ray) -> None:
    images = gear_images(8)
    names = sorted(images)
    now = [T0]
    rec = InspectionRecorder(open_store(gear_store).backend, SETTINGS, clock=lambda: now[0])
    for k, name in enumerate(names):
        now[0] = T0 + 100.0 * k  # one image every 100 s
        rec.submit(PRODUCT, [(name, _png(images[name]))], [_result()], f"req{k}")
    assert rec.flush(120.0)
    rec.close()
    since, until = T0 + 250.0, T0 + 650.0  # images 3, 4, 5 and 6
    inside = names[3:7]

    report = inspect_archive(
        RecordSource(gear_store, PRODUCT, since, until),
        PRODUCT,
        str(tmp_path / "out"),
        JobOptions(store=gear_store, batch_size=2),
    )
    rows = read_rows(str(tmp_path / "out"))
    assert report.written == len(rows) == len(inside) and report.errors == 0
    assert all("/inspection-images/" in r["path"] and r["path"].startswith(str(Path(gear_store))) for r in rows)

    folder = tmp_path / "same-images"
    folder.mkdir()
    for name in inside:
        (folder / name).write_bytes(_png(images[name]))
    assert main(
        ["predict", str(folder), "--product", PRODUCT, "--store", gear_store, "--json", str(tmp_path / "p.json")]
    ) in (0, 1)
    predicted = sorted(r["score"] for r in json.loads((tmp_path / "p.json").read_text()))
    ours = sorted(r["score"] for r in rows)
    np.testing.assert_allclose(ours, predicted, rtol=1e-5, atol=2e-6)  # the same images, scored alike

    # the CLI: the same range through --since/--until, one bound in ISO 8601, the other in unix seconds
    iso = datetime.fromtimestamp(since, UTC).replace(tzinfo=None).isoformat()  # a time without a zone is UTC
    cli = ["inspect", "--product", PRODUCT, "--store", gear_store, "--out", str(tmp_path / "cli")]
    assert main([*cli, "--since", iso, "--until", str(until)]) == 0
    assert sorted(r["path"] for r in read_rows(str(tmp_path / "cli"))) == sorted(r["path"] for r in rows)
