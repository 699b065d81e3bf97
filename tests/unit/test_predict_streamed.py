"""``hetmm predict`` takes its frames a chunk at a time: every record (score, verdict,
threshold) and heat-map equals what one chunk holding every frame gives; a bad file among them is
skipped without losing the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from hetmm_ray.cli import main, scoring
from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

CONFIG = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": 32, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "threshold": {"folds": 2},
    "device": "cpu",
}


@pytest.mark.parametrize("tiles", [None, [2, 2]], ids=["one canvas", "tiled"])
def test_predict_in_chunks_writes_what_one_chunk_writes(tmp_path: Path, monkeypatch, capsys, tiles):
    part = SyntheticProduct(seed=9, size=64)
    cfg = DetectorConfig.from_dict({**CONFIG, **({"geometry": {"tiles": tiles}} if tiles else {})})
    operations.fit(open_store(tmp_path / "store"), "p", cfg, [part.good(i) for i in range(5)])
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(10):  # more than a pass of the default batch: several chunks either way
        Image.fromarray(part.good(50 + i) if i % 2 else part.defective(50 + i, "scratch")[0]).save(folder / f"{i}.png")
    (folder / "2b.png").write_bytes(b"not a png")  # skipped, the rest scored
    results = {}
    for frames in (2, 1000):
        monkeypatch.setattr(scoring, "STREAM_FRAMES", frames)
        out = tmp_path / f"out{frames}"
        args = ["predict", str(folder), "--product", "p", "--store", str(tmp_path / "store"), "--out", str(out)]
        code = main([*args, "--json", str(out / "r.json")])
        assert code == 1  # one file skipped
        assert "skipped" in capsys.readouterr().err
        records = json.loads((out / "r.json").read_text())
        maps = [Path(r.pop("heatmap")).read_bytes() for r in records]
        results[frames] = (records, maps)
    assert len(results[2][0]) == 10
    assert results[2][0] == results[1000][0]
    assert results[2][1] == results[1000][1]
