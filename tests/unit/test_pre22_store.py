"""A product stored before issue 22 (no tiles, no region: tests/data/pre22/, written by the code of
commit 8c31f0d, see its make_store.py) loads with today's code as the same untiled product and scores
bit for bit as that code scored it: scores and thresholds as float hex, maps by sha256, verdicts;
and reading it rewrites nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hetmm_ray.config import GeometryConfig
from hetmm_ray.detector import HETMM
from hetmm_ray.store import open_store
from hetmm_ray.tiled import load_detector

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[1] / "data" / "pre22"


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("version", [1, 2])
def test_a_pre_issue_product_loads_and_scores_bit_for_bit(tmp_path, version):
    shutil.copytree(DATA / "store", tmp_path / "store")
    before = {k: v for k, v in _tree(tmp_path / "store").items() if not k.endswith(".lock")}
    store = open_store(tmp_path / "store")
    manifest = store.manifest("old", version)
    assert "geometry" not in manifest["config"] and "region" not in manifest["config"]  # as written then
    record = store.record("old", version)
    assert record.config.geometry == GeometryConfig() and record.config.region is None
    det = load_detector(store, "old", version, device="cpu", backbone_runtime="torch")  # as it was made
    assert type(det) is HETMM and det.version == version
    test = [np.asarray(Image.open(DATA / f"test{i}.png").convert("RGB")) for i in range(3)]
    pred = det.predict(test)
    expected = json.loads((DATA / "expected.json").read_text())[str(version)]
    assert [float(s).hex() for s in pred.scores] == expected["scores"]
    assert float(pred.threshold).hex() == expected["threshold"]
    assert [hashlib.sha256(np.ascontiguousarray(m, dtype=np.float32).tobytes()).hexdigest() for m in pred.maps] == (
        expected["maps_sha256"]
    )
    assert [bool(v) for v in pred.is_anomaly] == expected["is_anomaly"]
    after = {k: v for k, v in _tree(tmp_path / "store").items() if not k.endswith(".lock")}
    assert after == before  # reading an old product writes nothing
