"""Aligned template mutual matching (ALGORITHM.md §3).

Both directions look at the same (query pixel, template pixel) pairs, so they
share one product. For every template pixel ``y`` the query window around it is
unfolded (``B*p*p`` vectors of ``C`` channels) and multiplied by the ``K``
template vectors at ``y``: one batched matmul over pixels,
``S[y, b, d, k] = <Q[b, y + d], T[k, y]>``. Reducing over ``k`` leaves
``M[y, b, d]``; backward ATM at ``y`` is the max over ``d``, forward ATM at
``x`` is the max over ``d`` of ``M[x - d, b, d]``. Offsets that leave the map
are masked to ``-inf``, never scored as zero similarity. Pixels are processed
in row chunks so the ``S`` block stays within a memory budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "anomaly_maps",
    "atm_pair",
    "backward_atm",
    "default_chunk_bytes",
    "forward_atm",
    "fuse_layer_maps",
    "pixel_major",
    "window_max_similarity",
]


def default_chunk_bytes(device: torch.device) -> int:
    """Working-block size: cache-sized on CPU (the matmul output is reduced while still in
    cache: ~2x faster than large blocks), large on GPUs (fewer, bigger kernels)."""
    return 256 * 2**20 if device.type == "cuda" else 4 * 2**20


def pixel_major(templates: Tensor) -> Tensor:
    """(K, C, H, W) templates -> (H*W, K, C), the layout the matmul wants.

    Done once per template version, not per query.
    """
    k, c, h, w = templates.shape
    return templates.permute(2, 3, 0, 1).reshape(h * w, k, c).contiguous()


def _check(query: Tensor, t_pm: Tensor, hw: tuple[int, int], window: int) -> None:
    if query.dim() != 4:
        raise ValueError(f"query must be (B, C, H, W), got shape {tuple(query.shape)}")
    h, w = hw
    if t_pm.shape[0] != h * w or t_pm.shape[2] != query.shape[1]:
        raise ValueError(
            f"templates do not match the query: query {tuple(query.shape)}, templates (H*W, K, C) = {tuple(t_pm.shape)}"
        )
    if window < 1 or window % 2 == 0:
        raise ValueError(f"window sizes must be odd and >= 1, got {window}")


def window_max_similarity(
    query: Tensor,
    t_pm: Tensor,
    window: int,
    *,
    chunk_bytes: int | None = None,
) -> Tensor:
    """``M[b, d, y] = max_k <Q[b, y + d], T[k, y]>`` over a ``window``-square of offsets.

    ``query`` (B, C, H, W); ``t_pm`` (H*W, K, C) from :func:`pixel_major`.
    Returns (B, window*window, H, W), ``-inf`` where ``y + d`` is off the map.
    ``chunk_bytes`` bounds both the unfolded query windows of a row slab and the
    similarity block of one matmul (default :func:`default_chunk_bytes`).
    """
    b, c, h, w = query.shape
    _check(query, t_pm, (h, w), window)
    k = t_pm.shape[1]
    p, r = window, window // 2
    pp = p * p
    chunk = chunk_bytes or default_chunk_bytes(query.device)
    elsize = query.element_size()
    rows = max(1, min(h, chunk // (w * c * b * pp * elsize)))
    group = max(1, chunk // (b * pp * k * elsize))
    # Zero padding only keeps the unfold rectangular; those entries are masked below.
    padded = F.pad(query, (r, r, r, r))

    ys = torch.arange(h, device=query.device)
    xs = torch.arange(w, device=query.device)
    ds = torch.arange(-r, r + 1, device=query.device)
    col_ok = (xs[:, None] + ds[None, :] >= 0) & (xs[:, None] + ds[None, :] < w)  # (W, p) over dx

    out = torch.empty(h, w, b, pp, dtype=query.dtype, device=query.device)
    for y0 in range(0, h, rows):
        y1 = min(h, y0 + rows)
        n = y1 - y0
        # (B, C, n, W, p, p) view -> (n*W, C, B*p*p) copy: the query windows of each pixel,
        # a few rows at a time so the copy is still in cache when the matmul reads it.
        win = padded[:, :, y0 : y1 + 2 * r].unfold(2, p, 1).unfold(3, p, 1)
        win = win.permute(2, 3, 1, 0, 4, 5).reshape(n * w, c, b * pp)
        best = out[y0:y1].view(n * w, b * pp)
        t_slab = t_pm[y0 * w : y1 * w]
        for i in range(0, n * w, group):
            # (G, K, C) @ (G, C, B*p*p): the max over K then runs along contiguous rows.
            torch.amax(torch.bmm(t_slab[i : i + group], win[i : i + group]), dim=1, out=best[i : i + group])
        row_ok = (ys[y0:y1, None] + ds[None, :] >= 0) & (ys[y0:y1, None] + ds[None, :] < h)  # (n, p) over dy
        ok = row_ok[:, None, None, :, None] & col_ok[None, :, None, None, :]
        out[y0:y1].view(n, w, b, p, p).masked_fill_(~ok, float("-inf"))
    return out.permute(2, 3, 0, 1)


def _central(m: Tensor, window: int, sub: int) -> Tensor:
    """Restrict (B, p*p, H, W) offsets to the central ``sub`` x ``sub`` square."""
    if sub == window:
        return m
    b, _, h, w = m.shape
    cut = (window - sub) // 2
    m = m.view(b, window, window, h, w)[:, cut : cut + sub, cut : cut + sub]
    return m.reshape(b, sub * sub, h, w)


def _backward_from(m: Tensor) -> Tensor:
    return 1 - m.amax(dim=1)


def _forward_from(m: Tensor, window: int) -> Tensor:
    """``F[b, x] = 1 - max_d M[b, d, x - d]``: a shifted max over offsets."""
    b, _, h, w = m.shape
    r = window // 2
    mp = F.pad(m, (r, r, r, r), value=float("-inf")).view(b, window, window, h + 2 * r, w + 2 * r)
    best = torch.full((b, h, w), float("-inf"), dtype=m.dtype, device=m.device)
    for i in range(window):  # offset dy = i - r reads row x - dy
        for j in range(window):
            torch.maximum(best, mp[:, i, j, 2 * r - i : 2 * r - i + h, 2 * r - j : 2 * r - j + w], out=best)
    return 1 - best


def atm_pair(
    query: Tensor,
    t_pm: Tensor,
    forward_window: int,
    backward_window: int,
    *,
    chunk_bytes: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Forward and backward ATM from one shared product. Returns two (B, H, W)."""
    p = max(forward_window, backward_window)
    if forward_window % 2 == 0 or backward_window % 2 == 0:
        raise ValueError(f"window sizes must be odd, got {forward_window} and {backward_window}")
    m = window_max_similarity(query, t_pm, p, chunk_bytes=chunk_bytes)
    fwd = _forward_from(_central(m, p, forward_window), forward_window)
    bwd = _backward_from(_central(m, p, backward_window))
    return fwd, bwd


