"""Tiles (issue 22): where a tiled product's frame scores come from, and the seam rule, measured.

    python benchmarks/bench_tile_seams.py ../shared/data/mvtec_ad/bottle --grid 2x2
    python benchmarks/bench_tile_seams.py ../shared/data/bsd_pitting --grid auto
    python benchmarks/bench_tile_seams.py surface                      # 2048 x 2048, tiles auto

One fit and one predict of the tiled product (default backbone, ALL templates, ``--overlap`` px,
``hetmm_ray/tiled.py``), keeping every tile's fused map: the out-of-fold maps each position's
calibration scored and the test frames' maps. Then:

1. **Where the scores come from**: the good test frames that score highest and the defective ones
   that score lowest under today's rule (each tile's score over its own far-1 % scale, maximum
   over tiles), with each tile's normalised score, the winning tile and where its maximum lies
   (map pixels from the tile's canvas edge that borders another tile), and the share of each
   position's out-of-fold maxima that lie within ``--edge`` map pixels of such an interior edge.
2. **Rules**: the frame score when a tile's maximum is taken over the whole tile (today) or only
   over the pixels it *owns* (those nearer its own centre than a neighbour's: the overlaps split at
   their middle, a frame edge kept), optionally less a further margin of map pixels along interior
   edges, each with the per-position scale from the far-1 % threshold or the median of that
   position's out-of-fold scores; each frame threshold is calibrated the product's way (far 1 % on
   the per-frame maxima of the normalised out-of-fold scores). Image AUROC, recall and false alarms
   at that threshold.

An untiled product has no interior edge: every rule is today's there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_tile_rules import add_data_arguments, data_root, grid_of, measure
from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.core.geometry import Box
from hetmm_ray.core.scoring import content_maps
from hetmm_ray.core.tiles import axis_tiles
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.tiled import TiledHETMM, frame_shape, resolve_tiles


def capture(det: TiledHETMM) -> list[list[tuple[torch.Tensor, list[Box] | None]]]:
    """Wrap each position's ``score_maps`` (this instance only) to keep its fused maps and map boxes."""
    kept: list[list[tuple[torch.Tensor, list[Box] | None]]] = [[] for _ in det.dets]
    for p, d in enumerate(det.dets):
        scorer = d.scorer
        inner = scorer.score_maps

        def wrapped(feats, prepared, boxes=None, *, progress=None, _inner=inner, _s=scorer, _k=kept[p]):
            m = _inner(feats, prepared, boxes, progress=progress)
            _k.append((m.detach().cpu(), _s.map_boxes(boxes)))
            return m

        scorer.score_maps = wrapped  # type: ignore[method-assign]
    return kept


def blurred(chunks: list[tuple[torch.Tensor, list[Box] | None]], sigma: float) -> list[torch.Tensor]:
    """Each map's content blurred as its score is (``content_maps``), in capture order."""
    return [c for m, b in chunks for c in content_maps(m, sigma, b)]


def owned(length: int, n: int, overlap: float) -> list[tuple[float, float, int]]:
    """Per tile: the (lo, hi) frame pixels it owns, tile-local (overlaps split at their middle), and its side."""
    ax = axis_tiles(length, n, overlap)
    cuts = [0.0, *[(ax[i + 1][0] + ax[i][0] + ax[i][1]) / 2 for i in range(n - 1)], float(length)]
    return [(cuts[i] - s, cuts[i + 1] - s, t) for i, (s, t) in enumerate(ax)]


def own_mask(det: TiledHETMM, p: int, frame: tuple[int, int], shape: tuple[int, int], margin: int) -> torch.Tensor:
    """Which pixels of position ``p``'s content map (``shape``) it owns, less ``margin`` map px at interior edges."""
    rows, cols = det.rows, det.cols
    r, c = divmod(p, cols)
    ylo, yhi, th = owned(frame[0], rows, det.config.geometry.tile_overlap)[r]
    xlo, xhi, tw = owned(frame[1], cols, det.config.geometry.tile_overlap)[c]
    fy, fx = shape[0] / th, shape[1] / tw
    y0, y1 = round(ylo * fy) + (margin if r > 0 else 0), round(yhi * fy) - (margin if r < rows - 1 else 0)
    x0, x1 = round(xlo * fx) + (margin if c > 0 else 0), round(xhi * fx) - (margin if c < cols - 1 else 0)
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[max(0, y0) : max(y1, y0 + 1), max(0, x0) : max(x1, x0 + 1)] = True
    return mask


def interior_distance(det: TiledHETMM, p: int, shape: tuple[int, int], y: int, x: int) -> int:
    """Map pixels from (y, x) to the nearest canvas edge of position ``p`` that borders another tile."""
    r, c = divmod(p, det.cols)
    d = [y] if r > 0 else []
    d += [shape[0] - 1 - y] if r < det.rows - 1 else []
    d += [x] if c > 0 else []
    d += [shape[1] - 1 - x] if c < det.cols - 1 else []
    return min(d) if d else 10**6


