"""The false-alarm threshold rule, out-of-fold scores, labelled validation and `hetmm calibrate`.

The estimator is checked against literal order statistics and scipy's normal
quantile; the out-of-fold scores against a hand-written fold loop that re-selects
PTS without the held-out images; honesty on a synthetic product with 500 fresh good
images that calibration never saw.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats

from hetmm_ray.cli import main
from hetmm_ray.config import (
    BackboneConfig,
    ConfigError,
    DetectorConfig,
    ReplicaSettings,
    ScoringConfig,
    ThresholdConfig,
)
from hetmm_ray.core.atmm import anomaly_maps, pixel_major
from hetmm_ray.core.calibration import (
    TailModel,
    best_f1_cut,
    check_rate,
    fold_plan,
    labelled_cuts,
    recall_cut,
)
from hetmm_ray.core.pts import select_layers
from hetmm_ray.core.scoring import Calibration, image_scores
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- the estimator ----------------------------------------------------------------------------
def _slow_threshold(scores, rate):
    """The rule written out literally: conformal rank when two scores lie above it, else the
    upper-semi-MAD log-normal quantile (scipy) floored at the third-largest score."""
    x = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(x)
    k = math.ceil((n + 1) * (1 - rate) - 1e-9)
    if k <= n - 2:
        return x[max(k, 1) - 1]
    logs = np.log(np.maximum(x, 1e-6))
    mu = np.median(logs)
    s = np.median(logs[logs > mu] - mu) / stats.norm.ppf(0.75)
    return max(x[max(0, n - 3)], math.exp(mu + stats.norm.ppf(1 - rate) * s))


@pytest.mark.parametrize("n", [5, 20, 37, 98, 99, 299, 300, 1000])
@pytest.mark.parametrize("rate", [0.001, 0.01, 0.05, 0.2])
def test_tail_threshold_equals_the_literal_rule(n, rate):
    scores = np.random.default_rng(n).gamma(4.0, 0.05, size=n)
    tail = TailModel(scores.tolist())
    assert tail.threshold(rate) == pytest.approx(_slow_threshold(scores, rate), rel=1e-12)
    assert tail.regime(rate) == ("empirical" if math.ceil((n + 1) * (1 - rate) - 1e-9) <= n - 2 else "parametric")


def test_far_rule_is_empirical_from_299_images_for_1_percent():
    assert TailModel([0.1 * i for i in range(1, 299)]).regime(0.01) == "parametric"  # 298: rank 297 of 298
    assert TailModel([0.1 * i for i in range(1, 300)]).regime(0.01) == "empirical"  # 299: rank 297


def test_false_alarm_rate_inverts_threshold_and_is_monotone():
    scores = np.random.default_rng(1).lognormal(-1.0, 0.3, size=40).tolist()
    tail = TailModel(scores)
    rates = [0.002, 0.01, 0.03, 0.05, 0.1, 0.3]
    thresholds = [tail.threshold(r) for r in rates]
    assert thresholds == sorted(thresholds, reverse=True)
    for r, t in zip(rates, thresholds, strict=True):
        est = tail.false_alarm_rate(t)
        assert tail.threshold(est) == pytest.approx(t, rel=1e-6)
        if tail.regime(r) == "parametric" and t > tail.floor:  # on the floor: the rate where the curve meets it
            assert est == pytest.approx(r, rel=1e-6)
    assert tail.false_alarm_rate(1e9) == pytest.approx(1e-6)
    assert tail.false_alarm_rate(-1.0) == 1.0  # below every good score: every good part is flagged


def test_a_few_unusual_training_images_barely_move_the_threshold():
    rng = np.random.default_rng(2)
    for n in (30, 300):
        clean = rng.gamma(6.0, 0.05, size=n)
        dirty = np.concatenate([clean[:-2], [clean.max() * 5, clean.max() * 8]])  # two defective "good" images
        t_clean, t_dirty = TailModel(clean.tolist()).threshold(0.01), TailModel(dirty.tolist()).threshold(0.01)
        assert t_dirty < 1.15 * t_clean, (n, t_clean, t_dirty)
        assert t_dirty < clean.max() * 5 / 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -0.01, 0.6, True, "0.01"])
def test_bad_rates_are_refused(bad):
    with pytest.raises(ValueError):
        check_rate(bad)
    with pytest.raises(ConfigError, match=r"threshold\.false_alarm_rate"):
        ThresholdConfig(false_alarm_rate=bad)
    with pytest.raises(ConfigError, match="false_alarm_rate"):
        ReplicaSettings(false_alarm_rate=bad)


def test_threshold_settings_are_validated():
    with pytest.raises(ConfigError, match="did you mean 'rule'"):
        DetectorConfig.from_dict({"threshold": {"rules": "far"}})
    with pytest.raises(ConfigError, match=r"threshold\.rule"):
        ThresholdConfig(rule="percentile")
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ConfigError, match="sigmas"):
            ThresholdConfig(sigmas=bad)
        with pytest.raises(ConfigError, match="sigmas"):
            ReplicaSettings(sigmas=bad)
    with pytest.raises(ConfigError, match="at most one"):
        ReplicaSettings(sigmas=3.0, false_alarm_rate=0.01)
    assert ThresholdConfig().rule == "far" and ThresholdConfig().false_alarm_rate == 0.01
    assert ThresholdConfig().max_images >= 1000


def test_calibration_round_trips_with_and_without_a_validation_record():
    plain = Calibration((0.1, 0.2, 0.3))
    assert plain.to_json() == [0.1, 0.2, 0.3]  # the original storage format
    assert Calibration.from_json([0.1, 0.2, 0.3]) == plain
    validated = Calibration((0.1, 0.2), validation={"threshold": 0.25, "objective": "f1"})
    assert Calibration.from_json(json.loads(json.dumps(validated.to_json()))) == validated
    op = validated.operating_point("validation")
    assert op.threshold == 0.25 and op.rule == "validation"
    with pytest.raises(ValueError, match="hetmm calibrate"):
        plain.operating_point("validation")


# --- labelled cuts -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_labelled_cuts_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    scores = np.round(rng.normal(size=40), 1)  # ties on purpose
    labels = (rng.random(40) < 0.4).astype(int)
    labels[:2] = [0, 1]
    cuts = labelled_cuts(scores.tolist(), labels.tolist())
    verdicts = set()
    for c in cuts:
        flagged = scores > c.threshold
        assert c.true_positives == int((flagged & (labels == 1)).sum())
        assert c.false_positives == int((flagged & (labels == 0)).sum())
        verdicts.add(tuple(flagged))
    assert len(verdicts) == len(np.unique(scores)) + 1  # every distinct verdict, once
    # best F1 / recall under a cap against every possible threshold
    grid = np.concatenate([np.unique(scores) - 1e-9, [scores.max()]])
    f1s, rec_ok = [], []
    for t in grid:
        f = scores > t
        tp, fp = int((f & (labels == 1)).sum()), int((f & (labels == 0)).sum())
        fn = int((~f & (labels == 1)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn))
        if fp / (labels == 0).sum() <= 0.1:
            rec_ok.append(tp / (labels == 1).sum())
    assert best_f1_cut(cuts).f1 == pytest.approx(max(f1s))
    assert recall_cut(cuts, 0.1).recall == pytest.approx(max(rec_ok))


# --- out-of-fold scores --------------------------------------------------------------------------
SIZE = 32


def tiny_config(**changes) -> DetectorConfig:
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE, layers=("layer2", "layer3")),
        scoring=ScoringConfig(forward_windows=(3, 3), backward_windows=(3, 3), alphas=(0.5, 0.5), layer_weights=(1, 1)),
        batch_size=32,
        device="cpu",
    )
    return config.replace(**changes) if changes else config


@pytest.fixture(scope="module")
def gear() -> SyntheticProduct:
    return SyntheticProduct(seed=3, size=SIZE)


def test_out_of_fold_reselects_pts_without_the_held_out_fold(gear):
    config = tiny_config(**{"templates.kind": "pts_o", "templates.sheets": 3, "threshold.folds": 3})
    det = HETMM(config).fit([gear.good(i) for i in range(9)])
    ts = det.templates
    oof = det.out_of_fold(ts)
    sc = config.scoring
    expected = {}
    for held in fold_plan(9, folds=3, max_images=config.threshold.max_images, seed=0, keys=ts.image_digests):
        kept = [i for i in range(9) if i not in held]
        bank = {k: v[kept] for k, v in ts.bank.items()}
        indices, _ = select_layers(bank, "pts_o", 3, 0)
        templates = {}
        for layer, b in bank.items():  # T[k, :, y, x] = bank[idx[k, y, x], :, y, x], written as loops
            idx = indices[layer]
            t = torch.empty((3, *b.shape[1:]), dtype=torch.float32)
            for k in range(3):
                for y in range(b.shape[2]):
                    for x in range(b.shape[3]):
                        t[k, :, y, x] = b[idx[k, y, x], :, y, x].float()
            templates[layer] = pixel_major(t)
        q = {k: v[held].float() for k, v in ts.bank.items()}
        maps = anomaly_maps(q, templates, sc.forward_windows, sc.backward_windows, sc.alphas, sc.layer_weights, SIZE)
        expected.update(
            zip(held, image_scores(maps, sc.score_sigma, top_k=det.config.score_pixels).tolist(), strict=True)
        )
    assert sorted(oof.images) == list(range(9)) and oof.folds == 3
    got = oof.by_image()
    for i in range(9):
        assert got[i] == pytest.approx(expected[i], abs=1e-5)
    np.testing.assert_allclose(ts.calibration.scores, oof.scores)


@pytest.mark.parametrize(
    ("kind", "bank_dtype", "dtype"),
    [("all", "float32", "float32"), ("pts_o", "bfloat16", "float32"), ("cover", "float16", "float16")],
)
def test_a_folds_templates_gathered_from_the_pixel_major_bank_are_its_own_sets(gear, kind, bank_dtype, dtype):
    """``Scorer.prepare_rows`` (what the out-of-fold calibration scores each fold against) equals
    ``Scorer.prepare`` of the fold's own template set, built from its kept rows, bit for bit."""
    config = tiny_config(**{"templates.kind": kind, "templates.sheets": 3, "bank_dtype": bank_dtype, "dtype": dtype})
    det = HETMM(config).fit([gear.good(i) for i in range(9)])
    ts, scorer = det.templates, det.scorer
    bank_pm = scorer.pixel_major_bank(ts)
    for kept in ([0, 2, 3, 5, 8], [1, 4, 6, 7], list(range(9))):
        bank = {k: v[kept] for k, v in ts.bank.items()}
        indices = None if kind == "all" else select_layers(bank, kind, 3, 0)[0]
        own = TemplateSet(
            bank=bank,
            config=config,
            weights_id=ts.weights_id,
            image_digests=tuple(ts.image_digests[i] for i in kept),
            indices=indices,
        )
        want, got = scorer.prepare(own), scorer.prepare_rows(bank_pm, kept, indices)
        assert got.keys() == want.keys() == ts.bank.keys()
        for layer in want:
            assert got[layer].dtype == want[layer].dtype and got[layer].is_contiguous()
            assert torch.equal(got[layer], want[layer]), (kind, kept, layer)


