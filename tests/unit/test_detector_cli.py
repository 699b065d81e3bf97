"""HETMM end to end on tiny synthetic images: detector API, backbone weights, and the CLI.

Everything runs on the CPU with a randomly initialised resnet18 at 64x64, so no
network, no pretrained weights and no shared data are needed.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from reference_impls import calibrate
from scipy.ndimage import gaussian_filter

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.atmm import anomaly_maps, pixel_major
from hetmm_ray.core.backbone import IMAGENET_MEAN, IMAGENET_STD, Backbone, WeightsError
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.core.templates import TemplateError
from hetmm_ray.data.decode import images_to_tensor
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct, write_mvtec_layout
from hetmm_ray.detection.detector import HETMM, Prediction
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

SIZE = 64


def det_config(**changes) -> DetectorConfig:
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
        device="cpu",
    )
    return config.replace(**changes) if changes else config


def save_png(array: np.ndarray, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


# --- an independent, literal feature extractor -----------------------------------------------
def seeded_resnet18(seed: int) -> torch.nn.Module:
    from hetmm_ray.compat.torchvision import models

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = models.resnet18(weights=None)
    return model.eval()


@torch.no_grad()
def literal_features(model: torch.nn.Module, images: torch.Tensor, pre_relu: bool) -> dict[str, torch.Tensor]:
    """docs/algorithm.md §1 written out block by block (no feature-extraction graph)."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    x = (images - mean) / std
    x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
    out = {}
    for name in ("layer1", "layer2", "layer3"):
        blocks = list(getattr(model, name))
        for block in blocks[:-1]:
            x = block(x)
        last = blocks[-1]
        identity = x if last.downsample is None else last.downsample(x)
        residual_sum = last.bn2(last.conv2(last.relu(last.bn1(last.conv1(x))))) + identity
        x = torch.relu(residual_sum)
        out[name] = F.normalize(residual_sum if pre_relu else x, dim=1)
    return out


def scipy_blur(maps: np.ndarray, sigma: float) -> np.ndarray:
    if sigma <= 0:
        return maps.astype(np.float64)
    r = math.ceil(4 * sigma)
    return np.stack([gaussian_filter(m.astype(np.float64), sigma, mode="mirror", radius=r) for m in maps])


def top_k_mean(rows: np.ndarray, k: int) -> np.ndarray:
    """The image score's rule written out: the mean of each row's ``k`` highest values."""
    return np.sort(rows, axis=1)[:, ::-1][:, :k].mean(axis=1)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def product() -> SyntheticProduct:
    return SyntheticProduct(seed=0, size=SIZE)


@pytest.fixture(scope="module")
def images(product):
    train = [product.good(i) for i in range(6)]
    good = [product.good(100 + i) for i in range(3)]
    bad = [product.defective(200 + i, kind)[0] for i, kind in enumerate(DEFECT_KINDS)]
    return train, good, bad


@pytest.fixture(scope="module")
def fitted(images) -> HETMM:
    train, _, _ = images
    return HETMM(det_config()).fit(train)


@pytest.fixture(scope="module")
def prediction(fitted, images) -> Prediction:
    train, good, bad = images
    return fitted.predict(train[:2] + good + bad)


# --- detector API ----------------------------------------------------------------------------------
def test_fit_predict_shapes_and_verdicts(fitted, prediction):
    n = 2 + 3 + len(DEFECT_KINDS)
    assert len(prediction) == n
    assert prediction.scores.shape == (n,)
    assert prediction.maps.shape == (n, SIZE, SIZE)
    assert prediction.maps.dtype == np.float32
    assert np.isfinite(prediction.scores).all() and np.isfinite(prediction.maps).all()
    assert math.isfinite(prediction.threshold)
    assert prediction.threshold == fitted.operating_point().threshold
    np.testing.assert_array_equal(prediction.is_anomaly, prediction.scores > prediction.threshold)
    assert prediction.version is None  # not saved yet
    assert fitted.templates.n_images == 6
    assert fitted.templates.weights_id == "random:seed=0"


