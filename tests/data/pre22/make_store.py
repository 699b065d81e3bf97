"""How tests/data/pre22/ was made: run once with the code as it was before tiles and regions (commit 8c31f0d,
``git archive 8c31f0d hetmm_ray | tar -x -C /tmp/pre22``), never by the test suite:

    PYTHONPATH=/tmp/pre22 python tests/data/pre22/make_store.py tests/data/pre22

It fits a tiny untiled product (backbone precision float32, run on torch: the features do not depend
on the machine's bf16 or OpenVINO) (no region: neither existed then) on five synthetic good images,
publishes it (v1: ALL), compresses it (v2: pts_o, 2 sheets), and records what that code scored on
three test images (``expected.json``: scores as float hex, thresholds, maps' sha256). The test
``tests/unit/test_pre22_store.py`` loads the store with today's code and compares.
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
from hetmm_ray.detection.detector import HETMM
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
    det = HETMM(DetectorConfig.from_dict(CONFIG)).fit(train)
    expected = {}
    for version in (det.save(store, "old"), None):
        if version is None:
            det.compress("pts_o", 2)
            version = det.save(store, "old")
        pred = HETMM.load(store, "old", version, device="cpu", backbone_runtime="torch").predict(test)
        expected[str(version)] = {
            "scores": [float(s).hex() for s in pred.scores],
            "threshold": float(pred.threshold).hex(),
            "maps_sha256": [
                hashlib.sha256(np.ascontiguousarray(m, dtype=np.float32).tobytes()).hexdigest() for m in pred.maps
            ],
            "is_anomaly": [bool(v) for v in pred.is_anomaly],
        }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
