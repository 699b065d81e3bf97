"""Inspecting an archive: batch scoring of a folder, a glob, an ``s3://`` prefix, a list of URIs or a product's
inspection record into
Parquet, as a Ray Data job (``hetmm inspect``; docs/cluster.md, "Inspecting an archive").

Exact semantics, module by module:

- :mod:`.locations`: local paths and ``s3://`` through ``pyarrow.fs`` with the template store's
  endpoint and credential rules; size-checked reads; atomic writes.
- :mod:`.listing`: what SOURCE names, streamed; what DEST already holds (a restart's skip set).
- :mod:`.schema`: the output schema, one row per source file.
- :mod:`.stages`: read + decode + canvas fit (CPU tasks), detector actors (one model each), part writer.
- :mod:`.job`: :func:`inspect_archive` (the job) and :func:`score_rows` (the seam for comparing versions).
- :mod:`.compare_job`: :func:`compare_archive`, two versions compared over SOURCE by that seam.

A row's score is ``hetmm predict``'s for the same version; a bad file is a row with an ``error`` and no
score and never stops the job; a restart with the same DEST writes only what is missing.
"""

from __future__ import annotations

from .compare_job import compare_archive
from .job import InspectReport, JobOptions, inspect_archive, score_rows
from .listing import RecordSource
from .locations import ArchiveError, FsSpec
from .schema import OUTPUT_SCHEMA

__all__ = [
    "OUTPUT_SCHEMA",
    "ArchiveError",
    "FsSpec",
    "InspectReport",
    "JobOptions",
    "RecordSource",
    "compare_archive",
    "inspect_archive",
    "score_rows",
]