def test_training_images_score_lower_than_defective_ones(prediction):
    s = prediction.scores
    train, good, bad = s[:2], s[2:5], s[5:]
    # A training image finds itself among the templates: (almost) zero everywhere.
    assert (train < 1e-4).all()
    assert train.max() < bad.min()
    assert good.mean() < bad.mean()
    # Maps of training images are flat (near) zeros, defective ones are not.
    assert np.abs(prediction.maps[:2]).max() < 1e-3  # fp16 bank: cosines round to ~1e-4
    assert (prediction.maps[5:].reshape(len(bad), -1).max(axis=1) > 10 * 1e-4).all()


def test_predict_equals_an_independent_recomputation(fitted, images):
    train, good, bad = images
    query = good + bad
    pred = fitted.predict(query)
    sc = fitted.config.scoring

    # Backbone features (checked against a literal forward pass in test_pre_relu_taps).
    bank = fitted.backbone(images_to_tensor(train, SIZE))
    feats = fitted.backbone(images_to_tensor(query, SIZE))
    # The stored bank is exactly the training images' features, in the bank's storage dtype.
    for layer, t in bank.items():
        stored = fitted.templates.bank[layer]
        assert stored.dtype == getattr(torch, fitted.config.bank_dtype)
        assert torch.equal(stored, t.to(stored.dtype))

    t_pm = {k: pixel_major(v.to(fitted.templates.bank[k].dtype).float()) for k, v in bank.items()}
    maps = anomaly_maps(feats, t_pm, sc.forward_windows, sc.backward_windows, sc.alphas, sc.layer_weights, SIZE).numpy()
    scores = top_k_mean(scipy_blur(maps, sc.score_sigma).reshape(len(query), -1), fitted.config.score_pixels)
    np.testing.assert_allclose(pred.scores, scores, atol=1e-5)
    np.testing.assert_allclose(pred.maps, scipy_blur(maps, sc.map_sigma), atol=1e-5)


def test_calibration_is_out_of_fold(fitted):
    """Recompute the stored calibration scores with calibrate() and a hand-written scorer."""
    ts = fitted.templates
    cfg = fitted.config
    sc, tc = cfg.scoring, cfg.threshold

    def score_fold(held, kept):
        t_pm = {k: pixel_major(v[kept].float()) for k, v in ts.bank.items()}
        q = {k: v[held].float() for k, v in ts.bank.items()}
        maps = anomaly_maps(q, t_pm, sc.forward_windows, sc.backward_windows, sc.alphas, sc.layer_weights, SIZE)
        return top_k_mean(
            scipy_blur(maps.numpy(), sc.score_sigma).reshape(len(held), -1), fitted.config.score_pixels
        ).tolist()

    ref = calibrate(
        ts.n_images,
        folds=tc.folds,
        max_images=tc.max_images,
        seed=tc.seed,
        score_fold=score_fold,
        keys=ts.image_digests,
    )
    np.testing.assert_allclose(ts.calibration.scores, ref.scores, atol=1e-5)
    assert len(ts.calibration.scores) == 6
    # Held-out images are not in their own templates, so their scores are clearly > 0.
    assert min(ts.calibration.scores) > 1e-3
    arr = np.array(ts.calibration.scores)
    # Default rule: far at threshold.false_alarm_rate; the sigmas rule stays available.
    assert tc.rule == "far"
    assert fitted.operating_point().threshold == pytest.approx(
        TailModel(arr.tolist()).threshold(tc.false_alarm_rate), rel=1e-12
    )
    sig = fitted.operating_point(sigmas=tc.sigmas)
    assert sig.rule == "sigmas" and sig.threshold == pytest.approx(arr.mean() + tc.sigmas * arr.std(ddof=1), rel=1e-9)


def test_sigmas_override_changes_only_the_threshold(fitted, images, prediction):
    _, good, bad = images
    p0 = fitted.predict(good + bad, sigmas=0.0)
    np.testing.assert_allclose(p0.scores, prediction.scores[2:], atol=1e-6)
    assert p0.threshold == pytest.approx(fitted.templates.calibration.mean)
    np.testing.assert_array_equal(p0.is_anomaly, p0.scores > p0.threshold)


def test_predict_accepts_paths_bytes_and_arrays(fitted, images, tmp_path):
    _, good, bad = images
    arrays = [good[0], bad[0]]
    paths = [save_png(a, tmp_path / f"{i}.png") for i, a in enumerate(arrays)]
    by_array = fitted.predict(arrays).scores
    np.testing.assert_array_equal(fitted.predict(paths).scores, by_array)
    np.testing.assert_array_equal(fitted.predict([str(p) for p in paths]).scores, by_array)
    np.testing.assert_array_equal(fitted.predict([png_bytes(a) for a in arrays]).scores, by_array)


