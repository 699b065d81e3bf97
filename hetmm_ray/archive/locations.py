"""Where ``hetmm inspect`` reads and writes: local paths and ``s3://`` URIs through ``pyarrow.fs``.

Exact semantics:

- **A location** is a local path (``file://`` allowed) or ``s3://bucket/key``. Local paths are made
  absolute; the ``path`` column of the output holds the URI as :func:`normal_uri` writes it
  (``/abs/path`` or ``s3://bucket/key``), and a restart recognises its rows by that text.
- **S3 endpoint and credentials: the template store's rules** (hetmm_ray/store/__init__.py and
  store/s3.py): an ``endpoint_url`` given by the operator (``--endpoint-url``), else one in the URI
  (``s3://bucket/prefix?endpoint=http://host:9000``), else what boto3's standard chain resolves
  (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``, the profile's ``endpoint_url``); AWS's own endpoint
  is left to pyarrow (which does not read those variables itself). The region likewise (``?region=``,
  else boto3's). Credentials come from the AWS SDK's default chain (environment, profile, web
  identity, instance role): the same sources boto3 reads. Nothing here takes an endpoint from data
  (a list file's entries are URIs, never endpoints): a client never chooses an endpoint on the
  service's behalf.
- **Reading** (:func:`read_bytes`): the size is checked against ``MAX_IMAGE_BYTES`` before any byte
  is read (from the listing's size when known, else a ``stat``/``HEAD``), and at most
  ``max_bytes + 1`` bytes are read; every failure is an :class:`~hetmm_ray.data.decode.ImageError`
  naming the URI, so the caller turns it into an error row.
- **Writing** (:func:`write_atomic`): local files are written as ``.<name>.tmp`` and renamed
  (``os.replace``: readers see the whole file or none); on S3 one PUT is already all-or-nothing (an
  object, multipart or not, appears only when complete), so the final key is written directly.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

from ..config import MAX_IMAGE_BYTES
from ..data.decode import ImageError
from ..errors import HetmmError

__all__ = ["ArchiveError", "FsSpec", "normal_uri", "read_bytes", "split_uri", "write_atomic"]


class ArchiveError(HetmmError, ValueError):
    """A SOURCE or DEST ``hetmm inspect`` cannot use (one line: what and why)."""


def split_uri(uri: str) -> tuple[str, dict[str, str]]:
    """The URI without its query, and the query's ``endpoint``/``region`` (S3 only)."""
    if uri.startswith("s3://"):
        parts = urlsplit(uri)
        if not parts.netloc:
            raise ArchiveError(f"{uri}: give a bucket, e.g. s3://my-bucket/images")
        query = {k: v[0] for k, v in parse_qs(parts.query).items() if k in ("endpoint", "region")}
        return f"s3://{parts.netloc}{parts.path}", query
    if "://" in uri and not uri.startswith("file://"):
        raise ArchiveError(f"{uri}: use a local path or s3://bucket/prefix")
    return uri, {}


def normal_uri(uri: str) -> str:
    """``/absolute/path`` for a local path (``file://`` dropped), ``s3://bucket/key`` unchanged."""
    if uri.startswith("s3://"):
        return uri
    return os.path.abspath(os.path.expanduser(uri.removeprefix("file://")))


@dataclass
class FsSpec:
    """How to reach S3 (picklable; each process builds its filesystem once): the operator's
    ``endpoint_url`` and ``region``, or None for boto3's chain. Local paths need nothing."""

    endpoint_url: str | None = None
    region: str | None = None
    resolved: bool = False  # endpoint_url/region are final (None endpoint: AWS's own)
    _s3: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_s3": None}

    @classmethod
    def for_uri(cls, uri: str, endpoint_url: str | None = None) -> FsSpec:
        """The spec of ``uri``: ``endpoint_url`` first, else the URI's ``?endpoint=``/``?region=``, else
        boto3's chain, resolved here (in the driver), so every worker of the job uses the same endpoint
        whatever its own environment holds (credentials stay each node's own)."""
        base, query = split_uri(uri)
        spec = cls(endpoint_url or query.get("endpoint"), query.get("region"))
        if not base.startswith("s3://"):
            return spec
        endpoint, region = spec._resolved()
        return cls(endpoint, region, resolved=True)

    def s3(self) -> pafs.S3FileSystem:
        if self._s3 is None:
            endpoint, region = self._resolved()
            self._s3 = pafs.S3FileSystem(endpoint_override=endpoint, region=region)
        return self._s3

    def _resolved(self) -> tuple[str | None, str | None]:
        """(endpoint or None for AWS's own, region) by the store's rules (module docstring)."""
        if self.resolved or (self.endpoint_url and self.region):
            return self.endpoint_url, self.region
        import boto3  # boto3's chain: AWS_ENDPOINT_URL(_S3), the profile's endpoint_url and region

        client = boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, region_name=self.region)
        endpoint = self.endpoint_url or client.meta.endpoint_url
        if not self.endpoint_url and (urlsplit(endpoint).hostname or "").endswith(".amazonaws.com"):
            endpoint = None  # AWS itself: pyarrow resolves the bucket's regional endpoint
        return endpoint, self.region or client.meta.region_name or "us-east-1"

    def resolve(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """(filesystem, path inside it) of a location."""
        base, _ = split_uri(uri)
        if base.startswith("s3://"):
            return self.s3(), base.removeprefix("s3://").rstrip("/")
        return pafs.LocalFileSystem(), normal_uri(base)


def read_bytes(uri: str, size: int, spec: FsSpec, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The encoded bytes at ``uri`` (``size`` from the listing, -1 when unknown), sizes checked first."""
    try:
        fs, path = spec.resolve(uri)
        if size < 0:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise ImageError(uri, "file not found")
            if info.type != pafs.FileType.File:
                raise ImageError(uri, "not a regular file")
            size = int(info.size)
        _check_size(uri, size, max_bytes)
        with fs.open_input_stream(path) as f:
            raw = f.read(max_bytes + 1)  # the object may have changed since it was listed
    except ImageError:
        raise
    except (OSError, ArchiveError) as exc:
        raise ImageError(uri, f"cannot read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    _check_size(uri, len(raw), max_bytes)
    return raw


def _check_size(uri: str, n: int, max_bytes: int) -> None:
    if n == 0:
        raise ImageError(uri, "empty file (0 bytes)")
    if n > max_bytes:
        raise ImageError(uri, f"file too large: {n} bytes exceeds the limit of {max_bytes} bytes")


def write_atomic(dest: str, name: str, data: bytes, spec: FsSpec) -> str:
    """Write ``data`` as ``dest/name`` (module docstring: renamed locally, one PUT on S3); its URI."""
    fs, root = spec.resolve(dest)
    final = f"{root}/{name}"
    uri = final if not dest.startswith("s3://") else f"s3://{final}"
    if isinstance(fs, pafs.LocalFileSystem):
        target = Path(final)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return uri
    with fs.open_output_stream(final) as f:
        f.write(data)
    return uri
