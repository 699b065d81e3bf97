"""OPTICS for many small point sets at once, bit-identical to scikit-learn.

PTS (docs/algorithm.md §4) clusters the N bank vectors of every pixel separately:
thousands of independent OPTICS runs over a few hundred points each. Per pixel,
scikit-learn's ``compute_optics_graph(metric="precomputed")`` is slow,
almost all of it Python overhead around an O(N) update per step. Its scan is
a fixed procedure, identical at every pixel, so here it runs for P pixels in
lockstep: N steps, each a handful of (P, N) tensor operations.

What is reproduced exactly (``compute_optics_graph`` with ``max_eps=inf``):

- core distance = the ``min_samples``-th smallest entry of a point's distance
  row, the point itself included (``kneighbors`` with the query as its own
  neighbour), rounded with ``np.around(x, 15)``;
- the next point is the unprocessed one with the smallest reachability, the
  lowest index on ties (``np.argmin`` over the unprocessed indices in
  increasing order); while every unprocessed reachability is ``inf`` that is
  the lowest unprocessed index;
- the update ``r = around(max(d(p, q), core(p)), 15)`` replaces an unprocessed
  ``q``'s reachability (and sets its predecessor to ``p``) only when strictly
  smaller.

``torch.round(x, decimals=15)`` is the same ``rint(x * 1e15) / 1e15`` as numpy
and everything runs in float64, so the graph is bit-identical, ties included.
The scan keeps one ``key`` per point (reachability while unprocessed, +inf once
processed) and records a point's reachability when it is picked; all candidate
reachabilities ``around(max(D, core), 15)`` are computed up front in one pass.

The Xi cluster extraction (``cluster_optics_xi``) is a per-set walk over the
steep points of the reachability plot. It is ported statement for statement
(:func:`_xi_labels_one`) onto Python lists, with the steepness flags computed
for all sets at once in numpy: faster than calling scikit-learn per
pixel, and the tests check it against scikit-learn's ``cluster_optics_xi`` called per
set. Labels equal ``OPTICS(metric="precomputed", ...).fit(D).labels_``.

A consequence of scikit-learn's Xi with ``max_eps=inf`` worth knowing: the
plot starts at inf (the first point) and an inf is appended at its end, so the
whole range ``[0, N-1]`` always qualifies as a cluster; it is labelled when no
smaller cluster is. No set is ever all noise.

Distances must be finite and non-negative, as scikit-learn requires of a
precomputed matrix (it raises otherwise). The cosine helpers produce exactly
symmetric matrices with a zero diagonal, so callers and tests can hand the same
float64 matrix to this module and to scikit-learn.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "OpticsGraph",
    "cosine_distances",
    "cosine_similarities",
    "optics_graph",
    "optics_labels",
    "xi_labels",
]

_DECIMALS = int(np.finfo(np.float64).precision)  # 15: scikit-learn rounds core and reachability distances to this


class OpticsGraph(NamedTuple):
    """``compute_optics_graph``'s outputs for P point sets, each (P, N)."""

    ordering: Tensor  # int64, the processing order
    reachability: Tensor  # float64, inf for the first point of each connected scan
    predecessor: Tensor  # int64, -1 where reachability is inf
    core_distances: Tensor  # float64


def _buffer(out: Tensor | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float64, device=like.device)
    if out.shape != shape or out.dtype != torch.float64 or out.device != like.device:
        raise ValueError(f"buffer must be float64 {shape} on {like.device}, got {out.dtype} {tuple(out.shape)}")
    return out


def cosine_similarities(
    x: Tensor, *, out: Tensor | None = None, work: Tensor | None = None, vectors: Tensor | None = None
) -> Tensor:
    """(P, N, C) vectors -> (P, N, N) float64 cosine similarities.

    The vectors are re-normalised in float64 (float32 features are unit only to
    float32 precision). The result is made exactly symmetric, ``(A + A^T) / 2``
    (float addition commutes), clipped to [-1, 1], with an exact 1 on the
    diagonal: ``S[i, j] == S[j, i]`` bit for bit, so row and column sums agree.
    A zero vector gets similarity 0 to every other vector.

    ``out`` and ``work`` (P, N, N) and ``vectors`` (P, N, C) are optional
    float64 buffers; callers that run many chunks reuse them, because fresh
    buffers this large are fresh pages, and on CPU faulting them in can cost
    more than the arithmetic. The values do not depend on whether they are given.
    """
    if x.dim() != 3:
        raise ValueError(f"expected (P, N, C) vectors, got shape {tuple(x.shape)}")
    p, n, _ = x.shape
    xs = _buffer(vectors, tuple(x.shape), x)
    xs.copy_(x)
    xs.div_(xs.norm(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float64).tiny))
    raw = torch.bmm(xs, xs.transpose(1, 2), out=_buffer(work, (p, n, n), x))
    s = torch.add(raw, raw.transpose(1, 2), out=_buffer(out, (p, n, n), x))
    s.mul_(0.5).clamp_(-1.0, 1.0)
    s.diagonal(dim1=1, dim2=2).fill_(1.0)
    return s


