"""ProductRegistry on a real local Ray: hot update through the shards equals the single-process update."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from helpers import small_pts_config

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.pts import pts_indices
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.distributed import ProductRegistry
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray", "one_torch_thread")

SIZE = 64


@pytest.fixture
def product(tmp_path: Path) -> tuple[str, HETMM, list[np.ndarray]]:
    config = small_pts_config(max_images=4, folds=2, size=SIZE)
    gear = SyntheticProduct(seed=0, size=SIZE)
    det = HETMM(config).fit([gear.good(i) for i in range(6)])
    uri = str(tmp_path / "store")
    det.save(open_store(uri), "gear")
    return uri, det, [gear.good(i) for i in range(50, 54)]


def features(det: HETMM, images: list[np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
    feats, digests = det.extract(images, bank=True)
    return {k: v.numpy() for k, v in feats.items()}, digests


def test_hot_update_through_shards_equals_the_single_process_update(product) -> None:
    uri, det, more = product
    registry = ProductRegistry.remote(uri)
    assert ray.get(registry.head.remote("gear")) == 1
    shards = ray.get(registry.shard_handles.remote("gear"))
    assert sorted(shards) == sorted(det.templates.layers)
    for layer, shard in shards.items():
        got = ray.get(shard.selection.remote())["indices"]
        assert np.array_equal(got, det.templates.indices[layer].numpy())

    waiters = [registry.wait_for_version.remote("gear", 1, 60.0) for _ in range(3)]  # subscribers, parked
    feats, digests = features(det, more[:2])
    assert ray.get(registry.update.remote("gear", feats, digests)) == 2
    assert ray.get(waiters) == [2, 2, 2]  # every subscriber hears of v2
    snapshot = ray.get(registry.snapshot.remote("gear"))  # what replicas score with from now on
    assert snapshot.version == 2

    published = open_store(uri).get("gear")
    det.update(more[:2])  # the same update in one process
    expected = det.templates
    assert published.n_images == 8 and published.image_digests == expected.image_digests
    for layer in expected.layers:
        assert torch.equal(published.bank[layer], expected.bank[layer])
        assert torch.equal(published.indices[layer], expected.indices[layer])
        assert torch.equal(published.indices[layer], pts_indices(published.bank[layer], 3))
    assert published.calibration == expected.calibration


def test_concurrent_updates_serialise_without_losing_images(product) -> None:
    uri, det, more = product
    registry = ProductRegistry.remote(uri)
    batches = [features(det, more[i : i + 2]) for i in (0, 2)]
    versions = ray.get([registry.update.remote("gear", f, d) for f, d in batches])
    assert sorted(versions) == [2, 3]
    final = open_store(uri).get("gear")
    assert final.n_images == 10
    assert set(final.image_digests[6:]) == {d for _, ds in batches for d in ds}


def test_a_failed_update_leaves_the_old_version_everywhere(product) -> None:
    uri, det, more = product
    registry = ProductRegistry.remote(uri)
    feats, digests = features(det, more[:1])
    bad = {k: v for k, v in list(feats.items())[:-1]}  # a layer missing
    with pytest.raises(ray.exceptions.RayTaskError, match="layers"):
        ray.get(registry.update.remote("gear", bad, digests))
    assert ray.get(registry.head.remote("gear")) == 1 and open_store(uri).head("gear") == 1
    shards = ray.get(registry.shard_handles.remote("gear"))
    assert all(ray.get(s.info.remote())["images"] == 6 for s in shards.values())

    open_store(uri).put("gear", det.templates)  # another writer moves the head behind the registry's back
    # The store is the truth: the update builds on the head the other writer made
    # (v2) instead of failing with StoreConflict; only a publish racing its own CAS conflicts.
    assert ray.get(registry.update.remote("gear", feats, digests)) == 3
    final = open_store(uri).get("gear")
    assert final.meta["parent"] == 2 and final.n_images == 7
    assert final.image_digests[:6] == det.templates.image_digests and final.image_digests[6:] == tuple(digests)
    assert ray.get(registry.head.remote("gear")) == 3


def _back_from_the_store(registry, layer: str, old_pid: int, timeout: float = 60.0) -> tuple[dict, object]:
    """The shard's info and handle once the registry holds it again in a live host process."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            shard = ray.get(registry.shard_handles.remote("gear"))[layer]
            info = ray.get(shard.info.remote())
            if info["pid"] != old_pid:
                return info, shard
        except ray.exceptions.RayError:
            pass  # the host is dead or restarting, or restarted and not yet given its shards back
        time.sleep(0.2)
    raise AssertionError("the shard did not come back")


