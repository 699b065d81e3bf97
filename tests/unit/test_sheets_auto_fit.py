"""``templates.sheets: auto`` in a fit (fitting.py, tiled.py): the time budget per frame with a
deterministic cost model, compression of near-duplicate good images, and products stored with the
retired ``templates.auto_max_rel_diff`` loading and scoring bit for bit."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from hetmm_ray.config import BackboneConfig, ConfigError, DetectorConfig, TemplateConfig, ThresholdConfig, stored_config
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detector import HETMM
from hetmm_ray.fitting import FitPipeline
from hetmm_ray.store import open_store
from hetmm_ray.tiled import TiledHETMM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 64
MS_PER_SHEET = 0.5  # the cost model: ATMM ms per image = 0.5 x the sheets scored against


def config(**changes) -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(max_images=60, folds=4),
        templates=TemplateConfig(kind="pts_o", sheets="auto"),
        batch_size=8,
        device="cpu",
    )
    return c.replace(**changes) if changes else c


# Nothing agrees but a rung that holds every kept image of a fold (its out-of-fold scores are ALL's,
# up to float rounding, hence not exactly 1 and 0).
STRICT = {"templates.auto_min_rank_corr": 0.999, "templates.auto_max_norm_diff": 1e-6}


@pytest.fixture
def cost_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out-of-fold scores as measured, their ms per image from the cost model (final sheet count)."""
    measured = FitPipeline._oof_scores

    def modelled(self: FitPipeline, ts: TemplateSet, templates: TemplateConfig) -> tuple[list[float], float]:
        scores, _ = measured(self, ts, templates)
        return scores, MS_PER_SHEET * templates.sheets_of(ts.n_images)

    monkeypatch.setattr(FitPipeline, "_oof_scores", modelled)


@pytest.fixture(scope="module")
def goods() -> list[np.ndarray]:
    product = SyntheticProduct(seed=3, size=SIZE)
    return [product.good(i) for i in range(45)]


def chosen_ms(auto: dict) -> float:
    k = auto["chosen"]
    return next((r["ms_per_image"] for r in auto["ladder"] if r["sheets"] == k), auto["all_ms_per_image"])


def test_the_chosen_selection_meets_the_budget(goods: Sequence[np.ndarray], cost_model: None) -> None:
    """45 images, rungs 10 / 20 / 40 cost 5 / 10 / 20 ms, ALL 22.5 ms; only 40 agrees (it holds
    every kept image of a fold). A 12 ms budget: 40 and ALL are over it, so 20, the largest within."""
    free = HETMM(config(**STRICT)).fit(goods).templates.meta["sheets_auto"]
    assert free["chosen"] == 40 and "smallest K that agrees" in free["why"]
    det = HETMM(config(**STRICT, **{"templates.auto_max_ms_per_image": 12.0})).fit(goods)
    auto = det.templates.meta["sheets_auto"]
    assert det.config.templates.sheets == auto["chosen"] == 20 and "budget" in auto["why"]
    assert chosen_ms(auto) == 10.0 <= 12.0 and auto["tolerance"]["max_ms_per_image"] == 12.0
    assert all(r["sheets"] != 40 or r["agrees"] for r in auto["ladder"])  # refused for time, not agreement


def test_a_tiled_frame_meets_the_budget_with_all_its_tiles(cost_model: None) -> None:
    """Budget per frame: 2 tile positions of a 24 ms budget get 12 ms each (20 sheets, 10 ms), so
    the frame costs 20 ms; a per-image budget would have taken 40 sheets (2 x 20 = 40 ms)."""
    product = SyntheticProduct(seed=3, size=2 * SIZE)
    frames = [product.good(i) for i in range(45)]
    tiled = config(**STRICT, **{"templates.auto_max_ms_per_image": 24.0, "geometry.tiles": [1, 2]})
    det = TiledHETMM(tiled).fit(frames)
    autos = [d.templates.meta["sheets_auto"] for d in det.dets]
    assert [a["chosen"] for a in autos] == [20, 20]
    assert sum(chosen_ms(a) for a in autos) <= 24.0
    assert all(a["tolerance"]["tiles"] == 2 and a["tolerance"]["max_ms_per_tile"] == 12.0 for a in autos)
    assert det.config.templates.auto_max_ms_per_image == 24.0  # the product keeps its frame budget


def test_near_duplicate_good_images_are_compressed() -> None:
    """60 copies of one part with a little sensor noise: a few sheets say what every image says,
    so sheets auto (default tolerance) keeps fewer than N, and its verdicts are ALL's."""
    base = SyntheticProduct(seed=3, size=SIZE).good(0).astype(np.float32)
    rng = np.random.default_rng(0)
    images = [np.clip(base + rng.normal(0.0, 2.0, base.shape), 0, 255).astype(np.uint8) for _ in range(60)]
    det = HETMM(config()).fit(images)
    auto = det.templates.meta["sheets_auto"]
    k = det.config.templates.sheets
    assert isinstance(k, int) and k < 60 and k == auto["chosen"], auto
    rung = next(r for r in auto["ladder"] if r["sheets"] == k)
    assert rung["agrees"] and rung["norm_diff"] <= TemplateConfig().auto_max_norm_diff


def test_the_retired_raw_tolerance_is_dropped_from_stored_configs_and_refused_elsewhere() -> None:
    old = DetectorConfig().stored_dict()
    old["templates"] = {k: v for k, v in old["templates"].items() if k != "auto_max_norm_diff"} | {
        "auto_max_rel_diff": 0.05
    }
    assert stored_config(old) == DetectorConfig()
    with pytest.raises(ConfigError, match=r"auto_max_rel_diff.*did you mean 'auto_max_norm_diff'"):
        DetectorConfig.from_dict(old)


def test_a_product_stored_with_the_retired_key_loads_and_scores_bit_for_bit(
    goods: Sequence[np.ndarray], tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    det = HETMM(config(**{"templates.kind": "all"})).fit(goods[:12])
    probe = [goods[20], goods[21]]
    before = det.predict(probe)
    written = DetectorConfig.stored_dict

    def as_before(self: DetectorConfig) -> dict:  # the manifest config of a product stored before
        out = written(self)
        out["templates"] = {k: v for k, v in out["templates"].items() if k != "auto_max_norm_diff"} | {
            "auto_max_rel_diff": 0.05
        }
        return out

    store = open_store(tmp_path / "store")
    with monkeypatch.context() as m:
        m.setattr(DetectorConfig, "stored_dict", as_before)
        version = det.save(store, "gear")
    manifest = store.manifest("gear", version)
    assert manifest["config"]["templates"]["auto_max_rel_diff"] == 0.05
    assert "auto_max_norm_diff" not in manifest["config"]["templates"]
    again = HETMM.load(store, "gear", device="cpu")
    after = again.predict(probe)
    assert np.array_equal(before.scores, after.scores) and np.array_equal(before.maps, after.maps)
    assert again.operating_point().threshold == det.operating_point().threshold
