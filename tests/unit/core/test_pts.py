"""PTS and batched OPTICS against slow per-pixel references (docs/algorithm.md §4).

The references run scikit-learn per pixel and then §4 in plain Python loops, on
exactly the float64 matrices the batched code uses (``pixel_similarities``), so
every comparison is exact, ties included.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from reference_impls import select
from sklearn.cluster import OPTICS, cluster_optics_xi, compute_optics_graph

from hetmm_ray.core.cover import cover_indices
from hetmm_ray.core.optics import (
    cosine_distances,
    cosine_similarities,
    optics_graph,
    optics_labels,
    xi_labels,
)
from hetmm_ray.core.pts import (
    SELECTION_KINDS,
    cluster_medoids,
    kmeans_centres,
    pixel_similarities,
    pts_indices,
    select_templates,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:All reachability values are inf"),
    # scikit-learn's own Xi code divides by zero reachabilities (duplicates) in the references
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]


def sklearn_xi_labels(graph, min_samples: int, xi: float) -> torch.Tensor:
    """scikit-learn's ``cluster_optics_xi`` per set of ``graph`` (what ``xi_labels`` ports)."""
    ordering = graph.ordering.cpu().numpy()
    reach = graph.reachability.cpu().numpy()
    pred = graph.predecessor.cpu().numpy()
    out = np.empty(ordering.shape, dtype=np.int64)
    # Duplicate points give zero reachabilities; the steepness ratios then
    # divide by zero (harmlessly: inf compares as intended) and numpy would warn.
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(len(out)):
            out[i], _ = cluster_optics_xi(
                reachability=reach[i],
                predecessor=pred[i],
                ordering=ordering[i],
                min_samples=min_samples,
                min_cluster_size=None,
                xi=xi,
                predecessor_correction=True,
            )
    return torch.from_numpy(out)


# --- banks ---------------------------------------------------------------------------
def _unit(x: np.ndarray, axis: int = 1) -> np.ndarray:
    return x / np.linalg.norm(x, axis=axis, keepdims=True)


def _bank(x: np.ndarray, h: int, w: int) -> torch.Tensor:
    """(H*W, N, C) vectors -> (N, C, H, W) float32 bank."""
    hw, n, c = x.shape
    assert hw == h * w
    return torch.from_numpy(np.ascontiguousarray(x.transpose(1, 2, 0).reshape(n, c, h, w))).float()


def gaussian_bank(rng: np.random.Generator, n: int, c: int = 8, h: int = 2, w: int = 3) -> torch.Tensor:
    return _bank(_unit(rng.standard_normal((h * w, n, c)), 2), h, w)


def clustered_bank(
    rng: np.random.Generator, n: int, c: int = 8, h: int = 2, w: int = 3, groups: int = 4
) -> torch.Tensor:
    centres = rng.standard_normal((h * w, groups, c))
    member = rng.integers(0, groups, (h * w, n))
    x = np.take_along_axis(centres, member[..., None], axis=1) + 0.15 * rng.standard_normal((h * w, n, c))
    return _bank(_unit(x, 2), h, w)


def few_vectors_bank(
    rng: np.random.Generator, n: int, distinct: int, c: int = 8, h: int = 2, w: int = 2
) -> torch.Tensor:
    """Every vector drawn from a small set: many exact duplicates."""
    base = _unit(rng.standard_normal((h * w, distinct, c)), 2)
    pick = rng.integers(0, distinct, (h * w, n))
    return _bank(np.take_along_axis(base, pick[..., None], axis=1), h, w)


def dyadic_bank(rng: np.random.Generator, n: int, c: int = 8, h: int = 2, w: int = 2) -> torch.Tensor:
    """Unit vectors with four entries of +-1/2: every similarity and every sum is exact, so ties are real ties."""
    x = np.zeros((h * w, n, c))
    for i in range(h * w):
        for j in range(n):
            pos = rng.choice(c, 4, replace=False)
            x[i, j, pos] = rng.choice([-0.5, 0.5], 4)
    return _bank(x, h, w)