def cosine_distances(sim: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Cosine distance ``1 - S`` from :func:`cosine_similarities`: in [0, 2], symmetric, zero diagonal.

    Computed as ``(-S) + 1`` (the same correctly rounded sum), optionally into ``out``.
    """
    d = torch.neg(sim, out=_buffer(out, tuple(sim.shape), sim))
    return d.add_(1.0).clamp_(min=0.0)


def _check_distances(dist: Tensor, min_samples: int) -> None:
    if dist.dim() != 3 or dist.shape[1] != dist.shape[2]:
        raise ValueError(f"expected (P, N, N) distances, got shape {tuple(dist.shape)}")
    n = dist.shape[1]
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or not 2 <= min_samples <= n:
        raise ValueError(f"min_samples must be an integer in [2, N={n}], got {min_samples!r}")
    if dist.numel():
        lo, hi = torch.aminmax(dist)  # NaN propagates and fails both tests
        # The largest float is reserved by the scan (see optics_graph).
        if not (bool(lo >= 0) and bool(hi < torch.finfo(dist.dtype).max)):
            raise ValueError("distances must be finite and non-negative (as scikit-learn requires of precomputed ones)")


def _kth_smallest(dist: Tensor, k: int, block_bytes: int = 8 * 2**20) -> Tensor:
    """The k-th smallest entry of every row (an exact selection, so any method gives the same value).

    Done a few matrices at a time: the selection kernels copy their input, and
    on CPU a fresh copy of a whole chunk costs more in page faults than the work.
    """
    p, n, _ = dist.shape
    out = torch.empty((p, n), dtype=dist.dtype, device=dist.device)
    step = max(1, block_bytes // max(1, n * n * dist.element_size()))
    for i in range(0, p, step):
        block = dist[i : i + step]
        if 4 * k <= n:
            # topk is several times faster than kthvalue on CPU for small k.
            torch.amax(torch.topk(block, k, dim=-1, largest=False, sorted=False).values, dim=-1, out=out[i : i + step])
        else:
            out[i : i + step] = torch.kthvalue(block, k, dim=-1).values
    return out


def optics_graph(dist: Tensor, min_samples: int, *, overwrite: bool = False) -> OpticsGraph:
    """``compute_optics_graph(D, metric="precomputed", max_eps=inf)`` for every ``D`` in ``dist``.

    ``dist`` (P, N, N) float64 distance matrices (rows are what scikit-learn
    reads: ``D[p, q]`` is the distance from ``p`` to ``q``). Results are on
    ``dist``'s device. ``overwrite=True`` lets the scan reuse ``dist``'s memory
    (its contents are then undefined), which saves one (P, N, N) buffer.
    """
    if dist.dtype != torch.float64:
        raise TypeError(f"distances must be float64 so ties behave as in scikit-learn, got {dist.dtype}")
    _check_distances(dist, min_samples)
    p, n, _ = dist.shape
    dev = dist.device
    f64 = torch.float64
    big = torch.finfo(f64).max
    inf = float("inf")
    core = _kth_smallest(dist, min_samples).round_(decimals=_DECIMALS)
    # Every candidate reachability sklearn can compute, up front and in one pass:
    # rd[i, a, b] = around(max(D[a, b], core[a]), 15). The scan then only reads rows.
    rd = torch.maximum(dist, core.unsqueeze(2), out=dist if overwrite else None).round_(decimals=_DECIMALS)

    # ``key`` drives the choice of the next point. Unprocessed: the current
    # reachability, with the initial ``inf`` lowered to the largest float so an
    # unprocessed point still beats a processed one (+inf): while all unprocessed
    # are at inf, sklearn takes the lowest *unprocessed* index. Keys are >= 0, so
    # their int64 bit patterns order like the floats, and integer argmin is faster
    # (first minimum: lowest index on ties, as np.argmin).
    key = torch.full((p, n), big, dtype=f64, device=dev)
    key_bits = key.view(torch.int64)
    # +inf once processed: max(candidate, done) then never lowers a processed key.
    done = torch.zeros((p, n), dtype=f64, device=dev)
    ordering = torch.empty((p, n), dtype=torch.int64, device=dev)
    reach_in_order = torch.empty((p, n), dtype=f64, device=dev)
    pred = torch.full((p, n), -1, dtype=torch.int64, device=dev)
    flat = rd.view(p * n, n)
    row_base = torch.arange(p, device=dev) * n
    # Reused buffers: fresh (P, N) tensors every step would be large allocations.
    cand = torch.empty((p, n), dtype=f64, device=dev)
    improved = torch.empty((p, n), dtype=torch.bool, device=dev)
    flat_idx = torch.empty(p, dtype=torch.int64, device=dev)
    for step in range(n):
        point = torch.argmin(key_bits, dim=1)
        ordering[:, step] = point
        torch.add(row_base, point, out=flat_idx)
        # A point's reachability is final once it is picked (only unprocessed ones change).
        torch.index_select(key.view(-1), 0, flat_idx, out=reach_in_order[:, step])
        key.view(-1)[flat_idx] = inf
        done.view(-1)[flat_idx] = inf
        torch.index_select(flat, 0, flat_idx, out=cand)
        torch.maximum(cand, done, out=cand)
        # sklearn: strictly smaller replaces reachability and predecessor.
        torch.lt(cand, key, out=improved)
        torch.where(improved, point.unsqueeze(1), pred, out=pred)
        torch.minimum(key, cand, out=key)
    reach_in_order.masked_fill_(reach_in_order == big, inf)
    reach = torch.empty_like(reach_in_order).scatter_(1, ordering, reach_in_order)
    return OpticsGraph(ordering, reach, pred, core)


def xi_labels(graph: OpticsGraph, min_samples: int, xi: float = 0.05) -> Tensor:
    """Xi cluster labels (P, N) int64 (-1 = noise), as scikit-learn's ``cluster_optics_xi``.

    With scikit-learn's OPTICS defaults: ``min_cluster_size=None`` (= ``min_samples``),
    ``predecessor_correction=True``. Runs :func:`_xi_labels_one`, a line-by-line port of
    scikit-learn's ``_xi_cluster`` / ``_extract_xi_labels`` on Python lists with the steepness
    flags computed for all sets at once: several times faster than calling scikit-learn per
    set, and checked equal to ``cluster_optics_xi`` per set by the tests (tests/unit/core/test_pts.py).
    """
    if not 0.0 <= xi <= 1.0:
        raise ValueError(f"xi must be in [0, 1], got {xi!r}")
    p, n = graph.ordering.shape
    if not 2 <= min_samples <= n:
        raise ValueError(f"min_samples must be an integer in [2, N={n}], got {min_samples!r}")
    ordering = graph.ordering.cpu().numpy()
    reach = graph.reachability.cpu().numpy()
    pred = graph.predecessor.cpu().numpy()
    out = np.empty((p, n), dtype=np.int64)

    # _xi_cluster's preamble for all sets at once: the plot with an inf appended,
    # and the four steepness flags (same float64 arithmetic, NaN compares false).
    plot = np.take_along_axis(reach, ordering, axis=1)
    plot = np.concatenate([plot, np.full((p, 1), np.inf)], axis=1)
    pred_plot = np.take_along_axis(pred, ordering, axis=1)
    xi_complement = 1 - xi
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = plot[:, :-1] / plot[:, 1:]
    steep_up = ratio <= xi_complement
    steep_down = ratio >= 1 / xi_complement
    downward = ratio > 1
    upward = ratio < 1
    rank = np.empty_like(ordering)
    np.put_along_axis(rank, ordering, np.arange(n)[None].repeat(p, axis=0), axis=1)
    for i in range(p):
        steep = np.flatnonzero(steep_up[i] | steep_down[i]).tolist()
        out[i] = _xi_labels_one(
            plot[i].tolist(),
            pred_plot[i].tolist(),
            ordering[i],
            rank[i].tolist(),
            steep,
            steep_up[i].tolist(),
            steep_down[i].tolist(),
            upward[i].tolist(),
            downward[i].tolist(),
            min_samples,
            min_samples,
            xi_complement,
        )
    return torch.from_numpy(out).to(graph.ordering.device)


def _extend_region(steep: list[bool], xward: list[bool], start: int, min_samples: int) -> int:
    """sklearn's ``_extend_region``."""
    n = len(steep)
    non_xward = 0
    index = start
    end = start
    while index < n:
        if steep[index]:
            non_xward = 0
            end = index
        elif not xward[index]:
            non_xward += 1
            if non_xward > min_samples:
                break
        else:
            return end
        index += 1
    return end


def _xi_labels_one(
    plot: list[float],
    pred_plot: list[int],
    ordering: np.ndarray,
    rank: list[int],
    steep_points: list[int],
    steep_up: list[bool],
    steep_down: list[bool],
    upward: list[bool],
    downward: list[bool],
    min_samples: int,
    min_cluster_size: int,
    xi_complement: float,
) -> np.ndarray:
    """sklearn's ``_xi_cluster`` + ``_extract_xi_labels`` for one set, statement for statement.

    ``plot`` is the reachability plot with an inf appended; ``rank[p]`` the
    position of point ``p`` in ``ordering``. The one change of form: the
    predecessor correction's scan ``p_e in ordering[s:e]`` is ``s <= rank[p_e] < e``.
    """
    inf = float("inf")
    sdas: list[list[float]] = []  # [start, end, mib]
    clusters: list[tuple[int, int]] = []
    index = 0
    mib = 0.0
    for steep_index in steep_points:
        if steep_index < index:
            continue
        mib = max(mib, max(plot[index : steep_index + 1]))
        # _update_filter_sdas
        if mib == inf:
            sdas = []
        else:
            sdas = [sda for sda in sdas if mib <= plot[int(sda[0])] * xi_complement]
            for sda in sdas:
                sda[2] = max(sda[2], mib)
        if steep_down[steep_index]:
            d_end = _extend_region(steep_down, upward, steep_index, min_samples)
            sdas.append([steep_index, d_end, 0.0])
            index = d_end + 1
            mib = plot[index]
            continue
        u_start = steep_index
        u_end = _extend_region(steep_up, downward, u_start, min_samples)
        index = u_end + 1
        mib = plot[index]
        found = []
        for sda in sdas:
            d_start, d_end, d_mib = int(sda[0]), int(sda[1]), sda[2]
            c_start = d_start
            c_end = u_end
            if plot[c_end + 1] * xi_complement < d_mib:
                continue
            d_max = plot[d_start]
            if d_max * xi_complement >= plot[c_end + 1]:
                while plot[c_start + 1] > plot[c_end + 1] and c_start < d_end:
                    c_start += 1
            elif plot[c_end + 1] * xi_complement >= d_max:
                while plot[c_end - 1] > d_max and c_end > u_start:
                    c_end -= 1
            # _correct_predecessor
            s, e = c_start, c_end
            corrected = False
            while s < e:
                if plot[s] > plot[e]:
                    corrected = True
                    break
                p_e = pred_plot[e]
                if p_e >= 0 and s <= rank[p_e] < e:
                    corrected = True
                    break
                e -= 1
            if not corrected:
                continue
            c_start, c_end = s, e
            if c_end - c_start + 1 < min_cluster_size:
                continue
            if c_start > d_end:
                continue
            if c_end < u_start:
                continue
            found.append((c_start, c_end))
        found.reverse()
        clusters.extend(found)
    # _extract_xi_labels: smaller clusters come first; a cluster is labelled only if untouched.
    labels = np.full(len(ordering), -1, dtype=np.int64)
    label = 0
    for c0, c1 in clusters:
        if not (labels[c0 : c1 + 1] != -1).any():
            labels[c0 : c1 + 1] = label
            label += 1
    out = np.empty_like(labels)
    out[ordering] = labels
    return out


def optics_labels(dist: Tensor, min_samples: int, xi: float = 0.05) -> Tensor:
    """``OPTICS(metric="precomputed", min_samples=min_samples, xi=xi).fit(D).labels_`` for every ``D`` in ``dist``."""
    return xi_labels(optics_graph(dist, min_samples), min_samples, xi)
