"""Regions on the command line: ``hetmm fit --region``, ``hetmm region``, ``hetmm evaluate --region``,
region files (JSON, YAML, PNG masks) and their one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.config import ConfigError
from hetmm_ray.core.region import raster
from hetmm_ray.data.region_file import read_region
from hetmm_ray.data.synthetic import SyntheticProduct, write_mvtec_layout
from hetmm_ray.store import open_store

FLAGS = ["--backbone", "resnet18", "--weights", "random", "--device", "cpu", "--set", "backbone.image_size=64"]
FLAGS += ["--set", "threshold.max_images=6", "--set", "threshold.folds=3"]
SIZE = 64


def run(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.strip() and "%|" not in x]
    assert len(lines) == 1 and lines[0].startswith("hetmm: error:"), lines
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def coded() -> SyntheticProduct:
    return SyntheticProduct(seed=4, size=SIZE, printed_code=True)


@pytest.fixture(scope="module")
def train(tmp_path_factory, coded) -> Path:
    root = tmp_path_factory.mktemp("train")
    for i in range(6):
        Image.fromarray(coded.good(i)).save(root / f"{i:03d}.png")
    return root


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


# --- region files ---------------------------------------------------------------------------
def test_region_files(tmp_path) -> None:
    shapes = {"size": [40, 50], "exclude": [{"rect": [5, 5, 20, 20]}]}
    from_json = read_region(write_json(tmp_path / "r.json", shapes))
    (tmp_path / "r.yaml").write_text("size: [40, 50]\nexclude:\n  - rect: [5, 5, 20, 20]\n")
    assert read_region(tmp_path / "r.yaml") == from_json
    mask = np.full((40, 50), 255, dtype=np.uint8)
    mask[5:20, 5:20] = 0
    Image.fromarray(mask).save(tmp_path / "m.png")
    from_png = read_region(tmp_path / "m.png")
    assert np.array_equal(raster(from_png), raster(from_json))
    assert read_region("none") is None


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("bad.json", "{not json", "not valid JSON"),
        ("out.json", json.dumps({"size": [10, 10], "include": [{"rect": [0, 0, 20, 5]}]}), "outside the 10 x 10"),
        ("empty.json", json.dumps({"size": [10, 10], "exclude": [{"rect": [0, 0, 10, 10]}]}), "no pixel"),
        ("r.txt", "x", "unknown region file type"),
    ],
)
def test_bad_region_files(tmp_path, name: str, content: str, words: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=words):
        read_region(tmp_path / name)


def test_empty_mask_is_refused(tmp_path) -> None:
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / "zero.png")
    with pytest.raises(ConfigError, match="empty include area"):
        read_region(tmp_path / "zero.png")


# --- the commands ---------------------------------------------------------------------------
def test_fit_with_a_region_and_a_new_region_version(capsys, tmp_path, train, coded) -> None:
    store = tmp_path / "store"
    code, out, err = run(capsys, "fit", train, "--product", "g", "--store", store, *FLAGS)
    assert code == 0, err
    plain = open_store(store).get("g")
    region = write_json(tmp_path / "code.json", {"size": [SIZE, SIZE], "exclude": [{"rect": coded.code_region()}]})
    code, out, err = run(capsys, "region", "--product", "g", "--region", region, "--store", store)
    assert code == 0, err
    assert "version 2 (from v1)" in out and "1 exclude shapes" in out
    ruled = open_store(store).get("g")
    assert ruled.config.region == read_region(region)
    assert ruled.image_digests == plain.image_digests  # the same templates, recalibrated
    assert np.mean(ruled.calibration.scores) < np.mean(plain.calibration.scores)
    # fit --region gives the same calibration as fit then region
    code, out, err = run(capsys, "fit", train, "--product", "h", "--store", store, *FLAGS, "--region", region)
    assert code == 0, err
    assert "region 0 include / 1 exclude" in out
    assert open_store(store).get("h").calibration.scores == ruled.calibration.scores
    # and 'none' removes it again: the calibration of the plain fit
    code, out, err = run(capsys, "region", "--product", "g", "--region", "none", "--store", store)
    assert code == 0, err
    again = open_store(store).get("g")
    assert again.config.region is None and again.calibration.scores == plain.calibration.scores


def test_region_errors_are_one_line(capsys, tmp_path, train) -> None:
    store = tmp_path / "store"
    bad = write_json(tmp_path / "bad.json", {"size": [SIZE, SIZE], "include": [{"rect": [0, 0, 99, 9]}]})
    code, _, err = run(capsys, "fit", train, "--product", "g", "--store", store, *FLAGS, "--region", bad)
    one_error_line(code, err, "bad.json", "outside the 64 x 64 frame")
    empty = write_json(tmp_path / "empty.json", {"size": [SIZE, SIZE], "include": [{"rect": [1.6, 1.6, 2.4, 2.4]}]})
    code, _, err = run(capsys, "fit", train, "--product", "g", "--store", store, *FLAGS, "--region", empty)
    one_error_line(code, err, "no pixel")
    code, _, err = run(capsys, "region", "--product", "g", "--region", tmp_path / "missing.json", "--store", store)
    one_error_line(code, err, "cannot read the region file")
    # a region too small for the map: refused before the fit's work
    tiny = write_json(tmp_path / "tiny.json", {"size": [2000, 2000], "include": [{"rect": [0, 0, 3, 3]}]})
    code, _, err = run(capsys, "fit", train, "--product", "g", "--store", store, *FLAGS, "--region", tiny)
    one_error_line(code, err, "covers no pixel of the 64-px map")


def test_evaluate_with_a_region(capsys, tmp_path) -> None:
    data = write_mvtec_layout(tmp_path / "gear", n_train=6, n_test_good=3, n_test_per_defect=2, size=SIZE)
    region = write_json(tmp_path / "r.json", {"size": [SIZE, SIZE], "exclude": [{"rect": [0, 0, 64, 20]}]})
    out_json = tmp_path / "r.json.out"
    code, _, err = run(capsys, "evaluate", "--data", data, *FLAGS, "--region", region, "--json", out_json)
    assert code == 0, err
    result = json.loads(out_json.read_text())
    assert result["pixel_auroc"] is not None and result["pro"] is not None