def circle_bank(n: int, h: int = 1, w: int = 2) -> torch.Tensor:
    """Evenly spread points on a circle: equal reachabilities, OPTICS finds no cluster."""
    a = 2 * np.pi * np.arange(n) / n
    x = np.stack([np.cos(a), np.sin(a), np.zeros(n)], axis=1)
    return _bank(np.repeat(x[None], h * w, axis=0), h, w)


def make_bank(kind: str, rng: np.random.Generator, n: int, distinct: int = 3) -> torch.Tensor:
    if kind == "gaussian":
        return gaussian_bank(rng, n)
    if kind == "clustered":
        return clustered_bank(rng, n)
    if kind == "few":
        return few_vectors_bank(rng, n, distinct=distinct)
    if kind == "dyadic":
        return dyadic_bank(rng, n)
    assert kind == "circle"
    return circle_bank(n)


BANK_KINDS = ("gaussian", "clustered", "few", "dyadic", "circle")


# --- the slow reference ----------------------------------------------------------------
def reference_pts(sim: np.ndarray, k: int) -> list[int]:
    """docs/algorithm.md §4 for one pixel, step by step, with scikit-learn's OPTICS."""
    n = sim.shape[0]
    if k >= n:
        return list(range(n))
    dist = cosine_distances(torch.from_numpy(sim)).numpy()
    labels = OPTICS(metric="precomputed", min_samples=max(2, n // k)).fit(dist).labels_
    clusters: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        if lab >= 0:
            clusters.setdefault(int(lab), []).append(i)
    groups = sorted(clusters.values(), key=min) if clusters else [list(range(n))]
    chosen: list[int] = []
    for members in groups:
        if len(chosen) == k:
            break
        best, best_sum = -1, -math.inf
        for i in members:
            s = 0.0
            for j in members:
                if j != i:
                    s += float(sim[i, j])
            if s > best_sum:
                best, best_sum = i, s
        chosen.append(best)
    return _reference_complete(sim, chosen, k)


def _reference_complete(sim: np.ndarray, chosen: list[int], k: int) -> list[int]:
    n = sim.shape[0]
    sums = [0.0] * n
    for c in chosen:
        for q in range(n):
            sums[q] += float(sim[c, q])
    while len(chosen) < k:
        best = min((q for q in range(n) if q not in chosen), key=lambda q: (sums[q], q))
        chosen.append(best)
        for q in range(n):
            sums[q] += float(sim[best, q])
    return chosen


def reference_pts_kmeans(unit: np.ndarray, sim: np.ndarray, k: int, seed: int) -> list[int]:
    """PTS_K for one pixel: faiss centres -> nearest samples (deduplicated) -> hard normals.

    ``unit``: the pixel's float64 unit vectors, normalised as PTS does.
    """
    n = sim.shape[0]
    if k >= n:
        return list(range(n))
    x = unit
    centres = kmeans_centres(x.astype(np.float32), k, seed).astype(np.float64)
    centres = centres / np.linalg.norm(centres, axis=1, keepdims=True)
    chosen: list[int] = []
    for c in centres:
        nearest = int(np.argmax(x @ c))
        if nearest not in chosen:
            chosen.append(nearest)
    return _reference_complete(sim, chosen, k)


def check_against_reference(bank: torch.Tensor, k: int) -> torch.Tensor:
    got = pts_indices(bank, k)
    n, _, h, w = bank.shape
    assert got.shape == (min(k, n), h, w) and got.dtype == torch.int64
    sims = pixel_similarities(bank).numpy()
    flat = got.reshape(got.shape[0], -1)
    for pix in range(h * w):
        assert flat[:, pix].tolist() == reference_pts(sims[pix], k), f"pixel {pix}, N={n}, K={k}"
    return got


# --- batched OPTICS == scikit-learn ---------------------------------------------------
def _sklearn_graph(dist: np.ndarray, m: int):
    return compute_optics_graph(
        dist,
        min_samples=m,
        max_eps=np.inf,
        metric="precomputed",
        p=2,
        metric_params=None,
        algorithm="auto",
        leaf_size=30,
        n_jobs=None,
    )


@pytest.mark.parametrize("kind", BANK_KINDS)
def test_optics_graph_and_labels_match_sklearn(kind: str) -> None:
    rng = np.random.default_rng(BANK_KINDS.index(kind))
    for n in (3, 7, 24, 61):
        bank = make_bank(kind, rng, n)
        dist = cosine_distances(pixel_similarities(bank))
        for m in sorted({2, 3, max(2, n // 4), n}):
            graph = optics_graph(dist.clone(), m)
            labels = optics_labels(dist.clone(), m)
            for pix in range(dist.shape[0]):
                ref = OPTICS(metric="precomputed", min_samples=m).fit(dist[pix].numpy())
                np.testing.assert_array_equal(graph.ordering[pix].numpy(), ref.ordering_)
                np.testing.assert_array_equal(graph.core_distances[pix].numpy(), ref.core_distances_)
                np.testing.assert_array_equal(graph.reachability[pix].numpy(), ref.reachability_)
                np.testing.assert_array_equal(graph.predecessor[pix].numpy(), ref.predecessor_)
                np.testing.assert_array_equal(labels[pix].numpy(), ref.labels_)


def test_optics_graph_equals_compute_optics_graph() -> None:
    # The function the module reproduces, called directly (OPTICS.fit goes through it too).
    rng = np.random.default_rng(4)
    dist = cosine_distances(pixel_similarities(few_vectors_bank(rng, 30, distinct=4)))
    for m in (2, 5, 30):
        graph = optics_graph(dist.clone(), m)
        for pix in range(dist.shape[0]):
            want = _sklearn_graph(dist[pix].numpy(), m)
            got = (graph.ordering, graph.core_distances, graph.reachability, graph.predecessor)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g[pix].numpy(), w)


def test_xi_port_equals_sklearn_xi() -> None:
    # The ported Xi extraction against scikit-learn's cluster_optics_xi on many
    # small graphs: duplicates, exact ties, clusters, every min_samples and several xi.
    rng = np.random.default_rng(21)
    for trial in range(120):
        n = int(rng.integers(2, 60))
        kind = BANK_KINDS[trial % 4]
        bank = make_bank(kind, rng, n, distinct=int(rng.integers(1, 5))) if n > 2 else gaussian_bank(rng, n)
        dist = cosine_distances(pixel_similarities(bank))
        m = int(rng.integers(2, n + 1))
        graph = optics_graph(dist, m)
        for xi in (0.05, float(rng.choice([0.01, 0.2, 0.5]))):
            assert torch.equal(xi_labels(graph, m, xi), sklearn_xi_labels(graph, m, xi))


def test_cosine_matrices_are_exact_distance_matrices() -> None:
    x = torch.randn(5, 30, 16)
    s = cosine_similarities(x)
    d = cosine_distances(s)
    assert s.dtype == torch.float64 and torch.equal(s, s.transpose(1, 2))
    assert torch.equal(d, d.transpose(1, 2))
    assert bool((d >= 0).all()) and bool((d <= 2).all())
    assert bool((d.diagonal(dim1=1, dim2=2) == 0).all())


def test_optics_rejects_bad_input() -> None:
    d = cosine_distances(cosine_similarities(torch.randn(2, 5, 3)))
    with pytest.raises(ValueError, match="min_samples"):
        optics_graph(d, 6)
    with pytest.raises(TypeError, match="float64"):
        optics_graph(d.float(), 2)
    with pytest.raises(ValueError, match="non-negative"):
        optics_graph(d - 1, 2)


def test_xi_always_finds_a_cluster() -> None:
    # With max_eps=inf the reachability plot starts at inf and sklearn appends an
    # inf at its end, so Xi always yields at least the whole range [0, N-1]:
    # no pixel is ever all noise, even for evenly spread points.
    for n in (3, 10, 40):
        dist = cosine_distances(pixel_similarities(circle_bank(n)))
        for m in range(2, n + 1):
            assert bool((optics_labels(dist, m) >= 0).any(dim=1).all())


def test_all_noise_falls_back_to_the_global_medoid() -> None:
    # Unreachable through scikit-learn's OPTICS (see above), so checked directly.
    rng = np.random.default_rng(9)
    for bank in (gaussian_bank(rng, 17), few_vectors_bank(rng, 17, distinct=3), dyadic_bank(rng, 17)):
        sims = pixel_similarities(bank)
        first, count = cluster_medoids(sims, torch.full(sims.shape[:2], -1), 5)
        assert count.tolist() == [1] * sims.shape[0]
        for pix, sim in enumerate(sims.numpy()):
            totals = [sum(float(sim[i, j]) for j in range(17) if j != i) for i in range(17)]
            assert int(first[pix, 0]) == max(range(17), key=lambda i: (totals[i], -i))


# --- PTS == the reference -------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 30])
def test_pts_matches_reference_all_k(n: int) -> None:
    rng = np.random.default_rng(100 + n)
    bank = clustered_bank(rng, n, h=1, w=3) if n > 4 else gaussian_bank(rng, n, h=1, w=3)
    for k in range(1, n + 6):
        check_against_reference(bank, k)


@pytest.mark.parametrize(
    ("kind", "n", "ks"),
    [
        ("gaussian", 50, (1, 3, 10, 24, 26, 49)),
        ("clustered", 80, (1, 5, 20, 41, 60)),
        ("few", 40, (1, 2, 4, 9, 21, 39)),
        ("few", 25, (3, 13, 24)),
        ("dyadic", 40, (1, 4, 7, 20, 33)),
        ("circle", 40, (1, 5, 8, 19)),
    ],
)
def test_pts_matches_reference(kind: str, n: int, ks: tuple[int, ...]) -> None:
    rng = np.random.default_rng(n)
    bank = make_bank(kind, rng, n, distinct=2 if n == 25 else 5)
    for k in ks:
        check_against_reference(bank, k)


def test_pts_more_clusters_than_k() -> None:
    # Ten tight groups of three (the last of two) and min_samples = 29 // 8 = 3:
    # nine clusters for K = 8, so the easy-normal step must stop at K.
    rng = np.random.default_rng(0)
    member = np.repeat(np.arange(10), 3)[:29]
    x = rng.standard_normal((3, 10, 16))[:, member] + 0.02 * rng.standard_normal((3, 29, 16))
    bank = _bank(_unit(x, 2), 1, 3)
    labels = optics_labels(cosine_distances(pixel_similarities(bank)), 29 // 8)
    assert (labels.max(dim=1).values + 1).tolist() == [9, 9, 9]
    for k in (8, 9, 12):
        check_against_reference(bank, k)


def test_pts_matches_reference_large() -> None:
    rng = np.random.default_rng(7)
    check_against_reference(clustered_bank(rng, 300, c=16, h=1, w=1, groups=6), 10)
    check_against_reference(clustered_bank(rng, 209, c=16, h=1, w=2, groups=8), 60)


def test_pts_chunking_and_progress() -> None:
    rng = np.random.default_rng(3)
    bank = clustered_bank(rng, 30, h=3, w=4)
    calls: list[tuple[int, int]] = []
    whole = pts_indices(bank, 7)
    chunked = pts_indices(bank, 7, chunk_pixels=5, progress=lambda d, t: calls.append((d, t)))
    assert torch.equal(whole, chunked)
    assert calls == [(5, 12), (10, 12), (12, 12)]


def test_pts_whole_bank_when_k_at_least_n() -> None:
    bank = gaussian_bank(np.random.default_rng(0), 6)
    for k in (6, 9):
        got = pts_indices(bank, k)
        assert torch.equal(got, torch.arange(6).view(6, 1, 1).expand(6, 2, 3))


def test_pts_rejects_bad_arguments() -> None:
    bank = gaussian_bank(np.random.default_rng(0), 6)
    with pytest.raises(ValueError, match="k must be"):
        pts_indices(bank, 0)
    with pytest.raises(ValueError, match="init"):
        pts_indices(bank, 2, init="dbscan")
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        pts_indices(bank[0], 2)
    bad = bank.clone()
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        pts_indices(bad, 2)


def test_pts_kmeans_matches_reference() -> None:
    rng = np.random.default_rng(11)
    bank = clustered_bank(rng, 40, h=1, w=3)
    sims = pixel_similarities(bank).numpy()
    vectors = bank.reshape(40, 8, -1).permute(2, 0, 1).double()
    vectors = (vectors / vectors.norm(dim=-1, keepdim=True)).numpy()
    for k in (1, 4, 15, 39):
        got = pts_indices(bank, k, init="kmeans", seed=5)
        assert torch.equal(got, pts_indices(bank, k, init="kmeans", seed=5))
        flat = got.reshape(k, -1)
        for pix in range(3):
            assert flat[:, pix].tolist() == reference_pts_kmeans(vectors[pix], sims[pix], k, 5)


# --- gather and baselines -------------------------------------------------------------
def test_select_templates_is_a_per_pixel_gather() -> None:
    bank = torch.randn(7, 5, 3, 4)
    idx = torch.randint(0, 7, (4, 3, 4))
    got = select_templates(bank, idx)
    want = torch.empty(4, 5, 3, 4)
    for k in range(4):
        for y in range(3):
            for x in range(4):
                want[k, :, y, x] = bank[idx[k, y, x], :, y, x]
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="do not fit"):
        select_templates(bank, idx[:, :2])


@pytest.mark.parametrize("kind", SELECTION_KINDS)
def test_selection_variants(kind: str) -> None:
    rng = np.random.default_rng(5)
    bank = clustered_bank(rng, 20, h=2, w=3)
    n, c, h, w = bank.shape
    for k in (4, 25):
        a = select(kind, bank, k, seed=3)
        b = select(kind, bank, k, seed=3)
        kk = n if kind == "all" else min(k, n)
        assert a.kind == kind and a.templates.shape == (kk, c, h, w)
        assert torch.equal(a.templates, b.templates)
        if kind in ("all", "pc_k") or (kind == "cover" and k >= n):  # cover of the whole bank: ALL
            assert a.indices is None
        else:
            assert a.indices is not None and b.indices is not None
            assert a.indices.shape == (kk, h, w) and torch.equal(a.indices, b.indices)
            assert torch.equal(a.templates, select_templates(bank, a.indices))
            # every pixel selects distinct images
            assert all(len(set(col.tolist())) == kk for col in a.indices.reshape(kk, -1).T)
        if kind == "pc_k":
            norms = a.templates.norm(dim=1)
            assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
    if kind in ("ir", "pr", "pts_k", "pc_k"):
        # a different seed draws differently (for these banks, with overwhelming probability)
        assert not torch.equal(select(kind, bank, 4, seed=3).templates, select(kind, bank, 4, seed=4).templates)
    if kind == "ir":
        idx = select(kind, bank, 4, seed=3).indices
        assert idx is not None and bool((idx == idx[:, :1, :1]).all())
    if kind == "pts_o":
        assert torch.equal(select(kind, bank, 4).indices, pts_indices(bank, 4))
    if kind == "cover":
        assert torch.equal(select(kind, bank, 4).indices, cover_indices(bank, 4)[0])


def test_unknown_selection() -> None:
    with pytest.raises(ValueError, match="unknown selection"):
        select("best", torch.randn(3, 2, 1, 1), 2)


def test_no_warnings_leak_from_faiss_or_sklearn() -> None:
    bank = clustered_bank(np.random.default_rng(2), 12, h=1, w=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pts_indices(bank, 3)
