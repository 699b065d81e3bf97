"""Reading the inspection record: ``pyarrow.dataset`` over a product's folder or S3 prefix.

Exact semantics (layout and columns in record/layout.py):

- :func:`read_rows` gives the rows of ``product`` with ``since <= time < until`` (unix seconds,
  either bound optional) as a ``pyarrow.Table`` sorted by time, through one dataset over
  ``{product}/inspections/`` (Hive partitions ``date=YYYY-MM-DD``, pruned by the bounds' UTC days,
  then filtered by ``time``). No file yet: an empty table of the record's schema.
- The filesystem is the store's: a local folder (``LocalBackend.root``) or S3 through
  ``pyarrow.fs.S3FileSystem`` at the S3 backend's bucket, prefix and endpoint, with the same
  credentials chain as boto3 (environment, profile, instance role).
- ``label`` is filled from the product's labelled set (store/labels.py), by the first 16 hex
  digits of ``image_digest``, unless ``labels=False``.
- :func:`recent_rows`: the newest ``limit`` rows (optionally only flagged ones, ``is_anomaly``),
  newest first, reading the newest day partitions first and stopping once it has enough.
- :func:`recorded_images`: the kept images of a time range as ``(name, bytes)`` with their rows:
  the image set of "compare before promote" when it names the record.
- Rows a writer has not flushed yet are not there (record/writer.py: the crash bound).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from ..store.base import Backend
from ..store.labels import LabelSet
from .layout import INSPECTIONS, day_of
from .writer import schema

__all__ = ["filesystem_of", "kept_image_keys", "read_rows", "recent_rows", "recorded_images", "row_of"]


def filesystem_of(backend: Backend) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and base path of a store backend (its root folder or bucket/prefix)."""
    root = getattr(backend, "root", None)
    if root is not None:  # LocalBackend
        return pafs.LocalFileSystem(), str(root)
    bucket = getattr(backend, "bucket", None)
    if bucket is None:
        raise TypeError(f"no pyarrow filesystem for the store {backend.describe()}")
    endpoint = getattr(backend, "endpoint", None)
    kwargs: dict[str, Any] = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme or "https")
    region = getattr(getattr(getattr(backend, "client", None), "meta", None), "region_name", None)
    if region:
        kwargs["region"] = region
    prefix = getattr(backend, "prefix", "")
    return pafs.S3FileSystem(**kwargs), f"{bucket}/{prefix}".rstrip("/")


def _days(fs: pafs.FileSystem, base: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return sorted(
        i.base_name.removeprefix("date=")
        for i in infos
        if i.type == pafs.FileType.Directory and i.base_name.startswith("date=")
    )


def _range_days(
    backend: Backend, product: str, since: float | None, until: float | None
) -> tuple[pafs.FileSystem, str, list[str]]:
    """The record's filesystem, its base folder and the UTC days (``date=`` partitions) that can hold
    rows of ``[since, until)``."""
    fs, root = filesystem_of(backend)
    base = f"{root}/{product}/{INSPECTIONS}"
    days = [
        d for d in _days(fs, base) if (since is None or d >= day_of(since)) and (until is None or d <= day_of(until))
    ]
    return fs, base, days


def _time_filter(since: float | None, until: float | None) -> ds.Expression | None:
    """``since <= time < until`` (either bound open when None); None when both are."""
    filt = None
    if since is not None:
        filt = ds.field("time") >= since
    if until is not None:
        upper = ds.field("time") < until
        filt = upper if filt is None else filt & upper
    return filt


def _dataset(fs: pafs.FileSystem, dirs: str | list[str]) -> ds.Dataset:
    """One dataset over the Parquet files of the given day folders (temporary files, named with a
    leading dot by the local store, are left out)."""
    files: list[str] = []
    for d in [dirs] if isinstance(dirs, str) else dirs:
        infos = fs.get_file_info(pafs.FileSelector(d, allow_not_found=True, recursive=True))
        files += sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
        )
    return ds.dataset(files, schema=schema(), filesystem=fs, format="parquet")


def _with_labels(backend: Backend, product: str, table: pa.Table) -> pa.Table:
    words = {r["id"]: r["label"] for r in LabelSet(backend).records(product)}
    if not words or table.num_rows == 0:
        return table
    labels = [words.get(d[:16]) for d in table.column("image_digest").to_pylist()]
    return table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.string()))


