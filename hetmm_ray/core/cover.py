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
score of a part is ALL's plus at most what the radius allows (:func:`nearest_sheet_distances`
measures it for any selection).

Exact semantics, per pixel, so that results are reproducible and checkable:

- Vectors ``x_i``: the bank's, re-normalised in float32 (a zero vector stays zero). Similarities
  ``S[i, j] = <x_i, x_j>``, the float32 batched matrix product :func:`cover_similarities`
  (public, so that checks hand the same matrices to a reference, ``tests/reference_impls.py``).
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
- Radius of a selection (:func:`nearest_sheet_distances`, not part of selecting): the largest
  chord distance from a real bank vector to its nearest chosen one (0 when every one is chosen).

Cost: one (N, N) float32 matrix product per pixel, shared by every selection (row of
``excluded``), then ``K`` steps of (selections, N) updates: the ten folds of a calibration
share one pass of matrix products over the bank instead of ten selections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["LAST", "cover_folds", "cover_indices", "cover_similarities", "nearest_sheet_distances", "unit_vectors"]

Progress = Callable[[int, int], object]
CHUNK_BYTES = 256 * 2**20  # work per pixel chunk: the float32 (P, N, N) similarities, the vectors, the rows
LAST = 1e30  # |cover| <= 1 (float32), so this offset orders every zero vector after every real one


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
) -> list[Tensor]:
    """The cover selections of ``bank`` (N, C, H, W), one per row of ``excluded`` (F, N) bool
    (default: one selection of the whole bank), in the module's exact semantics: each (K, H, W)
    int64 bank indices in selection order, K = ``min(k, candidates)``. Runs on
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
    step = min(chunk_pixels or total, _chunk_pixels(n, c, f, total))  # never past CHUNK_BYTES of work
    candidate = (~excluded).to(torch.float64)  # (F, N)
    never = excluded.to(torch.float32).masked_fill(excluded, torch.inf)  # (F, N): +inf, never chosen
    lowest = torch.argmax((~excluded).to(torch.int8), dim=1)  # (F,): where a pixel all padding starts
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
        first = torch.where(torch.isinf(sums).all(dim=2), lowest[:, None], first)
        offset = never[:, None, :] + (empty.to(torch.float32) * LAST)[None]  # (F, P, N)
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
        if progress is not None:
            progress(p1, total)
    result = []
    for i, size in enumerate(sizes):
        if size == int(n - excluded[i].sum()):  # every candidate: in index order
            result.append(torch.nonzero(~excluded[i]).view(-1, 1, 1).expand(size, h, w).contiguous())
        else:
            result.append(out[i, :size].reshape(size, h, w).clone())
    return result


def nearest_sheet_distances(bank: Tensor, indices: Tensor) -> Tensor:
    """(N, H, W) float32: per pixel, the chord distance ``sqrt(2 (1 - cos))`` from each bank
    vector to its nearest sheet of ``indices`` (K, H, W), NaN for a zero vector (letterbox
    padding, which matches nothing). Its largest value at a pixel is the selection's radius there
    (the bound on what each ATMM match loses against ALL; module docstring)."""
    n, c, h, w = bank.shape
    x = unit_vectors(bank.reshape(n, c, h * w).permute(2, 0, 1))  # (P, N, C)
    idx = indices.to(bank.device).reshape(indices.shape[0], h * w).T  # (P, K)
    out = torch.empty((h * w, n), dtype=torch.float32, device=bank.device)
    for p0 in range(0, h * w, 256):
        xs, ks = x[p0 : p0 + 256], idx[p0 : p0 + 256]
        sheets = xs.gather(1, ks[:, :, None].expand(-1, -1, c))
        best = torch.bmm(xs, sheets.transpose(1, 2)).amax(dim=2).clamp(max=1.0)  # (P, N)
        out[p0 : p0 + 256] = (2 * (1 - best)).clamp_min(0).sqrt().scatter_(1, ks, 0.0)  # a sheet: itself
    out[x.abs().amax(dim=2) == 0] = torch.nan
    return out.T.reshape(n, h, w)


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
            folds[f][layer] = position[f][selection.cpu()]  # type: ignore[index]
    return folds
