"""A product's latest evaluation report, kept in the template store beside its versions.

``hetmm evaluate --store S --report DIR`` writes the report (``DIR/index.html`` and its PNGs,
``report/page.py``), publishes the fitted templates, then stores the report here as that
product's latest, tagged with the version it was published as and the time; the service serves it
read-only (``GET /v1/products/{p}/report/``, serve/ui.py). Layout under a product::

    <product>/report/LATEST.json        {"format": 1, "id", "version", "created",
                                         "files": {name: {"sha256", "size"}}}, written last
    <product>/report/<id>/<name>        the files of report <id>, <name> as the page refers to them

Exact semantics:

- **Names** (:func:`check_report_name`): a relative path of at most :data:`MAX_DEPTH` segments
  separated by ``/``, each 1-128 letters, digits, ``_``, ``-`` or ``.`` starting with a letter or
  digit (so no ``..``, no absolute path, no backslash), ending in one of :data:`SUFFIXES`. A
  report holds ``index.html``. A ``.png`` file must start with the PNG signature and an
  ``.html`` file must be UTF-8. Anything else is refused (:class:`StoreError`) before a byte is
  written.
- **Sizes**: each file at most :data:`MAX_FILE_BYTES`, all of them at most
  :data:`MAX_REPORT_BYTES`, at most :data:`MAX_FILES` files.
- **Files from a folder** (:func:`collect_report`): ``index.html`` and every file its ``src`` /
  ``href`` attributes name by a relative path that passes the name rule, read from the folder;
  references the rule refuses (another suffix, a path out of the folder, a query) and absolute
  URLs are not read, and are returned as left out. A file the page names that is missing is a
  :class:`StoreError`. So what is stored is exactly what the page shows, never a stray file of the
  folder.
- **Replacing** (:func:`put_report`): the files are written under a fresh id, then ``LATEST.json``
  is swapped by compare-and-swap on the ETag read (create-only when there is none), retried on a
  lost race, so of two writers the one that swaps last wins; then the files of the report it
  replaced are deleted, and those of any other report that is not the latest and whose id is older
  than :data:`STALE_S` (left by a writer that died before its swap). A reader follows
  ``LATEST.json`` to one report's files; a file read just as a newer report replaced it is read
  again from the newer one.
- **Reading** (:func:`latest_report`, :func:`get_report_file`): ``None`` without a report; a
  file's bytes are checked against the size and sha256 recorded for it (:class:`StoreCorrupt`
  otherwise). A name outside the latest report's set, or no report, is :class:`ProductNotFound`
  (no object is read for a name the rule refuses).
- **Deleting** the product (``VersionedStore.delete_product``) removes everything under
  ``<product>/``, its report included.

Nothing is unpickled or executed: the files are stored and served as bytes, the index is JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .base import Backend, ProductNotFound, StoreConflict, StoreCorrupt, StoreError, check_product_name

__all__ = [
    "INDEX",
    "MAX_DEPTH",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_REPORT_BYTES",
    "REPORT",
    "STALE_S",
    "SUFFIXES",
    "ReportFile",
    "ReportRecord",
    "check_report_name",
    "collect_report",
    "get_report_file",
    "latest_report",
    "media_type",
    "put_report",
]

REPORT = "report"  # <product>/report/
LATEST = "LATEST.json"
FORMAT = 1
INDEX = "index.html"
SUFFIXES = {".html": "text/html; charset=utf-8", ".png": "image/png"}
"""The suffixes a report's files may have, and the media type each is served as."""
MAX_DEPTH = 2  # index.html, histogram.png, gallery/000-frame.png
MAX_FILE_BYTES = 32 * 2**20
MAX_REPORT_BYTES = 256 * 2**20
MAX_FILES = 2000
STALE_S = 600.0
"""A report id older than this that is not the latest was left by a writer that died before its swap."""
SWAP_ATTEMPTS = 5
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class ReportFile:
    sha256: str
    size: int


@dataclass(frozen=True)
class ReportRecord:
    """The latest report of a product: the version it was published with, when, and its files."""

    product: str
    version: int
    created: float
    id: str
    files: Mapping[str, ReportFile]

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        """What the service answers about it: version, time, file names (sorted) and total bytes."""
        return {"version": self.version, "created": self.created, "files": sorted(self.files), "bytes": self.size}


