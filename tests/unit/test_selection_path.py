"""One selection path: ``core.pts.select_layer`` is what the detector's fit
pipeline, the registry's create and the shards' hot update all run; only where PTS executes
differs. Checked against slow obvious implementations of each kind, and the three callers
against each other on the same bank.
"""

from __future__ import annotations

import ast
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO
from reference_impls import cover_reference

from hetmm_ray.config import TASK_CPUS, BackboneConfig, DetectorConfig, ScoringConfig, TemplateConfig
from hetmm_ray.core.cover import cover_similarities, unit_vectors
from hetmm_ray.core.pts import kmeans_centres, pts_indices, select_layer, select_layers
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.distributed.pts_fanout import pts_indices_ray
from hetmm_ray.distributed.shard import LayerShard

PACKAGE = REPO / "hetmm_ray"


def _bank(n: int, seed: int, c: int = 6, h: int = 3, w: int = 4, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(3, c, h, w, generator=g), dim=1)
    pick = torch.randint(0, 3, (n,), generator=g)
    return F.normalize(centres[pick] + 0.3 * torch.randn(n, c, h, w, generator=g), dim=1).to(dtype)


# --- slow obvious implementations ------------------------------------------------------
def _slow_cover(bank: torch.Tensor, k: int) -> torch.Tensor:
    """The cover kind one pixel at a time, by its plain reference (reference_impls.py)."""
    _n, _c, h, w = bank.shape
    out = torch.empty((min(k, bank.shape[0]), h, w), dtype=torch.int64)
    for y in range(h):
        for x in range(w):
            xv = unit_vectors(bank[:, :, y, x])
            out[:, y, x] = torch.tensor(cover_reference(xv, cover_similarities(xv[None])[0], k))
    return out


