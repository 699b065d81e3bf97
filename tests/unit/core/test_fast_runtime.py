"""The CPU fast path's two runtimes equal the plain ones.

- OpenVINO's backbone (core/openvino_runtime.py) gives torch's features to 1e-5 (relative), for
  torchvision and timm networks, pre-ReLU residual taps, any batch size and canvas shape;
- its converted models are cached on disk and a damaged cache entry is converted again;
- libpng's PNG pixels (data/decode.py fast path) are Pillow's, byte for byte, and every input
  it does not take goes to Pillow unchanged.

On real data (bottle, battery_weld) the fast path changes no verdict:
tests/unit/test_throughput.py::test_fast_paths_change_no_verdict.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, SHARED, randomise_bn
from PIL import Image

import hetmm_ray.core.openvino_runtime as ovr
import hetmm_ray.data.decode as decode
from hetmm_ray.config import MODEL_CACHE_ENV, BackboneConfig, ConfigError, DetectorConfig
from hetmm_ray.core.backbone import Backbone, resolve_runtime
from hetmm_ray.data.decode import ImageError, decode_image

pytestmark = pytest.mark.skipif(not ovr.openvino_available(), reason="the openvino package is not installed")


@pytest.fixture
def model_cache(tmp_path, monkeypatch) -> Path:
    """A fresh disk cache and an empty in-process cache (each test converts what it uses)."""
    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path))
    ovr._compiled.clear()
    return tmp_path / "openvino"


def _pair(name: str) -> tuple[Backbone, Backbone]:
    """The same network (non-trivial BN statistics, then folded) run by OpenVINO and by torch."""
    fast = Backbone(BackboneConfig(name=name, weights="random"), runtime="openvino")
    plain = Backbone(BackboneConfig(name=name, weights="random"), runtime="torch")
    assert (fast.runtime, plain.runtime) == ("openvino", "torch")
    return fast, plain


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18", "efficientnet_lite0"])
def test_openvino_features_equal_torch(name: str, model_cache: Path) -> None:
    fast, plain = _pair(name)
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 3, 64, 64), (3, 3, 64, 64), (2, 3, 96, 128)]:  # dynamic batch; another canvas
        x = torch.rand(*shape, generator=g)
        a, b = fast(x), plain(x)
        assert a.keys() == b.keys()
        for tap in a:
            assert a[tap].shape == b[tap].shape
            rel = float((a[tap] - b[tap]).abs().max() / b[tap].abs().max())
            assert rel < 1e-5, f"{name} {tap} {shape}: OpenVINO differs from torch by {rel:.2e}"
    assert len(list(model_cache.glob("*.xml"))) == 2  # one converted model per canvas shape


def test_openvino_with_batch_norm_statistics_equals_the_unfolded_torch_network(model_cache: Path) -> None:
    """Folding then converting a network with real BN statistics: still torch's features."""
    config = BackboneConfig(name="mobilenet_v2", weights="random", seed=3)
    plain = Backbone(config, fold_bn=False, runtime="torch")
    randomise_bn(plain.extractor)
    fast = Backbone(config, fold_bn=False, runtime="openvino")
    fast.extractor.load_state_dict(plain.extractor.state_dict())
    # the BN statistics are no longer the seed's: a new identity, so no cached graph is reused
    fast._openvino.identity = ("randomised BN", 3)  # type: ignore[union-attr]
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    a, b = fast(x), plain(x)
    for tap in a:
        assert float((a[tap] - b[tap]).abs().max() / b[tap].abs().max()) < 1e-5


def test_converted_models_are_cached_on_disk_and_a_damaged_entry_is_converted_again(model_cache: Path) -> None:
    x = torch.rand(1, 3, 64, 64)
    fast, plain = _pair("resnet18")
    want = plain(x)
    fast(x)
    (xml,) = model_cache.glob("*.xml")
    assert xml.with_suffix(".bin").stat().st_size > 1_000_000  # the weights, stored as float32
    assert not list(model_cache.glob("*.tmp.*")), "temporary files left behind"
    stamp = xml.stat().st_mtime_ns
    ovr._compiled.clear()
    fresh = Backbone(BackboneConfig(name="resnet18", weights="random"), runtime="openvino")
    fresh(x)
    assert xml.stat().st_mtime_ns == stamp, "a cached model was converted again"
    xml.write_text("<not a model")
    ovr._compiled.clear()
    again = Backbone(BackboneConfig(name="resnet18", weights="random"), runtime="openvino")
    got = again(x)
    assert xml.stat().st_mtime_ns != stamp
    for tap in got:
        assert torch.allclose(got[tap], want[tap], atol=1e-5)


