"""What "a product stored by older code scores as it did" can promise on any CPU, checked
in three parts by tests/unit/test_pre22_store.py and test_tile_whole_view.py:

1. **Exact on every machine.** The stored bytes load and nothing is rewritten; the thresholds
   (float64 arithmetic on the stored calibration: no backbone, no vector-width-dependent sum) and
   the verdicts are the ones the old code gave, bit for bit.
2. **The scoring of stored features** (tests/stored_features.py replays the features the old code's
   backbone gave): scores, tile scores and maps equal the old code's on those features to
   ``REPLAY_RTOL``. Not bit for bit: ATMM's and the fusion's float32 sums are ordered by the CPU's
   vector width and by MKL's kernel for that CPU. Measured: the last 1-2 bits of a score change
   between torch's AVX2 kernels and its plain ones (``ATEN_CPU_CAPABILITY=default
   ONEDNN_MAX_CPU_ISA=SSE41``), about 4e-7; between the AVX2 machine that recorded the stores and an
   AVX-512 Xeon (bf16/fp16 extensions), up to 7e-5 relative on a small score (6e-6 absolute).
3. **Through the backbone** (either CPU runtime): scores and maps equal what the old code scored
   on the machine that wrote the store to ``BACKBONE_RTOL``, the bound the GPU check holds predict
   scores to (benchmarks/device_check.py ``check_predict``), because a convolution's result is not
   bit-equal between CPUs (1e-4 relative measured between an Intel Xeon with AVX-512 and an AMD
   EPYC) nor between OpenVINO and torch (1e-5).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file
from stored_features import replaying

from hetmm_ray.core.openvino_runtime import openvino_available

__all__ = [
    "BACKBONE_RTOL",
    "REPLAY_RTOL",
    "RUNTIMES",
    "check_replayed",
    "check_through_backbone",
    "store_copy",
    "test_frames",
]

REPLAY_RTOL = 2e-4
"""Today's scoring of the old backbone's features against the old code's (part 2 above)."""
BACKBONE_RTOL = 1e-3
"""Scores through the backbone against the old machine's (part 3 above)."""

RUNTIMES = [
    "torch",
    pytest.param(
        "openvino",
        marks=pytest.mark.skipif(not openvino_available(), reason="the openvino package is not installed"),
    ),
]
"""The product's two CPU runtimes (``backbone_runtime``): two kernels for the same network."""


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and p.suffix != ".lock"
    }


@contextmanager
def store_copy(data: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of ``data/store`` to load; on leaving, checks that reading it rewrote nothing."""
    import shutil

    shutil.copytree(data / "store", tmp_path / "store")
    before = _tree(tmp_path / "store")
    yield tmp_path / "store"
    assert _tree(tmp_path / "store") == before, "reading an old product wrote to its store"


def test_frames(data: Path) -> list[np.ndarray]:
    """The three test images stored beside the product."""
    return [np.asarray(Image.open(data / f"test{i}.png").convert("RGB")) for i in range(3)]


test_frames.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def _floats(hexes: list[str]) -> np.ndarray:
    return np.array([float.fromhex(h) for h in hexes])


def check_replayed(det: Any, data: Path, version: int) -> Any:
    """Part 2: ``det`` scores the old backbone's recorded features as the old code did. Returns the
    prediction (its threshold and verdicts are checked exactly)."""
    want = json.loads((data / "replayed.json").read_text())[str(version)]
    with replaying(data / "features.safetensors") as record:
        pred = det.predict(test_frames(data))
    assert record.replayed > 0, "the backbone was not asked for the test images' features"
    np.testing.assert_allclose(pred.scores, _floats(want["scores"]), rtol=REPLAY_RTOL, atol=0)
    if "tile_scores" in want:
        got = np.asarray(pred.tile_scores)
        np.testing.assert_allclose(got, [_floats(r) for r in want["tile_scores"]], rtol=REPLAY_RTOL, atol=0)
    maps = load_file(str(data / "replayed_maps.safetensors"))
    for i, m in enumerate(pred.maps):
        ref = maps[f"{version}/{i}"]
        np.testing.assert_allclose(m, ref, rtol=REPLAY_RTOL, atol=REPLAY_RTOL * float(np.abs(ref).max()))
    assert float(pred.threshold).hex() == want["threshold"]  # exact: no backbone, float64
    assert [bool(v) for v in pred.is_anomaly] == want["is_anomaly"]
    return pred


def check_through_backbone(det: Any, data: Path, expected: dict[str, Any], replayed: Any) -> Any:
    """Part 3: ``det`` (on its own backbone) scores the test images as the old code did on the
    machine that wrote the store (``expected``: that code's expected.json entry), to
    ``BACKBONE_RTOL``; its maps are the replayed prediction's to the same bound."""
    pred = det.predict(test_frames(data))
    np.testing.assert_allclose(pred.scores, _floats(expected["scores"]), rtol=BACKBONE_RTOL, atol=0)
    if "tile_scores" in expected:
        got = np.asarray(pred.tile_scores)
        np.testing.assert_allclose(got, [_floats(r) for r in expected["tile_scores"]], rtol=BACKBONE_RTOL, atol=0)
    for m, ref in zip(pred.maps, replayed.maps, strict=True):
        np.testing.assert_allclose(m, ref, rtol=BACKBONE_RTOL, atol=BACKBONE_RTOL * float(np.abs(ref).max()))
    assert float(pred.threshold).hex() == expected["threshold"]
    # every verdict stands more than the tolerance away from the threshold, so none may flip
    margins = np.abs(_floats(expected["scores"]) / float.fromhex(expected["threshold"]) - 1)
    assert margins.min() > 10 * BACKBONE_RTOL
    assert [bool(v) for v in pred.is_anomaly] == expected["is_anomaly"]
    return pred
