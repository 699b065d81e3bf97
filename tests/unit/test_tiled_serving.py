"""``TiledHETMM.serving``: a replica's tiled detector over the (tile, layer) tiny sets scores as the
stored product does (``from_template_set`` over the whole bank and selection)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import tiled_served

from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.templates import TemplateError
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct
from hetmm_ray.detection.tiled import TiledHETMM

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config() -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
        device="cpu",
    )
    tiles_alone = {"geometry.tiles": [2, 2], "geometry.tile_overlap": 8, "geometry.tile_whole_view": False}
    return c.replace(**tiles_alone, **{"templates.kind": "pts_k"})  # the whole view: test_tile_whole_view.py


def test_serving_over_tiny_sets_scores_as_the_stored_product() -> None:
    prod = SyntheticProduct(seed=1, size=96)
    det = TiledHETMM(config().replace(**{"templates.sheets": 3})).fit([prod.good(i) for i in range(6)])
    ts = det.template_set()
    assert set(ts.bank) == {f"tile{p}/{layer}" for p in range(4) for layer in ts.config.backbone.taps}
    tiny = {key: ts.templates(key) for key in ts.bank}  # what each (tile, layer) shard hands out
    assert all(t.shape[0] == 3 for t in tiny.values())
    served = tiled_served(ts, det.backbone, version=7)
    assert served.backbone is det.backbone  # shared, not built again
    frames = [prod.good(50), *(prod.defective(60 + i, k)[0] for i, k in enumerate(DEFECT_KINDS[:2]))]
    want, got = TiledHETMM.from_template_set(ts).predict(frames), served.predict(frames)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5)
    np.testing.assert_allclose(got.tile_scores, want.tile_scores, rtol=1e-5)
    assert got.threshold == want.threshold and list(got.is_anomaly) == list(want.is_anomaly)
    assert got.version == 7 and got.maps[0].shape == (96, 96)
    with pytest.raises(TemplateError, match="positions"):
        tiled_served(ts, det.backbone, version=7, config=ts.config.replace(**{"geometry.tiles": [1, 2]}))
