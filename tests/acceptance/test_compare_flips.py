"""``hetmm compare`` on a real product, end to end (no Ray, the CLI in process).

On ``../shared/data/battery_weld`` (MVTec layout): v1 fitted on the first half of ``train/good``
(sorted by name), a candidate ``hetmm update --candidate`` with all of them, then ``hetmm compare
--labelled test/`` (HEAD v1 against the candidate) and ``hetmm predict --version`` of each version
alone on the same images. The flips compare lists must be the flips the two predicts give. Prints
each version's recall and false alarms (``-s`` shows them).

Quick (``HETMM_ACCEPTANCE_QUICK=1``): 4 + 4 train images, 6 test images of each kind, 64-px canvas.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.common import BATTERY
from hetmm_ray.cli import main as hetmm

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.shared,
    pytest.mark.skipif(not BATTERY.is_dir(), reason=f"needs {BATTERY} (../shared)"),
]


def _copy(paths: list[Path], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for p in paths:
        shutil.copy(p, folder / p.name)
    return folder


def test_compare_lists_the_flips_of_predicting_each_version_alone(tmp_path: Path, quick: bool) -> None:
    data = BATTERY
    train = sorted((data / "train" / "good").iterdir())
    kinds = sorted(d.name for d in (data / "test").iterdir() if d.is_dir())
    if quick:
        train = train[:8]
    half = train[: len(train) // 2]
    store = str(tmp_path / "store")
    test = tmp_path / "test"
    for kind in kinds:
        _copy(sorted((data / "test" / kind).iterdir())[: 6 if quick else None], test / kind)
    extra = ["--set", "backbone.image_size=64", "--set", "geometry.tile_large_frames=false"] if quick else []
    assert hetmm(["fit", str(_copy(half, tmp_path / "half")), "--product", "p", "--store", store, *extra]) == 0
    every = str(_copy(train, tmp_path / "all"))
    assert hetmm(["update", every, "--product", "p", "--store", store, "--candidate"]) == 0
    report = tmp_path / "compare.json"
    assert hetmm(["compare", "--product", "p", "--candidate", "2", "--labelled", str(test), "--store", store,
                  "--json", str(report)]) == 0  # fmt: skip
    result = json.loads(report.read_text())
    verdicts = {}
    for v in (1, 2):
        out = tmp_path / f"v{v}.json"
        hetmm(["predict", str(test), "--product", "p", "--version", str(v), "--store", store, "--json", str(out)])
        verdicts[v] = {r["image"]: r["is_anomaly"] for r in json.loads(out.read_text())}
    listed = sorted(f["image"] for f in result["flips"])
    separately = sorted(k for k in verdicts[1] if verdicts[1][k] != verdicts[2][k])
    lab = result["labelled"]
    print(f"train {len(half)} -> {len(train)} images; test {lab['good']} good + {lab['defective']} defective")
    for side in ("base", "candidate"):
        print(f"v{result[side]}: recall {lab[side]['recall']}, false alarms {lab[side]['false_alarm_rate']}, "
              f"threshold {result['threshold'][side]}, estimated false alarms "
              f"{result['false_alarm_rate'][side]['estimated']}")  # fmt: skip
    print(f"flips listed by compare: {len(listed)}; by predicting each version alone: {len(separately)}")
    assert listed == separately
