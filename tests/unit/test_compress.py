"""Template selection through the detector, the store and the CLI (PTS wired end to end)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from reference_impls import select

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.calibration import fold_plan
from hetmm_ray.core.cover import cover_indices
from hetmm_ray.core.pts import pts_indices, select_layers
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import SyntheticProduct, write_mvtec_layout
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

SIZE = 64
FLAGS = ["--backbone", "resnet18", "--weights", "random", "--set", f"backbone.image_size={SIZE}"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(kind: str = "all", sheets: int = 3) -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind=kind, sheets=sheets),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=4,
    )


@pytest.fixture(scope="module")
def images() -> tuple[list[np.ndarray], list[np.ndarray]]:
    product = SyntheticProduct(seed=0, size=SIZE)
    train = [product.good(i) for i in range(7)]
    query = [product.good(100), product.defective(101, "hole")[0]]
    return train, query


def test_fit_with_pts_stores_the_exact_pts_indices(images):
    train, query = images
    det = HETMM(config("pts_o", 3)).fit(train)
    ts = det.templates
    assert ts is not None and ts.sheets == 3 and ts.centres is None
    for layer, bank in ts.bank.items():
        assert torch.equal(ts.indices[layer], pts_indices(bank, 3))
        assert torch.equal(ts.templates(layer), select("pts_o", bank, 3).templates)
    pred = det.predict(query)
    assert pred.scores.shape == (2,) and np.isfinite(pred.threshold)


@pytest.mark.parametrize("kind", ["cover", "ir", "pr", "pc_k", "pts_k", "pts_o"])
def test_compress_round_trips_through_the_store(images, tmp_path, kind):
    train, query = images
    det = HETMM(config()).fit(train)
    assert det.templates.sheets == 7
    det.compress(kind, 3)
    assert det.config.templates.kind == kind and det.templates.sheets == 3
    assert (det.templates.centres is not None) == (kind == "pc_k")
    store = open_store(tmp_path)
    version = det.save(store, "gear")
    loaded = load_detector(store, "gear", version)
    assert loaded.templates.sheets == 3
    for layer in det.templates.layers:
        assert torch.equal(loaded.templates.templates(layer), det.templates.templates(layer))
    np.testing.assert_array_equal(loaded.predict(query).scores, det.predict(query).scores)
    assert loaded.operating_point().threshold == det.operating_point().threshold


def test_calibration_leaves_the_held_out_images_sheets_out(images):
    det = HETMM(config("pts_o", 3)).fit(images[0])
    ts = det.templates
    held = [1, 4]
    prepared = det.scorer.prepare(ts, held_out=held)
    for layer, pm in prepared.items():
        idx = ts.indices[layer]  # (K, H, W)
        k, h, w = idx.shape
        t = pm.reshape(h, w, k, -1).permute(2, 3, 0, 1)  # back to (K, C, H, W)
        left_out = torch.isin(idx, torch.tensor(held))
        assert left_out.any()
        assert (t.permute(0, 2, 3, 1)[left_out] == 0).all()
        kept = ts.templates(layer).float().permute(0, 2, 3, 1)[~left_out]
        assert torch.equal(t.permute(0, 2, 3, 1)[~left_out], kept)


def test_update_reselects_from_the_grown_bank(images):
    train, _ = images
    det = HETMM(config("pts_o", 3)).fit(train[:5])
    det.update(train[5:])
    ts = det.templates
    assert ts.n_images == 7 and ts.sheets == 3
    for layer, bank in ts.bank.items():
        assert torch.equal(ts.indices[layer], pts_indices(bank, 3))


def test_a_default_product_grown_past_its_sheets_is_compressed_by_the_hot_update(images):
    """The default selection (``cover``): a bank of at most ``sheets`` images is ALL
    itself (nothing selected, nothing stored); a hot update past it selects ``sheets`` per pixel
    from the grown bank, with no refit asked for."""
    assert DetectorConfig().templates.kind == "cover"
    train, query = images
    cfg = config().replace(**{"templates.kind": "cover", "templates.sheets": 5})
    det = HETMM(cfg).fit(train[:4])
    assert det.templates.indices is None and det.templates.sheets == 4
    before = det.predict(query).scores
    np.testing.assert_array_equal(before, HETMM(config()).fit(train[:4]).predict(query).scores)  # = ALL
    det.update(train[4:])
    ts = det.templates
    assert ts.n_images == 7 and ts.sheets == 5
    for layer, bank in ts.bank.items():
        assert torch.equal(ts.indices[layer], cover_indices(bank, 5)[0])


def test_cover_calibration_is_one_selection_per_fold_made_in_one_pass(images):
    """The cover kind selects every fold's templates in one pass over the bank; the out-of-fold
    scores equal those of a refit per fold (the kept images selected alone), so the threshold is
    as honest as ten compressions in a row."""
    cfg = config("cover", 3).replace(**{"threshold.max_images": 7, "threshold.folds": 3})
    det = HETMM(cfg).fit(images[0])
    ts = det.templates
    oof = det.pipeline.out_of_fold(ts)
    th = cfg.threshold
    plan = fold_plan(ts.n_images, folds=th.folds, max_images=th.max_images, seed=th.seed, keys=ts.image_digests)
    expected = {}
    for held in plan:
        kept = [i for i in range(ts.n_images) if i not in held]
        bank = {k: v[kept] for k, v in ts.bank.items()}
        indices, _ = select_layers(bank, "cover", 3)
        fold = TemplateSet(
            bank=bank, config=ts.config, weights_id=ts.weights_id,
            image_digests=tuple(ts.image_digests[i] for i in kept), indices=indices,
        )  # fmt: skip
        scores = det.scorer.score({k: v[held] for k, v in ts.bank.items()}, det.scorer.prepare(fold), None)
        expected.update(zip(held, scores.tolist(), strict=True))
    assert oof.by_image() == expected


def test_cli_compress_and_evaluate_with_pts(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data = write_mvtec_layout(tmp_path / "data", n_train=6, n_test_good=2, n_test_per_defect=1, size=SIZE)
    store = str(tmp_path / "store")
    small = ["--set", "threshold.max_images=4", "--set", "threshold.folds=2"]
    assert main(["fit", str(data / "train" / "good"), "--product", "gear", "--store", store, *FLAGS, *small]) == 0
    assert main(["compress", "--product", "gear", "--store", store, "--templates", "pts", "--sheets", "2"]) == 0
    out = capsys.readouterr().out
    assert "version 2 = pts_o with 2 sheets of 6 images" in out
    assert main(["versions", "--product", "gear", "--store", store]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[-1].startswith("*") and listing[-1].split()[1:5] == ["2", "1", "6", "2"]
    result = tmp_path / "eval.json"
    argv = ["evaluate", "--data", str(data), *FLAGS, *small, "--templates", "pts_o", "--sheets", "2"]
    assert main([*argv, "--json", str(result)]) == 0
    got = json.loads(result.read_text())
    assert got["templates"] == "pts_o" and got["sheets"] == 2 and 0 <= got["image_auroc"] <= 100


def test_cli_update_appends_images_as_a_new_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    data = write_mvtec_layout(tmp_path / "data", n_train=5, n_test_good=3, n_test_per_defect=1, size=SIZE)
    store_dir = str(tmp_path / "store")
    small = ["--set", "threshold.max_images=4", "--set", "threshold.folds=2", "--templates", "pts", "--sheets", "2"]
    fit = ["fit", str(data / "train" / "good"), "--product", "gear", "--store", store_dir, *FLAGS, *small]
    assert main(fit) == 0
    assert main(["update", str(data / "test" / "good"), "--product", "gear", "--store", store_dir]) == 0
    assert "version 2 (from v1) with 3 more good images, 8 in all" in capsys.readouterr().out
    store = open_store(store_dir)
    v1, v2 = store.manifest("gear", 1), store.manifest("gear", 2)
    assert v2["images"] == 8 and v2["parent"] == 1
    assert v2["chunks"][: len(v1["chunks"])] == v1["chunks"]  # appended, not rewritten
    ts = store.get("gear")
    assert ts.sheets == 2 and ts.config.templates.kind == "pts_o"
    for layer, bank in ts.bank.items():
        assert torch.equal(ts.indices[layer], pts_indices(bank, 2))
    assert main(["update", str(tmp_path / "missing"), "--product", "gear", "--store", store_dir]) == 2
    assert store.head("gear") == 2  # a failed update leaves the head alone


def test_compress_with_a_device_stores_no_run_time_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """``hetmm compress --device ...`` once wrote ``device`` into the manifest, so a later
    CPU-only host tried the compressing host's CUDA. Run-time settings are never stored; and a
    selection over fewer images than K reports the sheets it holds (6), not the configured 60."""
    from hetmm_ray.config import RUN_TIME_SETTINGS

    data = write_mvtec_layout(tmp_path / "data", n_train=6, n_test_good=1, n_test_per_defect=1, size=SIZE)
    store = str(tmp_path / "store")
    small = ["--set", "threshold.max_images=4", "--set", "threshold.folds=2", "--set", "batch_size=3"]
    fit = ["fit", str(data / "train" / "good"), "--product", "gear", "--store", store, *FLAGS, *small]
    assert main([*fit, "--device", "cpu", "--dtype", "float32"]) == 0
    compress = ["compress", "--product", "gear", "--store", store, "--templates", "pts", "--sheets", "60"]
    assert main([*compress, "--device", "cpu"]) == 0
    assert "pts_o with 6 sheets of 6 images" in capsys.readouterr().out
    for version in (1, 2):
        stored = open_store(store).manifest("gear", version)["config"]
        assert not set(RUN_TIME_SETTINGS) & set(stored), stored
    assert open_store(store).get("gear").config.device == "auto"  # this host's default, not the writer's
    assert main(["versions", "--product", "gear", "--store", store]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[-1].split()[1:5] == ["2", "1", "6", "6"]  # version, parent, images, sheets held
