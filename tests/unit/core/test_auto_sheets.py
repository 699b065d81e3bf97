"""``templates.sheets: auto`` (core/auto_sheets.py): the ladder, the agreement rule, the choice."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, ConfigError, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.auto_sheets import (
    Rung,
    agreement,
    choose_sheets,
    ladder,
    normalised_diff,
    scaled_ms,
    spearman,
)
from hetmm_ray.core.pts import pts_indices
from hetmm_ray.data.synthetic import SyntheticProduct, write_mvtec_layout
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

_T = TemplateConfig()
DEFAULT_TOL = {
    "min_rank_corr": _T.auto_min_rank_corr,
    "max_norm_diff": _T.auto_max_norm_diff,
    "min_verdict_agreement": _T.auto_min_verdict_agreement,
}
TOL = {"min_rank_corr": 0.9, "max_norm_diff": 0.1, "min_verdict_agreement": 0.9}


def test_ladder_stops_below_n():
    assert ladder(10) == []
    assert ladder(61) == [10, 20, 40, 60]
    assert ladder(209) == [10, 20, 40, 60, 100, 150, 200]


@pytest.mark.parametrize("seed", range(4))
def test_spearman_equals_scipy(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6, 30).astype(float)  # many ties
    b = a + rng.normal(scale=2, size=30)
    assert spearman(a.tolist(), b.tolist()) == pytest.approx(scipy.stats.spearmanr(a, b).statistic, abs=1e-12)


def test_agreement_by_its_definition():
    ref = [1.0, 2.0, 3.0, 4.0]
    same = agreement(10, ref, 3.5, ref, 3.5, 1.0, **TOL)
    assert same.agrees and same.rank_corr == 1.0 and same.norm_diff == 0.0 and same.verdict_agreement == 1.0
    # one image moves by 0.5 / 3.5 = 0.143 of the threshold (> 0.1); verdicts and ranks unchanged
    shifted = agreement(10, [1.0, 2.0, 3.0, 4.5], 3.5, ref, 3.5, 1.0, **TOL)
    assert shifted.norm_diff == pytest.approx(0.5 / 3.5) and shifted.verdict_agreement == 1.0 and not shifted.agrees
    swapped = agreement(10, [2.0, 1.0, 3.0, 4.0], 3.5, ref, 3.5, 1.0, **TOL)
    assert swapped.rank_corr == pytest.approx(0.8) and not swapped.agrees
    flagged = agreement(10, [1.0, 2.0, 3.0, 4.0], 2.5, ref, 3.5, 1.0, **TOL)  # its own threshold flags one more
    assert flagged.verdict_agreement == 0.75 and not flagged.agrees


def _threshold(scores) -> float:
    from hetmm_ray.detection.fitting import FitPipeline

    return FitPipeline._verdict_threshold(DetectorConfig(), scores)  # the product's rule: far 1 %


def test_a_selection_with_uniformly_higher_scores_agrees():
    """Scores all 1.3x ALL's: the threshold is 1.3x too, so every verdict and rank is the same and
    the scores agree once each is read against its own threshold (the retired raw rule refused it)."""
    a = np.random.default_rng(0).lognormal(-3.0, 0.3, 300)
    s = 1.3 * a
    rung = agreement(10, s.tolist(), _threshold(s), a.tolist(), _threshold(a), 1.0, **DEFAULT_TOL)
    assert rung.agrees and rung.verdict_agreement == 1.0 and rung.rank_corr == 1.0
    assert rung.norm_diff < 1e-9 and rung.scale == pytest.approx(1.3)
    assert float(np.abs(s - a).max() / np.median(a)) > 0.05  # what the raw rule compared: rejected


def test_a_selection_that_reorders_or_flips_verdicts_does_not_agree():
    rng = np.random.default_rng(1)
    a = rng.lognormal(-3.0, 0.3, 300)
    ta = _threshold(a)
    reordered = 1.3 * rng.permutation(a)  # the same distribution, other images high
    rung = agreement(10, reordered.tolist(), _threshold(reordered), a.tolist(), ta, 1.0, **DEFAULT_TOL)
    assert rung.rank_corr < 0.5 and rung.norm_diff > 0.3 and not rung.agrees
    # every image as ALL has it, but the ALL's three highest fall well under the selection's own threshold
    top = np.argsort(a)[-3:]
    flipped = a.copy()
    flipped[top] = np.median(a)
    rung = agreement(10, flipped.tolist(), _threshold(flipped), a.tolist(), ta, 1.0, **DEFAULT_TOL)
    flagged_all = int((a > ta).sum())
    assert flagged_all >= 1 and rung.verdict_agreement < 1.0 and not rung.agrees


def test_normalised_diff_is_infinite_at_an_unusable_threshold():
    assert normalised_diff([1.0, 2.0], 0.0, [1.0, 2.0], 0.0) == 0.0
    assert normalised_diff([1.0, 2.0], 0.0, [1.0, 2.5], 1.0) == math.inf
    assert normalised_diff([1.0, 2.0], 2.0, [2.0, 4.0], 4.0) == 0.0


def _rung(k: int, ok: bool, ms: float) -> Rung:
    """A rung whose estimated frame cost is ``ms`` (its ATMM-only ``ms_per_image`` is reported only)."""
    return Rung(k, 1.0, 0.0, 1.0, ms / 4, ok, ms_per_frame=ms)


def test_choose_takes_the_smallest_agreeing_k_by_doubling_then_bisection():
    tried = []

    def evaluate(k):
        tried.append(k)
        return _rung(k, k >= 40, k / 10)

    k, rungs, why = choose_sheets(209, evaluate)
    # rungs 10 20 40 60 100 150 200: doubling tries indices 0, 1, 3 (60 agrees), bisection 2 (40)
    assert k == 40 and tried == [10, 20, 60, 40] and [r.sheets for r in rungs] == [10, 20, 40, 60]
    assert "smallest" in why


@pytest.mark.parametrize("n", [11, 61, 209, 700, 2500])
def test_search_equals_the_linear_walk_when_agreement_grows_with_k(n):
    """A slow obvious reference: walk every rung; the search finds the same K with fewer tries."""
    for first in [*ladder(n), n]:
        tried = []

        def evaluate(k, first=first, tried=tried):
            tried.append(k)
            return _rung(k, k >= first, 1.0)

        walk = next((k for k in ladder(n) if k >= first), n)
        k, _, _ = choose_sheets(n, evaluate)
        assert k == walk
        assert len(tried) <= max(1, 2 * math.ceil(math.log2(len(ladder(n)) + 1)))


def test_search_never_returns_a_rung_that_disagrees():
    """Agreement that does not grow with K: the choice is still a rung measured to agree."""
    agreeing = {20, 200}
    k, rungs, _ = choose_sheets(209, lambda k: _rung(k, k in agreeing, 1.0))
    assert k in agreeing and next(r for r in rungs if r.sheets == k).agrees


def test_choose_falls_back_to_all_and_respects_a_budget():
    k, rungs, _ = choose_sheets(70, lambda k: _rung(k, False, k))
    assert k == 70 and [r.sheets for r in rungs] == [10, 20, 60]
    k, rungs, why = choose_sheets(209, lambda k: _rung(k, k >= 100, k / 10), max_ms_per_frame=5.0)
    assert k == 40 and rungs[-1].sheets == 60 and "budget" in why


def cost(k: int) -> float:
    """A deterministic cost model: ATMM ms per image affine in the sheets (docs/performance.md)."""
    return 3.8 + 0.246 * k


@pytest.mark.parametrize("budget", [5.0, 10.0, 20.0, 40.0, 80.0, 1000.0])
@pytest.mark.parametrize("first_agreeing", [10, 60, 150, 10_000])
def test_a_budget_is_met_by_the_chosen_selection(budget, first_agreeing):
    """With a budget, the K chosen is never measured over it while a rung within it exists; ALL
    (209 images, its cost over the budget or not) only when within it."""
    n = 209
    k, rungs, why = choose_sheets(
        n, lambda k: _rung(k, k >= first_agreeing, cost(k)), max_ms_per_frame=budget, all_ms_per_frame=cost(n)
    )
    ms = cost(n) if k == n else next(r for r in rungs if r.sheets == k).ms_per_frame
    if cost(10) <= budget:
        assert ms <= budget, why
    else:
        assert k == 10 and "over the budget" in why
    within = [r.sheets for r in rungs if r.ms_per_frame <= budget]
    if first_agreeing in within:  # agreement within the budget: the smallest agreeing K
        assert k == first_agreeing
    elif k != n and cost(10) <= budget:  # the largest K within it that was tried
        assert k == max(within) and "budget" in why


def test_all_is_not_chosen_over_the_budget():
    k, _, why = choose_sheets(70, lambda k: _rung(k, False, cost(k)), max_ms_per_frame=20.0, all_ms_per_frame=cost(70))
    assert k == 60 and "budget" in why  # 60: 18.6 ms, ALL: 21.0 ms
    k, _, _ = choose_sheets(70, lambda k: _rung(k, False, cost(k)), max_ms_per_frame=25.0, all_ms_per_frame=cost(70))
    assert k == 70


def test_the_budget_falls_back_to_ms_per_image_without_a_frame_estimate():
    """A rung without ``ms_per_frame`` is judged by its ``ms_per_image``; a rung's record keeps its
    old keys when no budget was set (no ``ms_per_frame`` key)."""
    plain = [Rung(k, 1.0, 0.0, 1.0, cost(k), False) for k in (10, 20, 40, 60)]
    k, _, why = choose_sheets(70, lambda k: next(r for r in plain if r.sheets == k), max_ms_per_frame=10.0)
    assert k == 20 and "budget" in why  # 20: 8.7 ms, 40: 13.6 ms
    assert "ms_per_frame" not in plain[0].to_dict() and _rung(10, True, 5.0).to_dict()["ms_per_frame"] == 5.0


def test_scaled_ms():
    assert scaled_ms(9.0, 209, 188.1) == pytest.approx(9.0 * 209 / 188.1)  # ALL: a fold holds fewer sheets
    assert scaled_ms(9.0, 60, 60) == 9.0 and scaled_ms(9.0, 60, 80) == 9.0  # never scaled down


def test_sheets_setting_is_validated():
    assert TemplateConfig().sheets == 200  # the cover default
    assert TemplateConfig(sheets="auto").sheets == "auto"
    assert TemplateConfig(sheets=7).sheets == 7
    for bad in ("many", 0, True, 2.5):
        with pytest.raises(ConfigError, match=r"templates\.sheets"):
            TemplateConfig(sheets=bad)


def test_pts_selection_is_not_a_prefix_across_k():
    """Why every rung runs its own PTS: min_samples = max(2, N // K) changes the easy normals."""
    import torch

    g = torch.Generator().manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(6, 8, generator=g), dim=1)
    x = centres[torch.randint(0, 6, (60,), generator=g)] + 0.3 * torch.randn(60, 8, generator=g)
    bank = torch.nn.functional.normalize(x, dim=1).T.reshape(1, 8, 60, 1).permute(2, 1, 0, 3).reshape(60, 8, 1, 1)
    small, large = pts_indices(bank, 5), pts_indices(bank, 20)
    assert not torch.equal(small, large[:5])