def test_a_killed_shard_comes_back_from_the_store_bit_for_bit(product) -> None:
    uri, det, more = product
    registry = ProductRegistry.remote(uri)
    feats, digests = features(det, more[:2])
    assert ray.get(registry.update.remote("gear", feats, digests)) == 2
    shards = ray.get(registry.shard_handles.remote("gear"))
    layer = sorted(shards)[0]
    shard = shards[layer]
    before = ray.get(shard.tiny.remote())
    old = ray.get(shard.info.remote())
    assert old["version"] == 2
    # A crash of the template host holding it: Ray restarts the host (empty); the registry's next
    # store poll sees it lost its shards and loads them again from the store, on the hosts up then.
    ray.kill(shard.host, no_restart=False)
    info, shard = _back_from_the_store(registry, layer, old["pid"])
    assert info["version"] == 2 and info["images"] == 8
    after = ray.get(shard.tiny.remote())
    assert np.array_equal(after, before)
    stored = open_store(uri).get("gear")
    assert np.array_equal(after, stored.templates(layer).numpy())


def test_cluster_fit_equals_single_process_fit(product) -> None:
    """``HETMM(steps=ray_steps())`` (features and PTS as Ray tasks, as with ``--address``) fits the same set."""
    from hetmm_ray.distributed.ray_steps import ray_steps

    det = product[1]
    gear = SyntheticProduct(seed=0, size=SIZE)
    images = [gear.good(i) for i in range(6)]
    on_ray = HETMM(det.config, steps=ray_steps()).fit(images).templates
    local = det.templates
    assert on_ray.image_digests == local.image_digests
    for layer in local.layers:
        assert torch.equal(on_ray.bank[layer], local.bank[layer])
        assert torch.equal(on_ray.indices[layer], local.indices[layer])
    assert on_ray.calibration == local.calibration


def test_cluster_fit_takes_paths(product, tmp_path: Path) -> None:
    """Paths are a documented input, also with the Ray steps (it raised
    ``ImageError(... got PosixPath)``); the bank equals the in-process fit's."""
    from helpers import png

    from hetmm_ray.distributed.ray_steps import ray_steps

    det = product[1]
    gear = SyntheticProduct(seed=0, size=SIZE)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"good_{i}.png")
        paths[-1].write_bytes(png(gear.good(i)))
    on_ray = HETMM(det.config, steps=ray_steps()).fit([*paths[:3], *map(str, paths[3:])]).templates
    assert on_ray.image_digests == det.templates.image_digests
    for layer in det.templates.layers:
        assert torch.equal(on_ray.bank[layer], det.templates.bank[layer])


def test_cli_address_that_cannot_be_reached_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from PIL import Image

    image = tmp_path / "g.png"
    Image.fromarray(SyntheticProduct(seed=0, size=SIZE).good(0)).save(image)
    argv = ["fit", str(image), str(image), "--product", "x", "--store", str(tmp_path / "s"), "--address", "127.0.0.1:1"]
    done = subprocess.run([sys.executable, "-m", "hetmm_ray.cli", *argv], capture_output=True, text=True, timeout=120)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("hetmm: error: ray cluster at 127.0.0.1:1 is unreachable"), err