def test_predict_resizes_other_sizes(fitted):
    big = SyntheticProduct(seed=0, size=96).good(3)
    pred = fitted.predict([big])
    assert pred.maps.shape == (1, SIZE, SIZE)
    assert np.isfinite(pred.scores).all()


def test_misuse_is_refused(fitted, images):
    train, _, _ = images
    with pytest.raises(RuntimeError, match="fit"):
        HETMM(det_config()).predict(train[:1])
    with pytest.raises(ValueError, match="at least 2"):
        HETMM(det_config()).fit(train[:1])
    with pytest.raises(ValueError, match="uint8"):
        fitted.predict([train[0].astype(np.float32)])


def test_save_load_gives_identical_scores(fitted, images, tmp_path):
    _, good, bad = images
    store = open_store(tmp_path / "store")
    before = fitted.predict(good + bad)
    try:
        assert fitted.save(store, "gear") == 1
        loaded = load_detector(store, "gear")
        assert loaded.version == 1
        # the product's settings; run-time ones (device, batch_size) are this host's
        assert loaded.config.stored_dict() == fitted.config.stored_dict()
        after = loaded.predict(good + bad)
        np.testing.assert_array_equal(after.scores, before.scores)
        np.testing.assert_array_equal(after.maps, before.maps)
        assert after.threshold == before.threshold
        assert after.version == 1
        # An explicit version and run-time overrides.
        again = load_detector(store, "gear", 1, batch_size=1)
        assert again.config.batch_size == 1
        np.testing.assert_allclose(again.predict(good + bad).scores, before.scores, atol=1e-6)
    finally:
        fitted.version = None  # the module fixture stays unsaved


def test_load_refuses_templates_of_other_weights(fitted, tmp_path):
    store = open_store(tmp_path)
    store.put("gear", fitted.templates)
    with pytest.raises(TemplateError, match="weights"):
        load_detector(store, "gear", **{"backbone.seed": 1})


def test_update_grows_the_bank_and_keeps_working(fitted, product, images, tmp_path):
    _, good, bad = images
    store = open_store(tmp_path)
    store.put("gear", fitted.templates)
    det = load_detector(store, "gear")
    extra = [product.good(50), product.good(51)]
    det.update(extra)
    ts = det.templates
    assert ts.n_images == 8
    assert ts.image_digests[:6] == fitted.templates.image_digests
    assert len(set(ts.image_digests)) == 8
    for layer in ts.layers:
        assert ts.bank[layer].shape[0] == 8
        torch.testing.assert_close(ts.bank[layer][:6], fitted.templates.bank[layer])
    assert len(ts.calibration.scores) == 6  # max_images
    assert math.isfinite(det.operating_point().threshold)
    pred = det.predict(extra + good + bad)
    assert (pred.scores[:2] < 1e-4).all()  # the added images are now templates
    np.testing.assert_array_equal(pred.is_anomaly, pred.scores > pred.threshold)
    # The fitted detector it was loaded from is unchanged, and the update can be published.
    assert fitted.templates.n_images == 6
    assert store.put("gear", ts) == 2
    assert store.get("gear").n_images == 8


