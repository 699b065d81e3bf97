"""Aligned template mutual matching (docs/algorithm.md §3).

Both directions look at the same (query pixel, template pixel) pairs, so they
share one product. For every template pixel ``y`` the ``B*p*p`` query vectors
of the window around it are multiplied by the ``K`` template vectors at ``y``:
one batched matmul over pixels, ``S[y, k, d, b] = <Q[b, y + d], T[k, y]>``.
Reducing over ``k`` leaves ``M[d, y, b]``; backward ATM at ``y`` is the max over
``d``, forward ATM at ``x`` is the max over ``d`` of ``M[d, x - d, b]``. Offsets
that leave the map are ``-inf``, never scored as zero similarity.

The query windows are not unfolded ``p*p``-fold. The query is stored
``(C, pixels, p, B)``: unfolded along rows only, batch innermost. Then the
window of template pixel ``u``, ordered ``(dx, dy, b)``, is one contiguous run
of ``p*p*B`` values, and the windows of consecutive pixels start ``p*B``
apart: an overlapping strided view that the matmul reads in place. That keeps
the per-query work (the copy, ``p`` times the query) small next to the matmul,
so the ATMM time scales with ``K`` (PTS sheets pay off).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from .geometry import Box, cell_boxes, replicate_into_padding

__all__ = [
    "anomaly_maps",
    "atm_pair",
    "backward_atm",
    "content_window",
    "default_chunk_bytes",
    "forward_atm",
    "fuse_layer_maps",
    "pixel_major",
]


def default_chunk_bytes(device: torch.device) -> int:
    """Working-block size: cache-sized on CPU (the matmul output is reduced while still in
    cache, which beats large blocks), large on GPUs (fewer, bigger kernels)."""
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


_SCRATCH = threading.local()
_SCRATCH_MAX_BYTES = 256 * 2**20


def _scratch(numel: int, like: Tensor) -> Tensor:
    """A flat working buffer of ``numel`` elements, kept per thread and reused on the CPU.

    Freshly allocated multi-MiB tensors cost a page fault per 4 KiB page on every call
    (the allocator returns big blocks to the OS on free), system time that grows with the
    sheets. Per thread, so concurrent callers never share one. CUDA has its own
    caching allocator. Whatever a caller returns must not be a view of it.
    """
    if like.device.type != "cpu" or numel * like.element_size() > _SCRATCH_MAX_BYTES:
        return torch.empty(numel, dtype=like.dtype, device=like.device)
    bufs: dict[torch.dtype, Tensor] = _SCRATCH.__dict__.setdefault("bufs", {})
    buf = bufs.get(like.dtype)
    if buf is None or buf.numel() < numel:
        buf = bufs[like.dtype] = torch.empty(numel, dtype=like.dtype)
    return buf[:numel]


def _carve(flat: Tensor, *shapes: tuple[int, ...]) -> list[Tensor]:
    """Consecutive contiguous views of ``flat``, each starting 64-byte aligned (16 elements)."""
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[at : at + n].view(shape))
        at += -(-n // 16) * 16
    return out


def _carve_size(*shapes: tuple[int, ...]) -> int:
    return sum(-(-math.prod(s) // 16) * 16 for s in shapes)


def _window_max(query: Tensor, t_pm: Tensor, window: int, chunk_bytes: int | None) -> Tensor:
    """``M[dx, dy, y, x, b] = max_k <Q[b, y + dy, x + dx], T[k, y, x]>``, offsets ``-r .. r``
    (column offset first), ``-inf`` where the query pixel is off the map.

    Stored as (p, p, pad + H*W + pad, B) with pixels numbered row by row and ``pad = r*W + r``
    entries of ``-inf`` before and after each offset's plane (see :func:`_forward_from`);
    :func:`_interior` gives the (p, p, H, W, B) view. The result lives in this thread's
    scratch buffer: use it before the next call.
    """
    b, c, h, w = query.shape
    _check(query, t_pm, (h, w), window)
    k = t_pm.shape[1]
    p, r = window, window // 2
    pp, pb, ppb = p * p, p * b, p * p * b
    pad = r * w + r
    chunk = chunk_bytes or default_chunk_bytes(query.device)
    elsize = query.element_size()
    rows = max(1, min(h, chunk // (c * w * pb * elsize)))  # query rows per unfolded slab
    # Pixels per matmul (within a slab): its (n, K, p*p*B) output is reduced over K while still in cache.
    group = max(1, min(rows * w, chunk // (ppb * k * elsize)))
    shapes = {
        "qt": (c, h + 2 * r, w, b),
        "z": (c, rows * w + 2 * r, p, b),
        "prod": (group, k, ppb),
        "sims": (rows * w, ppb),
        "m": (pp, pad + h * w + pad, b),
    }
    qt, z, prod, sims, m = _carve(_scratch(_carve_size(*shapes.values()), query), *shapes.values())
    # (C, H + 2r, W, B): batch innermost; the 2r zero rows only keep the slabs rectangular
    qt[:, :r].zero_()
    qt[:, r + h :].zero_()
    qt[:, r : r + h].copy_(query.permute(1, 2, 3, 0))
    # Pixels are numbered row by row with no column padding, so pixel u's window starts p*B
    # after pixel u-1's even across rows and a matmul group may span rows. Window columns
    # past the left/right edge read the neighbouring row (or the zero slack at the slab
    # ends): finite values at exactly the offsets that _mask_off_map_ sets to -inf.
    z[:, :r].zero_()
    z[:, r + rows * w :].zero_()
    m[:, :pad].fill_(float("-inf"))
    m[:, pad + h * w :].fill_(float("-inf"))
    for i0 in range(0, h, rows):
        n_rows = min(rows, h - i0)
        npx, u_base = n_rows * w, i0 * w
        # z[:, r + u, dy] = query row (row of u) + dy - r, batch innermost: the p rows every
        # template row needs side by side, so a window (dx, dy, b) is one contiguous run.
        zs = z[:, r : r + npx].view(c, n_rows, w, p, b)
        for dy in range(p):  # p copies of contiguous (rows, W, B) blocks: faster than one unfold copy
            zs[:, :, :, dy].copy_(qt[:, i0 + dy : i0 + dy + n_rows])
        for u0 in range(0, npx, group):
            n = min(group, npx - u0)
            # (n, C, p*p*B) overlapping view of z, no copy
            win = z.as_strided((n, c, ppb), (pb, z.stride(0), 1), z.storage_offset() + u0 * pb)
            # (n, K, C) @ (n, C, p*p*B): the max over K runs along contiguous rows.
            t = t_pm[u_base + u0 : u_base + u0 + n]
            torch.amax(torch.bmm(t, win, out=prod[:n]), dim=1, out=sims[u0 : u0 + n])
        # offset-major, so the reductions below read contiguous (W, B) rows per offset
        m[:, pad + u_base : pad + u_base + npx].copy_(sims[:npx].view(npx, pp, b).transpose(0, 1))
    m = m.view(p, p, pad + h * w + pad, b)
    _mask_off_map_(_interior(m, h, w))
    return m


def _interior(m: Tensor, h: int, w: int) -> Tensor:
    """(p, p, H, W, B) view of the padded offset planes of :func:`_window_max`."""
    pad = (m.shape[2] - h * w) // 2
    return m[:, :, pad : pad + h * w].unflatten(2, (h, w))


def _mask_off_map_(m: Tensor) -> None:
    """Set ``M[dx, dy, y, x]`` to -inf where ``(y + dy, x + dx)`` is off the map: for each
    offset only a strip of at most ``r`` rows or columns, filled directly."""
    p, h, w = m.shape[0], m.shape[2], m.shape[3]
    r = p // 2
    for e in range(p):  # dy = e - r: rows y with y + dy outside [0, h)
        dy = e - r
        if dy < 0:
            m[:, e, : min(-dy, h)].fill_(float("-inf"))
        elif dy > 0:
            m[:, e, max(h - dy, 0) :].fill_(float("-inf"))
    for a in range(p):  # dx = a - r: columns
        dx = a - r
        if dx < 0:
            m[a, :, :, : min(-dx, w)].fill_(float("-inf"))
        elif dx > 0:
            m[a, :, :, max(w - dx, 0) :].fill_(float("-inf"))


def _backward_from(m: Tensor, h: int, w: int, sub: int) -> Tensor:
    """``Bw[b, y] = 1 - max_d M[d, y, b]`` over the central ``sub`` x ``sub`` offsets: (B, H, W)."""
    cut = (m.shape[0] - sub) // 2
    best = _interior(m, h, w)[cut : cut + sub, cut : cut + sub].amax(dim=(0, 1))  # (H, W, B)
    return 1 - best.permute(2, 0, 1)


def _forward_from(m: Tensor, h: int, w: int, sub: int) -> Tensor:
    """``F[b, x] = 1 - max_d M[d, x - d, b]`` over the central ``sub`` x ``sub`` offsets: (B, H, W).

    In the row-by-row pixel numbering ``x - d`` is ``x - (dy*W + dx)``: for one column offset
    all row offsets are a single strided view (plane stride minus one row), so the max is
    ``sub`` reductions instead of ``sub**2`` shifted slices. Shifts past the map's top or bottom
    land in the ``-inf`` padding; shifts past its left or right edge land on the neighbouring
    row at an offset that leaves the map there, which :func:`_mask_off_map_` made ``-inf``.
    """
    p, _, length, b = m.shape
    r, cut = p // 2, (p - sub) // 2
    pad = (length - h * w) // 2
    plane = length * b
    best: Tensor | None = None
    for a in range(cut, cut + sub):  # dx = a - r; element (a, e, x) sits at
        # a*p*plane + e*plane + (pad + x - (e - r)*W - (a - r))*B
        start = m.storage_offset() + a * p * plane + cut * (plane - w * b) + (pad + r * w + r - a) * b
        col = m.as_strided((sub, h * w, b), (plane - w * b, b, 1), start).amax(dim=0)
        best = col if best is None else torch.maximum(best, col, out=best)
    assert best is not None
    return 1 - best.view(h, w, b).permute(2, 0, 1)


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
    m = _window_max(query, t_pm, p, chunk_bytes)  # checks the shapes
    h, w = query.shape[2:]
    return _forward_from(m, h, w, forward_window), _backward_from(m, h, w, backward_window)


def forward_atm(query: Tensor, templates: Tensor, patch: int, *, chunk_bytes: int | None = None) -> Tensor:
    """``1 - max_{k, d} <Q[b, x], T[k, x + d]>`` for every query pixel ``x``: (B, H, W)."""
    m = _window_max(query, pixel_major(templates), patch, chunk_bytes)
    return _forward_from(m, query.shape[2], query.shape[3], patch)


def backward_atm(query: Tensor, templates: Tensor, patch: int, *, chunk_bytes: int | None = None) -> Tensor:
    """``1 - max_{k, d} <Q[b, y + d], T[k, y]>`` for every template pixel ``y``: (B, H, W)."""
    m = _window_max(query, pixel_major(templates), patch, chunk_bytes)
    return _backward_from(m, query.shape[2], query.shape[3], patch)


@functools.lru_cache(maxsize=64)
def _resize_matrix(n_in: int, n_out: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(n_out, n_in) linear-interpolation weights, ``align_corners=True``: output ``i`` samples
    input position ``i * (n_in - 1) / (n_out - 1)``. Built in float64."""
    src = torch.arange(n_out, dtype=torch.float64) * ((n_in - 1) / max(n_out - 1, 1))
    lo = src.floor().long().clamp(max=n_in - 1)
    hi = (lo + 1).clamp(max=n_in - 1)
    frac = src - lo
    a = torch.zeros(n_out, n_in, dtype=torch.float64)
    rows = torch.arange(n_out)
    a.index_put_((rows, lo), 1 - frac, accumulate=True)
    a.index_put_((rows, hi), frac, accumulate=True)
    return a.to(device=device, dtype=dtype)