def test_a_restarted_registry_recovers_its_state_from_the_store(product) -> None:
    """The registry keeps nothing the store does not have: killed and restarted, it serves the same head."""
    from hetmm_ray.distributed.registry import get_registry

    uri, det, more = product
    registry = get_registry(uri, detached=True)
    feats, digests = features(det, more[:2])
    assert ray.get(registry.update.remote("gear", feats, digests)) == 2
    before = ray.get(registry.snapshot.remote("gear"))
    before_tiny = {k: ray.get(v) for k, v in before.tiny.items()}
    ray.kill(registry, no_restart=False)  # a crash: Ray restarts it (max_restarts=-1)
    try:
        again = get_registry(uri, detached=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert ray.get(again.head.remote("gear"), timeout=30) == 2
                break
            except ray.exceptions.RayActorError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        after = ray.get(again.snapshot.remote("gear"))
        assert after.version == 2 and after.calibration == before.calibration
        for layer, tiny in before_tiny.items():
            assert np.array_equal(ray.get(after.tiny[layer]), tiny)
    finally:
        ray.kill(get_registry(uri, detached=True), no_restart=True)


def test_hot_update_of_an_all_templates_product_with_default_sheets(tmp_path: Path) -> None:
    """``kind: all`` with ``sheets: auto`` in its config (an older default): an update must not
    hand it to PTS."""
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="all", sheets="auto"),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=4,
    )
    gear = SyntheticProduct(seed=0, size=SIZE)
    det = HETMM(config).fit([gear.good(i) for i in range(4)])
    uri = str(tmp_path / "store")
    det.save(open_store(uri), "gear")
    registry = ProductRegistry.remote(uri)
    feats, digests = features(det, [gear.good(60), gear.good(61)])
    assert ray.get(registry.update.remote("gear", feats, digests)) == 2
    published = open_store(uri).get("gear")
    det.update([gear.good(60), gear.good(61)])
    assert published.n_images == 6 and published.indices is None
    assert published.calibration == det.templates.calibration


def test_hot_update_on_the_cluster_covers_a_grown_default_product(tmp_path: Path) -> None:
    """The default selection (``cover``) grown past its sheets by a hot update on the cluster: the
    published version holds the cover of the grown bank and the calibration a one-process update
    computes, with no refit asked for."""
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(sheets=5),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
    )
    assert config.templates.kind == "cover"
    gear = SyntheticProduct(seed=0, size=SIZE)
    det = HETMM(config).fit([gear.good(i) for i in range(4)])
    assert det.templates.indices is None  # 4 images, at most 5 sheets: ALL itself
    uri = str(tmp_path / "store")
    det.save(open_store(uri), "gear")
    registry = ProductRegistry.remote(uri)
    new = [gear.good(60), gear.good(61), gear.good(62)]
    feats, digests = features(det, new)
    assert ray.get(registry.update.remote("gear", feats, digests)) == 2
    published = open_store(uri).get("gear")
    det.update(new)
    assert published.n_images == 7 and published.sheets == 5
    for layer, indices in det.templates.indices.items():
        assert torch.equal(published.indices[layer], indices)
    assert published.calibration == det.templates.calibration


def test_create_with_auto_sheets_runs_the_single_process_pipeline(tmp_path: Path) -> None:
    """The registry's create is the one fit pipeline with its steps in tasks: ``sheets: auto``
    chooses the same K, selection and calibration as a fit in one process."""
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets="auto"),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
    )
    gear = SyntheticProduct(seed=0, size=SIZE)
    images = [gear.good(i) for i in range(6)]
    det = HETMM(config).fit(images)
    uri = str(tmp_path / "store")
    registry = ProductRegistry.remote(uri)
    feats, digests = features(HETMM(config), images)
    assert ray.get(registry.create.remote("gear", config.to_dict(), feats, digests)) == 1
    published = open_store(uri).get("gear")
    assert published.config.templates.sheets == det.config.templates.sheets
    assert published.meta.sheets_auto.chosen == det.templates.meta.sheets_auto.chosen
    for layer in published.layers:
        assert torch.equal(published.indices[layer], det.templates.indices[layer])
    assert published.calibration == det.templates.calibration


@ray.remote
class _Heard:
    """Stands in for the registry's ``job_report``: records what a task reports."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None, int, int]] = []

    def job_report(self, job_id: str, stage: str | None, done: int, total: int) -> None:
        self.events.append((job_id, stage, done, total))

    def heard(self) -> list[tuple[str, str | None, int, int]]:
        return self.events


def test_calibration_in_a_task_reports_its_progress_to_the_job(product) -> None:
    """The service's calibration task tells the job its stage and how many images are scored."""
    from hetmm_ray.distributed.ray_steps import JobReport, service_steps

    _uri, det, _more = product
    heard = _Heard.remote()
    ts = service_steps(report=JobReport(heard, "job-1")).calibrate(det.templates)
    assert ts.calibration == det.templates.calibration
    deadline = time.monotonic() + 60
    while (events := ray.get(heard.heard.remote()))[-1:] != [("job-1", None, 4, 4)]:
        assert time.monotonic() < deadline, events
        time.sleep(0.1)
    assert ("job-1", "calibrate: out-of-fold", 0, 4) in events
