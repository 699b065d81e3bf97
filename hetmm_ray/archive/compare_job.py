"""Comparing two stored versions over an archive or the inspection record, as the Ray Data job
(issue 24 item 4; ``hetmm compare --on-ray``).

Exact semantics of :func:`compare_archive`: SOURCE (anything ``hetmm inspect`` takes, the record
over a time range included) is scored twice by :func:`~.job.score_rows`, once per version, each
under its own stored threshold rule (the rows ``hetmm inspect --version`` writes); the two row sets
are joined on ``path``. A file that either side could not read or score is left out of the
comparison and counted (``unreadable``); a path listed twice is compared once. The result is
:func:`hetmm_ray.compare.summarise` on the joined images in path order (flips, score shift,
flagged counts, each version's out-of-fold estimate from its stored calibration), the same
numbers :func:`hetmm_ray.compare.compare_versions` gives for the same images in one process, but
no heat-maps and no labels: the images never reach the driver, so it runs on a cluster over a
bucket of any size, holding only two floats and two verdicts per image.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .job import JobOptions, score_rows
from .listing import RecordSource

__all__ = ["compare_archive"]


def _side(source: str | RecordSource, product: str, version: int, opts: JobOptions) -> tuple[dict, set[str], float]:
    scored: dict[str, tuple[float, bool]] = {}
    failed: set[str] = set()
    threshold = float("nan")
    for row in score_rows(source, product, version, opts):
        if row["error"] is not None or row["score"] is None:
            failed.add(row["path"])
            continue
        scored[row["path"]] = (float(row["score"]), bool(row["is_anomaly"]))
        threshold = float(row["threshold"])
    return scored, failed, threshold


def compare_archive(
    source: str | RecordSource, product: str, candidate: int, opts: JobOptions, *, base: int | None = None
) -> dict[str, Any]:
    """``base`` (default HEAD) and ``candidate`` of ``product`` side by side on SOURCE (module docstring)."""
    from ..compare import summarise
    from ..store import open_store

    store = open_store(opts.store, endpoint_url=opts.endpoint_url)
    base = store.head(product) if base is None else int(base)
    ops = (store.record(product, base).operating_point(), store.record(product, candidate).operating_point())
    (b, b_failed, t0), (c, c_failed, t1) = (_side(source, product, v, opts) for v in (base, candidate))
    paths = sorted(set(b) & set(c))
    s0, s1 = (np.asarray([side[p][0] for p in paths], dtype=np.float64) for side in (b, c))
    f0, f1 = (np.asarray([side[p][1] for p in paths], dtype=bool) for side in (b, c))
    out = summarise(product, (base, int(candidate)), paths, (s0, s1), (f0, f1), (t0, t1), ops)
    out["unreadable"] = len((b_failed | c_failed | set(b) | set(c)) - set(paths))
    return out