def read_rows(
    backend: Backend,
    product: str,
    *,
    since: float | None = None,
    until: float | None = None,
    columns: list[str] | None = None,
    labels: bool = True,
) -> pa.Table:
    """Rows of ``product`` in ``[since, until)`` sorted by time (module docstring)."""
    fs, base, days = _range_days(backend, product, since, until)
    want = None if columns is None else list(dict.fromkeys([*columns, "time", "image_digest"]))
    if not days:
        table = schema().empty_table()
    else:
        filt = _time_filter(since, until)
        table = _dataset(fs, [f"{base}/date={d}" for d in days]).to_table(columns=want, filter=filt)
        table = table.sort_by("time")
    if labels and (want is None or "label" in want):
        table = _with_labels(backend, product, table)
    return table if columns is None else table.select(columns)


def recent_rows(
    backend: Backend, product: str, limit: int, *, flagged_only: bool = False, before: float | None = None
) -> list[dict[str, Any]]:
    """The newest ``limit`` rows of ``product`` (older than ``before`` when given), newest first."""
    fs, root = filesystem_of(backend)
    base = f"{root}/{product}/{INSPECTIONS}"
    out: list[pa.Table] = []
    held = 0
    for day in reversed(_days(fs, base)):
        if before is not None and day > day_of(before):
            continue
        filt = None
        if flagged_only:  # flagged as the ring means it: is_anomaly (a review verdict is not flagged)
            filt = ds.field("is_anomaly")
        if before is not None:
            older = ds.field("time") < before
            filt = older if filt is None else filt & older
        table = _dataset(fs, f"{base}/date={day}").to_table(filter=filt)
        out.append(table)
        held += table.num_rows
        if held >= limit:
            break
    if not out:
        return []
    table = pa.concat_tables(out)
    # newest first; rows of one request share their time: reversed write order first, then a stable sort
    table = table.take(pa.array(range(table.num_rows - 1, -1, -1), pa.int64()))
    table = table.sort_by([("time", "descending")]).slice(0, limit)
    return _with_labels(backend, product, table).to_pylist()


def row_of(backend: Backend, product: str, recent_id: str, *, days: int = 3) -> dict[str, Any] | None:
    """The row of a console id (``recent_id``) among the newest ``days`` day partitions, or None."""
    fs, root = filesystem_of(backend)
    base = f"{root}/{product}/{INSPECTIONS}"
    for day in reversed(_days(fs, base)[-days:]):
        table = _dataset(fs, f"{base}/date={day}").to_table(filter=ds.field("recent_id") == recent_id)
        if table.num_rows:
            return table.slice(table.num_rows - 1).to_pylist()[0]
    return None


def recorded_images(
    backend: Backend, product: str, *, since: float | None = None, until: float | None = None
) -> list[tuple[dict[str, Any], bytes]]:
    """``(row, image bytes)`` of every row in ``[since, until)`` whose image the record kept, by
    time (rows whose image retention deleted meanwhile are left out)."""
    out = []
    for row in read_rows(backend, product, since=since, until=until).to_pylist():
        if row["image_key"] is None:
            continue
        try:
            out.append((row, backend.read(row["image_key"])[0]))
        except KeyError:
            continue
    return out


def kept_image_keys(
    backend: Backend, product: str, *, since: float | None = None, until: float | None = None
) -> Iterator[tuple[str, int]]:
    """``(image_key, image_bytes)`` of every row in ``[since, until)`` whose image the record kept, by
    time, read one UTC day of the record at a time (only the ``time``, ``image_key`` and
    ``image_bytes`` columns): a long range streams, one day's keys in memory. A key whose image
    retention deleted since is still yielded (its reader then fails on it: one error row in
    ``hetmm inspect``)."""
    fs, base, days = _range_days(backend, product, since, until)
    in_range = _time_filter(since, until)
    kept = ds.field("image_key").is_valid()
    filt = kept if in_range is None else in_range & kept
    for day in days:
        table = _dataset(fs, f"{base}/date={day}").to_table(columns=["time", "image_key", "image_bytes"], filter=filt)
        for row in table.sort_by("time").to_pylist():
            yield row["image_key"], int(row["image_bytes"])
