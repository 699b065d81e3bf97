"""ATMM against a slow, literal implementation of docs/algorithm.md §3."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from reference_impls import window_max_similarity

from hetmm_ray.core.atmm import (
    anomaly_maps,
    atm_pair,
    backward_atm,
    content_window,
    forward_atm,
    fuse_layer_maps,
    pixel_major,
)
from hetmm_ray.core.geometry import Box, cell_boxes, replicate_into_padding, zero_padding


def naive_forward(q: torch.Tensor, t: torch.Tensor, p: int) -> torch.Tensor:
    b, _, h, w = q.shape
    r = p // 2
    out = torch.empty(b, h, w, dtype=torch.float64)
    for bi, x, y in itertools.product(range(b), range(h), range(w)):
        best = -float("inf")
        for dx, dy in itertools.product(range(-r, r + 1), repeat=2):
            if 0 <= x + dx < h and 0 <= y + dy < w:
                best = max(best, float((t[:, :, x + dx, y + dy] @ q[bi, :, x, y]).max()))
        out[bi, x, y] = 1 - best
    return out


def naive_backward(q: torch.Tensor, t: torch.Tensor, p: int) -> torch.Tensor:
    b, _, h, w = q.shape
    r = p // 2
    out = torch.empty(b, h, w, dtype=torch.float64)
    for bi, x, y in itertools.product(range(b), range(h), range(w)):
        best = -float("inf")
        for dx, dy in itertools.product(range(-r, r + 1), repeat=2):
            if 0 <= x + dx < h and 0 <= y + dy < w:
                best = max(best, float((t[:, :, x, y] @ q[bi, :, x + dx, y + dy]).max()))
        out[bi, x, y] = 1 - best
    return out


def unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=1)


CASES = [
    # (B, K, C, H, W, window)
    (2, 3, 5, 7, 7, 3),
    (1, 1, 4, 6, 6, 5),  # even map, K = 1, B = 1
    (3, 4, 6, 5, 8, 1),  # non-square, window 1
    (2, 2, 3, 4, 9, 7),  # window wider than the map height
    (1, 5, 8, 3, 3, 11),  # window larger than the whole map
    (2, 6, 16, 9, 4, 9),
]


@pytest.mark.parametrize(("b", "k", "c", "h", "w", "p"), CASES)
def test_forward_and_backward_equal_naive(b: int, k: int, c: int, h: int, w: int, p: int) -> None:
    q = unit(b, c, h, w, seed=1)
    t = unit(k, c, h, w, seed=2)
    ref_f = naive_forward(q, t, p)
    ref_b = naive_backward(q, t, p)
    got_f = forward_atm(q.float(), t.float(), p)
    got_b = backward_atm(q.float(), t.float(), p)
    assert got_f.shape == (b, h, w) and got_f.dtype == torch.float32
    torch.testing.assert_close(got_f.double(), ref_f, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_b.double(), ref_b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_bytes", [1, 4096, 1 << 30])
def test_chunking_does_not_change_results(chunk_bytes: int) -> None:
    q = unit(2, 8, 9, 7, seed=3).float()
    t = unit(5, 8, 9, 7, seed=4).float()
    ref = naive_forward(q.double(), t.double(), 5)
    got = forward_atm(q, t, 5, chunk_bytes=chunk_bytes)
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("pf", "pb"), [(5, 3), (3, 7), (1, 5), (7, 7)])
def test_pair_with_different_windows(pf: int, pb: int) -> None:
    q = unit(2, 6, 8, 6, seed=5)
    t = unit(4, 6, 8, 6, seed=6)
    fwd, bwd = atm_pair(q.float(), pixel_major(t.float()), pf, pb)
    torch.testing.assert_close(fwd.double(), naive_forward(q, t, pf), atol=1e-5, rtol=0)
    torch.testing.assert_close(bwd.double(), naive_backward(q, t, pb), atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 5000, 20000, 1 << 30])
@pytest.mark.parametrize(("h", "w", "pf", "pb"), [(9, 7, 5, 3), (4, 11, 3, 9), (3, 3, 7, 5)])
def test_pair_chunking_and_borders(chunk_bytes: int, h: int, w: int, pf: int, pb: int) -> None:
    # chunk sizes that make matmul groups of one pixel, groups that span rows, several row
    # slabs (the last one shorter), one slab; windows reaching past the map; wide maps
    q = unit(3, 5, h, w, seed=11)
    t = unit(4, 5, h, w, seed=12)
    fwd, bwd = atm_pair(q.float(), pixel_major(t.float()), pf, pb, chunk_bytes=chunk_bytes)
    torch.testing.assert_close(fwd.double(), naive_forward(q, t, pf), atol=1e-5, rtol=0)
    torch.testing.assert_close(bwd.double(), naive_backward(q, t, pb), atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_bytes", [1, None])
def test_window_max_similarity_layout(chunk_bytes: int | None) -> None:
    b, k, c, h, w, p = 2, 3, 4, 5, 6, 3
    q = unit(b, c, h, w, seed=13)
    t = unit(k, c, h, w, seed=14)
    got = window_max_similarity(q.float(), pixel_major(t.float()), p, chunk_bytes=chunk_bytes)
    assert got.shape == (b, p * p, h, w)
    r = p // 2
    for bi, y, x, dy, dx in itertools.product(range(b), range(h), range(w), range(-r, r + 1), range(-r, r + 1)):
        d = (dy + r) * p + (dx + r)  # row offset major
        if 0 <= y + dy < h and 0 <= x + dx < w:
            ref = float((t[:, :, y, x] @ q[bi, :, y + dy, x + dx]).max())
            assert abs(float(got[bi, d, y, x]) - ref) < 1e-5
        else:
            assert got[bi, d, y, x] == float("-inf")


def test_border_is_skipped_not_zero_padded() -> None:
    # All similarities are negative: a zero-padded border would win the max and give 1.0.
    c, h, w = 4, 5, 5
    q = torch.zeros(1, c, h, w)
    q[:, 0] = 1.0
    t = torch.zeros(1, c, h, w)
    t[:, 0] = -1.0
    assert torch.allclose(forward_atm(q, t, 5), torch.full((1, h, w), 2.0))
    assert torch.allclose(backward_atm(q, t, 5), torch.full((1, h, w), 2.0))


def test_identical_query_scores_zero() -> None:
    t = unit(3, 8, 6, 6, seed=7).float()
    q = t[1:2].clone()
    assert forward_atm(q, t, 3).abs().max() < 1e-6
    assert backward_atm(q, t, 3).abs().max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_close_to_fp32(dtype: torch.dtype) -> None:
    q = unit(2, 32, 8, 8, seed=8).float()
    t = unit(6, 32, 8, 8, seed=9).float()
    ref = forward_atm(q, t, 5)
    got = forward_atm(q.to(dtype), t.to(dtype), 5)
    assert got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=0)


def test_even_window_rejected() -> None:
    q = unit(1, 4, 5, 5, seed=1).float()
    with pytest.raises(ValueError, match="odd"):
        forward_atm(q, q, 4)


def test_anomaly_maps_equal_naive_merge() -> None:
    sizes = {"a": (8, 8), "b": (4, 4)}
    q = {n: unit(2, 6, *hw, seed=i).float() for i, (n, hw) in enumerate(sizes.items())}
    t = {n: unit(3, 6, *hw, seed=10 + i).float() for i, (n, hw) in enumerate(sizes.items())}
    fw, bw, alphas, weights = (5, 3), (3, 3), (0.3, 0.7), (1.0, 0.5)
    got = anomaly_maps(q, {n: pixel_major(v) for n, v in t.items()}, fw, bw, alphas, weights, 16)
    expected = torch.zeros(2, 16, 16, dtype=torch.float64)
    for j, n in enumerate(sizes):
        s = alphas[j] * naive_forward(q[n].double(), t[n].double(), fw[j])
        s = s + (1 - alphas[j]) * naive_backward(q[n].double(), t[n].double(), bw[j])
        expected += weights[j] * F.interpolate(s[:, None], size=16, mode="bilinear", align_corners=True)[:, 0]
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "boxes",
    [
        [Box(0, 10, 32, 12), Box(0, 10, 32, 12)],  # a tall frame's strip, the same in every image
        [Box(0, 10, 32, 12), Box(4, 6, 24, 10)],  # two shapes in one batch: the window holds both
        [Box(12, 0, 8, 32), Box(13, 0, 6, 32)],  # a wide strip, windows that reach the layer's edge
    ],
)
def test_letterboxed_maps_on_the_content_window_equal_the_whole_layer(boxes: list[Box]) -> None:
    # Only the content window (plus the widest window's radius) is matched; the whole layer,
    # matched literally and its pad replicated, must give the same maps at every pixel.
    canvas, sizes = 32, {"a": (16, 16), "b": (8, 8)}
    q = zero_padding({n: unit(2, 6, *hw, seed=i).float() for i, (n, hw) in enumerate(sizes.items())}, boxes, canvas)
    t_boxes = [boxes[0], boxes[-1], boxes[0]]
    t = zero_padding(
        {n: unit(3, 6, *hw, seed=9 + i).float() for i, (n, hw) in enumerate(sizes.items())}, t_boxes, canvas
    )
    fw, bw, alphas, weights = (5, 3), (3, 3), (0.3, 0.7), (1.0, 0.5)
    assert all(content_window(cell_boxes(boxes, canvas, hw), hw, 2) is not None for hw in sizes.values())
    got = anomaly_maps(
        q, {n: pixel_major(v) for n, v in t.items()}, fw, bw, alphas, weights, canvas, boxes=boxes, canvas=canvas
    )
    layers = []
    for j, (n, hw) in enumerate(sizes.items()):
        s = alphas[j] * naive_forward(q[n].double(), t[n].double(), fw[j])
        s = s + (1 - alphas[j]) * naive_backward(q[n].double(), t[n].double(), bw[j])
        layers.append(replicate_into_padding(s.float(), cell_boxes(boxes, canvas, hw)))
    torch.testing.assert_close(got, fuse_layer_maps(layers, weights, canvas), atol=1e-5, rtol=0)


def test_the_content_window_is_none_for_a_full_layer() -> None:
    assert content_window([Box(0, 0, 8, 8)], (8, 8), 2) is None
    assert content_window([Box(1, 1, 6, 6)], (8, 8), 1) is None  # the margin reaches every edge
    assert content_window([Box(1, 2, 3, 2)], (8, 8), 1) == ((0, 5), (1, 5))


def test_fuse_corners_keep_values() -> None:
    s = torch.arange(4.0).view(1, 2, 2)
    up = fuse_layer_maps([s], [2.0], 5)
    assert up[0, 0, 0] == 0 and up[0, -1, -1] == 6.0 and up[0, 0, -1] == 2.0


@pytest.mark.parametrize(
    ("sizes", "out"),
    [
        (((64, 64), (32, 32), (16, 16)), 256),  # the mobilenet_v2 taps at 256x256
        (((8, 8), (4, 4)), 16),
        (((5, 7), (3, 2), (1, 1)), (9, 4)),
        (((6, 6),), 1),
        (((4, 3),), (4, 3)),
    ],
)
def test_fuse_equals_interpolate(sizes: tuple[tuple[int, int], ...], out: int | tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(15)
    maps = [torch.rand(2, *hw, generator=g, dtype=torch.float64) for hw in sizes]
    weights = [1.0, 0.5, 0.3][: len(maps)]
    expected = sum(
        wj * F.interpolate(s[:, None], size=out, mode="bilinear", align_corners=True)[:, 0]
        for s, wj in zip(maps, weights, strict=True)
    )
    got = fuse_layer_maps([m.float() for m in maps], weights, out)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=0)
