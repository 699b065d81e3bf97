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
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.fitting import FitPipeline
from hetmm_ray.detection.frame_cost import TimeBudgetWarning
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 64
MS_PER_SHEET = 0.5  # the cost model: ATMM ms per canvas = 0.5 x the sheets scored against


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


class ModelledCost:
    """A deterministic :class:`~hetmm_ray.detection.frame_cost.FrameCost`: ``backbone_ms`` per frame plus
    ``MS_PER_SHEET`` x K per scored canvas."""

    def __init__(self, backbone_ms: float, canvases: int, scored: int) -> None:
        self.backbone_ms, self.canvases, self.scored = backbone_ms, canvases, scored
        self.post_ms = 0.0
        self.fixed_ms = backbone_ms

    def atmm_ms(self, sheets: int) -> float:
        return MS_PER_SHEET * sheets

    def ms_per_frame(self, sheets: int | Sequence[int]) -> float:
        if isinstance(sheets, int):
            return self.backbone_ms + self.scored * self.atmm_ms(sheets)
        return self.backbone_ms + sum(self.atmm_ms(k) for k in sheets)


@pytest.fixture
def cost_model(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The frame cost from the model (``backbone_ms`` settable per test; each frame canvas counts);
    the out-of-fold ATMM time (reported only) from the model too."""
    settings = {"backbone_ms": 5.0}
    measured = FitPipeline._oof_scores

    def modelled(self: FitPipeline, ts: TemplateSet, templates: TemplateConfig) -> tuple[list[float], float]:
        scores, _ = measured(self, ts, templates)
        return scores, MS_PER_SHEET * templates.sheets_of(ts.n_images)

    def frame_cost(self: FitPipeline) -> ModelledCost:
        scored = self.tiles if self.scored is None else self.scored
        return ModelledCost(settings["backbone_ms"], self.tiles, scored)

    def shared(self: TiledHETMM, frame: object) -> None:  # tiled.py's one measurement for all positions
        for det in self.dets:
            det.pipeline.cost = None  # each position's frame_cost() above

    monkeypatch.setattr(FitPipeline, "_oof_scores", modelled)
    monkeypatch.setattr(FitPipeline, "frame_cost", frame_cost)
    monkeypatch.setattr(TiledHETMM, "_measure_cost", shared)
    return settings


@pytest.fixture(scope="module")
def goods() -> list[np.ndarray]:
    product = SyntheticProduct(seed=3, size=SIZE)
    return [product.good(i) for i in range(45)]


def chosen_frame_ms(auto: dict) -> float:
    return auto["tolerance"]["estimated_ms_per_frame"]


def test_the_chosen_selection_meets_the_budget(goods: Sequence[np.ndarray], cost_model: dict) -> None:
    """45 images, backbone 5 ms per frame; rungs 10 / 20 / 40 cost 10 / 15 / 25 ms per frame, ALL
    27.5 ms; only 40 agrees (it holds every kept image of a fold). A 17 ms budget: 40 and ALL are
    over it, so 20, the largest within; the budget is the frame's, backbone included."""
    free = HETMM(config(**STRICT)).fit(goods).templates.meta["sheets_auto"]
    assert free["chosen"] == 40 and "smallest K that agrees" in free["why"]
    assert all("ms_per_frame" not in r for r in free["ladder"])  # no budget: nothing timed for it
    assert "estimated_ms_per_frame" not in free["tolerance"]
    det = HETMM(config(**STRICT, **{"templates.auto_max_ms_per_image": 17.0})).fit(goods)
    auto = det.templates.meta["sheets_auto"]
    assert det.config.templates.sheets == auto["chosen"] == 20 and "budget" in auto["why"]
    assert chosen_frame_ms(auto) == 15.0 <= 17.0 and auto["tolerance"]["max_ms_per_image"] == 17.0
    assert auto["tolerance"]["fixed_ms_per_frame"] == 5.0
    assert {r["sheets"]: r["ms_per_frame"] for r in auto["ladder"]} == {10: 10.0, 20: 15.0, 40: 25.0}
    assert all(r["sheets"] != 40 or r["agrees"] for r in auto["ladder"])  # refused for time, not agreement


def test_a_tiled_frame_meets_the_budget_with_all_its_tiles(cost_model: dict) -> None:
    """Budget per frame, backbone of both tiles included: 20 ms of backbone and a 42 ms budget leave
    11 ms of ATMM per tile position: 20 sheets (10 ms each), so the frame is estimated at 40 ms. The
    ATMM-only rule of before (42 / 2 = 21 ms per position) took 40 sheets: 20 + 2 x 20 = 60 ms."""
    cost_model["backbone_ms"] = 20.0
    product = SyntheticProduct(seed=3, size=2 * SIZE)
    frames = [product.good(i) for i in range(45)]
    tiles_alone = {"geometry.tiles": [1, 2], "geometry.tile_whole_view": False}  # the two tiles, no whole view
    tiled = config(**STRICT, **{"templates.auto_max_ms_per_image": 42.0, **tiles_alone})
    det = TiledHETMM(tiled).fit(frames)
    autos = [d.templates.meta["sheets_auto"] for d in det.dets]
    assert [a["chosen"] for a in autos] == [20, 20]
    frame = ModelledCost(20.0, 2, 2).ms_per_frame([a["chosen"] for a in autos])
    assert frame == 40.0 <= 42.0 and all(chosen_frame_ms(a) == 40.0 for a in autos)
    assert all(a["tolerance"]["tiles"] == 2 for a in autos)
    assert det.config.templates.auto_max_ms_per_image == 42.0  # the product keeps its frame budget


def test_a_budget_under_the_backbone_alone_warns_and_takes_the_cheapest(
    goods: Sequence[np.ndarray], cost_model: dict
) -> None:
    """The backbone alone (50 ms) is over the 42 ms budget: no template count meets it. The ladder's
    cheapest rung is taken, and a TimeBudgetWarning (stored in ``why`` too) says what it would take."""
    cost_model["backbone_ms"] = 50.0
    with pytest.warns(TimeBudgetWarning, match=r"backbone alone takes 50\.0 ms.*fewer tiles.*smaller backbone"):
        det = HETMM(config(**STRICT, **{"templates.auto_max_ms_per_image": 42.0})).fit(goods)
    auto = det.templates.meta["sheets_auto"]
    assert auto["chosen"] == 10 and "cannot be met" in auto["why"] and chosen_frame_ms(auto) == 55.0


def test_a_budget_met_by_the_backbone_but_not_the_first_rung_warns(
    goods: Sequence[np.ndarray], cost_model: dict
) -> None:
    cost_model["backbone_ms"] = 10.0
    with pytest.warns(TimeBudgetWarning, match=r"10 sheets per scored canvas bring it to 15\.0 ms"):
        det = HETMM(config(**STRICT, **{"templates.auto_max_ms_per_image": 12.0})).fit(goods)
    assert det.templates.meta["sheets_auto"]["chosen"] == 10


def test_without_a_budget_no_frame_cost_is_measured(goods: Sequence[np.ndarray], monkeypatch) -> None:
    """No budget: behaviour as before, nothing timed for it (the cost would fail here)."""

    def refuse(self: FitPipeline) -> None:
        raise AssertionError("frame cost measured without a budget")

    monkeypatch.setattr(FitPipeline, "frame_cost", refuse)
    det = HETMM(config(**STRICT)).fit(goods[:30])
    auto = det.templates.meta["sheets_auto"]
    assert auto["chosen"] == 30 and all("ms_per_frame" not in r for r in auto["ladder"])  # no rung holds a fold


def test_near_duplicate_good_images_are_compressed() -> None:
    """60 copies of one part with a little sensor noise: a few sheets say what every image says,
    so sheets auto (default tolerance) keeps fewer than N, and its verdicts are ALL's."""
    base = SyntheticProduct(seed=3, size=SIZE).good(0).astype(np.float32)
    rng = np.random.default_rng(0)
    images = [np.clip(base + rng.normal(0.0, 2.0, base.shape), 0, 255).astype(np.uint8) for _ in range(60)]
    # Scored by the map's maximum: 60 copies of one part score within noise of each other, and on
    # this small canvas the default top pixels leave a rung's verdicts just short of the agreement
    # the ladder asks for; the claim here is the ladder's, not the score's.
    det = HETMM(config(**{"scoring.score_top_k": 1})).fit(images)
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
    assert stored_config(old) == DetectorConfig().product_only()
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
    again = load_detector(store, "gear", device="cpu")
    after = again.predict(probe)
    assert np.array_equal(before.scores, after.scores) and np.array_equal(before.maps, after.maps)
    assert again.operating_point().threshold == det.operating_point().threshold


def test_real_frame_costs_in_a_tiled_fit_and_compress() -> None:
    """The real measurement end to end (no model): a budget nothing can meet warns and takes the
    ladder's first rung at every position, in a fit (the first frame's tiles) and a compress (a blank
    frame of the training size); a budget anything meets takes what no budget takes."""
    product = SyntheticProduct(seed=3, size=2 * SIZE)
    frames = [product.good(i) for i in range(25)]
    tiled = config(**{"geometry.tiles": [1, 2], "templates.auto_max_ms_per_image": 0.001})
    with pytest.warns(TimeBudgetWarning, match="cannot be met"):
        det = TiledHETMM(tiled).fit(frames)
    autos = [d.templates.meta["sheets_auto"] for d in det.dets]
    assert [a["chosen"] for a in autos] == [10, 10, 10]  # the two tiles and the whole view
    for a in autos:
        tol = a["tolerance"]
        assert 0 < tol["fixed_ms_per_frame"] < tol["estimated_ms_per_frame"], tol
        assert all(r["ms_per_frame"] > tol["fixed_ms_per_frame"] for r in a["ladder"])
    with pytest.warns(TimeBudgetWarning):
        det.compress(sheets="auto")
    assert [d.templates.meta["sheets_auto"]["chosen"] for d in det.dets] == [10, 10, 10]
    free = TiledHETMM(config(**{"geometry.tiles": [1, 2]})).fit(frames)
    roomy = TiledHETMM(config(**{"geometry.tiles": [1, 2], "templates.auto_max_ms_per_image": 1e6})).fit(frames)
    assert [d.config.templates.sheets for d in roomy.dets] == [d.config.templates.sheets for d in free.dets]
