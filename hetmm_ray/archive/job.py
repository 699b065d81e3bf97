"""The ``hetmm inspect`` job: SOURCE -> Ray Data (read + decode tasks, detector actors) -> Parquet in DEST.

Exact semantics of :func:`inspect_archive`:

1. The product's version is fixed first (``--version``, else the store's head at the start): every
   row of the job is scored by that one version.
2. Ray: ``distributed.runtime.connect(address)``: the embedded local Ray of the project's rules by
   default (a new one, loopback only), a cluster with ``--address``.
3. **Restart.** DEST's finished parts (``part-*.parquet``) are read for their ``path`` column; those
   files are skipped. Local temporary files of an interrupted run (``.part-*.tmp``) are removed (one
   job per DEST at a time). So a job interrupted at any point (Ctrl-C, a lost node, SIGKILL) and
   started again with the same SOURCE and DEST finishes with every listed file in exactly one row:
   a part is written whole or not at all, a retried block rewrites its own part under the same name
   (``stages.part_name``), and a file already in a part is never listed again.
4. **Listing, streamed.** SOURCE is walked (``listing.iter_source``) and put into Ray's object store
   in blocks of ``block_size`` URIs (``config.archive.BLOCK_IMAGES``): the driver holds one block and the
   references, never the whole listing (the store may spill it to disk). The count gives the progress
   bar's total. Each block goes through the pipeline as one Ray Data block and is written as one part.
5. **The pipeline** (``ray.data``, streaming with Ray Data's backpressure: a bounded number of decoded
   blocks in flight whatever the archive's size): ``read_and_fit`` tasks (``DECODE_CPUS`` each) ->
   ``DetectorActor`` pool (``concurrency`` = (min, max) actors, each ``ACTOR_CPUS`` CPUs and, where
   the cluster has GPUs, ``ACTOR_GPUS`` GPUs; default min 1, max what the cluster's CPUs or GPUs hold,
   leaving one CPU for decoding on CPU clusters) -> ``write_part`` tasks. Ray Data places the actors
   with its default SPREAD strategy (best effort), and the minimum number of actors is up before the
   first block is scored (``config.archive.ACTORS_START_S``), so each of them takes a share.
6. The driver follows the written rows with a progress bar (images/s and ETA) and returns an
   :class:`InspectReport`: rows written this run, errors, rows per node.

:func:`score_rows` is the seam for comparing candidate versions (``compare``): the same
pipeline with a given version, yielding the output rows (dicts of ``schema.OUTPUT_SCHEMA``) instead
of writing them; nothing is skipped and nothing written.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..config.archive import (
    ACTOR_CPUS,
    ACTOR_GPUS,
    ACTOR_THREADS,
    ACTORS_START_S,
    BLOCK_IMAGES,
    DECODE_CPUS,
    PART_PREFIX,
    SCORE_BATCH,
)
from .listing import RecordSource, done_paths, iter_source
from .locations import ArchiveError, FsSpec, split_uri
from .schema import SOURCE_SCHEMA
from .stages import DetectorActor, read_and_fit, write_part

__all__ = [
    "InspectReport",
    "JobOptions",
    "decoded",
    "detector_kwargs",
    "inspect_archive",
    "score_rows",
    "score_with",
    "spool_source",
]


@dataclass
class JobOptions:
    """How the job runs (never what a score is)."""

    store: str
    endpoint_url: str | None = None
    address: str | None = None
    concurrency: tuple[int, int] | None = None  # detector actors (min, max); None: from the cluster
    actor_cpus: float = ACTOR_CPUS  # Ray's reservation (scheduling only)
    actor_threads: int = ACTOR_THREADS  # torch threads per actor; 0: stages.actor_threads of its node
    actor_gpus: float | None = None  # None: ACTOR_GPUS where the cluster has GPUs, else 0
    batch_size: int = SCORE_BATCH
    block_size: int = BLOCK_IMAGES  # images per listing block = per Parquet part
    device: str | None = None
    dtype: str | None = None
    sigmas: float | None = None
    false_alarm_rate: float | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.actor_threads, int) or self.actor_threads < 0:
            raise ArchiveError(f"actor_threads {self.actor_threads!r}: expected 0 (the rule) or a positive integer")
        for name in ("batch_size", "block_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ArchiveError(f"{name} {getattr(self, name)!r}: expected a positive integer")
        if self.actor_cpus <= 0 or (self.actor_gpus is not None and self.actor_gpus < 0):
            raise ArchiveError(f"actor resources {self.actor_cpus} CPUs, {self.actor_gpus} GPUs: expected > 0 CPUs")


@dataclass
class InspectReport:
    """What one run did."""

    product: str
    version: int
    listed: int = 0  # files the listing named that were not written yet
    skipped: int = 0  # files already in DEST's parts (a restart)
    written: int = 0  # rows written this run
    errors: int = 0  # of those, rows with an error
    per_node: dict[str, int] = field(default_factory=dict)  # scored rows per Ray node id
    seconds: float = 0.0

    def summary(self) -> str:
        rate = self.written / self.seconds if self.seconds else 0.0
        nodes = ", ".join(f"{n[:8]} {c}" for n, c in sorted(self.per_node.items()))
        return (
            f"{self.written} images written ({self.errors} with errors), {self.skipped} already done, "
            f"{rate:.1f} images/s, product {self.product} v{self.version}; per node: {nodes or 'none'}"
        )


def _product(opts: JobOptions, product: str, version: int | None) -> tuple[int, Any]:
    from ..store import open_store

    store = open_store(opts.store, endpoint_url=opts.endpoint_url)
    version = store.head(product) if version is None else version
    return version, store.record(product, version).config


def _source_spec(source: str | RecordSource, opts: JobOptions) -> FsSpec:
    """How to reach SOURCE's files (a record's: the template store's endpoint)."""
    return FsSpec.for_uri(source.store if isinstance(source, RecordSource) else source, opts.endpoint_url)