def check_report_name(name: str) -> str:
    """``name`` if a report may hold a file of that name (module docstring, "Names"); StoreError otherwise."""
    parts = name.split("/") if isinstance(name, str) else []
    suffix = "." + name.rsplit(".", 1)[-1] if isinstance(name, str) and "." in name else ""
    if not (1 <= len(parts) <= MAX_DEPTH) or not all(_SEGMENT.fullmatch(p) for p in parts) or suffix not in SUFFIXES:
        raise StoreError(
            f"report file name {name!r}: use a relative path of at most {MAX_DEPTH} parts of letters, digits, "
            f"'_', '-' or '.', ending in {' or '.join(SUFFIXES)}"
        )
    return name


def media_type(name: str) -> str:
    """The media type a report file is served as (by its suffix; the name passes :func:`check_report_name`)."""
    return SUFFIXES["." + check_report_name(name).rsplit(".", 1)[1]]


def _checked(files: Mapping[str, bytes]) -> dict[str, bytes]:
    if INDEX not in files:
        raise StoreError(f"a report holds {INDEX}; got {sorted(files)[:5]}")
    if len(files) > MAX_FILES:
        raise StoreError(f"a report holds at most {MAX_FILES} files; got {len(files)}")
    total = 0
    out = {}
    for name, data in files.items():
        check_report_name(name)
        data = bytes(data)
        if len(data) > MAX_FILE_BYTES:
            raise StoreError(f"report file {name}: {len(data)} bytes, more than {MAX_FILE_BYTES}")
        if name.endswith(".png") and not data.startswith(_PNG_SIGNATURE):
            raise StoreError(f"report file {name}: not a PNG file")
        if name.endswith(".html"):
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise StoreError(f"report file {name}: not UTF-8 text") from None
        total += len(data)
        out[name] = data
    if total > MAX_REPORT_BYTES:
        raise StoreError(f"a report holds at most {MAX_REPORT_BYTES} bytes; got {total}")
    return out


class _References(HTMLParser):
    """Every ``src`` and ``href`` attribute of a page, in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [v for k, v in attrs if k in ("src", "href") and v]


def collect_report(directory: str | Path) -> tuple[dict[str, bytes], list[str]]:
    """``(files, left out)`` of the report in ``directory`` (module docstring, "Files from a folder"):
    name -> bytes of ``index.html`` and the files it refers to; the references not read."""
    root = Path(directory)
    try:
        index = (root / INDEX).read_bytes()
    except OSError as exc:
        raise StoreError(f"{root / INDEX}: cannot read the report ({exc.strerror or exc})") from None
    parser = _References()
    try:
        parser.feed(index.decode("utf-8"))
        parser.close()
    except UnicodeDecodeError:
        raise StoreError(f"{root / INDEX}: not UTF-8 text") from None
    files, left_out = {INDEX: index}, []
    for ref in dict.fromkeys(parser.found):
        parts = urlsplit(ref)
        if parts.scheme or parts.netloc or (not parts.path and parts.fragment):
            continue  # an absolute URL or a link within the page: nothing to store
        try:
            name = check_report_name(ref)
        except StoreError:
            left_out.append(ref)
            continue
        if name in files:
            continue
        try:
            files[name] = (root / name).read_bytes()
        except OSError as exc:
            raise StoreError(f"{root / INDEX} refers to {name}, which cannot be read ({exc.strerror or exc})") from None
    return files, left_out


def _prefix(product: str) -> str:
    return f"{check_product_name(product)}/{REPORT}/"


def _parse(product: str, data: bytes, where: str) -> ReportRecord:
    try:
        body = json.loads(data)
        if body.get("format") != FORMAT:
            raise StoreError(f"{where}: unsupported report format {body.get('format')!r}")
        files = {
            check_report_name(str(name)): ReportFile(sha256=str(f["sha256"]), size=int(f["size"]))
            for name, f in body["files"].items()
        }
        record = ReportRecord(
            product=product,
            version=int(body["version"]),
            created=float(body["created"]),
            id=str(body["id"]),
            files=files,
        )
    except StoreError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StoreCorrupt(f"{where}: unreadable report index") from None
    if not _SEGMENT.fullmatch(record.id) or not all(_SHA256.fullmatch(f.sha256) for f in files.values()):
        raise StoreCorrupt(f"{where}: unreadable report index")
    return record


def _read_latest(backend: Backend, product: str) -> tuple[ReportRecord | None, str | None]:
    """The latest report and the ETag of its index (``(None, None)`` without one; a garbage index is
    ``(None, etag)``, so that a new report can replace it)."""
    key = _prefix(product) + LATEST
    try:
        data, etag = backend.read(key)
    except KeyError:
        return None, None
    try:
        return _parse(product, data, f"{backend.describe()}/{key}"), etag
    except StoreError:
        return None, etag


def latest_report(backend: Backend, product: str) -> ReportRecord | None:
    """The latest report of ``product``, or None (module docstring, "Reading")."""
    key = _prefix(product) + LATEST
    try:
        data, _ = backend.read(key)
    except KeyError:
        return None
    return _parse(product, data, f"{backend.describe()}/{key}")


def get_report_file(backend: Backend, product: str, name: str) -> bytes:
    """The bytes of file ``name`` of ``product``'s latest report, verified (module docstring, "Reading")."""
    prefix = _prefix(product)
    try:
        check_report_name(name)
    except StoreError:
        raise ProductNotFound(f"{product!r}'s report has no file {name!r}") from None
    for _ in range(2):  # once more if a newer report replaced this one between the two reads
        record = latest_report(backend, product)
        if record is None:
            raise ProductNotFound(f"product {product!r} has no evaluation report in {backend.describe()}")
        ref = record.files.get(name)
        if ref is None:
            raise ProductNotFound(f"{product!r}'s report (v{record.version}) has no file {name!r}")
        key = f"{prefix}{record.id}/{name}"
        try:
            data, _ = backend.read(key)
        except KeyError:
            continue
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise StoreCorrupt(f"{backend.describe()}/{key}: checksum mismatch, the stored report file is corrupt")
        return data
    raise ProductNotFound(f"{product!r}'s report file {name!r} was replaced while it was read; read it again")