def fuse_layer_maps(
    layer_maps: Sequence[Tensor],
    weights: Sequence[float],
    size: int | tuple[int, int],
) -> Tensor:
    """``S = sum_j w_j * up(S_j)``: bilinear, ``align_corners=True``, in float32. (B, H, W).

    Bilinear resizing is ``A_h @ S_j @ A_w^T`` with two interpolation matrices, so the whole
    weighted sum is one matmul: ``[A_h S_1 | A_h S_2 | ...] @ [w_1 A_w1^T; w_2 A_w2^T; ...]``
    (faster than resizing each map separately on a CPU).
    """
    out_h, out_w = (size, size) if isinstance(size, int) else size
    left, right = [], []
    for s, wj in zip(layer_maps, weights, strict=True):
        s = s.float()
        left.append(torch.matmul(_resize_matrix(s.shape[1], out_h, s.device, s.dtype), s))  # (B, H, w_j)
        right.append(_resize_matrix(s.shape[2], out_w, s.device, s.dtype).T * wj)  # (w_j, W)
    if not left:
        raise ValueError("no layer maps to fuse")
    return torch.matmul(torch.cat(left, dim=2), torch.cat(right, dim=0))


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
    boxes: Sequence[Box] | None = None,
    canvas: int | None = None,
) -> Tensor:
    """Per-layer ``alpha*F + (1-alpha)*Bw``, upsampled and summed: (B, size, size) float32.

    ``boxes`` (letterboxed inputs, ``core.geometry``): each image's content on the ``canvas``
    (the backbone's input size); every layer map's pad cells take their nearest content cell's
    value before the upsample, so no pad value is interpolated into the content.
    """
    if boxes is not None and canvas is None:
        raise ValueError("anomaly_maps: boxes need the canvas size")
    layers = []
    for j, name in enumerate(query):
        q, t_pm = query[name], templates_pm[name]
        cells = None if boxes is None else cell_boxes(boxes, canvas, tuple(q.shape[2:]))  # type: ignore[arg-type]
        p = max(forward_windows[j], backward_windows[j])
        crop = None if cells is None else content_window(cells, tuple(q.shape[2:]), p // 2)  # type: ignore[arg-type]
        if crop is not None:  # the window's query cells and the templates at the same cells
            (r0, r1), (c0, c1) = crop
            rows = torch.arange(r0, r1, device=t_pm.device)[:, None] * q.shape[3]
            q, t_pm = q[:, :, r0:r1, c0:c1], t_pm[(rows + torch.arange(c0, c1, device=t_pm.device)).flatten()]
        fwd, bwd = atm_pair(q, t_pm, forward_windows[j], backward_windows[j], chunk_bytes=chunk_bytes)
        layer = alphas[j] * fwd + (1 - alphas[j]) * bwd
        if crop is not None:
            whole = layer.new_zeros((layer.shape[0], *query[name].shape[2:]))
            whole[:, r0:r1, c0:c1] = layer
            layer = whole
        if cells is not None:
            layer = replicate_into_padding(layer, cells)  # every cell outside the window is a pad cell
        layers.append(layer)
    return fuse_layer_maps(layers, weights, size)


def content_window(
    cells: Sequence[Box], hw: tuple[int, int], margin: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The rows ``[r0, r1)`` and columns ``[c0, c1)`` of a layer of ``hw`` cells that hold every
    image's content cells (``cells``, from :func:`core.geometry.cell_boxes`) grown by ``margin``
    (the widest window's radius) and clipped to the layer; None when that is the whole layer.

    ATMM on that window alone is ATMM on the whole layer at every content cell: each window
    around a content cell lies inside it (or leaves the layer exactly where the whole layer's
    does), so only pad cells' values, which :func:`core.geometry.replicate_into_padding`
    replaces, are not computed. A letterboxed elongated frame's pad is most of its canvas."""
    h, w = hw
    r0 = max(min(c.top for c in cells) - margin, 0)
    r1 = min(max(c.top + c.height for c in cells) + margin, h)
    c0 = max(min(c.left for c in cells) - margin, 0)
    c1 = min(max(c.left + c.width for c in cells) + margin, w)
    return None if (r0, r1, c0, c1) == (0, h, 0, w) else ((r0, r1), (c0, c1))