# --- the detector and the CLI ------------------------------------------------------------------
SIZE = 64


def det_config(**changes) -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(max_images=24, folds=4),
        templates=TemplateConfig(kind="pts_o", sheets="auto"),
        batch_size=8,
        device="cpu",
    )
    return c.replace(**changes) if changes else c


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    product = SyntheticProduct(seed=3, size=SIZE)
    return [product.good(i) for i in range(24)]


def test_fit_with_auto_sheets_records_the_ladder_and_fixes_k(images, tmp_path, one_torch_thread):
    det = HETMM(det_config()).fit(images)
    auto = det.templates.meta["sheets_auto"]
    k = det.config.templates.sheets
    assert isinstance(k, int) and k == auto["chosen"] == det.templates.sheets
    assert [r["sheets"] for r in auto["ladder"]] == [10, 20][: len(auto["ladder"])]
    assert auto["images"] == 24 and auto["tolerance"]["min_rank_corr"] == TemplateConfig().auto_min_rank_corr
    agreeing = [r["sheets"] for r in auto["ladder"] if r["agrees"]]
    assert (k == agreeing[0]) if agreeing else (k == 24)
    # Stored: the chosen K is the product's configuration; a hot update keeps it.
    store = open_store(str(tmp_path / "s"))
    det.save(store, "gear")
    manifest = store.manifest("gear", 1)
    assert manifest["config"]["templates"]["sheets"] == k and manifest["meta"]["sheets_auto"]["chosen"] == k
    again = load_detector(store, "gear")
    assert again.config.templates.sheets == k
    # A fixed K still works, and it drops the ladder (nothing was measured).
    again.compress(sheets=5)
    assert again.templates.sheets == 5 and "sheets_auto" not in again.templates.meta