def put_report(
    backend: Backend, product: str, files: Mapping[str, bytes], *, version: int, created: float | None = None
) -> ReportRecord:
    """Store ``files`` (name -> bytes) as ``product``'s latest report, tagged with ``version`` and
    ``created`` (default: now); returns its record (module docstring, "Replacing")."""
    prefix = _prefix(product)
    checked = _checked(files)
    report_id = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
    record = ReportRecord(
        product=product,
        version=int(version),
        created=time.time() if created is None else float(created),
        id=report_id,
        files={n: ReportFile(hashlib.sha256(d).hexdigest(), len(d)) for n, d in sorted(checked.items())},
    )
    for name, data in sorted(checked.items()):
        backend.write(f"{prefix}{report_id}/{name}", data)
    body = {
        "format": FORMAT,
        "id": report_id,
        "version": record.version,
        "created": record.created,
        "files": {n: {"sha256": f.sha256, "size": f.size} for n, f in record.files.items()},
    }
    data = json.dumps(body, sort_keys=True).encode()
    for _ in range(SWAP_ATTEMPTS):
        replaced, etag = _read_latest(backend, product)
        try:
            backend.write(prefix + LATEST, data, if_none_match=etag is None, if_match=etag)
            break
        except StoreConflict:
            continue  # another report was stored meanwhile: swap over it
    else:
        _delete(backend, prefix, {report_id})
        raise StoreConflict(f"{product}: the report index kept changing under {SWAP_ATTEMPTS} attempts; retry")
    doomed = {replaced.id} if replaced is not None else set()
    cutoff = time.time_ns() - int(STALE_S * 1e9)
    for key in backend.list(prefix):
        rid, _, rest = key[len(prefix) :].partition("/")
        stamp = rid.split("-", 1)[0]
        if rest and stamp.isdigit() and int(stamp) < cutoff:
            doomed.add(rid)
    current, _ = _read_latest(backend, product)  # a writer that swapped after this one: its files stay
    _delete(backend, prefix, doomed - {report_id, current.id if current is not None else report_id})
    return record


def _delete(backend: Backend, prefix: str, report_ids: set[str]) -> None:
    """Every file of the reports ``report_ids``."""
    if report_ids:
        keys = [k for k in backend.list(prefix) if k[len(prefix) :].split("/", 1)[0] in report_ids]
        backend.delete(keys)