# --- backbone -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def weights_files(tmp_path_factory):
    """resnet18 state dicts (seed 123, not the default seed 0) as .pth, wrapped .pth and .safetensors."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("weights")
    model = seeded_resnet18(123)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(1 + 0.2 * torch.rand(m.num_features, generator=g))
    state = model.state_dict()
    torch.save(state, folder / "r18.pth")
    torch.save({"state_dict": state, "epoch": 3}, folder / "wrapped.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "r18.safetensors"))
    return folder, model


def test_backbone_loads_pth_and_safetensors_identically(weights_files, images):
    folder, model = weights_files
    train, _, _ = images
    batch = images_to_tensor(train[:2], SIZE)
    # pre_relu=False: the literal reference of pre_relu=True does not match yet (see test_pre_relu_taps).
    ref = literal_features(model, batch, pre_relu=False)
    random = Backbone(BackboneConfig(name="resnet18", weights="random", image_size=SIZE, pre_relu=False))(batch)
    outs = {}
    for name in ("r18.pth", "wrapped.pt", "r18.safetensors"):
        path = folder / name
        bb = Backbone(BackboneConfig(name="resnet18", weights=str(path), image_size=SIZE, pre_relu=False))
        assert bb.weights_id == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        outs[name] = bb(batch)
    for layer, t in ref.items():
        assert outs["r18.pth"][layer].shape == t.shape
        torch.testing.assert_close(outs["r18.pth"][layer], t, atol=1e-5, rtol=1e-4)
        assert torch.equal(outs["r18.pth"][layer], outs["r18.safetensors"][layer])
        assert torch.equal(outs["r18.pth"][layer], outs["wrapped.pt"][layer])
        # The file really was loaded: not the seeded random initialisation.
        assert not torch.allclose(outs["r18.pth"][layer], random[layer], atol=1e-3)


def test_backbone_refuses_weights_of_another_architecture(weights_files):
    folder, _ = weights_files
    for name in ("r18.pth", "r18.safetensors"):
        with pytest.raises(WeightsError, match="do not fit mobilenet_v2") as info:
            Backbone(BackboneConfig(name="mobilenet_v2", weights=str(folder / name), image_size=SIZE))
        assert name in str(info.value)


def test_backbone_refuses_bad_weight_files(tmp_path):
    missing = tmp_path / "missing.pth"
    with pytest.raises(WeightsError, match="not found") as info:
        Backbone(BackboneConfig(name="resnet18", weights=str(missing)))
    assert str(missing) in str(info.value)

    tensor = tmp_path / "tensor.pth"
    torch.save(torch.zeros(3), tensor)
    with pytest.raises(WeightsError, match="not a state dict"):
        Backbone(BackboneConfig(name="resnet18", weights=str(tensor)))

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError, match="could not be read"):
        Backbone(BackboneConfig(name="resnet18", weights=str(garbage)))

    # Arbitrary pickles are never unpickled (weights_only=True).
    pickled = tmp_path / "pickle.pth"
    torch.save({"model": Path("x")}, pickled)
    with pytest.raises(WeightsError, match="could not be read"):
        Backbone(BackboneConfig(name="resnet18", weights=str(pickled)))

    with pytest.raises(WeightsError, match="unknown weights"):
        Backbone(BackboneConfig(name="resnet18", weights="IMAGENET1K_V9"))


def test_pretrained_weights_offline_name_both_remedies(tmp_path, monkeypatch):
    import urllib.error

    import torch.hub

    # An empty torch hub cache, and no network whatever this machine has.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cache = Path(torch.hub.get_dir()) / "checkpoints" / "resnet18-f37072fd.pth"
    if cache.exists():  # pragma: no cover - only if TORCH_HOME is ignored
        pytest.skip(f"{cache} exists")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network unreachable (test)")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(WeightsError) as info:
        Backbone(BackboneConfig(name="resnet18", weights="DEFAULT"))
    msg = str(info.value)
    assert "--weights" in msg
    assert str(cache) in msg
    assert not cache.exists()


SHAPES = {"layer1": (64, 16, 16), "layer2": (128, 8, 8), "layer3": (256, 4, 4)}


def test_relu_taps_are_non_negative(images):
    train, _, _ = images
    batch = images_to_tensor(train[:2], SIZE)
    feats = Backbone(BackboneConfig(name="resnet18", weights="random", image_size=SIZE, pre_relu=False))(batch)
    ref = literal_features(seeded_resnet18(0), batch, pre_relu=False)
    assert list(feats) == list(SHAPES)
    for layer, f in feats.items():
        assert f.shape == (2, *SHAPES[layer])
        torch.testing.assert_close(f, ref[layer], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(f.norm(dim=1), torch.ones(2, *SHAPES[layer][1:]), atol=1e-5, rtol=0)
        assert (f >= 0).all(), f"{layer}: ReLU'd features must be >= 0"


@pytest.mark.parametrize("layer", list(SHAPES))
def test_pre_relu_taps_are_residual_sums(images, layer):
    """pre_relu taps are the residual sum of the stage's last block: negative entries exist."""
    train, _, _ = images
    batch = images_to_tensor(train[:2], SIZE)
    f = Backbone(BackboneConfig(name="resnet18", weights="random", image_size=SIZE, pre_relu=True))(batch)[layer]
    ref = literal_features(seeded_resnet18(0), batch, pre_relu=True)[layer]
    assert f.shape == (2, *SHAPES[layer])
    torch.testing.assert_close(f.norm(dim=1), torch.ones(2, *SHAPES[layer][1:]), atol=1e-5, rtol=0)
    assert (f < -1e-3).any(), f"{layer}: a residual sum should have negative entries"
    torch.testing.assert_close(f, ref, atol=1e-5, rtol=1e-4)


