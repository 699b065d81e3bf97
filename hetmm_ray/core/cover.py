"""Coverage selection (``templates.kind: cover``): per pixel, K bank vectors that every bank vector is close to.

ATMM scores a query pixel by its best cosine to the templates it sees (forward: the query pixel
against the template window; backward: each template pixel against the query window). A
selection helps speed only if it loses little of that best match. PTS (:mod:`.pts`) keeps the
medoids of OPTICS clusters and then the vectors of smallest *total* similarity to those chosen:
a bank vector unlike the chosen ones in one direction but close to a few of them may be left
uncovered, and on a product of varied poses (a pixel sees many unlike vectors) it is. The
cover selection instead takes, at every step, the bank vector *least covered* so far, the
greedy k-center rule (Gonzalez 1985, PatchCore's coreset rule applied per pixel). Its guarantee
is what ATMM needs: with the chord distance ``|u - v| = sqrt(2 (1 - cos))`` of unit vectors,
if every bank vector of a pixel has a chosen one within ``rho`` (the pixel's *radius*), then for
any query vector ``q``, ``dist(q, chosen) <= dist(q, bank) + rho`` (triangle inequality), in both
ATMM directions, and never below ALL's (the chosen ones are bank vectors). So the selection's
score of a part is ALL's plus at most what the radius allows, and the radius is measured at fit
time (:class:`CoverSelection`).

Exact semantics, per pixel, so that results are reproducible and checkable:

- Vectors ``x_i``: the bank's, re-normalised in float32 (a zero vector stays zero). Similarities
  ``S[i, j] = <x_i, x_j>``, the float32 batched matrix product :func:`cover_similarities`
  (public, so that checks hand the same matrices to a reference).
- Candidates: the bank's vectors minus the ``excluded`` images of a selection (one selection per
  row of ``excluded``: the out-of-fold calibration selects for every fold in one pass over the
  bank, :func:`cover_indices`). Zero vectors (the padded cells of letterboxed images,
  ``core.geometry``) match nothing; they are taken only after every real candidate.
- First: the medoid of the real candidates, ``argmax_i <x_i, sum_j x_j>`` over candidates ``i, j``
  (``j = i`` adds the same 1 to every real vector), in float64, lowest index on ties; a pixel whose
  candidates are all zero starts with its lowest candidate.
- Then, while fewer than ``min(K, candidates)`` are chosen: the unchosen candidate with the
  smallest ``cover[i] = max_{c chosen} S[c, i]``, lowest index on ties.
- ``K >=`` candidates: every candidate, in index order (the whole bank: ALL).
- Radius: ``sqrt(max(0, 2 (1 - min_i cover[i])))`` over the real candidates once K are chosen
  (0 when every real candidate is chosen).

Cost: one (N, N) float32 matrix product per pixel, shared by every selection (row of
``excluded``), then ``K`` steps of (selections, N) updates: the ten folds of a calibration
share one pass of matrix products over the bank instead of ten selections.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["CoverSelection", "cover_folds", "cover_indices", "cover_reference", "cover_similarities", "unit_vectors"]

Progress = Callable[[int, int], object]
CHUNK_BYTES = 256 * 2**20  # float64 work per pixel chunk: the (P, N, N) matrices and the (P, N, C) vectors
_LAST = 1e30  # |cover| <= 1 (float32), so this offset orders every zero vector after every real one


@dataclass(frozen=True)
class CoverSelection:
    """One selection of :func:`cover_indices`: ``indices`` (K, H, W) int64 bank indices in
    selection order (K = ``min(k, candidates)``) and ``radius`` (H, W) float64 chord radii."""

    indices: Tensor
    radius: Tensor


def _chunk_pixels(n: int, c: int, f: int, pixels: int) -> int:
    per_pixel = 4 * n * n + 8 * n * c + 16 * f * n  # S, the vectors (both precisions), the (F, N) rows
    return max(1, min(pixels, CHUNK_BYTES // per_pixel))


def unit_vectors(vectors: Tensor) -> Tensor:
    """(..., N, C) vectors re-normalised over C in float32 (zero vectors stay zero)."""
    x = vectors.to(torch.float32)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def cover_similarities(x: Tensor) -> Tensor:
    """(P, N, C) unit vectors (:func:`unit_vectors`) -> (P, N, N) float32 ``S[p, i, j] = <x_i, x_j>``."""
    return torch.bmm(x, x.transpose(1, 2))


def _check(bank: Tensor, k: int, excluded: Tensor) -> None:
    if bank.dim() != 4 or bank.shape[0] < 1:
        raise ValueError(f"bank must be a non-empty (N, C, H, W) tensor, got shape {tuple(bank.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if excluded.dim() != 2 or excluded.shape[1] != bank.shape[0] or excluded.dtype != torch.bool:
        raise ValueError(f"excluded must be (selections, N) bool, got {tuple(excluded.shape)} {excluded.dtype}")
    if bool(excluded.all(dim=1).any()):
        raise ValueError("a selection excludes every image of the bank")
    if bank.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(bank))).all()):
        raise ValueError("bank has non-finite values")


def cover_indices(
    bank: Tensor,
    k: int,
    *,
    excluded: Tensor | None = None,
    chunk_pixels: int | None = None,
    progress: Progress | None = None,
) -> list[CoverSelection]:
    """The cover selections of ``bank`` (N, C, H, W), one per row of ``excluded`` (F, N) bool
    (default: one selection of the whole bank), in the module's exact semantics. Runs on
    ``bank``'s device, ``chunk_pixels`` pixels at a time at most (and never more than
    :data:`CHUNK_BYTES` of work: a PTS chunk setting handed on by a caller cannot blow it up);
    ``progress(done, total)`` counts pixels after each chunk."""
    n, c, h, w = bank.shape if bank.dim() == 4 else (0, 0, 0, 0)
    excluded = torch.zeros((1, n), dtype=torch.bool) if excluded is None else excluded
    _check(bank, k, excluded)
    dev = bank.device
    excluded = excluded.to(dev)
    f = excluded.shape[0]
    sizes = [min(k, int(n - excluded[i].sum())) for i in range(f)]
    steps = max(sizes)
    total = h * w
    out = torch.empty((f, steps, total), dtype=torch.int64, device=dev)
    radius = torch.zeros((f, total), dtype=torch.float64, device=dev)
    step = min(chunk_pixels or total, _chunk_pixels(n, c, f, total))  # never past CHUNK_BYTES of work
    candidate = (~excluded).to(torch.float64)  # (F, N)
    never = excluded.to(torch.float32).masked_fill(excluded, torch.inf)  # (F, N): +inf, never chosen
    flat = bank.reshape(n, c, total)
    for p0 in range(0, total, step):
        p1 = min(total, p0 + step)
        p = p1 - p0
        x = unit_vectors(flat[:, :, p0:p1].permute(2, 0, 1))  # (P, N, C)
        sim = cover_similarities(x)  # (P, N, N)
        empty = x.abs().amax(dim=2) == 0  # (P, N)
        x64 = x.to(torch.float64)
        sums = torch.bmm(x64, torch.einsum("pnc,fn->pcf", x64, candidate)).permute(2, 0, 1)  # (F, P, N)
        sums = sums.masked_fill(excluded[:, None, :] | empty[None], -torch.inf)
        first = torch.argmax(sums, dim=2)  # (F, P): lowest index on ties
        lowest = torch.argmax((~excluded).to(torch.int8), dim=1)  # (F,): a pixel all padding takes its lowest
        first = torch.where(torch.isinf(sums).all(dim=2), lowest[:, None], first)
        offset = never[:, None, :] + (empty.to(torch.float32) * _LAST)[None]  # (F, P, N)
        rows = torch.arange(p, device=dev)[None, :]
        cover = sim[rows, first]  # (F, P, N): S[first, i]
        keyed = torch.empty_like(cover)
        out[:, 0, p0:p1] = first
        offset.scatter_(2, first[..., None], torch.inf)
        for t in range(1, steps):
            pick = torch.argmin(torch.add(cover, offset, out=keyed), dim=2)  # lowest index on ties
            out[:, t, p0:p1] = pick
            offset.scatter_(2, pick[..., None], torch.inf)
            torch.maximum(cover, sim[rows, pick], out=cover)
        for i, size in enumerate(sizes):
            if size < steps:  # this selection stopped earlier: its cover over its own K
                chosen = out[i, :size, p0:p1].T  # (P, size)
                cover[i] = sim.gather(1, chosen[:, :, None].expand(p, size, n)).amax(dim=1)
        real = (~excluded)[:, None, :] & ~empty[None]  # (F, P, N)
        least = torch.where(real, cover.double(), torch.inf).amin(dim=2).clamp(max=1.0)  # (F, P); inf: none
        radius[:, p0:p1] = torch.where(torch.isinf(least), 0.0, (2 * (1 - least)).clamp_min(0).sqrt())
        if progress is not None:
            progress(p1, total)
    result = []
    for i, size in enumerate(sizes):
        if size == int(n - excluded[i].sum()):  # every candidate: in index order
            kept = torch.nonzero(~excluded[i]).view(-1)
            idx = kept.view(-1, 1, 1).expand(size, h, w).contiguous()
            result.append(CoverSelection(idx, torch.zeros((h, w), dtype=torch.float64, device=dev)))
        else:
            result.append(CoverSelection(out[i, :size].reshape(size, h, w).clone(), radius[i].reshape(h, w)))
    return result


def cover_folds(
    bank: dict[str, Tensor], k: int, held_out: Sequence[Sequence[int]], *, device: torch.device | str | None = None
) -> list[dict[str, Tensor] | None]:
    """The cover selection of every fold of an out-of-fold calibration, all folds in one pass per
    layer: for fold ``f`` (its ``held_out`` images excluded), each layer's (K, H, W) indices into
    the fold's KEPT bank (the images not held out, in index order), on the CPU; None for a fold
    whose kept images are at most ``k`` (its templates are the whole kept bank, as ALL's)."""
    n = next(iter(bank.values())).shape[0]
    excluded = torch.zeros((len(held_out), n), dtype=torch.bool)
    for f, held in enumerate(held_out):
        excluded[f, list(held)] = True
    position = torch.cumsum(~excluded, dim=1) - 1  # (F, N): an image's place in its fold's kept bank
    folds: list[dict[str, Tensor] | None] = [None if n - len(h) <= k else {} for h in held_out]
    compressed = [f for f, fold in enumerate(folds) if fold is not None]
    if not compressed:
        return folds
    for layer, b in bank.items():
        work = b if device is None else b.to(device)
        chosen = cover_indices(work, k, excluded=excluded[compressed])
        for f, selection in zip(compressed, chosen, strict=True):
            folds[f][layer] = position[f][selection.indices.cpu()]  # type: ignore[index]
    return folds


def cover_reference(x: Tensor, sim: Tensor, k: int, excluded: Tensor | None = None) -> list[int]:
    """The module's semantics for ONE pixel, written plainly (for tests): ``x`` (N, C) its unit
    vectors and ``sim`` (N, N) their similarities (:func:`unit_vectors`, :func:`cover_similarities`);
    the chosen bank indices in order."""
    n = x.shape[0]
    v = x.double().tolist()
    s = sim.tolist()
    out_ = set() if excluded is None else {i for i in range(n) if bool(excluded[i])}
    cands = [i for i in range(n) if i not in out_]
    empty = {i for i in cands if max(abs(a) for a in v[i]) == 0}
    if min(k, len(cands)) == len(cands):
        return cands
    real = [i for i in cands if i not in empty]
    if real:
        total = [math.fsum(v[j][ch] for j in cands) for ch in range(len(v[0]))]
        sums = [math.fsum(a * b for a, b in zip(v[i], total, strict=True)) for i in real]
        first = real[sums.index(max(sums))]  # the first maximum: lowest index on ties
    else:
        first = cands[0]
    chosen = [first]
    while len(chosen) < k:
        best_key, pick = math.inf, -1
        for i in cands:
            if i in chosen:
                continue
            key = max(s[c][i] for c in chosen) + (_LAST if i in empty else 0.0)
            if key < best_key:
                best_key, pick = key, i
        chosen.append(pick)
    return chosen
