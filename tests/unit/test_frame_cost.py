"""``frame_cost.FrameCost`` / ``estimate_ms_per_frame``: the frame's scoring cost on this host (backbone of
all its canvases + ATMM of every scored canvas), the figure ``hetmm fit`` prints, the create job
reports and ``sheets: auto``'s time budget is judged by.

The bookkeeping is checked against a slow obvious computation with a clock that counts the work
(each canvas through the backbone, each sheet scored against) instead of the wall time; the real
clock only has to order obviously different amounts of work.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.config import BackboneConfig, DetectorConfig, ScoringConfig, TemplateConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.frame_cost import FrameCost, blank_frame_crops, estimate_ms_per_frame
from hetmm_ray.detection.scorer import Scorer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 32
BACKBONE_S = 0.004  # the counting clock: seconds per canvas through the backbone
ATMM_S = 0.0005  # and per sheet a canvas is scored against


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE, layers=("layer2", "layer3")),
        scoring=ScoringConfig(forward_windows=(3, 3), backward_windows=(3, 3), alphas=(0.5, 0.5), layer_weights=(1, 1)),
        templates=TemplateConfig(kind="all"),
        device="cpu",
    )


class CountingClock:
    """Seconds that pass only when the counted work runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def counting_scorer(clock: CountingClock) -> Scorer:
    """A real scorer whose backbone pass and ATMM scoring advance ``clock`` by the work they do."""
    scorer = HETMM(config()).scorer
    features, prepare, score_maps = scorer.features, scorer.prepare, scorer.score_maps
    sheets = {"k": 0}

    def counted_features(batch, boxes=None):
        clock.now += BACKBONE_S * batch.shape[0]
        return features(batch, boxes)

    def counted_prepare(ts, held_out=None):
        sheets["k"] = ts.n_images
        return prepare(ts, held_out)

    def counted_score_maps(feats, prepared, boxes=None, **kw):
        clock.now += ATMM_S * sheets["k"] * next(iter(feats.values())).shape[0]
        return score_maps(feats, prepared, boxes, **kw)

    scorer.features, scorer.prepare, scorer.score_maps = counted_features, counted_prepare, counted_score_maps
    return scorer


def slow_obvious_ms(canvases: int, scored_sheets: list[int]) -> float:
    """A frame's cost by hand: every canvas through the backbone once, every scored canvas against its sheets."""
    return 1000 * (BACKBONE_S * canvases + sum(ATMM_S * k for k in scored_sheets))


@pytest.mark.parametrize(("canvases", "scored", "sheets"), [(1, None, 7), (4, None, 20), (4, 3, 20), (6, 1, 1)])
def test_the_estimate_is_the_backbone_of_every_canvas_plus_atmm_of_every_scored_one(canvases, scored, sheets):
    clock = CountingClock()
    product = SyntheticProduct(seed=0, size=48)
    crops = [product.good(i) for i in range(canvases)]
    cost = FrameCost(counting_scorer(clock), crops, scored=scored, clock=clock)
    n_scored = canvases if scored is None else scored
    # the untimed first pass (it builds the network) is not counted; one batch of all canvases is
    assert cost.backbone_ms == pytest.approx(slow_obvious_ms(canvases, []))
    assert cost.atmm_ms(sheets) == pytest.approx(slow_obvious_ms(0, [sheets]))
    assert cost.ms_per_frame(sheets) == pytest.approx(slow_obvious_ms(canvases, [sheets] * n_scored))
    # positions holding different counts (a tiled product): each scored canvas its own
    mixed = [sheets + i for i in range(n_scored)]
    assert cost.ms_per_frame(mixed) == pytest.approx(slow_obvious_ms(canvases, mixed))


def test_other_per_frame_work_is_fixed_cost():
    """``post`` (a tiled frame's stitching) is timed like the backbone and counted once per frame."""
    clock = CountingClock()

    def stitching() -> None:
        clock.now += 0.003

    cost = FrameCost(counting_scorer(clock), blank_frame_crops(config(), 2), post=stitching, clock=clock)
    assert cost.post_ms == pytest.approx(3.0) and cost.fixed_ms == pytest.approx(slow_obvious_ms(2, []) + 3.0)
    assert cost.ms_per_frame(10) == pytest.approx(slow_obvious_ms(2, [10, 10]) + 3.0)


def test_estimate_ms_per_frame_is_the_frame_cost():
    """One function: ``estimate_ms_per_frame`` (``hetmm fit``'s line, the create job's figure) is
    ``FrameCost.ms_per_frame``, measured the same way."""
    clock = CountingClock()
    scorer = counting_scorer(clock)
    crops = blank_frame_crops(scorer.config, 3)
    assert len(crops) == 3 and crops[0].shape == (SIZE, SIZE, 3)
    reference = FrameCost(scorer, crops, scored=2, clock=clock).ms_per_frame(9)
    import hetmm_ray.detection.frame_cost as frame_cost

    original = frame_cost.FrameCost.__init__

    def counted(self, *args, **kw):
        original(self, *args, **{**kw, "clock": clock})

    with pytest.MonkeyPatch.context() as m:
        m.setattr(frame_cost.FrameCost, "__init__", counted)
        assert estimate_ms_per_frame(scorer, crops, 9, scored=2) == pytest.approx(reference)
    assert reference == pytest.approx(slow_obvious_ms(3, [9, 9]))


def test_on_the_real_clock_more_sheets_and_more_canvases_cost_more():
    scorer = HETMM(config()).scorer
    frame = SyntheticProduct(seed=0, size=48).good(0)
    cost = FrameCost(scorer, [frame], repeats=5)
    # 4000 sheets: several times one sheet's work at this size, so a loaded machine's noise cannot reorder them
    assert 0 < cost.atmm_ms(1) < cost.atmm_ms(4000)
    assert cost.ms_per_frame(4000) > cost.backbone_ms > 0
    with pytest.raises(ValueError):
        cost.atmm_ms(0)
    with pytest.raises(ValueError):
        FrameCost(scorer, [])
    assert np.isfinite(estimate_ms_per_frame(scorer, [frame] * 4, 5, scored=4))