def forward_atm(query: Tensor, templates: Tensor, patch: int, *, chunk_bytes: int | None = None) -> Tensor:
    """``1 - max_{k, d} <Q[b, x], T[k, x + d]>`` for every query pixel ``x``: (B, H, W)."""
    m = window_max_similarity(query, pixel_major(templates), patch, chunk_bytes=chunk_bytes)
    return _forward_from(m, patch)


def backward_atm(query: Tensor, templates: Tensor, patch: int, *, chunk_bytes: int | None = None) -> Tensor:
    """``1 - max_{k, d} <Q[b, y + d], T[k, y]>`` for every template pixel ``y``: (B, H, W)."""
    return _backward_from(window_max_similarity(query, pixel_major(templates), patch, chunk_bytes=chunk_bytes))


def fuse_layer_maps(
    layer_maps: Sequence[Tensor],
    weights: Sequence[float],
    size: int | tuple[int, int],
) -> Tensor:
    """``S = sum_j w_j * up(S_j)``: bilinear, ``align_corners=True``, in float32. (B, H, W)."""
    total: Tensor | None = None
    for s, wj in zip(layer_maps, weights, strict=True):
        up = F.interpolate(s[:, None].float(), size=size, mode="bilinear", align_corners=True)[:, 0]
        total = up * wj if total is None else total + up * wj
    assert total is not None
    return total


def anomaly_maps(
    query: Mapping[str, Tensor],
    templates_pm: Mapping[str, Tensor],
    forward_windows: Sequence[int],
    backward_windows: Sequence[int],
    alphas: Sequence[float],
    weights: Sequence[float],
    size: int | tuple[int, int],
    *,
    chunk_bytes: int | None = None,
) -> Tensor:
    """Per-layer ``alpha*F + (1-alpha)*Bw``, upsampled and summed: (B, size, size) float32."""
    layers = []
    for j, name in enumerate(query):
        fwd, bwd = atm_pair(
            query[name], templates_pm[name], forward_windows[j], backward_windows[j], chunk_bytes=chunk_bytes
        )
        layers.append(alphas[j] * fwd + (1 - alphas[j]) * bwd)
    return fuse_layer_maps(layers, weights, size)
