"""Defaults of ``hetmm inspect`` (hetmm_ray/archive/): how an archive is cut into work, never what a score is.

Exact semantics: these values change how many images travel together and how many CPUs each stage
asks Ray for; they never change a score or a verdict (scores do not depend on which images share
a batch, ``scorer.Scorer.predict``).

- :data:`BLOCK_IMAGES`: URIs per listing block the driver puts in Ray's object store while it walks
  the source (the driver holds one block at a time, and only references to the others). A block is
  read, decoded, scored and written as one Parquet part: the unit of a restart and of the memory a
  block in flight takes (its decoded canvases).
- :data:`SCORE_BATCH`: images per call of a detector actor (one ``predict`` per call).
- :data:`DECODE_CPUS`: Ray's CPU share of one read-and-decode task.
- :data:`ACTOR_CPUS`: Ray's CPU share of one detector actor on a CPU node (what Ray schedules by;
  its torch threads: :data:`ACTOR_THREADS`); an actor on a GPU node also takes
  :data:`ACTOR_GPUS` of a GPU.
- :data:`ACTOR_THREADS`: torch threads of one detector actor on a CPU node, set apart from Ray's
  reservation (:data:`ACTOR_CPUS`, which only schedules). 0: the rule of ``archive.stages.actor_threads``:
  the node's CPUs divided by the actors the default pool places on it (all but one logical CPU of
  the node, ``ACTOR_CPUS`` each), at least the reservation. So an actor alone on a 2-CPU node runs
  2 threads while it reserves 1 CPU and the other logical CPU stays free for the read-and-decode and
  write tasks (an actor reserving every CPU of its node would leave Ray Data no CPU to schedule them:
  the pipeline would wait forever). Reading and decoding take little CPU beside scoring, so the
  threads of the actors cover the node's cores.
- :data:`ACTORS_START_S`: how long the job waits for its minimum number of detector actors to be up
  before the first block is scored (so each of them gets a share; on an autoscaling cluster the
  time new nodes take to join); past it the job stops with Ray Data's "Timed out while starting actors".
- :data:`PART_PREFIX`, :data:`PART_SUFFIX`: the names of DEST's Parquet parts (``part-<digest>.parquet``).
"""

from __future__ import annotations

__all__ = [
    "ACTOR_CPUS",
    "ACTORS_START_S",
    "ACTOR_THREADS",
    "ACTOR_GPUS",
    "BLOCK_IMAGES",
    "DECODE_CPUS",
    "PART_PREFIX",
    "PART_SUFFIX",
    "SCORE_BATCH",
]

BLOCK_IMAGES = 256
SCORE_BATCH = 16
DECODE_CPUS = 0.5
ACTOR_CPUS = 1.0
ACTOR_GPUS = 1.0
ACTOR_THREADS = 0
ACTORS_START_S = 900
PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