def test_auto_rejects_nothing_when_everything_agrees(images, one_torch_thread):
    """With a tolerance every K meets, auto takes the ladder's first rung."""
    loose = det_config(
        **{"templates.auto_min_rank_corr": -1.0, "templates.auto_max_norm_diff": 1e9,
           "templates.auto_min_verdict_agreement": 0.0}
    )  # fmt: skip
    det = HETMM(loose).fit(images)
    assert det.config.templates.sheets == 10 and len(det.templates.meta["sheets_auto"]["ladder"]) == 1


def test_cli_compress_sheets_auto_prints_the_ladder(tmp_path: Path, capsys, one_torch_thread):
    data = tmp_path / "gear"
    write_mvtec_layout(data, n_train=24, n_test_good=1, n_test_per_defect=1, seed=3, size=SIZE)
    store = str(tmp_path / "store")
    base = ["--backbone", "resnet18", "--weights", "random", "--set", f"backbone.image_size={SIZE}"]
    assert main(["fit", "--product", "gear", "--store", store, *base, str(data / "train" / "good")]) == 0
    assert main(["compress", "--product", "gear", "--store", store, "--templates", "pts", "--sheets", "auto"]) == 0
    out = capsys.readouterr().out
    assert "sheets: auto" in out and "ms/img" in out and "chosen K = " in out
    assert main(["versions", "--product", "gear", "--store", store]) == 0
    assert "chosen by sheets: auto" in capsys.readouterr().out  # the head's K is marked
    with pytest.raises(SystemExit) as exit_info:  # argparse: one usage line, exit 2
        main(["compress", "--product", "gear", "--store", store, "--templates", "pts", "--sheets", "many"])
    assert exit_info.value.code == 2
    assert "expected a positive integer or auto, got 'many'" in capsys.readouterr().err
