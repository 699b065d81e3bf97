"""A tiled product's create and hot update as the service runs them (``ProductRegistry.start_create`` /
``start_normals`` on a real local Ray: the frames' tile features as frame-batch tasks, then one fit
task) publish exactly what the in-process fit and update store: the same images, threshold, frame
calibration, tile scales and every position's template tensors. The frame-batch extraction itself
equals the one-process extraction, and a bad frame is named by its index."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from helpers import png

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.decode import ImageError
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.interface import frames_per_pass
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.distributed import ProductRegistry
from hetmm_ray.distributed.extract import extract_tiles_ray
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

pytestmark = pytest.mark.usefixtures("local_ray", "one_torch_thread")

FRAME = 96
CONFIG = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
    templates=TemplateConfig(kind="pts_o", sheets=3),
    threshold=ThresholdConfig(max_images=6, folds=2),
    batch_size=8,  # 4 tiles: 2 frames per backbone pass, so 6 frames are 3 feature tasks
    device="cpu",
).replace(**{"geometry.tiles": [2, 2], "geometry.tile_overlap": 8})


@pytest.fixture(scope="module")
def part() -> SyntheticProduct:
    return SyntheticProduct(seed=5, size=FRAME)


def finished(registry: Any, job: dict[str, Any], timeout: float = 240.0) -> dict[str, Any]:
    """The job's record once it has ended (the registry waits for it, a few seconds at a time)."""
    deadline = time.monotonic() + timeout
    while (record := ray.get(registry.job.remote(job["id"], 5.0)))["state"] == "running":
        assert time.monotonic() < deadline, record
    return record


def same_product(got: TemplateSet, want: TemplateSet) -> None:
    """Two stored tiled versions hold the same product (creation times aside)."""
    assert got.n_images == want.n_images and got.image_digests == want.image_digests
    assert got.calibration == want.calibration  # the frame calibration
    assert got.config.stored_dict() == want.config.stored_dict()
    got_tiles, want_tiles = got.meta["tiles"], want.meta["tiles"]
    assert got_tiles["scales"] == want_tiles["scales"] and got_tiles["frame"] == want_tiles["frame"]
    assert [s["calibration"] for s in got_tiles["sets"]] == [s["calibration"] for s in want_tiles["sets"]]
    assert set(got.bank) == set(want.bank) and got.indices is not None and want.indices is not None
    for key in want.bank:
        assert got.bank[key].dtype == want.bank[key].dtype, key
        assert torch.equal(got.bank[key], want.bank[key]), key
        assert torch.equal(got.indices[key], want.indices[key]), key
        assert torch.equal(got.templates(key), want.templates(key)), key


def test_the_service_create_and_hot_update_publish_the_in_process_product(tmp_path: Path, part) -> None:
    frames = [part.good(i) for i in range(6)]
    uri = str(tmp_path / "service")
    registry = ProductRegistry.remote(uri)
    job = ray.get(registry.start_create.remote("plate", CONFIG.to_dict(), [png(f) for f in frames]))
    record = finished(registry, job)
    assert record["state"] == "succeeded" and record["version"] == 1, record
    # the cost, measured in the first feature task: grid, tile size, sheets per tile, ms per frame
    assert record["tiles"] == [2, 2] and record["tile_px"] == [52, 52], record  # ceil((96 + 8) / 2)
    assert record["sheets"] == 3 and record["estimated_ms_per_frame"] > 0, record

    local = open_store(str(tmp_path / "local"))
    operations.fit(local, "plate", CONFIG, frames)  # the same frames in this process
    service = open_store(uri)
    same_product(service.get("plate", 1), local.get("plate", 1))
    got, want = service.record("plate", 1), local.record("plate", 1)
    assert got.images == want.images == 6
    assert got.operating_point() == want.operating_point()  # the same threshold, rule and rate
    shards = ray.get(registry.shard_handles.remote("plate"))
    assert set(shards) == set(service.get("plate", 1).bank)  # its (position, layer) shards, loaded

    more = [part.good(i) for i in (40, 41)]
    job = ray.get(registry.start_normals.remote("plate", [png(f) for f in more]))
    record = finished(registry, job)
    assert record["state"] == "succeeded" and record["version"] == 2 and record["added_images"] == 2, record
    grown = load_detector(local, "plate", 1, device="cpu").update(more)
    assert isinstance(grown, TiledHETMM)
    same_product(service.get("plate", 2), grown.template_set())
    assert service.record("plate", 2).images == 8
    for handle in ray.get(registry.shard_handles.remote("plate")).values():
        info = ray.get(handle.info.remote())
        assert info["version"] == 2 and info["images"] == 8, info  # grown in place
    job = ray.get(registry.start_normals.remote("plate", [png(f) for f in more]))  # a retry adds nothing
    record = finished(registry, job)
    assert record["version"] == 2 and record["skipped_duplicates"] == 2, record
    assert service.head("plate") == 2


def test_frame_batches_as_tasks_equal_the_one_process_extraction(part) -> None:
    frames = [part.good(i) for i in range(5)]
    images = [png(f) if i % 2 else f for i, f in enumerate(frames)]  # bytes and arrays mixed
    calls: list[tuple[int, int]] = []
    batches = extract_tiles_ray(CONFIG, images, progress=lambda d, t: calls.append((d, t)))
    assert frames_per_pass(CONFIG) == 2 and len(batches.nodes) == 3 and len(batches.positions) == 5
    got = batches.gathered()
    want = TiledHETMM(CONFIG).extract_tiles(frames)
    assert got.digests == want.digests and got.shapes == want.shapes == [(FRAME, FRAME)] * 5
    assert got.boxes == want.boxes and list(got.feats) == list(want.feats) == list(CONFIG.backbone.taps)
    for layer, v in want.feats.items():
        assert got.feats[layer].dtype == v.dtype == np.float16  # the bank dtype
        assert got.feats[layer].shape[0] == 5 * 5  # 4 tiles and the whole view per frame
        assert np.array_equal(got.feats[layer], v), layer  # the same groups through the same code
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[-1] == (5, 5) and len(calls) == 3
    with pytest.raises(ValueError, match="multiple of 2"):
        extract_tiles_ray(CONFIG, images, frames_per_task=3)


def test_fit_from_gathered_slices_is_the_fit_of_every_frame(part) -> None:
    """(a) on slices of whole backbone groups, gathered in order, then (b): the product ``fit`` makes."""
    from hetmm_ray.detection.tiled import TileFeatures

    frames = [part.good(i) for i in range(6)]
    det = TiledHETMM(CONFIG)
    extracted = TileFeatures.gathered([det.extract_tiles(frames[:4]), det.extract_tiles(frames[4:])])
    split = TiledHETMM(CONFIG).fit_extracted(extracted, frames[0])
    whole = TiledHETMM(CONFIG).fit(frames)
    same_product(split.template_set(), whole.template_set())
    with pytest.raises(ValueError, match="positions per frame"):
        TiledHETMM(CONFIG.replace(**{"geometry.tile_whole_view": False})).fit_extracted(extracted, frames[0])


def test_a_bad_frame_is_named_by_its_index(part) -> None:
    images = [png(part.good(i)) for i in range(4)]
    images[3] = images[3][:200]  # truncated
    with pytest.raises(ImageError, match=r"^image 3: "):
        extract_tiles_ray(CONFIG, images)