def _listing(source: str | RecordSource, spec: FsSpec) -> Iterator[tuple[str, int]]:
    """SOURCE's listing with its first entry already read: a missing or unreadable source fails
    here, before Ray starts."""
    import itertools

    listing = iter_source(source, spec)
    first = list(itertools.islice(listing, 1))
    return itertools.chain(first, listing)


def _spool(
    listing: Iterator[tuple[str, int]], done: set[str], block_size: int, progress: bool
) -> tuple[list[Any], int, int]:
    """Listing blocks in the object store (module docstring, 4): (refs, listed, skipped)."""
    import ray
    from tqdm.auto import tqdm

    refs: list[Any] = []
    uris: list[str] = []
    sizes: list[int] = []
    listed = skipped = 0
    bar = tqdm(desc="listing", unit=" files", disable=not progress, leave=False)

    def flush() -> None:
        if uris:
            refs.append(ray.put(pa.table({"uri": uris, "size": sizes}, schema=SOURCE_SCHEMA)))
            uris.clear()
            sizes.clear()

    for uri, size in listing:
        bar.update()
        if uri in done:
            skipped += 1
            continue
        uris.append(uri)
        sizes.append(size)
        listed += 1
        if len(uris) >= block_size:
            flush()
    flush()
    bar.close()
    return refs, listed, skipped


