"""Comparing two stored versions over an archive or the inspection record, as the Ray Data job
(``hetmm compare --on-ray``).

Exact semantics of :func:`compare_archive`: every file of SOURCE (anything ``hetmm inspect`` takes,
the record over a time range included) is scored by both versions, each under its own stored
threshold rule (the rows ``hetmm inspect --version`` writes), and the two scores are joined on
``path``. A file that either side could not read or score is left out of the comparison and counted
(``unreadable``); a path listed twice is compared once. The result is
:func:`hetmm_ray.workflows.compare.summarise` on the joined images in path order (flips, score shift, flagged
counts, each version's out-of-fold estimate from its stored calibration), the same numbers
:func:`hetmm_ray.workflows.compare.compare_versions` gives for the same images in one process, but no
heat-maps and no labels: the images never reach the driver, so it runs on a cluster over a bucket
of any size, holding only two floats and two verdicts per image. ``passes`` says how it ran (below).

How it runs: where both versions fit images to the same canvas (``DetectorConfig.decode_canvas``:
``backbone.image_size`` and ``backbone.geometry``, or the whole frame for a tiled product; what
``read_and_fit`` depends on), SOURCE
is listed, read and decoded **once** and each decoded batch is scored by both versions in one actor
(:class:`PairActor`: two ``DetectorActor``\\ s, so each score is exactly the one ``hetmm inspect
--version`` gives). Otherwise each version runs its own pass (``job.score_rows``) and the rows are
joined. The single pass lists, reads and decodes SOURCE once and starts one actor pool, not two, with the
same scores (``benchmarks/bench_archive.py compare``; docs/performance.md). Each actor holds both
versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from .job import JobOptions, decoded, detector_kwargs, score_rows, score_with, spool_source
from .listing import RecordSource
from .stages import DetectorActor

__all__ = ["PairActor", "collect_sides", "compare_archive", "paired_sides"]

Side = tuple[dict[str, tuple[float, bool]], set[str], float]  # scored path -> (score, flagged); failed; threshold


class PairActor:
    """Both versions' detectors in one actor: every decoded batch scored by each (module docstring).
    Rows: ``path``, ``error`` (the file's read or decode error, null when it was scored) and
    ``score_<i>``, ``is_anomaly_<i>``, ``threshold_<i>`` for side ``i`` in 0, 1."""

    def __init__(self, *, sides: list[dict[str, Any]]) -> None:
        self.sides = [DetectorActor(**kwargs) for kwargs in sides]

    def __call__(self, batch: pa.Table) -> pa.Table:
        columns: dict[str, Any] = {"path": batch.column("path"), "error": batch.column("error")}
        for i, side in enumerate(self.sides):
            scored = side(batch)
            columns |= {f"{name}_{i}": scored.column(name) for name in ("score", "is_anomaly", "threshold")}
        return pa.table(columns)


def collect_sides(rows: Iterable[dict[str, Any]], suffixes: tuple[str, ...] = ("",)) -> list[Side]:
    """Each version's scores by path from output rows, read as they stream in (one ``suffix`` per
    version: ``""`` for ``score_rows``' rows, ``"_0"``/``"_1"`` for :class:`PairActor`'s)."""
    sides: list[Side] = [({}, set(), float("nan")) for _ in suffixes]
    for row in rows:
        for i, suffix in enumerate(suffixes):
            scored, failed, _ = sides[i]
            score = row[f"score{suffix}"]
            if row["error"] is not None or score is None:
                failed.add(row["path"])
                continue
            scored[row["path"]] = (float(score), bool(row[f"is_anomaly{suffix}"]))
            sides[i] = (scored, failed, float(row[f"threshold{suffix}"]))
    return sides


def _canvas(config: Any) -> tuple[int, str] | None:
    """What ``stages.read_and_fit`` makes of a file under ``config``."""
    return config.decode_canvas


def paired_sides(
    source: str | RecordSource, product: str, versions: tuple[int, int], config: Any, opts: JobOptions
) -> list[Side]:
    """Both versions' sides from one pass over SOURCE (:class:`PairActor`); ``config``: either
    version's (they fit images to the same canvas)."""
    refs, spec = spool_source(source, opts)
    suffixes = tuple(f"_{i}" for i in range(len(versions)))
    if not refs:
        return collect_sides((), suffixes)
    sides = [detector_kwargs(opts, product, v, None, spec) for v in versions]
    ds = score_with(decoded(refs, config, opts, spec), PairActor, {"sides": sides}, opts)
    batches = ds.iter_batches(batch_size=None, batch_format="pyarrow")
    return collect_sides((row for batch in batches for row in batch.to_pylist()), suffixes)


def compare_archive(
    source: str | RecordSource, product: str, candidate: int, opts: JobOptions, *, base: int | None = None
) -> dict[str, Any]:
    """``base`` (default HEAD) and ``candidate`` of ``product`` side by side on SOURCE (module docstring)."""
    from ..result import review_threshold_of
    from ..store import open_store
    from ..workflows.compare import summarise

    store = open_store(opts.store, endpoint_url=opts.endpoint_url)
    base = store.head(product) if base is None else int(base)
    candidate = int(candidate)
    records = (store.record(product, base), store.record(product, candidate))
    ops = (records[0].operating_point(), records[1].operating_point())
    one_pass = _canvas(records[0].config) == _canvas(records[1].config)
    if one_pass:
        (b, b_failed, t0), (c, c_failed, t1) = paired_sides(source, product, (base, candidate), records[0].config, opts)
    else:
        (b, b_failed, t0), (c, c_failed, t1) = (
            collect_sides(score_rows(source, product, v, opts))[0] for v in (base, candidate)
        )
    paths = sorted(set(b) & set(c))
    s0, s1 = (np.asarray([side[p][0] for p in paths], dtype=np.float64) for side in (b, c))
    f0, f1 = (np.asarray([side[p][1] for p in paths], dtype=bool) for side in (b, c))
    reviews = (review_threshold_of(records[0]), review_threshold_of(records[1]))  # each version's review band
    out = summarise(product, (base, candidate), paths, (s0, s1), (f0, f1), (t0, t1), ops, reviews=reviews)
    out["unreadable"] = len((b_failed | c_failed | set(b) | set(c)) - set(paths))
    out["passes"] = 1 if one_pass else 2  # over SOURCE: listed, read and decoded once or once per version
    return out
