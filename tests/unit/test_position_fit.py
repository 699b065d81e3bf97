"""A tiled fit position by position, as the service spreads it (``distributed/position_fit.py``): each
position's rows alone, its selection apart from its calibration, the calibration scored in ranges of
folds and joined in order; against the one-call fit of every position (``TiledHETMM.fit_extracted``),
tensor for tensor. And the rule that cuts the folds into ranges, against a brute-force makespan."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.calibration import OutOfFold
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.tiled import TiledHETMM, TileFeatures
from hetmm_ray.distributed.position_fit import fold_chunks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAME = 96


def config(kind: str, sheets: int) -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        templates=TemplateConfig(kind=kind, sheets=sheets),
        threshold=ThresholdConfig(max_images=12, folds=4),  # 9 images kept per fold: above 3 sheets
        batch_size=8,
        device="cpu",
    ).replace(**{"geometry.tiles": [2, 2], "geometry.tile_overlap": 8})


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    part = SyntheticProduct(seed=11, size=FRAME)
    return [part.good(i) for i in range(12)]


def test_of_position_and_interleaved_are_inverse(frames) -> None:
    det = TiledHETMM(config("cover", 3))
    extracted = det.extract_tiles(frames[:3])
    parts = [extracted.of_position(p, det.n_positions) for p in range(det.n_positions)]
    assert [part.position for part in parts] == list(range(5)) and parts[2].feats["layer2"].shape[0] == 3
    back = TileFeatures.interleaved(parts)
    assert back.digests == extracted.digests and back.boxes == extracted.boxes and back.position is None
    for layer, v in extracted.feats.items():
        assert np.array_equal(back.feats[layer], v), layer
    with pytest.raises(ValueError, match="positions"):
        TileFeatures.interleaved(parts[1:])
    with pytest.raises(ValueError, match="position 2 asked"):
        parts[1].of_position(2, det.n_positions)


@pytest.mark.parametrize("kind", ["cover", "pts_o"])
def test_positions_selected_then_scored_in_fold_ranges_fit_the_one_call_product(frames, kind) -> None:
    cfg = config(kind, 3)
    extracted = TiledHETMM(cfg).extract_tiles(frames)
    whole = TiledHETMM(cfg).fit_extracted(extracted, frames[0]).template_set()
    det = TiledHETMM(cfg)
    sets = []
    for p in range(det.n_positions):
        rows = extracted.of_position(p, det.n_positions)
        selected = TiledHETMM(cfg).fit_position(rows, frames[0], calibrate=False)
        assert selected.calibration is None
        folds = det.fold_count(selected)
        assert folds == 4
        ranges = [range(0, 1), range(1, 3), range(3, 4)]  # consecutive, uneven
        parts = [TiledHETMM(cfg).position_scores(p, selected, r) for r in ranges]
        sets.append(det.calibrated_position(p, selected, parts))
        with pytest.raises(ValueError, match="fold plan holds out"):
            det.calibrated_position(p, selected, parts[::-1])  # out of fold order
    got = det.with_positions(sets, extracted.shapes).template_set()
    assert got.calibration == whole.calibration and got.meta["tiles"]["scales"] == whole.meta["tiles"]["scales"]
    assert got.indices is not None and whole.indices is not None
    for key, bank in whole.bank.items():
        assert torch.equal(got.bank[key], bank) and torch.equal(got.indices[key], whole.indices[key]), key


def test_out_of_fold_refuses_folds_out_of_order(frames) -> None:
    cfg = config("cover", 3)
    det = TiledHETMM(cfg)
    rows = det.extract_tiles(frames).of_position(0, det.n_positions)
    selected = det.fit_position(rows, frames[0], calibrate=False)
    with pytest.raises(ValueError, match="increasing indices"):
        det.position_scores(0, selected, [2, 1])
    empty = det.position_scores(0, selected, [])
    assert empty == OutOfFold(images=(), scores=(), folds=0)


def makespan(positions: int, chunks: int, slots: int) -> float:
    """Rounds of equal tasks (a position's calibration / ``chunks`` each) on ``slots`` slots, greedily."""
    loads = [0.0] * slots
    for _ in range(positions * chunks):
        loads[loads.index(min(loads))] += 1 / chunks
    return max(loads)


@pytest.mark.parametrize(
    ("positions", "folds", "slots"), [(5, 10, 1), (5, 10, 2), (5, 10, 4), (4, 10, 2), (9, 10, 8), (5, 2, 4)]
)
def test_fold_chunks_takes_the_fewest_ranges_that_end_soonest(positions, folds, slots) -> None:
    c = fold_chunks(positions, folds, slots)
    assert 1 <= c <= folds
    spans = {k: makespan(positions, k, slots) for k in range(1, folds + 1)}
    best = min(spans.values())
    assert math.isclose(spans[c], best)  # no count of ranges ends sooner
    assert all(spans[k] > best + 1e-9 for k in range(1, c))  # and none fewer ends as soon
    assert fold_chunks(positions, folds, 1) == 1  # one slot: no ranges


def test_a_hot_update_position_by_position_from_each_stored_position_set_is_the_one_call_update(frames) -> None:
    from hetmm_ray.detection.tiled import position_sets

    cfg = config("cover", 3)
    head = TiledHETMM(cfg).fit(frames[:8]).template_set()
    new = [*frames[6:8], *frames[8:12]]  # two already held: skipped
    want = TiledHETMM.from_template_set(head).update(new).template_set()
    extracted = TiledHETMM(cfg).extract_tiles(new)
    bases = position_sets(head)
    sets = []
    for p, base in enumerate(bases):
        det = TiledHETMM(head.config)  # holds no templates: each position's own set is given
        selected = det.update_position(extracted.of_position(p, len(bases)), new, base=base, calibrate=False)
        assert selected is not None and selected.n_images == 12 and selected.calibration is None
        parts = [det.position_scores(p, selected, range(0, 2)), det.position_scores(p, selected, range(2, 4))]
        sets.append(det.calibrated_position(p, selected, parts))
    got = TiledHETMM.from_template_set(head).with_positions(sets, extracted.shapes).template_set()
    assert got.image_digests == want.image_digests and got.calibration == want.calibration
    assert got.meta["tiles"]["scales"] == want.meta["tiles"]["scales"]
    assert got.indices is not None and want.indices is not None
    for key, bank in want.bank.items():
        assert torch.equal(got.bank[key], bank) and torch.equal(got.indices[key], want.indices[key]), key
    again = TiledHETMM(cfg).extract_tiles(frames[:2]).of_position(0, 5)
    assert TiledHETMM(head.config).update_position(again, frames[:2], base=bases[0]) is None  # all held
