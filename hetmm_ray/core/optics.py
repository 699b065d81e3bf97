"""OPTICS for many small point sets at once, bit-identical to scikit-learn.

PTS (ALGORITHM.md §4) clusters the N bank vectors of every pixel separately:
thousands of independent OPTICS runs over a few hundred points each. Per pixel,
scikit-learn's ``compute_optics_graph(metric="precomputed")`` costs ~90 ms,
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
The Xi cluster extraction is scikit-learn's own ``cluster_optics_xi`` run per
pixel (~0.5 ms each), so labels equal ``OPTICS(...).fit(D).labels_``.

Distances must be finite and non-negative, as scikit-learn requires of a
precomputed matrix (it raises otherwise). The cosine helpers produce exactly
symmetric matrices with a zero diagonal, so callers and tests can hand the same
float64 matrix to this module and to scikit-learn.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from sklearn.cluster import cluster_optics_xi
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


def cosine_similarities(x: Tensor) -> Tensor:
    """(P, N, C) vectors -> (P, N, N) float64 cosine similarities.

    The vectors are re-normalised in float64 (float32 features are unit only to
    float32 precision). The result is made exactly symmetric, ``(A + A^T) / 2``
    (float addition commutes), clipped to [-1, 1], with an exact 1 on the
    diagonal: ``S[i, j] == S[j, i]`` bit for bit, so row and column sums agree.
    A zero vector gets similarity 0 to every other vector.
    """
    if x.dim() != 3:
        raise ValueError(f"expected (P, N, C) vectors, got shape {tuple(x.shape)}")
    x = x.to(torch.float64)
    x = x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    s = torch.bmm(x, x.transpose(1, 2))
    s = (s + s.transpose(1, 2)).mul_(0.5).clamp_(-1.0, 1.0)
    s.diagonal(dim1=1, dim2=2).fill_(1.0)
    return s


def cosine_distances(sim: Tensor) -> Tensor:
    """Cosine distance ``1 - S`` from :func:`cosine_similarities`: in [0, 2], symmetric, zero diagonal."""
    return torch.sub(1.0, sim).clamp_(min=0.0)


def _check_distances(dist: Tensor, min_samples: int) -> None:
    if dist.dim() != 3 or dist.shape[1] != dist.shape[2]:
        raise ValueError(f"expected (P, N, N) distances, got shape {tuple(dist.shape)}")
    n = dist.shape[1]
    if not 2 <= min_samples <= n:
        raise ValueError(f"min_samples must be an integer in [2, N={n}], got {min_samples!r}")
    if not bool(torch.isfinite(dist).all()) or bool((dist < 0).any()):
        raise ValueError("distances must be finite and non-negative (as scikit-learn requires of precomputed ones)")


def optics_graph(dist: Tensor, min_samples: int) -> OpticsGraph:
    """``compute_optics_graph(D, metric="precomputed", max_eps=inf)`` for every ``D`` in ``dist``.

    ``dist`` (P, N, N) float64 distance matrices (rows are what scikit-learn
    reads: ``D[p, q]`` is the distance from ``p`` to ``q``). Results are on
    ``dist``'s device.
    """
    if dist.dtype != torch.float64:
        raise TypeError(f"distances must be float64 so ties behave as in scikit-learn, got {dist.dtype}")
    _check_distances(dist, min_samples)
    p, n, _ = dist.shape
    dev = dist.device
    core = torch.kthvalue(dist, min_samples, dim=2).values.round_(decimals=_DECIMALS)
    reach = torch.full((p, n), float("inf"), dtype=torch.float64, device=dev)
    pred = torch.full((p, n), -1, dtype=torch.int64, device=dev)
    ordering = torch.empty((p, n), dtype=torch.int64, device=dev)
    processed = torch.zeros((p, n), dtype=torch.bool, device=dev)
    # The argmin key: reachability for unprocessed points, with their ``inf``
    # lowered to the largest float so that it still beats processed points (+inf):
    # with all unprocessed at inf, sklearn takes the lowest *unprocessed* index.
    key = torch.full((p, n), torch.finfo(torch.float64).max, dtype=torch.float64, device=dev)
    rows = torch.arange(p, device=dev)
    core_finite = torch.isfinite(core)
    for step in range(n):
        point = torch.argmin(key, dim=1)  # first minimum: lowest index on ties
        ordering[:, step] = point
        processed[rows, point] = True
        key[rows, point] = float("inf")
        rd = torch.maximum(dist[rows, point], core[rows, point].unsqueeze(1)).round_(decimals=_DECIMALS)
        improved = (rd < reach) & ~processed & core_finite[rows, point].unsqueeze(1)
        reach = torch.where(improved, rd, reach)
        key = torch.where(improved, rd, key)
        pred = torch.where(improved, point.unsqueeze(1), pred)
    return OpticsGraph(ordering, reach, pred, core)


def xi_labels(graph: OpticsGraph, min_samples: int, xi: float = 0.05) -> Tensor:
    """Xi cluster labels (P, N) int64 (-1 = noise), scikit-learn's ``cluster_optics_xi`` per set.

    With scikit-learn's OPTICS defaults: ``min_cluster_size=None`` (= ``min_samples``),
    ``predecessor_correction=True``.
    """
    ordering = graph.ordering.cpu().numpy()
    reach = graph.reachability.cpu().numpy()
    pred = graph.predecessor.cpu().numpy()
    out = np.empty(ordering.shape, dtype=np.int64)
    for i in range(ordering.shape[0]):
        out[i], _ = cluster_optics_xi(
            reachability=reach[i],
            predecessor=pred[i],
            ordering=ordering[i],
            min_samples=min_samples,
            min_cluster_size=None,
            xi=xi,
            predecessor_correction=True,
        )
    return torch.from_numpy(out).to(graph.ordering.device)


def optics_labels(dist: Tensor, min_samples: int, xi: float = 0.05) -> Tensor:
    """``OPTICS(metric="precomputed", min_samples=min_samples, xi=xi).fit(D).labels_`` for every ``D`` in ``dist``."""
    return xi_labels(optics_graph(dist, min_samples), min_samples, xi)