def _actor_resources(opts: JobOptions) -> tuple[tuple[int, int], float]:
    import ray

    total = ray.cluster_resources()
    gpus = opts.actor_gpus if opts.actor_gpus is not None else (ACTOR_GPUS if total.get("GPU", 0) > 0 else 0.0)
    if opts.concurrency is not None:
        lo, hi = opts.concurrency
        if not 1 <= lo <= hi:
            raise ArchiveError(f"concurrency {lo},{hi}: expected 1 <= min <= max")
        return (lo, hi), gpus
    if gpus > 0:
        hi = int(total.get("GPU", 0) // gpus)
    else:
        hi = int((total.get("CPU", 1) - 1) // opts.actor_cpus)  # one CPU left for reading and decoding
    return (1, max(1, hi)), gpus


def _pipeline(
    refs: list[Any],
    product: str,
    version: int,
    config: Any,
    opts: JobOptions,
    specs: tuple[FsSpec, FsSpec],
    heatmaps: str | None,
) -> Any:
    """Listing blocks -> read_and_fit tasks -> detector actors; ``specs``: (SOURCE's, DEST's)."""
    spec, dest_spec = specs
    kwargs = detector_kwargs(opts, product, version, heatmaps, dest_spec)
    return score_with(decoded(refs, config, opts, spec), DetectorActor, kwargs, opts)


class _QuietDataConsole(logging.Filter):
    """Ray Data's console lines a job's user has no use for: its INFO (each dataset's start, plan and
    end, all kept in Ray Data's own log file) and its notice that its progress bars are off (the job
    draws its own). Its warnings and errors still print."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and "Progress bars disabled" not in record.getMessage()


def quiet_data_console() -> None:
    """:class:`_QuietDataConsole` on Ray Data's console handlers in this process (once; its file log
    keeps every line)."""
    for handler in logging.getLogger("ray.data").handlers:
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and not any(isinstance(f, _QuietDataConsole) for f in handler.filters):
            handler.addFilter(_QuietDataConsole())


def decoded(refs: list[Any], config: Any, opts: JobOptions, spec: FsSpec) -> Any:
    """Listing blocks -> ``read_and_fit`` tasks: each file decoded and fitted to ``config``'s canvas."""
    import ray.data

    # Ray Data's usage collection, on when the driver joins a cluster (a new local Ray turns Ray's
    # usage stats off), starts a thread that asks a Prometheus on localhost:9090 for cluster counters
    # every 10 s for the rest of the process, and reports each job to the cluster's usage tags. A
    # line PC has no use for it, and that thread running through a ray.shutdown is what ended a test
    # process (runtime.shutdown_ray). A value already set wins.
    os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the job's own bar (images/s, ETA) instead of one per operator
    quiet_data_console()
    ctx.wait_for_min_actors_s = ACTORS_START_S  # every minimum actor up before the first block (config.archive)
    return ray.data.from_arrow_refs(refs).map_batches(
        read_and_fit,  # type: ignore[arg-type]  # Ray's stub allows no keyword-only fn_kwargs parameters
        batch_format="pyarrow",
        batch_size=opts.batch_size,
        num_cpus=DECODE_CPUS,
        fn_kwargs={"spec": spec, "canvas": config.decode_canvas},
    )


def detector_kwargs(
    opts: JobOptions, product: str, version: int, heatmaps: str | None, dest_spec: FsSpec
) -> dict[str, Any]:
    """:class:`~.stages.DetectorActor`'s constructor arguments for ``version`` under ``opts``."""
    overrides = {k: v for k, v in (("device", opts.device), ("dtype", opts.dtype)) if v}
    return {
        "store": opts.store,
        "endpoint_url": opts.endpoint_url,
        "product": product,
        "version": version,
        "overrides": overrides,
        "sigmas": opts.sigmas,
        "false_alarm_rate": opts.false_alarm_rate,
        "heatmaps": heatmaps,
        "spec": dest_spec,
        "threads": opts.actor_threads,
    }


def score_with(decoded_ds: Any, actor: type, kwargs: dict[str, Any], opts: JobOptions) -> Any:
    """``decoded_ds`` through a pool of ``actor(**kwargs)`` (module docstring, 5: sizes and resources)."""
    import ray.data

    concurrency, gpus = _actor_resources(opts)
    return decoded_ds.map_batches(
        actor,
        batch_format="pyarrow",
        batch_size=opts.batch_size,
        compute=ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1]),
        num_cpus=opts.actor_cpus,
        num_gpus=gpus,
        fn_constructor_kwargs=kwargs,
    )


