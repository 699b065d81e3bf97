"""The product operations written once (hetmm_ray/workflows/operations.py), in process on a tiny
synthetic product, one canvas and tiled alike: what each stores, live or as a candidate, what a
retried update does, and the refusals that come before any work."""

from __future__ import annotations

import pytest

from hetmm_ray.config import ConfigError, DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.store import StoreConflict, open_store
from hetmm_ray.workflows import operations

CONFIG = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": 32, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "threshold": {"folds": 2},
    "device": "cpu",
}
REGION = {"size": [64, 64], "include": [], "exclude": [{"rect": [0, 0, 20, 64]}]}


@pytest.fixture(scope="module")
def frames():
    part = SyntheticProduct(seed=3, size=64)
    return [part.good(i) for i in range(6)]


@pytest.mark.parametrize("tiles", [None, [2, 2]], ids=["one canvas", "tiled"])
def test_operations_publish_live_or_as_candidates_and_retries_change_nothing(tmp_path, frames, tiles):
    store = open_store(tmp_path / "store")
    cfg = DetectorConfig.from_dict({**CONFIG, **({"geometry": {"tiles": tiles}} if tiles else {})})
    kind = TiledHETMM if tiles else HETMM
    fitted = operations.fit(store, "p", cfg, frames[:4])
    assert (fitted.version, fitted.base, fitted.candidate) == (1, None, False)
    assert type(fitted.detector) is kind and store.head("p") == 1

    grown = operations.update(store, "p", frames[2:6])  # two held already, two new
    assert (grown.version, grown.base, grown.added, grown.skipped, grown.changed) == (2, 1, 2, 2, True)
    assert load_detector(store, "p").template_set().n_images == 6
    again = operations.update(store, "p", frames[2:6])  # a retried update: nothing new, nothing stored
    assert (again.version, again.changed, again.skipped) == (2, False, 4) and store.head("p") == 2

    region = operations.set_region(store, "p", REGION, mode="candidate")
    assert (region.version, region.base, region.candidate) == (3, 2, True)
    assert store.head_and_candidates("p") == (2, [3])  # HEAD stays; the candidate beside it
    assert load_detector(store, "p", 3).config.region == REGION
    assert region.operating_point.threshold != region.before.threshold  # recalibrated under the region

    far = operations.set_far_rule(store, "p", 0.05)
    assert (far.version, far.candidate) == (4, False) and store.head("p") == 4
    assert far.operating_point.target == 0.05


def test_a_region_change_is_refused_before_any_work_on_the_validation_rule(tmp_path, frames):
    store = open_store(tmp_path / "store")
    operations.fit(store, "p", DetectorConfig.from_dict(CONFIG), frames[:4])
    rec = store.record("p", 1)
    store.republish("p", config=rec.config.replace(**{"threshold.rule": "validation"}).stored_dict(), expect_head=1)
    with pytest.raises(ConfigError, match="validation threshold rule"):
        operations.set_region(store, "p", REGION)
    det = load_detector(store, "p", 1)
    det.config = det.config.replace(**{"threshold.rule": "validation"})
    with pytest.raises(ConfigError, match="validation threshold rule"):
        det.with_region(REGION)  # the interface's refusal: the same words on every path
    assert store.head("p") == 2  # nothing written by the refusals


def test_an_update_fails_cleanly_when_another_writer_moved_the_head(tmp_path, frames, monkeypatch):
    store = open_store(tmp_path / "store")
    operations.fit(store, "p", DetectorConfig.from_dict(CONFIG), frames[:4])
    real_load = operations.load_detector

    def load_then_race(*args, **kwargs):  # another writer publishes while this update works
        det = real_load(*args, **kwargs)
        store.republish("p", config=store.record("p", 1).config.stored_dict(), expect_head=1)
        return det

    monkeypatch.setattr(operations, "load_detector", load_then_race)
    with pytest.raises(StoreConflict):
        operations.update(store, "p", frames[4:6])
    # the other writer's version stands
    assert store.head("p") == 2 and load_detector(store, "p").template_set().n_images == 4