def run(data: Path, grid: list[int] | str, overlap: int, margins: list[int], edge: int) -> dict:
    category = MVTecCategory(data)
    samples = category.measurable_samples()
    train = category.train_paths()
    tiles_alone = {"geometry.tiles": grid, "geometry.tile_overlap": overlap, "geometry.tile_whole_view": False}
    config = DetectorConfig().replace(**tiles_alone)  # the tiles alone (the whole view: bench_tile_pyramid.py)
    config = resolve_tiles(config, train)
    det = TiledHETMM(config, map_size=64)
    kept = capture(det)
    det.fit(train)
    sigma = config.scoring.score_sigma
    oof = [blurred(k, sigma) for k in kept]  # fold order: the i-th map is the same frame at every position
    for k in kept:
        k.clear()
    det.predict([s.path for s in samples])
    t, n = det.n_tiles, len(samples)
    test = [blurred(k, sigma) for k in kept]  # position p: one map per frame, frame order
    labels = np.array([s.label for s in samples])
    assert det.frame is not None
    train_frame = det.frame
    frames = [frame_shape(s.path) for s in samples]

    def scores(margin: int | None) -> tuple[np.ndarray, np.ndarray]:
        def peak(m: torch.Tensor, p: int, frame: tuple[int, int]) -> float:
            if margin is None:
                return float(m.max())
            return float(m[own_mask(det, p, frame, tuple(m.shape), margin)].max())

        so = np.array([[peak(m, p, train_frame) for m in oof[p]] for p in range(t)])
        st = np.array([[peak(test[p][f], p, frames[f]) for p in range(t)] for f in range(n)])
        return so, st

    so0, st0 = scores(None)
    check = np.abs(so0 - np.array([d.templates.calibration.scores for d in det.dets])).max()
    print(
        f"--- {data.name}: {det.rows} x {det.cols} tiles, overlap {overlap} px, {n} test frames; "
        f"out-of-fold maps reproduce the calibration to {check:.2e}"
    )
    far = np.array([TailModel(so0[p]).threshold(0.01) for p in range(t)])
    ft = (st0 / far).max(axis=1)
    where = []
    goods, bads = np.where(labels == 0)[0], np.where(labels == 1)[0]
    picks = [*goods[np.argsort(-ft[goods])][:4], *bads[np.argsort(ft[bads])][:4]]
    for f in picks:
        p = int(np.argmax(st0[f] / far))
        m = test[p][f]
        y, x = np.unravel_index(int(m.argmax()), tuple(m.shape))
        where.append(
            [
                "good" if labels[f] == 0 else "defect",
                "/".join(Path(samples[f].path).parts[-2:]),
                f"{ft[f]:.3f}",
                " ".join(f"{v:.3f}" for v in st0[f] / far),
                p,
                f"({y}, {x}) of {tuple(m.shape)}",
                interior_distance(det, p, tuple(m.shape), int(y), int(x)),
            ]
        )
    print(table(["", "frame", "score", "tiles / scale", "max tile", "max at", "px to seam"], where))
    near = []
    for p in range(t):
        d = [
            interior_distance(det, p, tuple(m.shape), *np.unravel_index(int(m.argmax()), tuple(m.shape)))
            for m in oof[p]
        ]
        near.append([p, f"{far[p]:.4f}", f"{np.median(so0[p]):.4f}", f"{100 * np.mean(np.array(d) < edge):.0f} %"])
    print(table(["position", "far-1 % scale", "median OOF", f"OOF maxima < {edge} px from a seam"], near))
    rows, out = [], {"data": data.name, "grid": [det.rows, det.cols], "overlap": overlap, "rules": {}}
    for name, margin in [("whole tile (today)", None), *[(f"owned pixels, margin {m}", m) for m in margins]]:
        so, st = (so0, st0) if margin is None else scores(margin)
        for scale_name, scale in (("far 1 %", lambda o: TailModel(o).threshold(0.01)), ("median", np.median)):
            s = np.array([scale(so[p]) for p in range(t)])
            fo, fs = (so / s[:, None]).max(axis=0), (st / s).max(axis=1)
            r = [f"{name}, {scale_name}", *measure(fo, fs, labels)]
            rows.append(r)
            out["rules"][r[0]] = {"image_auroc": float(r[1]), "recall": float(r[2]), "false_alarms": float(r[3])}
    print(table(["rule (tile maximum over, scale)", "image AUROC", "recall %", "false alarms %"], rows))
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.add_argument("--overlap", type=int, default=32, help="tile overlap in frame pixels")
    ap.add_argument("--margins", default="0,4,8", help="extra map pixels dropped along interior edges")
    ap.add_argument("--edge", type=int, default=16, help="map pixels from a seam that count as 'near'")
    args = ap.parse_args()
    margins = [int(v) for v in args.margins.split(",") if v]
    with data_root(args) as (_, root):
        run(root, grid_of(args), args.overlap, margins, args.edge)


if __name__ == "__main__":
    main()
