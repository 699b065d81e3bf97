"""Real MVTec AD bottle with real ImageNet mobilenet_v2 weights (needs ../shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetmm_ray.cli import main

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
BOTTLE = SHARED / "data" / "mvtec_ad" / "bottle"
WEIGHTS = SHARED / "weights" / "mobilenet_v2_imagenet.pth"

pytestmark = [
    pytest.mark.shared,
    pytest.mark.skipif(
        not (BOTTLE.is_dir() and WEIGHTS.is_file()),
        reason=f"needs the real MVTec bottle data and mobilenet_v2 weights in {SHARED} (absent here)",
    ),
]


def test_evaluate_bottle_reaches_the_acceptance_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bottle.json"
    argv = ["evaluate", "--data", str(BOTTLE), "--backbone", "mobilenet_v2", "--weights", str(WEIGHTS)]
    code = main([*argv, "--templates", "all", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert "image AUROC" in printed and "PRO" in printed
    assert (result["n_train"], result["n_test"], result["sheets"]) == (209, 83, 209)
    assert result["image_auroc"] >= 99.9
    assert result["pixel_auroc"] >= 98.8
    assert result["pro"] >= 96.0
    # The threshold comes from good training images only; it must still separate most of the test set.
    assert result["true_positives"] + result["true_negatives"] >= 0.9 * result["n_test"]
