"""How tests/data/pre_whole_view/ was made: run once with the code as it was before the whole view
(``geometry.tile_whole_view``; commit 83b9dac, ``git archive 83b9dac hetmm_ray | tar -x -C /tmp/prewv``),
never by the test suite:

    PYTHONPATH=/tmp/prewv python tests/data/pre_whole_view/make_store.py tests/data/pre_whole_view

It fits a tiny 2 x 2 tiled product (backbone precision float32, run on torch: the features do not
depend on the machine's bf16 or OpenVINO) on five synthetic good 64-px frames, publishes it, and
records what that code scored on three test frames (``expected.json``: frame and tile scores as
float hex, the threshold, the stitched maps' sha256, verdicts). The test
``tests/unit/test_tile_whole_view.py`` loads the store with today's code and compares.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.tiled import TiledHETMM, load_detector
from hetmm_ray.store import open_store

CONFIG = {
    "backbone": {
        "name": "resnet18",
        "weights": "random",
        "image_size": 32,
        "layers": ["layer2", "layer3"],
        "precision": "float32",  # "auto" resolves per machine (bf16 on some CPUs): fixed here
    },
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "threshold": {"folds": 2},
    "geometry": {"tiles": [2, 2], "tile_overlap": 8},
    "device": "cpu",
    "backbone_runtime": "torch",  # a run-time setting (not stored): the test loads with the same
}


def main(out: Path) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    prod = SyntheticProduct(seed=0, size=64)
    train = [prod.good(i) for i in range(5)]
    test = [prod.good(100), *(prod.defective(200 + i, k)[0] for i, k in enumerate(("scratch", "hole")))]
    for i, x in enumerate(test):
        Image.fromarray(x).save(out / f"test{i}.png")
    test = [np.asarray(Image.open(out / f"test{i}.png").convert("RGB")) for i in range(len(test))]
    store = open_store(out / "store")
    version = TiledHETMM(DetectorConfig.from_dict(CONFIG)).fit(train).save(store, "tiled")
    pred = load_detector(store, "tiled", version, device="cpu", backbone_runtime="torch").predict(test)
    expected = {
        "scores": [float(s).hex() for s in pred.scores],
        "tile_scores": [[float(s).hex() for s in row] for row in pred.tile_scores],
        "threshold": float(pred.threshold).hex(),
        "maps_sha256": [
            hashlib.sha256(np.ascontiguousarray(m, dtype=np.float32).tobytes()).hexdigest() for m in pred.maps
        ],
        "is_anomaly": [bool(v) for v in pred.is_anomaly],
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
