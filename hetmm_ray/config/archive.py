"""Defaults of ``hetmm inspect`` (hetmm_ray/archive/): how an archive is cut into work, never what a score is.

Exact semantics: these values change how many images travel together and how many CPUs each stage
asks Ray for; they never change a score or a verdict (scores do not depend on which images share
a batch, ``scorer.Scorer.predict``).

- :data:`LISTING_CHUNK`: URIs per listing block the driver puts in Ray's object store while it walks
  the source (the driver holds one block at a time, and only references to the others).
- :data:`SCORE_BATCH`: images per call of a detector actor (one ``predict`` per call).
- :data:`DECODE_CPUS`: Ray's CPU share of one read-and-decode task.
- :data:`ACTOR_CPUS`: Ray's CPU share of one detector actor on a CPU node (its torch threads follow
  it, ``distributed.runtime.use_assigned_cpus``); an actor on a GPU node also takes
  :data:`ACTOR_GPUS` of a GPU.
- :data:`PART_PREFIX`, :data:`PART_SUFFIX`: the names of DEST's Parquet parts (``part-<digest>.parquet``).
"""

from __future__ import annotations

__all__ = [
    "ACTOR_CPUS",
    "ACTOR_GPUS",
    "DECODE_CPUS",
    "LISTING_CHUNK",
    "PART_PREFIX",
    "PART_SUFFIX",
    "SCORE_BATCH",
]

LISTING_CHUNK = 1000
SCORE_BATCH = 16
DECODE_CPUS = 0.5
ACTOR_CPUS = 1.0
ACTOR_GPUS = 1.0
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
