"""Issue 23's compare acceptance on a real product, in one command (no Ray, the CLI in process).

On ``../shared/data/battery_weld`` (MVTec layout): v1 fitted on the first half of ``train/good``
(sorted by name), a candidate ``hetmm update --candidate`` with all of them, then ``hetmm compare
--labelled test/`` (HEAD v1 against the candidate) and ``hetmm predict --version`` of each version
alone on the same images. Prints the flips compare listed, the flips the two predicts give, and
whether they are equal (exit status 1 if not), with each version's recall and false alarms.

    PYTHONPATH=. python benchmarks/compare_check.py [--data ../shared/data/battery_weld] [--quick]

``--quick``: 4 + 4 train images, 6 test images of each kind, 64-px canvas (shows it runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from hetmm_ray.cli import main as hetmm

__all__ = ["run"]


def _copy(paths: list[Path], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for p in paths:
        shutil.copy(p, folder / p.name)
    return folder


def run(data: Path, quick: bool) -> int:
    train = sorted((data / "train" / "good").iterdir())
    kinds = sorted(d.name for d in (data / "test").iterdir() if d.is_dir())
    if quick:
        train = train[:8]
    half = train[: len(train) // 2]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = str(root / "store")
        test = root / "test"
        for kind in kinds:
            _copy(sorted((data / "test" / kind).iterdir())[: 6 if quick else None], test / kind)
        extra = ["--set", "backbone.image_size=64"] if quick else []
        assert hetmm(["fit", str(_copy(half, root / "half")), "--product", "p", "--store", store, *extra]) == 0
        assert (
            hetmm(["update", str(_copy(train, root / "all")), "--product", "p", "--store", store, "--candidate"]) == 0
        )
        report = root / "compare.json"
        assert hetmm(["compare", "--product", "p", "--candidate", "2", "--labelled", str(test), "--store", store,
                      "--json", str(report)]) == 0  # fmt: skip
        result = json.loads(report.read_text())
        verdicts = {}
        for v in (1, 2):
            out = root / f"v{v}.json"
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
    for name in listed:
        print(f"  {name}")
    print(f"equal: {listed == separately}")
    return 0 if listed == separately else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/battery_weld"
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sys.exit(run(args.data, args.quick))