def _slow_ir(n: int, k: int, h: int, w: int, seed: int) -> torch.Tensor:
    """The same first min(k, N) images of one seeded permutation at every pixel."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: min(k, n)].tolist()
    out = torch.empty((len(perm), h, w), dtype=torch.int64)
    for i, image in enumerate(perm):
        for y in range(h):
            for x in range(w):
                out[i, y, x] = image
    return out


def _slow_pr(n: int, k: int, h: int, w: int, seed: int) -> torch.Tensor:
    """Per pixel, the images in order of one seeded (N, H, W) uniform draw, first min(k, N)."""
    draw = torch.rand((n, h, w), generator=torch.Generator().manual_seed(seed))
    out = torch.empty((min(k, n), h, w), dtype=torch.int64)
    for y in range(h):
        for x in range(w):
            order = sorted(range(n), key=lambda i, y=y, x=x: (float(draw[i, y, x]), i))
            out[:, y, x] = torch.tensor(order[: min(k, n)])
    return out


def _slow_pts(bank: torch.Tensor, k: int, init: str, seed: int) -> torch.Tensor:
    """PTS one pixel at a time (the batched code's contract: pixels are independent)."""
    n, _c, h, w = bank.shape
    out = torch.empty((min(k, n), h, w), dtype=torch.int64)
    for y in range(h):
        for x in range(w):
            out[:, y, x] = pts_indices(bank[:, :, y : y + 1, x : x + 1], k, init, seed=seed)[:, 0, 0]
    return out


def _slow_pc_k(bank: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Spherical k-means per pixel on the float64-normalised vectors, centres re-normalised."""
    _n, c, h, w = bank.shape
    out = torch.empty((k, c, h, w), dtype=torch.float32)
    for y in range(h):
        for x in range(w):
            v = bank[:, :, y, x].to(torch.float64)
            v = (v / v.norm(dim=1, keepdim=True)).to(torch.float32).numpy()
            centres = torch.from_numpy(kmeans_centres(v, k, seed))
            out[:, :, y, x] = centres / centres.norm(dim=1, keepdim=True)
    return out.to(bank.dtype)


@pytest.mark.parametrize("kind", ["ir", "pr", "pts_o", "pts_k", "pc_k", "cover", "all"])
@pytest.mark.parametrize("k", [4, 30])
def test_select_layer_equals_the_slow_obvious_selection(kind: str, k: int) -> None:
    bank = _bank(12, seed=1)
    n, _, h, w = bank.shape
    got = select_layer(bank, kind, k, seed=3)
    if kind == "all" or (kind in ("pc_k", "cover") and k >= n):
        assert got.indices is None and got.centres is None
        return
    if kind == "pc_k":
        assert got.indices is None and got.centres is not None and got.centres.dtype == bank.dtype
        assert torch.allclose(got.centres.float(), _slow_pc_k(bank, k, 3).float(), atol=2e-3)
        return
    want = {
        "ir": lambda: _slow_ir(n, k, h, w, 3),
        "pr": lambda: _slow_pr(n, k, h, w, 3),
        "pts_o": lambda: _slow_pts(bank, k, "optics", 3),
        "pts_k": lambda: _slow_pts(bank, k, "kmeans", 3),
        "cover": lambda: _slow_cover(bank, k),
    }[kind]()
    assert got.centres is None and got.indices is not None
    assert got.indices.dtype == torch.int64 and got.indices.device.type == "cpu"
    assert torch.equal(got.indices, want)


def test_all_ignores_sheets_and_other_kinds_need_an_integer() -> None:
    bank = _bank(5, seed=3)
    done: list[tuple[int, int]] = []
    assert select_layer(bank, "all", "auto", progress=lambda d, t: done.append((d, t))) == select_layer(bank, "all", 3)
    assert done == [(12, 12)]
    with pytest.raises(ValueError, match="k must be an integer"):
        select_layer(bank, "pts_o", "auto")
    with pytest.raises(ValueError, match="unknown selection"):
        select_layer(bank, "pts", 3)


@pytest.mark.parametrize("kind", ["pts_o", "pr", "pc_k"])
def test_the_three_callers_choose_the_same_templates(kind: str) -> None:
    """The detector (in process), the registry's create (``select_layers`` with the Ray PTS step;
    the bank is smaller than a chunk, so it runs here) and a shard's re-selection agree."""
    bank = {"layer2": _bank(10, seed=4), "layer3": _bank(10, seed=5, c=8, h=2, w=2)}
    tc = TemplateConfig(kind=kind, sheets=4, seed=1)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64, layers=("layer2", "layer3")),
        scoring=ScoringConfig(forward_windows=(3, 3), backward_windows=(3, 3), alphas=(0.5, 0.5), layer_weights=(1, 1)),
        templates=tc,
        bank_dtype="float16",
    )
    ts = TemplateSet(bank=bank, config=config, weights_id="w", image_digests=tuple(f"d{i}" for i in range(10)))
    detector = HETMM(config).pipeline.select(ts, tc)
    registry = select_layers(bank, kind, 4, 1, pts=partial(pts_indices_ray, num_cpus=TASK_CPUS))
    shards: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})
    for layer, b in bank.items():
        shard = LayerShard("gear", layer, b.numpy())
        shard.select(kind, 4, 1, chunk_pixels=10**6)
        if shard.indices is not None:
            shards[0][layer] = shard.indices
        if shard.centres is not None:
            shards[1][layer] = shard.centres
    for got in (registry, (shards[0] or None, shards[1] or None)):
        for mine, theirs in zip(detector, got, strict=True):
            assert (mine is None) == (theirs is None)
            if mine is not None:
                assert mine.keys() == theirs.keys()
                assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def _calls(tree: ast.AST) -> set[str]:
    """Called names: ``f`` for ``f(...)``, ``x.f`` for ``x.f(...)`` (``x`` a plain name) and ``.f`` otherwise."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                names.add(f"{f.value.id}.{f.attr}" if isinstance(f.value, ast.Name) else f".{f.attr}")
            elif isinstance(f, ast.Name):
                names.add(f.id)
    return names


def test_selection_and_the_gather_are_written_once() -> None:
    """Outside ``core/pts.py`` (and ``core/cover.py``, the cover kind itself, whose gathers are of
    similarity rows) nothing runs a selection kind by itself or gathers templates: callers go
    through ``select_layer`` / ``select_layers`` and ``select_templates``; the calibration's
    one-pass cover folds (``cover_folds``) are the cover kind's own."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("pts.py", "cover.py") and path.parent.name == "core":
            continue
        calls = _calls(ast.parse(path.read_text()))
        gathers = {c for c in calls if c.endswith("gather") and c != "asyncio.gather"}
        bad = gathers | (calls & {"select", "pts_indices", "kmeans_centres", "cover_indices"})
        if path.name == "pts_fanout.py":
            bad -= {"pts_indices"}  # the Ray PTS step runs the same pts_indices per chunk
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert offenders == {}
    users = {
        p: {n.id for n in ast.walk(ast.parse((PACKAGE / p).read_text())) if isinstance(n, ast.Name)}
        for p in ("detection/fitting.py", "distributed/shard.py")  # the registry selects through fitting's pipeline
    }
    assert {p: bool(c & {"select_layer", "select_layers"}) for p, c in users.items()} == dict.fromkeys(users, True)


def test_numpy_bank_of_a_shard_selects_like_the_tensor() -> None:
    b = _bank(9, seed=6)
    shard = LayerShard("gear", "layer2", np.ascontiguousarray(b.numpy()))
    assert shard.select("pts_o", 3, chunk_pixels=10**6) == 3
    assert torch.equal(shard.indices, select_layer(b, "pts_o", 3).indices)


@pytest.mark.parametrize("selected", [False, True])
def test_rows_gathered_pixel_major_are_the_sub_banks_templates(selected: bool) -> None:
    """``select_rows_pixel_major`` on the whole bank laid out once equals, pixel by pixel, the
    sub-bank of those rows selected (``select_templates``) and then laid out."""
    from hetmm_ray.core.atmm import pixel_major
    from hetmm_ray.core.pts import select_rows_pixel_major, select_templates

    bank = _bank(9, seed=11, dtype=torch.float32)
    rows = torch.tensor([7, 0, 3, 5, 8])
    sub = bank[rows]
    indices = select_layer(sub, "pts_o", 3).indices if selected else None
    got = select_rows_pixel_major(pixel_major(bank), rows, indices)
    _n, _c, h, w = bank.shape
    for y in range(h):
        for x in range(w):
            images = indices[:, y, x].tolist() if indices is not None else list(range(len(rows)))
            want = torch.stack([sub[i, :, y, x] for i in images])
            assert torch.equal(got[y * w + x], want)
    if indices is not None:
        assert torch.equal(got, pixel_major(select_templates(sub, indices)))
