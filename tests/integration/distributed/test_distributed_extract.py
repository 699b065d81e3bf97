"""Feature extraction as Ray tasks on a real local Ray equals the single-process extraction."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import png

from hetmm_ray.config import BackboneConfig, DetectorConfig
from hetmm_ray.data.decode import ImageError
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.distributed import extract_features_ray

pytestmark = pytest.mark.usefixtures("local_ray", "one_torch_thread")

CONFIG = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
    batch_size=3,
    device="cpu",
)


@pytest.fixture(scope="module")
def images() -> list[bytes | np.ndarray]:
    gear = SyntheticProduct(seed=0, size=72)  # not 64: the tasks resize, like the single process
    return [png(gear.good(i)) if i % 2 else gear.good(i) for i in range(7)]  # bytes and arrays mixed


def test_equals_single_process_extract(images) -> None:
    calls: list[tuple[int, int]] = []
    feats, digests = extract_features_ray(CONFIG, images, progress=lambda d, t: calls.append((d, t)))
    expected, expected_digests = HETMM(CONFIG).extract(images, bank=True)
    assert digests == expected_digests
    assert list(feats) == list(expected)  # layers in tap order
    for layer, v in expected.items():
        assert feats[layer].dtype == np.float16
        # Same batches (3, 3, 1) through the same code on one thread each: bit for bit.
        assert np.array_equal(feats[layer], v.numpy()), layer
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[-1] == (7, 7)
    assert len(calls) == 3  # one call per finished batch


def test_the_first_task_estimates_the_frame_cost_with_its_backbone(images) -> None:
    """A create job's cost line (``on_estimate``): measured once, in the first batch's task, and the
    features are the same as without it."""
    got: list[float] = []
    feats, digests = extract_features_ray(CONFIG, images, estimate_sheets=5, on_estimate=got.append)
    plain, plain_digests = extract_features_ray(CONFIG, images)
    assert len(got) == 1 and 0 < got[0] < float("inf")
    assert digests == plain_digests and all(np.array_equal(feats[k], plain[k]) for k in plain)
    nothing: list[float] = []
    extract_features_ray(CONFIG, images[:2], estimate_sheets=None, on_estimate=nothing.append)
    assert nothing == []


def test_bfloat16_banks_come_back_as_float32_holding_the_bfloat16_values(images) -> None:
    config = replace(CONFIG, bank_dtype="bfloat16")
    feats, _ = extract_features_ray(config, images[:4], batch_size=2)
    expected, _ = HETMM(replace(config, batch_size=2)).extract(images[:4], bank=True)
    for layer, v in expected.items():
        assert feats[layer].dtype == np.float32
        assert np.array_equal(feats[layer], v.float().numpy())


def test_a_bad_image_is_named_by_its_index(images) -> None:
    broken = list(images)
    broken[4] = png(SyntheticProduct(seed=0, size=72).good(4))[:200]  # truncated
    with pytest.raises(ImageError, match=r"^image 4: ") as info:
        extract_features_ray(CONFIG, broken)
    assert info.value.source == "image 4"
    with pytest.raises(ImageError, match=r"^image 1: arrays must be RGB uint8"):
        extract_features_ray(CONFIG, [images[0], np.zeros((8, 8), dtype=np.uint8)])
    with pytest.raises(ValueError, match="no images"):
        extract_features_ray(CONFIG, [])


def test_features_are_the_backbones_unit_vectors(images) -> None:
    feats, _ = extract_features_ray(replace(CONFIG, bank_dtype="float32"), images[:2], batch_size=1)
    norms = np.linalg.norm(feats["layer1"], axis=1)
    assert torch.allclose(torch.from_numpy(norms), torch.ones(1), atol=1e-5)
