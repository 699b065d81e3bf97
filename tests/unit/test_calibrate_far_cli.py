"""``hetmm calibrate --far RATE``: the far rule at another rate as a new version of the head's templates
and out-of-fold scores (what the service's ``POST .../calibrate {"rule": "far"}`` stores), in process."""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("hetmm: error:"), lines
    for w in words:
        assert w in lines[0], lines[0]


def test_far_rule_at_another_rate_is_a_new_version_of_the_same_templates(tmp_path, capsys) -> None:
    gear = SyntheticProduct(seed=2, size=48)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        threshold=ThresholdConfig(max_images=8, folds=4),
        device="cpu",
    )
    uri = str(tmp_path / "store")
    store = open_store(uri)
    HETMM(config).fit([gear.good(i) for i in range(8)]).save(store, "gear")
    queries = [gear.good(100), gear.defective(200, "hole")[0], gear.defective(201, "scratch")[0]]
    v1 = load_detector(store, "gear", 1)
    code, out, err = run(capsys, "calibrate", "--product", "gear", "--store", uri, "--far", "0.2")
    assert code == 0, err
    rec = store.record("gear", 2)
    assert rec.config.threshold.rule == "far" and rec.config.threshold.false_alarm_rate == 0.2
    # the far threshold at 20 % of the same out-of-fold scores, computed directly
    want = TailModel(v1.calibration.scores).threshold(0.2)
    assert want < v1.operating_point().threshold  # a higher rate: a lower threshold
    assert f"version 2 (from v1) threshold {want:.4f} (rule far 20%" in out, out
    v2 = load_detector(store, "gear", 2)
    assert v2.operating_point().threshold == want and v2.calibration.scores == v1.calibration.scores
    np.testing.assert_array_equal(v2.predict(queries).scores, v1.predict(queries).scores)
    assert store.manifest("gear", 2)["chunks"] == store.manifest("gear", 1)["chunks"]  # nothing uploaded
    # as a candidate: HEAD stays, the candidate is announced with what to do next
    code, _, err = run(capsys, "calibrate", "--product", "gear", "--store", uri, "--far", "0.05", "--candidate")
    assert code == 0 and "v3 is a candidate; HEAD stays v2" in err, err
    assert store.head("gear") == 2 and store.record("gear", 3).config.threshold.false_alarm_rate == 0.05
    # mistakes: one line, exit 2, nothing stored
    one_error_line(*run(capsys, "calibrate", "--product", "gear", "--store", uri, "--far", "0.9")[::2], "0.5")
    one_error_line(
        *run(capsys, "calibrate", "--product", "gear", "--store", uri, "--far", "0.02", "--val-store")[::2],
        "give one of --val DIR, --val-store or --far RATE",
    )
    code, _, err = run(capsys, "calibrate", "--product", "gear", "--store", uri, "--far", "0.02", "--version", "1")
    one_error_line(code, err, "head, v2", "drop --version 1")
    one_error_line(*run(capsys, "calibrate", "--product", "gear", "--store", uri, "--far", "nan")[::2], "finite")
    assert store.head("gear") == 2 and store.versions("gear") == [1, 2] and store.candidates("gear") == [3]
    # the version list says which rule each version holds
    code, out, _ = run(capsys, "versions", "--product", "gear", "--store", uri)
    lines = out.splitlines()
    assert code == 0 and "threshold (rule)" in lines[0], out
    assert lines[1].split()[4:7] == [f"{v1.operating_point().threshold:.4f}", "far", "1%"], lines[1]
    assert lines[2].split()[:7] == ["*", "2", "1", "8", "8", f"{want:.4f}", "far"] and "20%" in lines[2], lines[2]
