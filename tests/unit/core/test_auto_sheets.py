"""``templates.sheets: auto`` (core/auto_sheets.py): the ladder, the agreement rule, the choice."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, ConfigError, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.auto_sheets import Rung, agreement, choose_sheets, ladder, spearman
from hetmm_ray.core.pts import pts_indices
from hetmm_ray.data.synthetic import SyntheticProduct, write_mvtec_layout
from hetmm_ray.detector import HETMM
from hetmm_ray.store import open_store

TOL = {"min_rank_corr": 0.9, "max_rel_diff": 0.1, "min_verdict_agreement": 0.9}


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
    ref = [1.0, 2.0, 3.0, 4.0]  # median 2.5
    same = agreement(10, ref, 3.5, ref, 3.5, 1.0, **TOL)
    assert same.agrees and same.rank_corr == 1.0 and same.max_rel_diff == 0.0 and same.verdict_agreement == 1.0
    shifted = agreement(10, [1.0, 2.0, 3.0, 4.5], 3.5, ref, 3.5, 1.0, **TOL)
    assert shifted.max_rel_diff == pytest.approx(0.5 / 2.5) and not shifted.agrees  # 0.2 > 0.1
    swapped = agreement(10, [2.0, 1.0, 3.0, 4.0], 3.5, ref, 3.5, 1.0, **TOL)
    assert swapped.rank_corr == pytest.approx(0.8) and not swapped.agrees
    flagged = agreement(10, [1.0, 2.0, 3.0, 4.0], 2.5, ref, 3.5, 1.0, **TOL)  # its own threshold flags one more
    assert flagged.verdict_agreement == 0.75 and not flagged.agrees


def _rung(k: int, ok: bool, ms: float) -> Rung:
    return Rung(k, 1.0, 0.0, 1.0, ms, ok)


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
    k, rungs, why = choose_sheets(209, lambda k: _rung(k, k >= 100, k / 10), max_ms_per_image=5.0)
    assert k == 40 and rungs[-1].sheets == 60 and "budget" in why


def test_sheets_setting_is_validated():
    assert TemplateConfig().sheets == "auto"
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
    assert auto["images"] == 24 and auto["tolerance"]["min_rank_corr"] == 0.98
    agreeing = [r["sheets"] for r in auto["ladder"] if r["agrees"]]
    assert (k == agreeing[0]) if agreeing else (k == 24)
    # Stored: the chosen K is the product's configuration; a hot update keeps it.
    store = open_store(str(tmp_path / "s"))
    det.save(store, "gear")
    manifest = store.manifest("gear", 1)
    assert manifest["config"]["templates"]["sheets"] == k and manifest["meta"]["sheets_auto"]["chosen"] == k
    again = HETMM.load(store, "gear")
    assert again.config.templates.sheets == k
    # A fixed K still works, and it drops the ladder (nothing was measured).
    again.compress(sheets=5)
    assert again.templates.sheets == 5 and "sheets_auto" not in again.templates.meta


def test_auto_rejects_nothing_when_everything_agrees(images, one_torch_thread):
    """With a tolerance every K meets, auto takes the ladder's first rung."""
    loose = det_config(
        **{"templates.auto_min_rank_corr": -1.0, "templates.auto_max_rel_diff": 1e9,
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
