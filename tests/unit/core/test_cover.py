"""The cover selection (``templates.kind: cover``, core/cover.py) against its plain reference,
its radius against a brute-force coverage, the bound it gives ATMM's matches, and the folds of a
calibration in one pass against a selection per fold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference_impls import cover_reference

from hetmm_ray.core.cover import cover_folds, cover_indices, cover_similarities, nearest_sheet_distances, unit_vectors
from hetmm_ray.core.pts import select_layer


def _bank(n: int, seed: int, c: int = 5, h: int = 3, w: int = 4, clusters: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(clusters, c, h, w, generator=g), dim=1)
    pick = torch.randint(0, clusters, (n,), generator=g)
    return F.normalize(centres[pick] + 0.4 * torch.randn(n, c, h, w, generator=g), dim=1)


def _radius(bank: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """(H, W) radius of a selection: the largest distance from a real bank vector to its nearest sheet."""
    return nearest_sheet_distances(bank, indices).nan_to_num(0.0).amax(dim=0)


def _reference(bank: torch.Tensor, k: int, excluded: torch.Tensor | None = None) -> torch.Tensor:
    _n, _c, h, w = bank.shape
    cols = []
    for y in range(h):
        for x in range(w):
            xv = unit_vectors(bank[:, :, y, x])
            cols.append(cover_reference(xv, cover_similarities(xv[None])[0], k, excluded))
    return torch.tensor(cols).T.reshape(-1, h, w)


@pytest.mark.parametrize("k", [1, 2, 7, 15, 22, 40])
@pytest.mark.parametrize("padded", [False, True])
def test_cover_equals_the_plain_reference_for_every_selection(k: int, padded: bool) -> None:
    n = 23
    bank = _bank(n, seed=k)
    if padded:  # letterbox padding: zero vectors, taken only after every real one
        bank[3, :, 0, :] = 0
        bank[7, :, 1, 1] = 0
        bank[:, :, 2, 3] = 0  # a pixel that is padding in every image
    excluded = torch.zeros((4, n), dtype=torch.bool)
    excluded[1, ::3] = True
    excluded[2, 5:] = True
    excluded[3, 1::2] = True
    chosen = cover_indices(bank, k, excluded=excluded, chunk_pixels=5)
    for f in range(4):
        assert torch.equal(chosen[f], _reference(bank, k, excluded[f])), f
        kept = int((~excluded[f]).sum())
        assert chosen[f].shape[0] == min(k, kept)
        assert not bool(excluded[f][chosen[f]].any())  # a held-out image never gives a sheet


def test_padding_is_taken_last() -> None:
    bank = _bank(12, seed=3)
    bank[[0, 4], :, 1, 2] = 0
    chosen = cover_indices(bank, 11)[0][:, 1, 2].tolist()
    assert set(chosen[:10]) == set(range(12)) - {0, 4}  # the ten real vectors first


def test_whole_bank_when_k_reaches_it() -> None:
    bank = _bank(9, seed=1)
    chosen = cover_indices(bank, 9)[0]
    assert torch.equal(chosen, torch.arange(9).view(9, 1, 1).expand(9, 3, 4))
    assert float(_radius(bank, chosen).abs().max()) == 0.0
    assert select_layer(bank, "cover", 9).indices is None  # the whole bank: ALL, nothing stored
    assert select_layer(bank, "cover", 50).indices is None
    assert select_layer(bank, "cover", 4).indices.shape == (4, 3, 4)


def test_radius_is_the_brute_force_coverage_and_bounds_every_match() -> None:
    """Every bank vector lies within the pixel's radius of a sheet (chord distance), and for any
    query the nearest sheet is at most the nearest bank vector plus the radius: ATMM's match in
    either direction loses at most that much against ALL."""
    bank = _bank(40, seed=5, c=6)
    k = 8
    chosen = cover_indices(bank, k)[0]
    radius = _radius(bank, chosen)
    _n, c, h, w = bank.shape
    g = torch.Generator().manual_seed(9)
    queries = F.normalize(torch.randn(30, c, generator=g), dim=1)
    for y in range(h):
        for x in range(w):
            xv = F.normalize(bank[:, :, y, x].double(), dim=1)
            sheets = xv[chosen[:, y, x]]
            nearest = (2 * (1 - (xv @ sheets.T).amax(dim=1).clamp(max=1))).clamp_min(0).sqrt()
            assert float(radius[y, x]) == pytest.approx(float(nearest.max()), abs=1e-5)
            q = queries.double()
            to_bank = (2 * (1 - (q @ xv.T).amax(dim=1).clamp(max=1))).clamp_min(0).sqrt()
            to_sheets = (2 * (1 - (q @ sheets.T).amax(dim=1).clamp(max=1))).clamp_min(0).sqrt()
            assert bool((to_sheets >= to_bank - 1e-6).all())  # never better than ALL
            assert bool((to_sheets <= to_bank + radius[y, x] + 1e-5).all())


def test_radius_shrinks_as_k_grows() -> None:
    bank = _bank(60, seed=2)
    radii = [float(_radius(bank, cover_indices(bank, k)[0]).mean()) for k in (2, 5, 10, 20, 40)]
    assert radii == sorted(radii, reverse=True)
    assert radii[-1] < radii[0]


def test_folds_in_one_pass_equal_one_selection_per_fold() -> None:
    """The calibration's folds (``cover_folds``): each fold's indices, into its kept bank, are the
    selection a refit on the kept images alone makes."""
    n = 30
    bank = {"a": _bank(n, seed=11), "b": _bank(n, seed=12, c=3, h=2, w=2)}
    held = [[0, 4, 9], list(range(10, 25)), [1, 2, 3, 29], list(range(0, 30, 2))]
    k = 12
    folds = cover_folds(bank, k, held)
    for f, out in enumerate(held):
        kept = [i for i in range(n) if i not in set(out)]
        if len(kept) <= k:
            assert folds[f] is None  # the whole kept bank, as ALL's
            continue
        for layer, b in bank.items():
            alone = cover_indices(b[kept], k)[0]
            assert torch.equal(folds[f][layer], alone), (f, layer)


def test_bad_input_is_refused() -> None:
    bank = _bank(5, seed=0)
    with pytest.raises(ValueError, match="k must be"):
        cover_indices(bank, 0)
    with pytest.raises(ValueError, match="every image"):
        cover_indices(bank, 2, excluded=torch.ones((1, 5), dtype=torch.bool))
    with pytest.raises(ValueError, match="excluded"):
        cover_indices(bank, 2, excluded=torch.zeros((1, 4), dtype=torch.bool))
    bad = bank.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        cover_indices(bad, 2)