def test_runtime_choice() -> None:
    assert resolve_runtime("auto", "cpu", "float32") == "openvino"
    assert resolve_runtime("auto", "cpu", "bfloat16") == "torch"
    assert resolve_runtime("auto", "cuda", "float32") == "torch"
    assert resolve_runtime("torch", "cpu", "float32") == "torch"
    with pytest.raises(ValueError, match="float32 on a CPU only"):
        resolve_runtime("openvino", "cpu", "bfloat16")
    with pytest.raises(ValueError, match="choose auto, torch or openvino"):
        resolve_runtime("onnx", "cpu", "float32")
    with pytest.raises(ConfigError, match="did you mean 'openvino'"):
        DetectorConfig(backbone_runtime="openvin")
    # a run-time setting: never stored with a product
    assert "backbone_runtime" not in DetectorConfig(backbone_runtime="torch").stored_dict()
    assert Backbone(BackboneConfig(name="resnet18", weights="random", precision="bfloat16")).runtime == "torch"


# --- PNG decoding: libpng's pixels are Pillow's --------------------------------------------------
def _pil_pixels(raw: bytes, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(decode, "_png_decode", None)
        return decode_image(raw)


def _png(array: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG", **save)
    return buf.getvalue()


def _with_chunk(raw: bytes, kind: bytes, data: bytes) -> bytes:
    """``raw`` with one more chunk right after IHDR (33 bytes in)."""
    chunk = len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    return raw[:33] + chunk + raw[33:]


def test_fast_png_pixels_are_pillows(monkeypatch) -> None:
    pytest.importorskip("imagecodecs")
    rng = np.random.default_rng(0)
    smooth = np.linspace(0, 255, 97 * 131 * 3).reshape(97, 131, 3).astype(np.uint8)
    noisy = rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)
    taken = [
        _png(smooth),
        _png(noisy, compress_level=1),
        _png(noisy, optimize=True),
        _with_chunk(_png(smooth), b"gAMA", (45455).to_bytes(4, "big")),  # gamma is not applied by either
        _png(rng.integers(0, 256, (9, 8, 3), dtype=np.uint8)),
    ]
    for raw in taken:
        assert decode._fast_png_rgb(raw) is not None, "expected the fast path to take this PNG"
        assert np.array_equal(decode_image(raw), _pil_pixels(raw, monkeypatch))
    left = [
        _png(smooth[..., 0]),  # grayscale
        _png(np.dstack([smooth, smooth[..., :1]])),  # RGBA: composited onto black by Pillow's path
        _png(smooth, transparency=(1, 2, 3)),  # RGB + tRNS
        _png((smooth.astype(np.uint16) * 257)[..., 0]),  # 16-bit
    ]
    for raw in left:
        assert decode._fast_png_rgb(raw) is None
        assert np.array_equal(decode_image(raw), _pil_pixels(raw, monkeypatch))
    # damaged data: whichever decoder sees it, one ImageError
    broken = bytearray(taken[1])
    broken[200:260] = bytes(60)
    with pytest.raises(ImageError, match="corrupt"):
        decode_image(bytes(broken))
    with pytest.raises(ImageError):
        decode_image(taken[0][: len(taken[0]) // 2])


@pytest.mark.shared
def test_fast_png_pixels_are_pillows_on_real_images(monkeypatch) -> None:
    pytest.importorskip("imagecodecs")
    files = sorted((SHARED / "data").rglob("*.png"))[::40]
    if not files:
        pytest.skip(f"needs the real data in {SHARED} (absent here)")
    fast_taken = 0
    for path in files:
        raw = path.read_bytes()
        fast_taken += decode._fast_png_rgb(raw) is not None
        assert np.array_equal(decode_image(raw), _pil_pixels(raw, monkeypatch)), path
    assert fast_taken > 0


def test_a_process_forked_with_python_to_run_never_destroys_openvino_objects(model_cache: Path) -> None:
    """Ray starts its processes with ``subprocess`` + ``preexec_fn``: the child deletes every other
    thread's locals, and an OpenVINO object destroyed there waits forever for executor threads the
    child does not have (ray.init hung in the suite). In a fresh interpreter: infer requests made by
    live worker threads whose compiled model is gone from the cache, then such a fork. It must
    finish (with the requests in thread-local storage it hangs: the outer timeout catches it)."""
    import os
    import subprocess
    import sys

    script = """
import subprocess, sys, torch
from hetmm_ray.config import BackboneConfig
from hetmm_ray.core.backbone import Backbone
import hetmm_ray.core.openvino_runtime as ovr
from hetmm_ray.detection.pipeline import map_in_workers
fast = Backbone(BackboneConfig(name="resnet18", weights="random"), runtime="openvino")
map_in_workers(lambda x: fast(x), [torch.rand(1, 3, 64, 64) for _ in range(4)], 2)
ovr._compiled.clear()  # the workers' requests are the last users of their models
done = subprocess.run([sys.executable, "-c", "print('ok')"], preexec_fn=lambda: None, capture_output=True)
print(done.stdout.decode().strip())
"""
    root = REPO
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


# --- exit: no OpenVINO inference outlives the runtime -----------------------------------
EXIT_WITH_A_THREAD_INFERRING = """
import threading
import torch
from hetmm_ray.config import BackboneConfig
from hetmm_ray.core.backbone import Backbone

bb = Backbone(BackboneConfig(name="resnet18", weights="random", image_size=32), runtime="openvino")
x = torch.rand(2, 3, 32, 32)
bb(x)
started = threading.Event()


def scoring():  # a daemon thread still scoring when the process exits
    while True:
        bb(x)
        started.set()


threading.Thread(target=scoring, daemon=True).start()
started.wait()
print("exiting", flush=True)
"""


def test_a_process_exits_cleanly_while_a_thread_still_infers(model_cache: Path) -> None:
    """Before the exit hook (openvino_runtime.release_compiled_models) such a process ended with
    "terminate called without an active exception" (SIGABRT) every time."""
    import os
    import subprocess
    import sys

    for _ in range(2):  # the fixture's cache (in the environment): converted once, by the first run
        out = subprocess.run(
            [sys.executable, "-c", EXIT_WITH_A_THREAD_INFERRING],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and "exiting" in out.stdout, (out.returncode, out.stderr[-2000:])


def test_inference_is_refused_once_the_models_are_released(model_cache: Path, monkeypatch) -> None:
    fast, _ = _pair("resnet18")
    x = torch.rand(1, 3, 32, 32)
    fast(x)
    monkeypatch.setattr(ovr, "_released", False)  # restored after the test: this process goes on inferring
    ovr.release_compiled_models(wait_s=1.0)
    assert not ovr._compiled and not ovr._requests
    with pytest.raises(RuntimeError, match="the process is exiting"):
        fast(x)


def test_another_thread_asking_to_infer_at_exit_is_parked_not_ended(model_cache: Path, monkeypatch) -> None:
    """The exit hook returns only once a thread still inferring has come back and been parked: a
    thread that ran on into torch code while the interpreter finalizes is ended by CPython inside a
    C++ frame (std::terminate); one blocked on a lock is not."""
    import threading

    fast, _ = _pair("resnet18")
    x = torch.rand(1, 3, 32, 32)
    fast(x)
    for name, value in (("_released", False), ("_users", set()), ("_parked", set())):
        monkeypatch.setattr(ovr, name, value)  # restored after the test: this process goes on inferring
    looping = threading.Event()

    def scoring() -> None:
        while True:
            fast(x)
            looping.set()

    thread = threading.Thread(target=scoring, daemon=True)  # stays parked for the rest of the process
    thread.start()
    assert looping.wait(120)
    ovr.release_compiled_models(wait_s=120.0)
    assert thread.ident in ovr._parked
    assert thread.is_alive()  # parked: not ended by an error, and never inferring again
    assert not ovr._compiled and not ovr._requests
