"""How ``features.safetensors`` and ``replayed.json`` / ``replayed_maps.safetensors`` beside a stored
product (tests/data/pre22/, tests/data/pre_whole_view/) were made: run once with the code
that wrote the store (its make_store.py names the commit), never by the test suite:

    git archive 8c31f0d hetmm_ray | tar -x -C /tmp/pre22
    PYTHONPATH=/tmp/pre22:tests python tests/data/record_features.py tests/data/pre22 old 1 2
    git archive 83b9dac hetmm_ray | tar -x -C /tmp/prewv
    PYTHONPATH=/tmp/prewv:tests python tests/data/record_features.py tests/data/pre_whole_view tiled 1

For each version it loads the store with that code, predicts the three test images once with the
real backbone (on torch) while recording every image row the backbone sees and its features
(tests/stored_features.py), then predicts them again with the backbone replaying that record, and
writes what that code scored on the recorded features: scores and tile scores as float hex, the
threshold, the verdicts (``replayed.json``) and the maps (``replayed_maps.safetensors``). Today's
tests replay the same features through today's code and compare (the CPU-independent half of
"an old product scores as it did"; the backbone's half is compared with a tolerance).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.numpy import save_file
from stored_features import recording, replaying

from hetmm_ray.store import open_store

try:
    from hetmm_ray.detection.tiled import load_detector
except ImportError:  # before tiles: every product was a HETMM
    from hetmm_ray.detection.detector import HETMM

    load_detector = HETMM.load


def main(root: Path, product: str, versions: list[int]) -> None:
    torch.set_num_threads(1)
    store = open_store(root / "store")
    test = [np.asarray(Image.open(root / f"test{i}.png").convert("RGB")) for i in range(3)]
    with recording(root / "features.safetensors"):
        for v in versions:
            load_detector(store, product, v, device="cpu", backbone_runtime="torch").predict(test)
    scored, maps = {}, {}
    with replaying(root / "features.safetensors"):
        for v in versions:
            pred = load_detector(store, product, v, device="cpu", backbone_runtime="torch").predict(test)
            scored[str(v)] = {
                "scores": [float(s).hex() for s in pred.scores],
                "threshold": float(pred.threshold).hex(),
                "is_anomaly": [bool(x) for x in pred.is_anomaly],
            }
            if getattr(pred, "tile_scores", None) is not None:
                scored[str(v)]["tile_scores"] = [[float(s).hex() for s in row] for row in pred.tile_scores]
            maps.update({f"{v}/{i}": np.ascontiguousarray(m, dtype=np.float32) for i, m in enumerate(pred.maps)})
    (root / "replayed.json").write_text(json.dumps(scored, indent=1) + "\n")
    save_file(maps, str(root / "replayed_maps.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], [int(v) for v in sys.argv[3:]])
