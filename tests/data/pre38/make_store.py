"""How tests/data/pre38/{plain,tiled}/ were made (one detector interface): run once with the
code as it was before it (commit f686468, ``git archive f686468 hetmm_ray | tar -x -C /tmp/pre38``),
never by the test suite:

    PYTHONPATH=/tmp/pre38 python tests/data/pre38/make_store.py tests/data/pre38/plain plain
    PYTHONPATH=/tmp/pre38 python tests/data/pre38/make_store.py tests/data/pre38/tiled tiled

Each writes a tiny product (resnet18 with random weights, 32-px canvas, float32, on torch: the
features do not depend on the machine's bf16 or OpenVINO) fitted on five synthetic good 64-px frames,
in the kinds of version the store held then:

- ``plain`` (one canvas): v1 the fit; v2 v1's templates under an inspection region, recalibrated
  (``hetmm region``); v3 v1 compressed to 2 PTS sheets, stored as a **candidate** beside HEAD v2.
- ``tiled`` (2 x 2 tiles and the whole view): v1 the fit; v2 v1 under the region, recalibrated per
  position (``TiledHETMM.with_region``), stored as a **candidate** beside HEAD v1.

and records what that code scored on three test frames (``expected.json`` per version: scores, tile
scores, the threshold as float hex, the verdicts). ``tests/data/record_features.py`` then recorded the
backbone's features and that code's scores of them (``features.safetensors``, ``replayed.json``,
``replayed_maps.safetensors``). The test ``tests/unit/test_pre38_store.py`` loads both with today's code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
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
    "device": "cpu",
    "backbone_runtime": "torch",  # a run-time setting (not stored): the test loads with the same
}
REGION = {"size": [64, 64], "include": [], "exclude": [{"rect": [0, 0, 20, 64]}]}  # the left third left out


def main(out: Path, kind: str) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    prod = SyntheticProduct(seed=0, size=64)
    train = [prod.good(i) for i in range(5)]
    test = [prod.good(100), *(prod.defective(200 + i, k)[0] for i, k in enumerate(("scratch", "hole")))]
    for i, x in enumerate(test):
        Image.fromarray(x).save(out / f"test{i}.png")
    test = [np.asarray(Image.open(out / f"test{i}.png").convert("RGB")) for i in range(len(test))]
    store = open_store(out / "store")
    if kind == "plain":
        det = HETMM(DetectorConfig.from_dict(CONFIG)).fit(train)
        det.save(store, kind)
        ts = det.templates
        store.put(kind, det.calibrated(replace(ts, config=replace(ts.config, region=REGION))))
        det.compress("pts_o", 2)
        store.put(kind, det.templates, candidate=True)
        versions = [1, 2, 3]
    else:
        cfg = DetectorConfig.from_dict({**CONFIG, "geometry": {"tiles": [2, 2], "tile_overlap": 8}})
        det = TiledHETMM(cfg).fit(train)
        det.save(store, kind)
        store.put(kind, det.with_region(REGION).template_set(), candidate=True)
        versions = [1, 2]
    expected = {}
    for v in versions:
        pred = load_detector(store, kind, v, device="cpu", backbone_runtime="torch").predict(test)
        expected[str(v)] = {
            "scores": [float(s).hex() for s in pred.scores],
            "threshold": float(pred.threshold).hex(),
            "is_anomaly": [bool(x) for x in pred.is_anomaly],
        }
        if getattr(pred, "tile_scores", None) is not None:
            expected[str(v)]["tile_scores"] = [[float(s).hex() for s in row] for row in pred.tile_scores]
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
