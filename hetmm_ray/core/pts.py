"""Pixel-level template selection: PTS and the ablation baselines (docs/algorithm.md §4).

At every pixel, PTS picks K of the N bank vectors: first the medoid of each
OPTICS cluster ("easy normals"), then, greedily, the vector least similar in
total to those already chosen ("hard normals"). Pixels are independent, so all
of it runs for a chunk of pixels in lockstep as tensor operations: one batched
matmul for the chunk's (P, N, N) cosine similarities, the OPTICS scan of
:mod:`.optics` (bit-identical to scikit-learn), and K masked argmin steps.

Exact semantics, so that results are reproducible and checkable:

- Similarities are float64 cosines of the vectors re-normalised in float64,
  made exactly symmetric (:func:`.optics.cosine_similarities`); OPTICS gets
  ``clip(1 - S, 0)`` with a zero diagonal, the matrix a per-pixel
  ``OPTICS(metric="precomputed", min_samples=max(2, N // K))`` would be given.
- Cluster medoid: the member with the largest sum of similarities to the
  *other* members, summed in increasing member index order; ties (equal
  float64 sums) go to the lowest index. Clusters are taken in order of their
  lowest member index, at most K of them.
- No cluster at all (every point noise): the whole set is treated as one
  cluster, i.e. the global medoid ``argmax_i sum_{j != i} S[i, j]``. Leaving
  out ``j == i`` cannot change the argmax in exact arithmetic (every
  ``S[i, i]`` is 1); it keeps this the same computation as a cluster medoid.
  With scikit-learn's Xi and ``max_eps=inf`` this cannot happen (the whole
  range always qualifies as a cluster, see :mod:`.optics`), so the branch is a
  safeguard; when the whole range is the only cluster its medoid is this same
  global medoid anyway.
- Hard normals: while fewer than K are chosen, add the unchosen sample with the
  smallest running sum ``sum_c S[c, q]`` over the chosen ``c``, accumulated
  in selection order; ties go to the lowest index.
- ``init="kmeans"`` (PTS_K): faiss spherical k-means with K centres on the
  pixel's unit vectors (float32, ``seed``, faiss's defaults otherwise:
  25 iterations, one run). Each centre is replaced by the sample of largest
  cosine to it (lowest index on ties), in faiss's centre order; a sample
  nearest to several centres is kept once, at its first place. The hard-normal
  step then completes the set to K.
- ``K >= N``: the whole bank, ``arange(N)`` at every pixel.
- Zero vectors (the padded cells of letterboxed images, ``core.geometry``) have similarity
  0 to everything, so the hard-normal rule would take them first; they are taken only after
  every non-zero vector of their pixel (they match nothing, a sheet spent on them is lost).
  Banks without zero vectors (every squash bank) are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..config import TEMPLATE_KINDS
from .cover import cover_indices
from .optics import cosine_distances, cosine_similarities, optics_graph, xi_labels

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "SELECTION_KINDS",
    "LayerSelection",
    "Workspace",
    "chunk_size",
    "cluster_medoids",
    "complete_selection",
    "kmeans_centres",
    "pixel_similarities",
    "pixel_vectors",
    "pts_indices",
    "select_layer",
    "select_layers",
    "select_rows_pixel_major",
    "select_templates",
]

SELECTION_KINDS = TEMPLATE_KINDS  # the one list lives in hetmm_ray.config
DEFAULT_CHUNK_BYTES = 256 * 2**20  # float64 work per pixel chunk: two (P, N, N) matrices and the (P, N, C) vectors

Progress = Callable[[int, int], object]


def _check_bank(bank: Tensor, k: int) -> None:
    if bank.dim() != 4:
        raise ValueError(f"bank must be (N, C, H, W), got shape {tuple(bank.shape)}")
    if bank.shape[0] < 1:
        raise ValueError("bank is empty")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")


def chunk_size(n: int, c: int, pixels: int, chunk_pixels: int | None) -> int:
    """Pixels per chunk of :func:`pts_indices`: ``chunk_pixels``, else as many as ``DEFAULT_CHUNK_BYTES``
    of float64 workspace hold (this and the other stages are public for ``benchmarks/bench_pts.py split``)."""
    if chunk_pixels is not None:
        if chunk_pixels < 1:
            raise ValueError(f"chunk_pixels must be >= 1, got {chunk_pixels}")
        return min(chunk_pixels, pixels)
    per_pixel = 8 * (2 * n * n + n * c)  # two (N, N) matrices and the (N, C) vectors, float64
    return max(1, min(pixels, DEFAULT_CHUNK_BYTES // per_pixel))


def pixel_vectors(bank: Tensor, p0: int, p1: int) -> Tensor:
    """Pixels ``p0:p1`` (row-major over H, W) of a (N, C, H, W) bank as a (P, N, C) view."""
    n, c = bank.shape[:2]
    return bank.reshape(n, c, -1)[:, :, p0:p1].permute(2, 0, 1)


class Workspace:
    """float64 buffers for the largest chunk, reused by every chunk (see :func:`.optics.cosine_similarities`)."""

    def __init__(self, p: int, n: int, c: int, device: torch.device) -> None:
        self.vectors = torch.empty((p, n, c), dtype=torch.float64, device=device)
        self.sim = torch.empty((p, n, n), dtype=torch.float64, device=device)
        self.work = torch.empty((p, n, n), dtype=torch.float64, device=device)

    def similarities(self, x: Tensor) -> Tensor:
        p = x.shape[0]
        return cosine_similarities(x, out=self.sim[:p], work=self.work[:p], vectors=self.vectors[:p])


def pixel_similarities(bank: Tensor, p0: int = 0, p1: int | None = None) -> Tensor:
    """The (P, N, N) float64 similarity matrices PTS uses for pixels ``p0:p1`` of ``bank``.

    Public so that checks can hand exactly these matrices to a reference.
    """
    return cosine_similarities(pixel_vectors(bank, p0, bank.shape[2] * bank.shape[3] if p1 is None else p1))


# --- easy normals ----------------------------------------------------------------------
def cluster_medoids(sim: Tensor, labels: Tensor, k: int, work: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Medoids of the clusters in ``labels`` (P, N), in order of lowest member index.

    Returns (P, k) indices (entries past the count are undefined) and the count
    per pixel, ``min(clusters, k)``. All-noise pixels count as one cluster.
    ``work``: an optional (P, N, N) float64 scratch buffer.
    """
    p, n, _ = sim.shape
    dev = sim.device
    labels = labels.clone()
    labels[(labels < 0).all(dim=1)] = 0
    noise = labels < 0
    n_lab = int(labels.max()) + 1
    lab = labels.masked_fill(noise, n_lab)  # noise gets its own, ignored, column
    idx = torch.arange(n, device=dev)
    # For the sums every noise point gets a label of its own: it then matches only
    # itself, and self-pairs are skipped anyway.
    lab_u = torch.where(noise, n_lab + idx, labels).to(torch.int32)

    # Sum of similarities to the other members, accumulated in increasing member
    # index (the order a plain loop would use, so equal sums are bitwise equal).
    # T = S * [same cluster, not self] is exactly symmetric (so are both factors),
    # so row j of T is column j: acc_i += T[j, i] reads contiguous rows. Adding
    # an exact S or an exact (signed) zero: no rounding beyond the loop's own.
    t = torch.empty_like(sim) if work is None else work
    torch.eq(lab_u.unsqueeze(2), lab_u.unsqueeze(1), out=t)  # bool -> 1.0 / 0.0
    t.diagonal(dim1=1, dim2=2).fill_(0.0)
    t.mul_(sim)
    acc = torch.zeros((p, n), dtype=torch.float64, device=dev)
    for j in range(n):
        acc.add_(t[:, j, :])

    best = torch.full((p, n_lab + 1), -torch.inf, dtype=torch.float64, device=dev)
    best.scatter_reduce_(1, lab, acc, reduce="amax")
    is_best = (acc == best.gather(1, lab)) & ~noise
    big = torch.full((p, n_lab + 1), n, dtype=torch.int64, device=dev)
    medoid = big.clone().scatter_reduce_(1, lab, torch.where(is_best, idx, n), reduce="amin")
    first = big.clone().scatter_reduce_(1, lab, idx.expand(p, n), reduce="amin")
    first[:, n_lab] = n
    order = torch.argsort(first, dim=1, stable=True)
    medoids = medoid.gather(1, order)
    count = (first < n).sum(dim=1).clamp(max=k)
    width = min(k, n_lab + 1)
    out = torch.zeros((p, k), dtype=torch.int64, device=dev)
    out[:, :width] = medoids[:, :width].clamp(max=n - 1)
    return out, count


