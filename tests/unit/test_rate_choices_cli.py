"""The rate chosen with the facts in view: ``hetmm calibrate --val`` prints the far rule at
``RATE_CHOICES`` with the good frames above each and the recall on the labelled defects at each
(``core.calibration.rate_choices``), and stores the same rows with the labelled record; the
labelled threshold's estimate comes with its interval."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.config import RATE_CHOICES, BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_labelled_calibration_shows_recall_at_each_rate(tmp_path, capsys) -> None:
    gear = SyntheticProduct(seed=4, size=48)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        threshold=ThresholdConfig(folds=5),
        device="cpu",
    )
    uri = str(tmp_path / "store")
    store = open_store(uri)
    HETMM(config).fit([gear.good(i) for i in range(20)]).save(store, "gear")
    val = tmp_path / "val"
    (val / "good").mkdir(parents=True)
    (val / "hole").mkdir()
    for i in range(6):
        Image.fromarray(gear.good(100 + i)).save(val / "good" / f"{i}.png")
        Image.fromarray(gear.defective(200 + i, "hole")[0]).save(val / "hole" / f"{i}.png")
    capsys.readouterr()
    assert main(["calibrate", "--product", "gear", "--store", uri, "--val", str(val)]) == 0
    out = capsys.readouterr().out
    v1 = load_detector(store, "gear", 1)
    bad = v1.predict([str(p) for p in sorted((val / "hole").glob("*.png"))]).scores
    tail = TailModel(v1.calibration.scores)
    rows = store.record("gear", 2).calibration.validation["rates"]
    assert [r["rate"] for r in rows] == list(RATE_CHOICES)
    for rate, row in zip(RATE_CHOICES, rows, strict=True):
        t = tail.threshold(rate)
        flagged = sum(1 for s in bad if s > t)
        above = sum(1 for s in v1.calibration.scores if s > t)
        assert row["threshold"] == t and row["defective_flagged"] == flagged and row["defective"] == 6
        assert row["good_above"] == above and row["recall"] == flagged / 6
        line = rf"^\s+{100 * rate:g}%\s+{t:.4f}\s+{above} of 20\s.*\s{100 * flagged / 6:.1f}% \({flagged} of 6\)$"
        assert re.search(line, out, re.M), out
    assert re.search(r"estimated false alarms on good parts [\d.]+% \(95% interval [\d.]+-[\d.]+%; \d+ of 20", out)