def test_feature_shapes(images):
    bb = Backbone(BackboneConfig(name="mobilenet_v2", weights="random", image_size=SIZE))
    shapes = bb.feature_shapes()
    assert list(shapes) == ["features.3", "features.6", "features.13"]
    assert shapes["features.3"] == (24, 16, 16)
    out = bb(images_to_tensor(images[0][:1], SIZE))
    assert {k: tuple(v.shape[1:]) for k, v in out.items()} == shapes
    with pytest.raises(ValueError, match="shape"):
        bb(torch.zeros(1, 1, SIZE, SIZE))


def test_compat_module_exposes_torchvision():
    import hetmm_ray.compat.torchvision as tvc

    assert callable(tvc.models.resnet18)
    assert callable(tvc.models.get_model_weights)
    assert callable(tvc.feature_extraction.create_feature_extractor)
    assert tvc.torchvision.__name__ == "torchvision"
    assert "resnet18" in tvc.models.list_models()


# --- CLI ------------------------------------------------------------------------------------------------
FLAGS = [
    "--backbone",
    "resnet18",
    "--weights",
    "random",
    "--device",
    "cpu",
    "--set",
    "backbone.image_size=64",
    "--set",
    "threshold.max_images=4",
]


def visible_lines(stderr: str) -> list[str]:
    """What a terminal shows: carriage returns overwrite (progress bars), blank lines dropped."""
    shown = []
    for raw in stderr.split("\n"):
        buf: list[str] = []
        pos = 0
        for ch in raw:
            if ch == "\r":
                pos = 0
                continue
            if pos < len(buf):
                buf[pos] = ch
            else:
                buf.append(ch)
            pos += 1
        line = "".join(buf).rstrip()
        if line:
            shown.append(line)
    return shown


