"""What SOURCE names, as a stream of ``(uri, size)``, and what DEST already holds.

Exact semantics of :func:`iter_source` (``size`` is the byte count from the listing, -1 when the
listing does not say; nothing is held beyond one folder's entries or one listing page):

- **a folder** (local): every regular file below it, walked one folder at a time in sorted order;
  entries whose name starts with ``.`` (and everything under such folders) are left out. Files are
  not filtered by suffix: an archive's every file is accounted for, and a file that is no image is
  an error row (``hetmm predict`` skips such files with a message instead).
- **a glob** (a local path or an ``s3://`` key with ``*``, ``?`` or ``[``): the files it matches
  (``**`` crosses folders; on S3 the keys under the part before the first wildcard, matched with
  ``fnmatch``, where ``*`` also crosses ``/``).
- **an ``s3://`` prefix**: every object under ``prefix/`` (or the one object named exactly), in key
  order, one page of 1,000 keys at a time (S3's ``ListObjectsV2``, through boto3 with the endpoint
  rules of ``locations.FsSpec``); keys ending in ``/`` (folder markers) and hidden names are left out.
- **a list file** (a local or S3 ``.txt``, ``.lst`` or ``.parquet``): its URIs in order; a text file
  has one per line (blank lines and ``#`` comments skipped); a Parquet file's column ``path``, else
  ``uri``, else its first string column, read one record batch at a time.
  A list that names a URI twice gives it two rows (lists are streamed, never held to be deduplicated).
- **a product's inspection record** (:class:`RecordSource`: ``hetmm inspect --since/--until``): the
  images the record kept in ``[since, until)`` (record/reader.py ``kept_image_keys``), by time, one
  UTC day of the record read at a time; each is its object's URI in the store (``<store>/<key>``;
  on S3 ``s3://bucket/prefix/<key>``), so the output's ``path`` says which kept image a row is.
- a file that is none of these is a one-image source. A source that does not exist is an
  :class:`~hetmm_ray.archive.locations.ArchiveError`.

:func:`done_paths` reads the ``path`` column of DEST's finished parts (``part-*.parquet``): the
set a restart skips. It holds one string per image already written (restarts only).
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..config.archive import PART_PREFIX, PART_SUFFIX
from .locations import ArchiveError, FsSpec, normal_uri, split_uri

__all__ = ["LIST_SUFFIXES", "RecordSource", "done_paths", "iter_source", "part_files"]

LIST_SUFFIXES = (".txt", ".lst", ".parquet")
_WILDCARDS = ("*", "?", "[")


@dataclass(frozen=True)
class RecordSource:
    """SOURCE = the images ``product``'s inspection record (in the template store ``store``) kept in
    ``[since, until)`` (unix seconds; None: open)."""

    store: str
    product: str
    since: float | None = None
    until: float | None = None


def iter_source(source: str | RecordSource, spec: FsSpec) -> Iterator[tuple[str, int]]:
    """``(uri, size)`` of every file SOURCE names (module docstring)."""
    if isinstance(source, RecordSource):
        yield from _record_source(source, spec)
        return
    base, _ = split_uri(source)
    if base.startswith("s3://"):
        yield from _s3_source(base, spec)
        return
    path = normal_uri(base)
    if any(c in path for c in _WILDCARDS):
        for p in glob.iglob(path, recursive=True):
            if os.path.isfile(p):
                yield p, os.path.getsize(p)
        return
    if os.path.isdir(path):
        yield from _walk(path)
    elif os.path.isfile(path):
        if path.lower().endswith(LIST_SUFFIXES):
            yield from _list_file(path, spec)
        else:
            yield path, os.path.getsize(path)
    else:
        raise ArchiveError(f"{source}: no such file or folder")


def _record_source(source: RecordSource, spec: FsSpec) -> Iterator[tuple[str, int]]:
    from ..record.reader import filesystem_of, kept_image_keys
    from ..store import open_store

    backend = open_store(source.store, endpoint_url=spec.endpoint_url).backend
    fs, base = filesystem_of(backend)
    prefix = f"s3://{base}" if isinstance(fs, pafs.S3FileSystem) else base
    for key, size in kept_image_keys(backend, source.product, since=source.since, until=source.until):
        yield f"{prefix}/{key}", size


def _walk(folder: str) -> Iterator[tuple[str, int]]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        yield folder, -1  # an unreadable folder: one error row says so (read_bytes fails on it)
        return
    for e in entries:
        if e.name.startswith("."):
            continue
        if e.is_dir(follow_symlinks=False):
            yield from _walk(e.path)
        else:
            try:
                yield e.path, e.stat().st_size if e.is_file() else -1
            except OSError:
                yield e.path, -1


def _s3_keys(bucket: str, prefix: str, spec: FsSpec) -> Iterator[tuple[str, int]]:
    import boto3

    endpoint, region = spec._resolved()
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region)
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"], int(obj["Size"])
    except (BotoCoreError, ClientError) as exc:
        raise ArchiveError(f"s3://{bucket}/{prefix}: cannot list ({exc})") from None


def _s3_source(base: str, spec: FsSpec) -> Iterator[tuple[str, int]]:
    bucket, _, key = base.removeprefix("s3://").partition("/")
    wild = min((key.find(c) for c in _WILDCARDS if c in key), default=-1)
    if wild >= 0:
        for k, size in _s3_keys(bucket, key[:wild], spec):
            if fnmatch.fnmatchcase(k, key):
                yield f"s3://{bucket}/{k}", size
        return
    if key.lower().endswith(LIST_SUFFIXES):
        yield from _list_file(base, spec)
        return
    prefix = key.rstrip("/")
    seen = False
    for k, size in _s3_keys(bucket, f"{prefix}/" if prefix else "", spec):
        if k.endswith("/") or any(part.startswith(".") for part in k[len(prefix) :].split("/")):
            continue
        seen = True
        yield f"s3://{bucket}/{k}", size
    if not seen and prefix:
        info = spec.s3().get_file_info(f"{bucket}/{prefix}")
        if info.type == pafs.FileType.File:
            yield base, int(info.size)
        else:
            raise ArchiveError(f"{base}: no objects under this prefix")


def _list_file(uri: str, spec: FsSpec) -> Iterator[tuple[str, int]]:
    fs, path = spec.resolve(uri)
    try:
        if path.lower().endswith(".parquet"):
            f = pq.ParquetFile(fs.open_input_file(path))
            column = _uri_column(f.schema_arrow)
            for batch in f.iter_batches(columns=[column], batch_size=1000):
                for value in batch.column(0).to_pylist():
                    if value:
                        yield _entry(value), -1
            return
        with fs.open_input_stream(path) as stream:
            rest = b""
            while chunk := stream.read(1 << 20):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                yield from _text_entries(lines)
            yield from _text_entries([rest])
    except OSError as exc:
        raise ArchiveError(f"{uri}: cannot read the list ({str(exc).splitlines()[0]})") from None


def _text_entries(lines: list[bytes]) -> Iterator[tuple[str, int]]:
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if line and not line.startswith("#"):
            yield _entry(line), -1


def _entry(value: str) -> str:
    base, _ = split_uri(value)  # refuses other schemes; an entry's ?endpoint= is never used
    return normal_uri(base)


def _uri_column(schema: pa.Schema) -> str:
    for name in ("path", "uri"):
        if name in schema.names:
            return name
    for f in schema:
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            return f.name
    raise ArchiveError(f"list file: no string column (path, uri) among {schema.names}")


def part_files(dest: str, spec: FsSpec) -> list[str]:
    """Paths (inside DEST's filesystem) of DEST's finished parts."""
    fs, root = spec.resolve(dest)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=False))
    except OSError as exc:
        raise ArchiveError(f"{dest}: cannot list ({str(exc).splitlines()[0]})") from None
    return sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.startswith(PART_PREFIX) and i.base_name.endswith(PART_SUFFIX)
    )


def done_paths(dest: str, spec: FsSpec) -> set[str]:
    """The ``path`` of every row in DEST's finished parts."""
    fs, _ = spec.resolve(dest)
    done: set[str] = set()
    for path in part_files(dest, spec):
        done.update(pq.read_table(path, columns=["path"], filesystem=fs).column(0).to_pylist())
    return done
