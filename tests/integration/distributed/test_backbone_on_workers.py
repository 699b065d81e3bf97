"""The default backbone (EfficientNet-Lite0) built inside Ray workers: the same features as one process."""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.config import DEFAULT_LAYERS, BackboneConfig, DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM


def good_images(n: int, size: int = 64) -> list[np.ndarray]:
    product = SyntheticProduct(seed=0, size=size)
    return [product.good(i) for i in range(n)]


@pytest.mark.usefixtures("local_ray", "one_torch_thread")
def test_ray_workers_build_the_default_backbone_and_match_one_process():
    # A Ray worker imports timm (and so torchvision) only through the shim: it would die otherwise.
    from hetmm_ray.distributed import extract_features_ray

    config = DetectorConfig(backbone=BackboneConfig(image_size=64), batch_size=2, device="cpu")
    images = good_images(3)
    feats, _ = extract_features_ray(config, images)
    expected, _ = HETMM(config).extract(images, bank=True)
    assert list(feats) == list(DEFAULT_LAYERS["efficientnet_lite0"])
    for layer, v in expected.items():
        assert np.array_equal(feats[layer], v.numpy()), layer