def run(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def check_error(code: int, err: str, expected_code: int, *words: str, prefix: str = "hetmm: error:") -> str:
    assert code == expected_code, err
    assert "Traceback" not in err
    lines = visible_lines(err)
    assert len(lines) == 1, lines
    line = lines[0]
    assert prefix in line, line
    head, msg = line[: line.index(prefix)], line[line.index(prefix) :]
    assert head == "" or "%|" in head, f"unexpected text before the message: {head!r}"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


@pytest.fixture(scope="module")
def cli_data(tmp_path_factory, product):
    root = tmp_path_factory.mktemp("cli")
    train = root / "train"
    for i in range(4):
        save_png(product.good(i), train / f"{i:03d}.png")
    test = root / "test"
    save_png(product.good(300), test / "good_0.png")
    save_png(product.good(301), test / "good_1.png")
    save_png(product.defective(302, "hole")[0], test / "hole.png")
    save_png(product.defective(303, "missing")[0], test / "missing.png")
    store = root / "store"
    code = main(["fit", str(train), "--product", "gear", "--store", str(store), *FLAGS])
    assert code == 0
    return {"root": root, "train": train, "test": test, "store": store}


def test_cli_fit_publishes_versions(capsys, cli_data, tmp_path):
    store = tmp_path / "store"
    code, out, err = run(capsys, "fit", cli_data["train"], "--product", "p", "--store", store, *FLAGS)
    assert code == 0, err
    assert "version 1" in out and "4 good images" in out and "random:seed=0" in out
    code, out, _ = run(
        capsys,
        "fit",
        cli_data["train"] / "000.png",
        cli_data["train"] / "001.png",
        "--product",
        "p",
        "--store",
        store,
        *FLAGS,
    )
    assert code == 0
    assert "version 2" in out
    st = open_store(store)
    assert st.versions("p") == [1, 2]
    assert st.get("p", 1).n_images == 4 and st.get("p").n_images == 2
    assert st.get("p").config.backbone.image_size == 64
    assert st.get("p").config.threshold.max_images == 4


def test_cli_predict_writes_heatmaps_and_json(capsys, cli_data, tmp_path):
    out_dir, js = tmp_path / "heat", tmp_path / "res" / "r.json"
    js.parent.mkdir()
    code, out, err = run(
        capsys,
        "predict",
        cli_data["test"],
        "--product",
        "gear",
        "--store",
        cli_data["store"],
        "--out",
        out_dir,
        "--json",
        js,
    )
    assert code == 0, err
    assert "Traceback" not in err and not visible_lines(err)
    records = json.loads(js.read_text())
    names = sorted(p.name for p in cli_data["test"].iterdir())
    assert sorted(Path(r["image"]).name for r in records) == names
    for r in records:
        assert set(r) >= {"image", "score", "threshold", "is_anomaly", "version", "heatmap"}
        assert r["version"] == 1
        assert r["is_anomaly"] == (r["score"] > r["threshold"])
        assert math.isfinite(r["score"]) and math.isfinite(r["threshold"])
        heat = Path(r["heatmap"])
        assert heat.parent == out_dir and heat.name == f"{Path(r['image']).stem}_heatmap.png"
        with Image.open(heat) as im:
            assert im.format == "PNG" and im.size == (SIZE, SIZE) and im.mode == "RGB"
        assert Path(r["image"]).name in out  # one line per image on stdout
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(f"{Path(n).stem}_heatmap.png" for n in names)

    # The CLI's numbers are the API's numbers.
    det = load_detector(open_store(cli_data["store"]), "gear")
    pred = det.predict([Path(r["image"]) for r in records])
    np.testing.assert_allclose([r["score"] for r in records], pred.scores, atol=2e-6)
    assert records[0]["threshold"] == pytest.approx(pred.threshold, abs=2e-6)


def test_cli_predict_sigmas_and_version(capsys, cli_data, tmp_path):
    js = tmp_path / "r.json"
    code, _, err = run(
        capsys,
        "predict",
        cli_data["test"] / "hole.png",
        "--product",
        "gear",
        "--store",
        cli_data["store"],
        "--version",
        1,
        "--sigmas",
        0,
        "--json",
        js,
    )
    assert code == 0, err
    (rec,) = json.loads(js.read_text())
    cal = open_store(cli_data["store"]).get("gear", 1).calibration
    assert rec["threshold"] == pytest.approx(cal.mean, abs=2e-6)
    assert "heatmap" not in rec


@pytest.fixture
def bad_images(tmp_path, product) -> dict[str, Path]:
    folder = tmp_path / "bad"
    folder.mkdir()
    data = png_bytes(product.good(7))
    files = {
        "empty": (folder / "empty.png", b""),
        "truncated": (folder / "truncated.png", data[: len(data) // 2]),
        "text": (folder / "text.png", b"this is a text file, not an image\n" * 4),
    }
    for path, content in files.values():
        path.write_bytes(content)
    return {k: p for k, (p, _) in files.items()}


PROBLEMS = {
    "empty": "empty file",
    "truncated": "truncated or corrupt",
    "text": "not a recognised image format",
}


@pytest.mark.parametrize("kind", list(PROBLEMS))
def test_cli_fit_refuses_a_bad_image(capsys, cli_data, bad_images, tmp_path, kind):
    folder = tmp_path / "train"
    for p in sorted(cli_data["train"].iterdir()):
        (folder / p.name).parent.mkdir(exist_ok=True)
        (folder / p.name).write_bytes(p.read_bytes())
    bad = folder / f"zz_{kind}.png"
    bad.write_bytes(bad_images[kind].read_bytes())
    code, _, err = run(capsys, "fit", folder, "--product", "p", "--store", tmp_path / "st", *FLAGS)
    check_error(code, err, 2, str(bad), PROBLEMS[kind])
    assert not (tmp_path / "st").exists()  # nothing published


def test_cli_fit_error_line_is_not_glued_to_a_progress_bar(capsys, bad_images, tmp_path):
    code, _, err = run(
        capsys, "fit", bad_images["empty"], bad_images["text"], "--product", "p", "--store", tmp_path / "st", *FLAGS
    )
    assert code == 2
    assert visible_lines(err)[0].startswith("hetmm: error:")


def test_cli_predict_skips_bad_images(capsys, cli_data, bad_images, tmp_path):
    js = tmp_path / "r.json"
    good = cli_data["test"] / "hole.png"
    code, _, err = run(
        capsys, "predict", good, *bad_images.values(), "--product", "gear", "--store", cli_data["store"], "--json", js
    )
    assert code == 1
    assert "Traceback" not in err
    lines = visible_lines(err)
    assert len(lines) == 3, lines
    for line, (kind, path) in zip(lines, bad_images.items(), strict=True):
        assert line.startswith(f"hetmm: skipped: {path}:"), line
        assert PROBLEMS[kind] in line
    (rec,) = json.loads(js.read_text())  # the good image was still scored
    assert rec["image"] == str(good)


def test_cli_predict_with_only_bad_images(capsys, cli_data, bad_images):
    code, _, err = run(capsys, "predict", bad_images["empty"], "--product", "gear", "--store", cli_data["store"])
    assert code == 2
    assert "Traceback" not in err
    lines = visible_lines(err)
    assert len(lines) == 2, lines
    assert lines[0].startswith("hetmm: skipped:") and "empty file" in lines[0]
    assert lines[1].startswith("hetmm: error:") and "no readable images" in lines[1]


def test_cli_predict_heatmaps_of_same_named_files_do_not_collide(capsys, cli_data, tmp_path, product):
    folder = tmp_path / "in"
    save_png(product.good(400), folder / "a" / "000.png")
    save_png(product.defective(401, "hole")[0], folder / "b" / "000.png")
    js = tmp_path / "r.json"
    code, _, err = run(
        capsys,
        "predict",
        folder,
        "--product",
        "gear",
        "--store",
        cli_data["store"],
        "--out",
        tmp_path / "heat",
        "--json",
        js,
    )
    assert code == 0, err
    records = json.loads(js.read_text())
    assert len({r["heatmap"] for r in records}) == 2


@pytest.fixture
def error_case(request, cli_data, tmp_path, monkeypatch):
    """(argv, words the one-line error must contain) for each kind of bad input."""
    store = cli_data["store"]
    train = cli_data["train"]
    kind = request.param
    if kind == "missing folder":
        missing = tmp_path / "no_such_folder"
        return ["predict", missing, "--product", "gear", "--store", store], [str(missing), "no such file or folder"]
    if kind == "empty folder":
        empty = tmp_path / "empty"
        empty.mkdir()
        return ["fit", empty, "--product", "p", "--store", tmp_path / "st", *FLAGS], [str(empty), "no images"]
    if kind == "unknown product":
        return ["predict", train, "--product", "nope", "--store", store], ["'nope'", "unknown product"]
    if kind == "unknown version":
        return ["predict", train, "--product", "gear", "--store", store, "--version", 9], ["'gear'", "no version 9"]
    if kind == "invalid product":
        return ["predict", train, "--product", "../evil", "--store", store], ["'../evil'", "invalid product name"]
    if kind == "bad --set key":
        args = ["fit", train, "--product", "p", "--store", tmp_path / "st", *FLAGS, "--set", "scoring.score_sigm=3"]
        return args, ["score_sigm", "did you mean 'score_sigma'"]
    if kind == "bad --set value":
        args = ["fit", train, "--product", "p", "--store", tmp_path / "st", *FLAGS, "--set", "scoring.alphas=[2,2,2]"]
        return args, ["scoring.alphas"]
    if kind == "--set without =":
        return ["fit", train, "--product", "p", "--store", tmp_path / "st", *FLAGS, "--set", "dtype"], ["KEY=VALUE"]
    if kind == "missing weights file":
        w = tmp_path / "missing.pth"
        args = ["fit", train, "--product", "p", "--store", tmp_path / "st", *FLAGS, "--weights", w]
        return args, [str(w), "not found"]
    if kind == "missing config file":
        c = tmp_path / "missing.yaml"
        return ["fit", train, "--product", "p", "--store", tmp_path / "st", "--config", c], [str(c), "cannot read"]
    if kind == "not mvtec layout":
        return ["evaluate", "--data", train, *FLAGS], [str(train), "MVTec"]
    if kind == "missing mvtec folder":
        d = tmp_path / "nowhere"
        return ["evaluate", "--data", d, *FLAGS], [str(d), "not found"]
    if kind == "s3 store":
        dead = ["--store", "s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9"]
        return ["predict", train, "--product", "gear", *dead], ["s3://bucket/x", "127.0.0.1:9"]
    if kind == "s3 store down":  # credentials given: the listing itself fails, and says so plainly
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
            monkeypatch.setenv(key, value)
        dead = ["--store", "s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9"]
        return ["versions", *dead], ["s3://bucket/x at http://127.0.0.1:9: list failed after retries"]
    if kind == "--wait-s without --grpc":
        return ["predict", train, "--product", "gear", "--store", store, "--wait-s", "5"], ["--wait-s", "--grpc"]
    if kind == "negative --wait-s":
        return ["predict", train, "--product", "gear", "--grpc", "127.0.0.1:9", "--wait-s", "-1"], ["--wait-s", "-1"]
    if kind == "gRPC service down":  # nothing listens there; --wait-s 0: sent once, UNAVAILABLE said
        return ["predict", train, "--product", "gear", "--grpc", "127.0.0.1:9", "--wait-s", "0"], [
            "127.0.0.1:9: UNAVAILABLE"
        ]
    if kind == "--sigmas with --grpc":  # before, ignored without a word
        return ["predict", train, "--product", "gear", "--grpc", "127.0.0.1:9", "--sigmas", "2"], [
            "--sigmas",
            "--threshold",
        ]
    if kind == "--device with --grpc":
        return ["predict", train, "--product", "gear", "--grpc", "127.0.0.1:9", "--device", "cpu"], ["--device"]
    if kind == "same --port and --grpc-port":
        same = ["--port", "8199", "--grpc-port", "8199"]
        return ["serve", "--store", tmp_path / "st", *same], ["--grpc-port 8199", "same port as --port"]
    raise AssertionError(kind)


ERROR_CASES = [
    "missing folder",
    "empty folder",
    "unknown product",
    "unknown version",
    "invalid product",
    "bad --set key",
    "bad --set value",
    "--set without =",
    "missing weights file",
    "missing config file",
    "not mvtec layout",
    "missing mvtec folder",
    "s3 store",
    "s3 store down",
    "--wait-s without --grpc",
    "negative --wait-s",
    "gRPC service down",
    "--sigmas with --grpc",
    "--device with --grpc",
    "same --port and --grpc-port",
]


@pytest.mark.parametrize("error_case", ERROR_CASES, indirect=True)
def test_cli_bad_inputs_give_one_line_errors(capsys, error_case):
    argv, words = error_case
    code, _, err = run(capsys, *argv)
    check_error(code, err, 2, *words)


def test_cli_evaluate_writes_metrics(capsys, tmp_path):
    data = write_mvtec_layout(tmp_path / "gear", n_train=4, n_test_good=2, n_test_per_defect=1, seed=1, size=SIZE)
    js = tmp_path / "out" / "eval.json"
    code, out, err = run(capsys, "evaluate", "--data", data, "--json", js, *FLAGS)
    assert code == 0, err
    result = json.loads(js.read_text())
    for key in ("image_auroc", "pixel_auroc", "pro"):
        assert 0.0 <= result[key] <= 100.0, (key, result[key])
    assert result["images_per_s"] > 0
    assert result["n_train"] == 4 and result["n_test"] == 2 + len(DEFECT_KINDS)
    assert result["backbone"] == "resnet18" and result["weights"] == "random:seed=0"
    assert math.isfinite(result["threshold"])
    assert (
        result["true_positives"] + result["false_positives"] + result["true_negatives"] + result["false_negatives"]
        == result["n_test"]
    )
    assert "image AUROC" in out


def test_cli_subprocess_exit_codes_and_messages(cli_data, bad_images, tmp_path):
    """The installed entry point (or ``python -m hetmm_ray.cli``) in a fresh process."""
    script = Path(sys.executable).with_name("hetmm")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hetmm_ray.cli"]
    good = cli_data["test"] / "hole.png"
    js = tmp_path / "r.json"
    proc = subprocess.run(
        [
            *cmd,
            "predict",
            str(good),
            str(bad_images["truncated"]),
            "--product",
            "gear",
            "--store",
            str(cli_data["store"]),
            "--json",
            str(js),
        ],
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    # Bytes, decoded by hand: text mode would turn tqdm's carriage returns into newlines.
    stderr, stdout = proc.stderr.decode(), proc.stdout.decode()
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    lines = visible_lines(stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"hetmm: skipped: {bad_images['truncated']}:")
    assert "truncated or corrupt" in lines[0]
    (rec,) = json.loads(js.read_text())
    assert rec["image"] == str(good)
    assert str(good) in stdout
