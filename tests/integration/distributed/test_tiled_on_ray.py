"""A tiled product's fit, hot update and compress with each tile position's PTS as Ray tasks (``fit_steps``,
what ``hetmm fit/update/compress --address`` gives) equal the in-process ones, on a real local Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from helpers import png

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.fit_steps import FitSteps
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.distributed.pts_fanout import pts_indices_ray
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray", "one_torch_thread")

FRAME = 96
TILED = {"geometry.tiles": [2, 2], "geometry.tile_overlap": 8, "geometry.tile_whole_view": False}


def config() -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
        device="cpu",
    )
    return c.replace(**TILED)


def same(a: TemplateSet, b: TemplateSet) -> None:
    assert a.image_digests == b.image_digests and a.calibration == b.calibration
    assert a.meta["tiles"]["scales"] == b.meta["tiles"]["scales"]
    for key in a.bank:
        assert torch.equal(a.bank[key], b.bank[key]), key
        assert torch.equal(a.indices[key], b.indices[key]), key


def test_each_positions_pts_as_ray_tasks_gives_the_in_process_product() -> None:
    part = SyntheticProduct(seed=6, size=FRAME)
    frames, more = [part.good(i) for i in range(6)], [part.good(i) for i in (40, 41)]
    calls: list[int] = []

    def pts_on_ray(*args, **kwargs):  # the Ray step, counted: the positions' PTS went through it
        calls.append(1)
        return pts_indices_ray(*args, **kwargs)

    on_ray = TiledHETMM(config(), steps=FitSteps(pts=pts_on_ray)).fit(frames)
    local = TiledHETMM(config()).fit(frames)
    per_fit = 4 * 3 * (1 + 2)  # positions x layers x (the selection + one per out-of-fold fold)
    assert len(calls) == per_fit
    same(on_ray.template_set(), local.template_set())
    on_ray.update(more)
    local.update(more)
    assert len(calls) == 2 * per_fit  # re-selected and recalibrated
    same(on_ray.template_set(), local.template_set())
    # another region keeps the steps (a new detector, recalibrated; no selection)
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [0, 0, 20, 20]}]}
    assert all(d.pipeline.steps.pts is pts_on_ray for d in on_ray.with_region(region).dets)


def test_cli_fit_update_compress_of_a_tiled_product_with_address(tmp_path: Path) -> None:
    """``--address`` on a tiled product (refused before: "tiled products are fit in process"): the same
    stored versions as without it."""
    part = SyntheticProduct(seed=7, size=FRAME)
    train, more = tmp_path / "train", tmp_path / "more"
    for folder, indices in ((train, range(6)), (more, (50, 51))):
        folder.mkdir()
        for i in indices:
            (folder / f"{i:03d}.png").write_bytes(png(part.good(i)))
    store = str(tmp_path / "store")
    flags = ["--store", store, "--backbone", "resnet18", "--weights", "random", "--device", "cpu"]
    flags += ["--set", "backbone.image_size=48", "--set", "threshold.max_images=6", "--set", "threshold.folds=2"]
    flags += ["--templates", "pts_o", "--sheets", "3", "--set", "geometry.tiles=[2,2]"]
    flags += ["--set", "geometry.tile_whole_view=false"]
    address = ["--address", ray.get_runtime_context().gcs_address]
    for name, extra in (("here", []), ("ray", address)):
        assert main(["fit", str(train), "--product", name, *flags, *extra]) == 0
        assert main(["update", str(more), "--product", name, "--store", store, *extra]) == 0
        assert main(["compress", "--product", name, "--store", store, "--sheets", "2", *extra]) == 0
    s = open_store(store)
    for version in (1, 2, 3):
        same(s.get("ray", version), s.get("here", version))
    assert s.record("ray", 3).sheets == 2 and s.record("ray", 2).images == 8
    np.testing.assert_array_equal(
        load_detector(s, "ray", device="cpu").predict([part.good(90)]).scores,
        load_detector(s, "here", device="cpu").predict([part.good(90)]).scores,
    )


def test_cli_tiled_fit_at_an_unreachable_address_is_one_line(tmp_path: Path) -> None:
    part = SyntheticProduct(seed=7, size=FRAME)
    for i in range(2):
        (tmp_path / f"{i}.png").write_bytes(png(part.good(i)))
    argv = ["fit", str(tmp_path), "--product", "x", "--store", str(tmp_path / "s"), "--set", "geometry.tiles=[2,2]"]
    argv += ["--backbone", "resnet18", "--weights", "random", "--address", "127.0.0.1:1"]
    done = subprocess.run([sys.executable, "-m", "hetmm_ray.cli", *argv], capture_output=True, text=True, timeout=180)
    err = [line for line in done.stderr.splitlines() if line.startswith("hetmm:")]
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("hetmm: error: ray cluster at 127.0.0.1:1 is unreachable"), err
