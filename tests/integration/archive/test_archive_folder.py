"""``hetmm inspect`` on a local folder: the Parquet rows equal ``hetmm predict``'s scores and verdicts,
bad files are rows with their error (the job finishes), heat-maps are written; on real bottle images
too when ../shared holds them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from archive_helpers import BAD_FILES, PRODUCT, read_rows, write_bad_files, write_images
from helpers import SHARED

from hetmm_ray.archive import JobOptions, inspect_archive
from hetmm_ray.cli import main
from hetmm_ray.detection.detector_choice import load_detector

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_IMAGES = 24


def _predict_json(folder: Path, store: str, out: Path) -> dict[str, dict]:
    """``hetmm predict`` on the folder, in this process: its JSON records by absolute path."""
    code = main(["predict", str(folder), "--product", PRODUCT, "--store", store, "--json", str(out)])
    assert code in (0, 1)  # 1: it skipped unreadable images
    return {str(Path(r["image"]).resolve()): r for r in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def inspected(gear_store: str, tmp_path_factory: pytest.TempPathFactory, local_ray) -> dict:
    root = tmp_path_factory.mktemp("folder")
    images = write_images(root / "in", N_IMAGES)
    bad = write_bad_files(root / "in")
    (root / "in" / ".hidden.png").write_bytes(b"left out")
    report = inspect_archive(
        str(root / "in"), PRODUCT, str(root / "out"), JobOptions(store=gear_store, batch_size=4), heatmaps=True
    )
    return {"root": root, "images": images, "bad": bad, "report": report, "rows": read_rows(str(root / "out"))}


def test_every_file_is_one_row_and_scores_equal_predict(inspected: dict, gear_store: str) -> None:
    rows = {r["path"]: r for r in inspected["rows"]}
    root = inspected["root"]
    assert len(inspected["rows"]) == len(rows) == N_IMAGES + len(inspected["bad"])  # once each, hidden left out
    assert inspected["report"].written == len(rows) and inspected["report"].errors == len(inspected["bad"])
    predicted = _predict_json(root / "in", gear_store, root / "predict.json")
    assert len(predicted) == N_IMAGES
    ours = np.array([rows[p]["score"] for p in sorted(predicted)])
    theirs = np.array([predicted[p]["score"] for p in sorted(predicted)])
    # float32 rounding of another process's threads
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-6)
    for p, rec in predicted.items():
        assert rows[p]["is_anomaly"] is rec["is_anomaly"], p
        assert rows[p]["verdict"] == rec["verdict"] == ("reject" if rec["is_anomaly"] else "ok")
        assert rows[p]["threshold"] == pytest.approx(rec["threshold"], abs=1e-6)
        assert rows[p]["version"] == rec["version"] == 1 and rows[p]["product"] == PRODUCT
    assert sum(r["is_anomaly"] for r in rows.values() if r["error"] is None) > 0  # defects are found at all


def test_scores_equal_the_detector_in_process_to_float32_rounding(inspected: dict, gear_store: str) -> None:
    from hetmm_ray.data.decode import decode_image, resize_to_geometry
    from hetmm_ray.store import open_store

    det = load_detector(open_store(gear_store), PRODUCT)
    paths = sorted(str(inspected["root"] / "in" / name) for name in inspected["images"])
    size, geometry = det.config.backbone.image_size, det.config.backbone.geometry
    pred = det.predict([resize_to_geometry(decode_image(p), size, geometry) for p in paths])
    rows = {r["path"]: r for r in inspected["rows"]}
    np.testing.assert_allclose([rows[p]["score"] for p in paths], pred.scores.astype(np.float64), rtol=1e-5)
    assert [rows[p]["is_anomaly"] for p in paths] == pred.is_anomaly.tolist()


def test_bad_files_are_rows_with_their_error_and_no_score(inspected: dict) -> None:
    rows = {Path(r["path"]).name: r for r in inspected["rows"]}
    for name in inspected["bad"]:
        row = rows[name]
        assert BAD_FILES[name] in row["error"], row["error"]
        assert row["error"].startswith(str(inspected["root"] / "in" / name))
        assert row["score"] is None and row["verdict"] is None and row["is_anomaly"] is None
    assert all(rows[name]["error"] is None for name in inspected["images"])


def test_rows_carry_location_timings_node_and_heatmap(inspected: dict) -> None:
    for row in inspected["rows"]:
        if row["error"] is not None:
            assert row["heatmap"] is None and row["node"] is None
            continue
        assert (row["width"], row["height"]) == (64, 64)
        assert 0 <= row["peak_x"] < row["width"] and 0 <= row["peak_y"] < row["height"]
        assert row["peak_value"] is not None and row["score_ms"] > 0 and row["decode_ms"] > 0
        assert row["node"] and Path(row["heatmap"]).is_file()
        assert Path(row["heatmap"]).read_bytes().startswith(b"\x89PNG")


BOTTLE = SHARED / "data" / "mvtec_ad" / "bottle"
WEIGHTS = SHARED / "weights" / "mobilenet_v2_imagenet.pth"


@pytest.mark.shared
@pytest.mark.skipif(not (BOTTLE.is_dir() and WEIGHTS.is_file()), reason=f"needs MVTec bottle in {SHARED}")
def test_real_bottle_images_score_as_predict(tmp_path: Path, local_ray) -> None:
    """Real images (900 x 900 PNGs of ../shared) with real mobilenet_v2 weights: the same scores and verdicts."""
    import shutil

    store = str(tmp_path / "store")
    train = sorted((BOTTLE / "train" / "good").glob("*.png"))[:10]
    fit = ["fit", *map(str, train), "--product", PRODUCT, "--store", store, "--backbone", "mobilenet_v2"]
    small = ["--set", "backbone.image_size=128", "--set", "geometry.tile_large_frames=false"]  # one small canvas
    assert main([*fit, "--weights", str(WEIGHTS), *small]) == 0
    test = tmp_path / "test"
    for kind in ("good", "broken_large", "contamination"):
        for p in sorted((BOTTLE / "test" / kind).glob("*.png"))[:4]:
            (test / kind).mkdir(parents=True, exist_ok=True)
            shutil.copy(p, test / kind / p.name)
    report = inspect_archive(str(test), PRODUCT, str(tmp_path / "out"), JobOptions(store=store, batch_size=4))
    assert report.written == 12 and report.errors == 0
    rows = {r["path"]: r for r in read_rows(str(tmp_path / "out"))}
    predicted = _predict_json(test, store, tmp_path / "predict.json")
    assert sorted(rows) == sorted(predicted)
    np.testing.assert_allclose(
        [rows[p]["score"] for p in sorted(rows)], [predicted[p]["score"] for p in sorted(rows)], rtol=1e-5, atol=2e-6
    )
    assert [rows[p]["is_anomaly"] for p in sorted(rows)] == [predicted[p]["is_anomaly"] for p in sorted(rows)]
    assert (rows[str(test / "good" / "000.png")]["width"], rows[str(test / "good" / "000.png")]["height"]) == (900, 900)


def test_score_rows_is_the_same_pipeline_without_writing(inspected: dict, gear_store: str) -> None:
    """The seam for comparing candidate versions: rows of one version, nothing written or skipped."""
    from hetmm_ray.archive import score_rows

    folder = inspected["root"] / "in"
    before = sorted(p.name for p in (inspected["root"] / "out").iterdir())
    rows = {r["path"]: r for r in score_rows(str(folder), PRODUCT, 1, JobOptions(store=gear_store, batch_size=8))}
    written = {r["path"]: r for r in inspected["rows"]}
    assert rows.keys() == written.keys()
    for path, row in rows.items():
        assert row["version"] == 1 and row["error"] == written[path]["error"]
        assert row["score"] == pytest.approx(written[path]["score"], rel=1e-5) if row["score"] is not None else True
    assert sorted(p.name for p in (inspected["root"] / "out").iterdir()) == before