def _optics_init(sim: Tensor, k: int, work: Tensor) -> tuple[Tensor, Tensor]:
    n = sim.shape[1]
    m = max(2, n // k)
    graph = optics_graph(cosine_distances(sim, out=work), m, overwrite=True)
    return cluster_medoids(sim, xi_labels(graph, m), k, work)


def kmeans_centres(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Spherical k-means centres (k, C) of one pixel's unit vectors ``x`` (N, C), by faiss.

    faiss's defaults except: ``seed``, ``spherical=True`` (centres re-normalised
    each iteration, assignment by inner product) and ``min_points_per_centroid=1``
    (a few hundred points for tens of centres is the normal case here, not a
    mistake worth a warning).
    """
    import faiss  # deferred: only the k-means variants need it

    x = np.ascontiguousarray(x, dtype=np.float32)
    km = faiss.Kmeans(x.shape[1], k, seed=int(seed), spherical=True, min_points_per_centroid=1, verbose=False)
    km.train(x)
    assert km.centroids is not None  # set by train
    return km.centroids.reshape(k, x.shape[1])


def _kmeans_init(unit: Tensor, k: int, seed: int) -> tuple[Tensor, Tensor]:
    """``unit``: the (P, N, C) float64 unit vectors the similarities were made from."""
    p = unit.shape[0]
    dev = unit.device
    x32 = unit.to(torch.float32).cpu().numpy()
    centres = np.stack([kmeans_centres(x32[i], k, seed) for i in range(p)])  # (P, k, C)
    c64 = torch.from_numpy(centres).to(dev, torch.float64)
    c64 = c64 / c64.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    nearest = torch.bmm(c64, unit.transpose(1, 2)).argmax(dim=2)  # (P, k), first maximum
    # Keep each sample once, at its first place: a later duplicate moves to the end.
    dup = (nearest.unsqueeze(2) == nearest.unsqueeze(1)).tril(diagonal=-1).any(dim=2)
    order = torch.argsort(dup.to(torch.int8), dim=1, stable=True)
    return nearest.gather(1, order), (~dup).sum(dim=1)


# --- hard normals -----------------------------------------------------------------------
def complete_selection(sim: Tensor, init: Tensor, count: Tensor, k: int, empty: Tensor | None = None) -> Tensor:
    """Selection order (P, k): ``init[:, :count]`` first, then hard normals.

    ``empty`` (P, N) marks zero vectors (letterbox padding, ``core.geometry``): they are
    taken as hard normals only after every real vector of their pixel.
    """
    p, n, _ = sim.shape
    dev = sim.device
    rows = torch.arange(p, device=dev)
    row_base = rows * n
    flat = sim.view(p * n, n)
    sums = torch.zeros((p, n), dtype=torch.float64, device=dev)
    row = torch.empty((p, n), dtype=torch.float64, device=dev)
    taken = torch.zeros((p, n), dtype=torch.float64, device=dev)  # +inf once chosen
    if empty is not None:
        # |running sums| <= k, so a 1e300 offset orders every empty vector after every real one
        # and keeps the hard-normal order among empty ones (all sums 0: lowest index first).
        taken.masked_fill_(empty, 1e300)
    keyed = torch.empty((p, n), dtype=torch.float64, device=dev)
    chosen = torch.empty((p, k), dtype=torch.int64, device=dev)
    n_init = int(count.max()) if p else 0
    for t in range(k):
        torch.add(sums, taken, out=keyed)
        pick = torch.argmin(keyed, dim=1)  # first minimum: lowest index on ties
        if t < n_init:
            pick = torch.where(t < count, init[:, t], pick)
        chosen[:, t] = pick
        taken[rows, pick] = torch.inf
        sums.add_(torch.index_select(flat, 0, row_base + pick, out=row))
    return chosen


def pts_indices(
    bank: Tensor,
    k: int,
    init: str = "optics",
    *,
    seed: int = 0,
    chunk_pixels: int | None = None,
    progress: Progress | None = None,
) -> Tensor:
    """Per-pixel PTS selection: (min(k, N), H, W) int64 bank indices in selection order.

    ``bank`` (N, C, H, W) features (L2-normalised per pixel; re-normalised in
    float64 anyway). ``init`` is ``"optics"`` (PTS_O, the method) or
    ``"kmeans"`` (PTS_K, seeded by ``seed``). Pixels are processed in chunks
    of ``chunk_pixels`` (default: sized so two (P, N, N) float64 matrices fit
    in :data:`DEFAULT_CHUNK_BYTES`); ``progress(done, total)`` is called with
    pixel counts after each chunk. Runs on ``bank``'s device.
    """
    _check_bank(bank, k)
    if init not in ("optics", "kmeans"):
        raise ValueError(f"init must be 'optics' or 'kmeans', got {init!r}")
    n, c, h, w = bank.shape
    total = h * w
    if bank.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(bank))).all()):  # no bank-sized temporary
        raise ValueError("bank has non-finite values")
    if k >= n:
        if progress is not None:
            progress(total, total)
        return torch.arange(n, device=bank.device).view(n, 1, 1).expand(n, h, w).contiguous()
    out = torch.empty((k, total), dtype=torch.int64, device=bank.device)
    step = chunk_size(n, c, total, chunk_pixels)
    ws = Workspace(step, n, c, bank.device)
    for p0 in range(0, total, step):
        p1 = min(total, p0 + step)
        sim = ws.similarities(pixel_vectors(bank, p0, p1))
        if init == "optics":
            first, count = _optics_init(sim, k, ws.work[: p1 - p0])
        else:
            first, count = _kmeans_init(ws.vectors[: p1 - p0], k, seed)
        vectors = pixel_vectors(bank, p0, p1)
        empty = vectors.abs().amax(dim=2) == 0  # (P, N) padding (letterbox), never a real feature
        out[:, p0:p1] = complete_selection(sim, first, count, k, empty if bool(empty.any()) else None).T
        if progress is not None:
            progress(p1, total)
    return out.view(k, h, w)


def select_templates(bank: Tensor, indices: Tensor) -> Tensor:
    """The tiny set (K, C, H, W): ``T[k, :, y, x] = bank[indices[k, y, x], :, y, x]``."""
    if indices.dim() != 3 or indices.shape[1:] != bank.shape[2:]:
        raise ValueError(f"indices {tuple(indices.shape)} do not fit bank {tuple(bank.shape)}")
    kk, h, w = indices.shape
    idx = indices.to(bank.device)[:, None].expand(kk, bank.shape[1], h, w)
    return torch.gather(bank, 0, idx)


def select_rows_pixel_major(bank_pm: Tensor, rows: Tensor, indices: Tensor | None) -> Tensor:
    """The templates of the bank's ``rows`` under ``indices``, pixel-major (``(H*W, K, C)``), from
    the whole bank laid out pixel-major (``bank_pm``, ``(H*W, N, C)``): at pixel ``p``, sheet ``k``
    is ``bank_pm[p, rows[indices[k, p]]]``, ``indices`` ``(K, H, W)`` indexing into ``rows`` (a
    selection made on the sub-bank of those rows); None: every one of ``rows``, in order. The same
    values as selecting from the sub-bank, then laying it out (``select_templates``)."""
    if indices is None:
        return bank_pm.index_select(1, rows)
    k, h, w = indices.shape
    if h * w != bank_pm.shape[0]:
        raise ValueError(f"indices {tuple(indices.shape)} do not fit a pixel-major bank {tuple(bank_pm.shape)}")
    chosen = rows[indices.to(rows.device).reshape(k, h * w).T]  # (H*W, K) bank rows
    return torch.gather(bank_pm, 1, chosen[:, :, None].expand(-1, -1, bank_pm.shape[2]))


# --- the ablation variants ----------------------------------------------------------
def _pc_k(bank: Tensor, k: int, seed: int, progress: Progress | None) -> Tensor:
    n, c, h, w = bank.shape
    flat = bank.detach().reshape(n, c, h * w).to(torch.float64)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    x = flat.to(torch.float32).permute(2, 0, 1).cpu().numpy()  # (H*W, N, C)
    out = np.empty((h * w, k, c), dtype=np.float32)
    for i in range(h * w):
        out[i] = kmeans_centres(x[i], k, seed)
        if progress is not None and ((i + 1) % 256 == 0 or i + 1 == h * w):
            progress(i + 1, h * w)
    centres = torch.from_numpy(out).permute(1, 2, 0).reshape(k, c, h, w)
    centres = centres / centres.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return centres.to(bank.device, bank.dtype)


def _chosen(
    kind: str,
    bank: Tensor,
    k: int,
    seed: int,
    chunk_pixels: int | None,
    progress: Progress | None,
    pts: Callable[..., Tensor],
) -> tuple[Tensor | None, Tensor | None]:
    """``(indices, centres)`` of selection ``kind`` on one layer's ``bank``: the one place that
    decides what a selection is (:func:`select_layer` documents the kinds). Both None: the whole bank."""
    if kind not in SELECTION_KINDS:
        raise ValueError(f"unknown selection {kind!r}; choose one of {', '.join(SELECTION_KINDS)}")
    _check_bank(bank, k)
    n, _, h, w = bank.shape
    kk = min(k, n)
    if kind == "all":
        return None, None
    if kind == "pc_k":
        if k >= n:
            return None, None
        return None, _pc_k(bank, k, seed, progress)
    if kind == "cover":
        if k >= n:
            return None, None
        return cover_indices(bank, k, chunk_pixels=chunk_pixels, progress=progress)[0], None
    if kind in ("pts_k", "pts_o"):
        init = "kmeans" if kind == "pts_k" else "optics"
        extra = {} if chunk_pixels is None else {"chunk_pixels": chunk_pixels}
        return pts(bank, k, init, seed=seed, progress=progress, **extra), None
    gen = torch.Generator().manual_seed(int(seed))
    if kind == "ir":
        idx = torch.randperm(n, generator=gen)[:kk].view(kk, 1, 1).expand(kk, h, w).contiguous()
    else:  # pr
        idx = torch.rand((n, h, w), generator=gen).argsort(dim=0)[:kk]
    return idx.to(bank.device), None


@dataclass(frozen=True)
class LayerSelection:
    """One layer's chosen tiny set as it is stored: bank ``indices`` (K, H, W) int64, or
    ``centres`` (K, C, H, W) when the templates are not bank vectors; both None: the whole bank."""

    indices: Tensor | None = None
    centres: Tensor | None = None


def select_layer(
    bank: Tensor,
    kind: str,
    sheets: int | str,
    seed: int = 0,
    *,
    pts: Callable[..., Tensor] = pts_indices,
    device: torch.device | str | None = None,
    chunk_pixels: int | None = None,
    progress: Progress | None = None,
) -> LayerSelection:
    """Select the templates of one layer: THE selection path. The detector's fit pipeline
    (``fitting.py``), the registry's create and the shards' hot update all call this; only
    where PTS executes is injected (``pts``: in process by default, the Ray fan-out
    ``distributed.pts_fanout.pts_indices_ray`` on a cluster, both with the contract of
    :func:`pts_indices`).

    ``bank`` (N, C, H, W) is moved to ``device`` for the work when given; the result is on the
    CPU, centres in ``bank``'s dtype. ``kind == "all"`` selects nothing and ignores ``sheets``
    (which may then still be ``"auto"``); every other kind needs an integer ``sheets`` (a
    product's ``sheets: auto`` is resolved first, ``fitting.FitPipeline.auto_selected``).
    ``progress(done, total)`` counts this layer's pixels.

    The kinds (docs/algorithm.md §4, the paper's Table RTMM), with ``k = sheets``:

    - ``all``: the whole bank (neither indices nor centres).
    - ``ir``: the same ``min(k, N)`` random images at every pixel (seeded).
    - ``pr``: ``min(k, N)`` random images drawn independently per pixel (seeded).
    - ``pc_k``: per-pixel spherical k-means centres (faiss, seeded), unit vectors, not bank
      members (``centres``); ``k >= N`` gives the bank.
    - ``cover``: per pixel, the ``k`` bank vectors of the greedy coverage rule
      (:func:`.cover.cover_indices`: each step takes the vector least covered so far, so every
      bank vector is within a measured radius of a chosen one); ``k >= N`` gives the bank.
    - ``pts_k`` / ``pts_o``: :func:`pts_indices` with ``init="kmeans"`` / ``"optics"``; ``pts``
      swaps in another implementation of the same contract (the Ray fan-out).

    Random draws use a CPU ``torch.Generator`` seeded with ``seed``, so they do not depend on
    the device or on global RNG state.
    """
    if kind == "all":
        if progress is not None:
            progress(bank.shape[2] * bank.shape[3], bank.shape[2] * bank.shape[3])
        return LayerSelection()
    work = bank if device is None else bank.to(device)
    indices, centres = _chosen(kind, work, sheets, seed, chunk_pixels, progress, pts)  # type: ignore[arg-type]
    return LayerSelection(
        indices=None if indices is None else indices.cpu(),
        centres=None if centres is None else centres.to("cpu", bank.dtype),
    )


def select_layers(
    bank: dict[str, Tensor],
    kind: str,
    k: int | str,
    seed: int = 0,
    *,
    device: torch.device | str | None = None,
    progress: Progress | None = None,
    pts: Callable[..., Tensor] = pts_indices,
) -> tuple[dict[str, Tensor] | None, dict[str, Tensor] | None]:
    """:func:`select_layer` for every layer of a bank: CPU ``(indices, centres)``, each None when unused.

    ``progress(done, total)`` counts pixels over all layers; ``pts`` as in :func:`select_layer`.
    """
    total = sum(v.shape[2] * v.shape[3] for v in bank.values())
    indices, centres, done = {}, {}, 0
    for layer, b in bank.items():

        def report(d: int, _t: int, base: int = done) -> None:
            if progress is not None:
                progress(base + d, total)

        chosen = select_layer(b, kind, k, seed, pts=pts, device=device, progress=report)
        done += b.shape[2] * b.shape[3]
        if chosen.indices is not None:
            indices[layer] = chosen.indices
        if chosen.centres is not None:
            centres[layer] = chosen.centres
    return indices or None, centres or None