def test_folds_follow_the_images_not_their_order():
    keys = [f"digest-{i}" for i in range(20)]
    plan = fold_plan(20, folds=4, max_images=12, seed=5, keys=keys)
    shuffled = keys[::-1]  # the same images uploaded in the opposite order
    again = fold_plan(20, folds=4, max_images=12, seed=5, keys=shuffled)
    assert [sorted(keys[i] for i in f) for f in plan] == [sorted(shuffled[i] for i in f) for f in again]
    assert sum(len(f) for f in plan) == 12 and len({i for f in plan for i in f}) == 12
    assert fold_plan(20, folds=4, max_images=12, seed=6, keys=keys) != plan


def test_out_of_fold_covers_every_image_up_to_the_cap(gear):
    det = HETMM(tiny_config(**{"threshold.max_images": 7, "threshold.folds": 3}))
    det.fit([gear.good(i) for i in range(12)])
    oof = det.out_of_fold(det.templates)
    assert len(oof.images) == 7 == len(set(oof.images))
    assert len(det.templates.calibration.scores) == 7


class _Recorder:
    """A fit's progress as the service's job hears it (``steps.Report``)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []

    def stage(self, name: str, total: int = 0) -> None:
        self.events.append(("stage", name, total))  # type: ignore[arg-type]

    def __call__(self, done: int, total: int) -> None:
        self.events.append(("done", done, total))  # type: ignore[arg-type]


def test_out_of_fold_calibration_reports_progress(gear, capsys):
    """Calibration is a stage of its own: its counts go to the report (a job on the service)
    and, with progress on, to a tqdm bar; the scores do not depend on who listens."""
    from hetmm_ray.detection.fitting import FitPipeline

    config = tiny_config(**{"threshold.max_images": 7, "threshold.folds": 3, "batch_size": 2})
    det = HETMM(config).fit([gear.good(i) for i in range(12)])
    heard = _Recorder()
    pipeline = FitPipeline(det.scorer, progress=True, report=heard)
    again = pipeline.calibrated(det.templates)
    assert again.calibration.scores == det.templates.calibration.scores
    start = heard.events.index(("stage", "calibrate: out-of-fold", 7))
    counts = [done for kind, done, total in heard.events[start + 1 :] if kind == "done" and total == 7]
    assert len(counts) >= 4 and counts == sorted(counts) and counts[-1] == 7  # per batch, not only per fold
    assert "calibrate: out-of-fold" in capsys.readouterr().err


def test_calibration_is_honest_on_fresh_good_images(gear):
    """>= 300 training images, 500 fresh good images never seen in calibration: the measured
    false-alarm rate at a 1 % target is in [0.3 %, 3 %], at 5 % in [2 %, 10 %]."""
    product = SyntheticProduct(seed=0, size=SIZE)
    det = HETMM(tiny_config()).fit([product.good(i) for i in range(300)])
    fresh = det.predict([product.good(100_000 + i) for i in range(500)])
    for target, lo, hi in ((0.01, 0.003, 0.03), (0.05, 0.02, 0.10)):
        op = det.operating_point(false_alarm_rate=target)
        measured = float((fresh.scores > op.threshold).mean())
        assert lo <= measured <= hi, (target, measured)
        assert op.false_alarm_rate == pytest.approx(target, rel=0.05)
    # the product's default rule is the 1 % one, and predictions carry it
    assert fresh.operating_point.rule == "far" and fresh.operating_point.target == 0.01


def test_predict_refuses_conflicting_or_bad_overrides(gear):
    det = HETMM(tiny_config(**{"threshold.folds": 2})).fit([gear.good(i) for i in range(6)])
    with pytest.raises(ValueError, match="not both"):
        det.predict([gear.good(50)], sigmas=3.0, false_alarm_rate=0.01)
    for bad in (float("nan"), float("inf"), 0.0, 0.9):
        with pytest.raises(ValueError):
            det.predict([gear.good(50)], false_alarm_rate=bad)
    with pytest.raises(ValueError):
        det.predict([gear.good(50)], sigmas=float("nan"))
    a = det.predict([gear.good(50)], false_alarm_rate=0.2)
    b = det.predict([gear.good(50)], false_alarm_rate=0.01)
    assert a.threshold < b.threshold and a.operating_point.rule == b.operating_point.rule == "far"


# --- hetmm calibrate / predict --false-alarm-rate ----------------------------------------------------
def _save(array: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


CLI_FLAGS = [
    "--backbone",
    "resnet18",
    "--weights",
    "random",
    "--device",
    "cpu",
    "--set",
    f"backbone.image_size={SIZE}",
    "--set",
    'backbone.layers=["layer2","layer3"]',
    "--set",
    "scoring.forward_windows=[3,3]",
    "--set",
    "scoring.backward_windows=[3,3]",
    "--set",
    "scoring.alphas=[0.5,0.5]",
    "--set",
    "scoring.layer_weights=[1,1]",
]


def test_cli_calibrate_stores_a_validation_version(tmp_path, capsys):
    product = SyntheticProduct(seed=1, size=SIZE)
    for i in range(8):
        _save(product.good(i), tmp_path / "train" / f"{i}.png")
    for i in range(4):
        _save(product.good(200 + i), tmp_path / "val" / "test" / "good" / f"{i}.png")
        _save(product.defective(300 + i, "hole")[0], tmp_path / "val" / "test" / "hole" / f"{i}.png")
    store = str(tmp_path / "store")
    assert main(["fit", str(tmp_path / "train"), "--product", "gear", "--store", store, *CLI_FLAGS]) == 0
    assert "rule far 1%" in capsys.readouterr().out
    args = ["calibrate", "--product", "gear", "--store", store, "--val", str(tmp_path / "val")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "version 2 (from v1)" in out and "for f1 on 4 good + 4 defective images" in out
    ts = open_store(store).get("gear", 2)
    assert ts.config.threshold.rule == "validation"
    record = ts.calibration.validation
    assert ts.calibration.scores == open_store(store).get("gear", 1).calibration.scores  # OOF kept
    det = load_detector(open_store(store), "gear", 2)
    val = [product.good(200 + i) for i in range(4)] + [product.defective(300 + i, "hole")[0] for i in range(4)]
    scores = det.predict(val).scores
    labels = np.array([0] * 4 + [1] * 4)
    assert det.operating_point().threshold == record["threshold"]
    assert record["f1"] == pytest.approx(best_f1_cut(labelled_cuts(scores.tolist(), labels.tolist())).f1)
    # predict reports the rule; --false-alarm-rate switches to the far rule for the call
    good_png = str(tmp_path / "val" / "test" / "good" / "0.png")
    out_json = tmp_path / "p.json"
    assert main(["predict", good_png, "--product", "gear", "--store", store, "--json", str(out_json)]) == 0
    rec = json.loads(out_json.read_text())[0]
    assert rec["threshold_rule"] == "validation" and rec["threshold"] == pytest.approx(record["threshold"], abs=1e-6)
    assert 0 < rec["estimated_false_alarm_rate"] <= 0.5
    assert main(["predict", good_png, "--product", "gear", "--store", store, "--json", str(out_json),
                 "--false-alarm-rate", "0.05"]) == 0  # fmt: skip
    rec = json.loads(out_json.read_text())[0]
    assert rec["threshold_rule"] == "far" and rec["rule_target"] == 0.05
    assert rec["threshold"] == pytest.approx(TailModel(ts.calibration.scores).threshold(0.05), abs=1e-6)
    capsys.readouterr()
    for bad in ("nan", "inf", "0", "2"):
        assert main(["predict", good_png, "--product", "gear", "--store", store, "--false-alarm-rate", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hetmm: error: ") and "false-alarm rate" in err[0]
    # a folder without defects is refused in one line
    assert main(["calibrate", "--product", "gear", "--store", store, "--val", str(tmp_path / "train")]) == 2
    assert "good/" in capsys.readouterr().err


def test_evaluate_reports_the_operating_point(tmp_path, capsys):
    from hetmm_ray.data.synthetic import write_mvtec_layout

    data = write_mvtec_layout(tmp_path / "data", n_train=8, n_test_good=3, n_test_per_defect=2, size=SIZE)
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--data", str(data), "--json", str(out), *CLI_FLAGS]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    tp, fn = result["true_positives"], result["false_negatives"]
    fp, tn = result["false_positives"], result["true_negatives"]
    assert result["recall"] == pytest.approx(100 * tp / (tp + fn))
    assert result["false_alarm_rate"] == pytest.approx(100 * fp / (fp + tn))
    assert result["threshold_rule"] == "far" and result["rule_target"] == 0.01
    assert 0 < result["estimated_false_alarm_rate"] <= 50
    assert 0 <= result["recall_at_1pct_false_alarms"] <= result["recall_at_5pct_false_alarms"] <= 100
    assert 0 < result["best_f1"] <= 100
    assert result["score_summary"]["out-of-fold train"]["n"] == 8
    for line in ("recall", "false alarms", "best F1", "recall @1% FA", "recall @5% FA", "rule far 1%"):
        assert line in table