def _clean_temporaries(dest: str, spec: FsSpec) -> None:
    if dest.startswith("s3://"):
        return  # S3 parts are single PUTs: nothing temporary is ever visible
    import glob

    _, root = spec.resolve(dest)
    for tmp in glob.glob(os.path.join(glob.escape(root), f".{PART_PREFIX}*.tmp")):
        os.remove(tmp)


def inspect_archive(
    source: str | RecordSource,
    product: str,
    dest: str,
    opts: JobOptions,
    *,
    version: int | None = None,
    heatmaps: bool = False,
) -> InspectReport:
    """Score every file of SOURCE with the product's version into Parquet parts in DEST (module docstring)."""
    from tqdm.auto import tqdm

    from ..distributed.runtime import connect

    dest_base, _ = split_uri(dest)
    spec = FsSpec.for_uri(dest, opts.endpoint_url)
    source_spec = _source_spec(source, opts)  # refuses unknown schemes before Ray starts
    version, config = _product(opts, product, version)
    listing = _listing(source, source_spec)
    connect(opts.address)
    start = time.perf_counter()  # the job's own time: Ray's start is not the archive's
    done = done_paths(dest_base, spec)
    _clean_temporaries(dest_base, spec)
    refs, listed, skipped = _spool(listing, done, opts.block_size, opts.progress)
    del done
    report = InspectReport(product, version, listed=listed, skipped=skipped)
    if listed:
        ds = _pipeline(refs, product, version, config, opts, (source_spec, spec), dest_base if heatmaps else None)
        written = ds.map_batches(
            write_part,
            batch_format="pyarrow",
            batch_size=None,
            num_cpus=DECODE_CPUS,
            fn_kwargs={"dest": dest_base, "spec": spec},
        )
        nodes: Counter[str] = Counter()
        with tqdm(total=listed, desc="inspect", unit=" img", disable=not opts.progress, smoothing=0.1) as bar:
            for batch in written.iter_batches(batch_size=None, batch_format="pyarrow"):
                failed = batch.column("failed").to_pylist()
                report.written += len(failed)
                report.errors += sum(failed)
                nodes.update(n for n in batch.column("node").to_pylist() if n is not None)
                bar.update(len(failed))
        report.per_node = dict(nodes)
    report.seconds = time.perf_counter() - start
    return report


def spool_source(source: str | RecordSource, opts: JobOptions) -> tuple[list[Any], FsSpec]:
    """SOURCE listed into the object store in blocks (module docstring, 2 and 4; nothing skipped) on
    the job's Ray: (block references, how to reach SOURCE's files). No references: SOURCE is empty."""
    from ..distributed.runtime import connect

    source_spec = _source_spec(source, opts)
    listing = _listing(source, source_spec)
    connect(opts.address)
    refs, _, _ = _spool(listing, set(), opts.block_size, progress=False)
    return refs, source_spec


def score_rows(
    source: str | RecordSource, product: str, version: int | None, opts: JobOptions
) -> Iterator[dict[str, Any]]:
    """Every file of SOURCE scored by the product's ``version`` (None: the head), as output rows.

    The seam for comparing candidate versions over a large record or bucket: call it once
    per version and join the rows on ``path`` (``compare_job`` does, where the two versions' canvases
    differ). Same pipeline and same scores as :func:`inspect_archive`; nothing is skipped or written.
    Rows arrive as blocks finish (not in listing order)."""
    version, config = _product(opts, product, version)
    refs, source_spec = spool_source(source, opts)
    if not refs:
        return
    ds = _pipeline(refs, product, version, config, opts, (source_spec, source_spec), None)
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        yield from batch.to_pylist()
