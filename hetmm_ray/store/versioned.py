"""Immutable, verified template versions over any :class:`Backend`.

Layout under a product::

    <product>/objects/<sha256>.safetensors   bank chunks and selections, content-addressed
    <product>/versions/<NNNNNN>.json        manifest of one version (immutable, carries its own sha256)
    <product>/HEAD                          {"version": n, "history": [kept versions],
                                             "candidates": [versions]} (candidates optional), written last
    <product>/moves/<time_ns>.json          one HEAD move that published nothing (rollback, repair)
    <product>/report/                       the latest evaluation report (store/reports.py)

Publishing writes data objects, then the manifest (create-only: it claims the
version number), then swaps HEAD with compare-and-swap on the ETag it read. A
crash before the HEAD swap leaves the old head serving and at most an orphan
manifest that no reader follows. Two writers racing: one swaps HEAD, the other
gets :class:`StoreConflict` and can retry. Readers follow HEAD to an immutable
manifest and objects whose sha256 is checked, so they see the old or the new
version, never a mix.

Banks grow by appended chunks: a version whose first images are its parent's
reuses the parent's chunk objects and uploads only the new images.

Manifest formats (``"format"``):

- 1 (the first format; read, never written): each chunk object holds every layer's rows of an
  image range, and one selection object holds every layer's indices/centres. Reading one layer
  reads them all. (tests/store_format1.py writes it, to test reading and migrating old stores.)
- 2 (written now): one chunk object per (layer, image range), each ref carrying ``"layer"``,
  and ``"selection"`` is ``{layer: ref}``. :meth:`VersionedStore.get_layer` reads one layer of
  one version and touches no other layer's object (store/layout.py; tests count the bytes).

HEAD moves that publish no version (a rollback, a repair that points HEAD elsewhere) are
recorded after the swap, one small create-only JSON object per move, ``{"kind": "rollback" |
"repair", "from": old head, "to": new head, "time": unix seconds}`` (:meth:`VersionedStore.moves`).
One object per move rather than a list in HEAD: HEAD's format stays what older readers and
writers expect (they ignore ``moves/``, and a writer that rewrites HEAD cannot drop the log),
and appending needs no read-modify-write on S3. A crash between the swap and the record loses
that one record (the move itself stands); a failed swap records nothing.

Candidates: ``put(..., candidate=True)`` (and ``republish``) writes the version
exactly as a publish does (objects, then the create-only manifest) and then swaps HEAD, by the
same compare-and-swap, to one that lists it under ``"candidates"`` with its ``version`` and
``history`` unchanged: readers that follow HEAD never see it. :meth:`VersionedStore.promote`
makes a candidate head (a CAS, then a move of kind ``promote`` in ``moves/``);
:meth:`VersionedStore.discard` drops it from the list (a CAS; its manifest stays an orphan).
Several candidates may exist at once. A candidate's ``parent`` is the head it was built over;
promoting it after HEAD has moved replaces that newer head (the comparison, not the store,
says whether it should). A HEAD without ``"candidates"`` is read as having none, so older
stores read as they did; an older writer that rewrites HEAD drops the list (the manifests stay).

Both formats are read. :meth:`VersionedStore.migrate` (``hetmm migrate``) republishes a
format-1 head in format 2 as a new version with the same content (a CAS on HEAD, like any
publish); older versions stay as they are and stay readable.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import Tensor

from ..config import ConfigError, stored_config
from ..core.scoring import Calibration, calibration_json
from ..core.templates import TemplateMeta, TemplateSet
from .base import Backend, ProductNotFound, StoreConflict, StoreCorrupt, StoreError, check_product_name
from .layout import LayerData, layer_chunks, read_layer, selection_refs
from .layout import tensors_from as _tensors_from
from .manifest import VersionRecord
from .reports import ReportRecord, get_report_file, latest_report, put_report

__all__ = ["VersionedStore"]

FORMAT = 2  # what put() writes (the only format written)
READABLE_FORMATS = (1, 2)
CHUNK_BYTES = 256 * 2**20  # bank bytes per chunk object: bounds memory on save and load
CLEANUP_STALE_S = 600.0  # a retention clean-up mark older than this was left by a crash
logger = logging.getLogger(__name__)
MOVES = "moves"  # <product>/moves/<time_ns>.json: HEAD moves that published nothing


def _sha256(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True).encode()


def _candidates(head: dict[str, Any]) -> list[int]:
    """HEAD's candidate versions (absent in a HEAD without any, and in older stores)."""
    return [int(v) for v in head.get("candidates", [])]


def _layout(ts: TemplateSet) -> dict[str, dict[str, Any]]:
    return {k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype).removeprefix("torch.")} for k, v in ts.bank.items()}


class VersionedStore:
    """The template store of docs/design.md: ``put``/``get``/``versions``/``products`` and more."""

    def __init__(self, backend: Backend, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.backend = backend
        self.chunk_bytes = chunk_bytes

    def __repr__(self) -> str:
        return f"VersionedStore({self.backend.describe()})"

    # --- reading -------------------------------------------------------------------------
    def _head(self, product: str) -> tuple[dict[str, Any], str] | None:
        key = f"{check_product_name(product)}/HEAD"
        try:
            data, etag = self.backend.read(key)
        except KeyError:
            return None
        try:
            head = json.loads(data)
            int(head["version"])
            list(head["history"])
        except (ValueError, KeyError, TypeError):
            raise StoreCorrupt(f"{self.backend.describe()}/{key}: unreadable head pointer") from None
        return head, etag

    def head(self, product: str) -> int:
        return int(self._require_head(product)[0]["version"])

    def products(self) -> list[str]:
        return sorted(k[: -len("/HEAD")] for k in self.backend.list("") if k.endswith("/HEAD") and k.count("/") == 1)

    def _require_head(self, product: str) -> tuple[dict[str, Any], str]:
        found = self._head(product)
        if found is None:
            raise ProductNotFound(f"unknown product {product!r} in store {self.backend.describe()}")
        return found

    def versions(self, product: str) -> list[int]:
        return sorted(int(v) for v in self._require_head(product)[0]["history"])

    def manifest(self, product: str, version: int) -> dict[str, Any]:
        """A version's manifest, verified against the sha256 it carries of its own body."""
        key = f"{check_product_name(product)}/versions/{version:06d}.json"
        try:
            data, _ = self.backend.read(key)
        except KeyError:
            raise ProductNotFound(
                f"product {product!r} has no version {version} in {self.backend.describe()}"
            ) from None
        try:
            manifest = json.loads(data)
            claimed = manifest.pop("sha256")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise StoreCorrupt(f"{self.backend.describe()}/{key}: unreadable manifest") from None
        if claimed != _sha256(_canonical(manifest)):
            raise StoreCorrupt(f"{self.backend.describe()}/{key}: manifest checksum mismatch, it is corrupt")
        if manifest.get("format") not in READABLE_FORMATS:
            raise StoreError(f"{key}: unsupported manifest format {manifest.get('format')!r}")
        return manifest

    def record(self, product: str, version: int | None = None) -> VersionRecord:
        """A version's manifest (``None`` = head) as a typed record (store/manifest.py): what code
        outside the store reads of a version. ConfigError if its stored configuration does not parse."""
        return VersionRecord.parse(self.manifest(product, self.head(product) if version is None else version))

    def _read_object(self, product: str, ref: dict[str, Any]) -> bytearray:
        buffer = bytearray(int(ref["size"]))
        key = f"{product}/{ref['key']}"
        try:
            self.backend.read_into(key, memoryview(buffer))
        except KeyError:
            raise StoreCorrupt(f"{self.backend.describe()}/{key}: object missing") from None
        if _sha256(buffer) != ref["sha256"]:
            raise StoreCorrupt(f"{self.backend.describe()}/{key}: checksum mismatch, the stored data is corrupt")
        return buffer

    def get(self, product: str, version: int | None = None, *, weights_id: str | None = None) -> TemplateSet:
        """A verified template set (``None`` = head). ``weights_id`` refuses another backbone's features."""
        if version is None:
            version = self.head(product)
        m = self.manifest(product, version)
        if weights_id is not None and m["weights_id"] != weights_id:
            raise StoreError(
                f"product {product!r} v{version} was built with weights {m['weights_id']}, not {weights_id}"
            )
        n = int(m["images"])
        bank = {
            name: torch.empty((n, *spec["shape"]), dtype=getattr(torch, spec["dtype"]))
            for name, spec in m["layers"].items()
        }
        for ref in m["chunks"]:
            start, stop = ref["images"]
            tensors = _tensors_from(self._read_object(product, ref), ref["key"])
            for name in [ref["layer"]] if "layer" in ref else bank:  # format 2: one layer per object
                bank[name][start:stop].copy_(tensors[name])
        selection: dict[str, Any] = {}
        if m.get("selection"):
            sel: dict[str, Tensor] = {}
            for ref in selection_refs(m).values():
                tensors = _tensors_from(self._read_object(product, ref), ref["key"])
                sel.update({k: v.clone() for k, v in tensors.items()})
            selection = TemplateSet.parse_selection(sel, list(bank))
        try:
            config = stored_config(m["config"])
        except ConfigError as exc:
            raise StoreCorrupt(f"{product} v{version}: stored configuration is invalid: {exc}") from None
        cal = m.get("calibration")
        return TemplateSet(
            bank=bank,
            config=config,
            weights_id=m["weights_id"],
            image_digests=tuple(m["image_digests"]),
            calibration=Calibration.from_json(cal),
            meta=TemplateMeta({**m.get("meta", {}), "version": version, "parent": m.get("parent")}),
            **selection,
        )

    # --- writing -------------------------------------------------------------------------
    def _put_object(self, product: str, tensors: dict[str, Tensor]) -> dict[str, Any]:
        data = st_save({k: v.contiguous() for k, v in tensors.items()})
        digest = _sha256(data)
        key = f"objects/{digest}.safetensors"
        if not self.backend.exists(f"{product}/{key}"):
            self.backend.upload(f"{product}/{key}", io.BytesIO(data), len(data))
        return {"key": key, "sha256": digest, "size": len(data)}

    @staticmethod
    def _extends(parent: dict[str, Any], ts: TemplateSet) -> bool:
        n = int(parent["images"])
        return parent["layers"] == _layout(ts) and tuple(parent["image_digests"]) == ts.image_digests[:n]

    def put(
        self, product: str, template_set: TemplateSet, *, expect_head: int | None = None, candidate: bool = False
    ) -> int:
        """Publish a new version and make it head; returns its number.

        ``expect_head``: fail with StoreConflict unless the head is still this version
        (optimistic concurrency for read-modify-write updates). ``candidate``: store it as a
        candidate of the head instead (HEAD keeps its version; see :meth:`promote`); a product's
        first version is always made head.
        """
        check_product_name(product)
        self.sweep_temp(product)  # what a writer killed mid-object left behind
        found = self._head(product)
        head: dict[str, Any] = found[0] if found else {"version": 0, "history": []}
        etag = found[1] if found else None
        if expect_head is not None and int(head["version"]) != expect_head:
            raise StoreConflict(f"{product}: head is v{head['version']}, not v{expect_head}; reload and retry")
        self._refuse_during_cleanup(product, head)
        parent = self.manifest(product, int(head["version"])) if found else None
        version = self._next_version(product, head)

        ts = template_set
        manifest = {
            "format": FORMAT,
            "product": product,
            "version": version,
            "parent": int(head["version"]) or None,
            "created": time.time(),
            "config": ts.config.stored_dict(),  # never this run's device, dtype or batch settings
            "backbone": ts.config.backbone.name,
            "weights_id": ts.weights_id,
            "layers": _layout(ts),
            "images": ts.n_images,
            "image_digests": list(ts.image_digests),
            "calibration": calibration_json(ts.calibration),
            "meta": {k: v for k, v in ts.meta.items() if k not in ("version", "parent")},
            "chunks": layer_chunks(self, product, ts, parent),
            "selection": self._selection_refs(product, ts),
        }
        sealed = {**manifest, "sha256": _sha256(_canonical(manifest))}
        self.backend.write(f"{product}/versions/{version:06d}.json", json.dumps(sealed).encode(), if_none_match=True)
        self._swap_head(product, head, etag, version, candidate=candidate and found is not None)
        return version

    def _swap_head(
        self, product: str, head: dict[str, Any], etag: str | None, version: int, *, candidate: bool
    ) -> None:
        """The last step of a publish: a compare-and-swap of HEAD on ``etag`` that makes ``version``
        head (appended to the history) or, for a candidate, adds it to ``candidates`` (HEAD's
        version and history unchanged). Other candidates are carried over either way."""
        if candidate:
            new_head = {**head, "candidates": [*_candidates(head), version]}
        else:
            new_head = {"version": version, "history": [*head["history"], version]}
            if _candidates(head):
                new_head["candidates"] = _candidates(head)
        self.backend.write(f"{product}/HEAD", json.dumps(new_head).encode(), if_none_match=etag is None, if_match=etag)

    @staticmethod
    def _refuse_during_cleanup(product: str, head: dict[str, Any]) -> None:
        cleanup = head.get("cleanup")
        if cleanup and time.time() - cleanup["since"] < CLEANUP_STALE_S:
            # Objects are being deleted: an 'exists' check now could trust a doomed object.
            raise StoreConflict(f"{product}: retention clean-up in progress; retry shortly")

    def _next_version(self, product: str, head: dict[str, Any]) -> int:
        """One past the head and every manifest written (an orphan manifest's number is never reused)."""
        existing = [
            int(k.rsplit("/", 1)[1].split(".")[0])
            for k in self.backend.list(f"{product}/versions/")
            if k.endswith(".json")
        ]
        return max([int(head["version"]), *existing]) + 1

    def republish(
        self,
        product: str,
        *,
        config: dict[str, Any],
        expect_head: int,
        meta: dict[str, Any] | None = None,
        candidate: bool = False,
    ) -> int:
        """Publish the head's content again under another stored configuration, as a new version.

        For settings that act at predict time (the threshold rule and its parameter): the bank,
        selection, image digests and calibration (its out-of-fold scores) stay the parent's, and
        the new manifest refers to the parent's content-addressed objects, so nothing is uploaded
        and nothing but the parent's manifest is read. ``config``: a stored configuration
        (``DetectorConfig.stored_dict()``); one that ``stored_config`` refuses raises ConfigError
        and publishes nothing. ``meta`` is merged over the parent's. StoreConflict unless the head
        is still ``expect_head``. ``candidate``: stored as a candidate (:meth:`put`). Returns the new version.
        """
        check_product_name(product)
        head, etag = self._require_head(product)
        if int(head["version"]) != expect_head:
            raise StoreConflict(f"{product}: head is v{head['version']}, not v{expect_head}; reload and retry")
        self._refuse_during_cleanup(product, head)
        stored_config(config)  # ConfigError before anything is written
        parent = self.manifest(product, expect_head)
        version = self._next_version(product, head)
        manifest = {
            **parent,  # same format, layers, digests, calibration and object refs
            "version": version,
            "parent": expect_head,
            "created": time.time(),
            "config": config,
            "meta": {**parent.get("meta", {}), **(meta or {})},
        }
        sealed = {**manifest, "sha256": _sha256(_canonical(manifest))}
        self.backend.write(f"{product}/versions/{version:06d}.json", json.dumps(sealed).encode(), if_none_match=True)
        self._swap_head(product, head, etag, version, candidate=candidate)
        return version

    def _selection_refs(self, product: str, ts: TemplateSet) -> Any:
        sel = ts.selection_tensors()
        if not sel:
            return None
        return {
            layer: self._put_object(product, {k: v for k, v in sel.items() if k.split("/", 1)[1] == layer})
            for layer in ts.layers
        }

    def get_layer(self, product: str, layer: str, version: int | None = None) -> LayerData:
        """One layer of one version (``None`` = head): its bank and selection, verified.

        Format 2 reads only that layer's objects; a format-1 version has no per-layer
        objects, so its whole chunks are read and the other layers dropped (``hetmm migrate``).
        """
        return read_layer(self, product, layer, version)

    def migrate(self, product: str) -> dict[str, Any]:
        """Republish a format-1 head in the current format, as a new version with the same content.

        Returns ``{"product", "from_version", "version", "format", "migrated"}``; a head already in
        the current format is left alone (``migrated`` False). Another writer moving HEAD meanwhile
        makes this raise :class:`StoreConflict` (nothing changed; run it again).
        """
        head = self.head(product)
        m = self.manifest(product, head)
        if m["format"] == FORMAT:
            return {"product": product, "from_version": head, "version": head, "format": m["format"], "migrated": False}
        ts = self.get(product, head)
        meta = {k: v for k, v in ts.meta.items() if k not in ("version", "parent")}
        ts = replace(ts, meta=TemplateMeta({**meta, "migrated_from": {"version": head, "format": m["format"]}}))
        version = self.put(product, ts, expect_head=head)
        out = {"product": product, "from_version": head, "version": version, "format": FORMAT}
        return {**out, "migrated": True}

    def rollback(self, product: str, version: int) -> int:
        """Make a kept older version head again."""
        head, etag = self._require_head(product)
        if version not in head["history"]:
            raise ProductNotFound(f"product {product!r} has no kept version {version} (kept: {head['history']})")
        self.get(product, version)  # verify it loads before pointing readers at it
        self.backend.write(f"{product}/HEAD", json.dumps({**head, "version": version}).encode(), if_match=etag)
        self._record_move(product, "rollback", int(head["version"]), version)
        return version

    def _record_move(self, product: str, kind: str, old: int | None, new: int) -> None:
        """Append one HEAD move to ``<product>/moves/`` (after the swap it records; see the module doc).

        A move to where HEAD already was is not recorded. The record is best effort: the move has
        happened, so a store error here is logged, not raised (the caller must not retry the move).
        """
        if old == new:
            return
        record = json.dumps({"kind": kind, "from": old, "to": new, "time": time.time()}).encode()
        for _ in range(3):
            key = f"{product}/{MOVES}/{time.time_ns():020d}.json"
            try:
                self.backend.write(key, record, if_none_match=True)
                return
            except StoreConflict:  # two moves in the same nanosecond: take the next one
                continue
            except StoreError as exc:
                logger.warning("%s: HEAD moved %s -> %s but not recorded: %s", product, old, new, exc)
                return

    def moves(self, product: str, *, last: int | None = None) -> list[dict[str, Any]]:
        """The recorded HEAD moves of ``product``, oldest first: ``{"kind", "from", "to", "time"}``.

        ``last``: read only the newest ``last`` records (one object read each). A record that does
        not parse is skipped (a reader of history must not fail on one bad entry).
        """
        keys = sorted(k for k in self.backend.list(f"{check_product_name(product)}/{MOVES}/") if k.endswith(".json"))
        out = []
        for key in keys if last is None else keys[-last:]:
            try:
                data, _ = self.backend.read(key)
                record = json.loads(data)
                move = {
                    "kind": str(record["kind"]),
                    "from": None if record["from"] is None else int(record["from"]),
                    "to": int(record["to"]),
                    "time": float(record["time"]),
                }
            except (KeyError, ValueError, TypeError, AttributeError):
                continue
            out.append(move)
        return sorted(out, key=lambda m: m["time"])

    # --- candidates ----------------------------------------------------------------------
    def candidates(self, product: str) -> list[int]:
        """The product's candidate versions, oldest first: stored and verified, not head."""
        return _candidates(self._require_head(product)[0])

    def head_and_candidates(self, product: str) -> tuple[int, list[int]]:
        """The head version and the candidates, from one read of HEAD (a store poll's one request)."""
        head = self._require_head(product)[0]
        return int(head["version"]), _candidates(head)

    def promote(self, product: str, version: int, *, expect_head: int | None = None) -> int:
        """Make candidate ``version`` head: one compare-and-swap of HEAD (the version appended to
        the history, dropped from the candidates), then recorded as a move of kind ``promote``
        (like a rollback). ``expect_head``: StoreConflict unless the head is still this version (a
        promote decided on a comparison against that head). A racing writer that moved HEAD
        between the read and the swap makes this raise StoreConflict; nothing changed then.
        ProductNotFound if ``version`` is not a candidate. Returns ``version``."""
        head, etag = self._require_head(product)
        if version not in _candidates(head):
            raise ProductNotFound(
                f"product {product!r} has no candidate v{version} (candidates: {_candidates(head) or 'none'})"
            )
        old = int(head["version"])
        if expect_head is not None and old != expect_head:
            raise StoreConflict(f"{product}: head is v{old}, not v{expect_head}; compare again and retry")
        self._refuse_during_cleanup(product, head)
        self.get(product, version)  # verify it loads before pointing readers at it
        rest = [v for v in _candidates(head) if v != version]
        new_head = {k: v for k, v in head.items() if k != "candidates"}
        new_head.update(version=version, history=[*head["history"], version])
        if rest:
            new_head["candidates"] = rest
        self.backend.write(f"{product}/HEAD", json.dumps(new_head).encode(), if_match=etag)
        self._record_move(product, "promote", old, version)
        return version

    def discard(self, product: str, version: int) -> int:
        """Drop candidate ``version`` (a compare-and-swap of HEAD; the head does not move and no move
        is recorded). Its manifest stays as an orphan that no reader follows, and its number is never
        reused; its objects go with the next retention clean-up unless another version holds them.
        ProductNotFound if it is not a candidate; StoreConflict if HEAD changed meanwhile."""
        head, etag = self._require_head(product)
        if version not in _candidates(head):
            raise ProductNotFound(
                f"product {product!r} has no candidate v{version} (candidates: {_candidates(head) or 'none'})"
            )
        rest = [v for v in _candidates(head) if v != version]
        new_head = {k: v for k, v in head.items() if k != "candidates"}
        if rest:
            new_head["candidates"] = rest
        self.backend.write(f"{product}/HEAD", json.dumps(new_head).encode(), if_match=etag)
        return version

    def retain(self, product: str, keep: int) -> list[int]:
        """Keep the newest ``keep`` versions and the head; delete the rest. Returns deleted versions.

        HEAD carries a clean-up mark while objects are deleted; publishes wait for it to
        clear (or to go stale after a crash), so none can reuse an object being deleted.
        """
        if keep < 1:
            raise StoreError("retention must keep at least 1 version")
        head, etag = self._require_head(product)
        history = sorted(head["history"])
        kept = sorted(set(history[-keep:]) | {int(head["version"])})
        dropped = [v for v in history if v not in kept]
        if not dropped:
            return []
        # a candidate may share chunk objects with any kept or dropped version: they stay
        live = {ref["key"] for v in [*kept, *_candidates(head)] for ref in self._refs(self.manifest(product, v))}
        doomed: set[str] = set()
        for v in dropped:
            doomed |= {ref["key"] for ref in self._refs(self.manifest(product, v))}
        marked = {**head, "history": kept, "cleanup": {"since": time.time()}}
        etag = self.backend.write(f"{product}/HEAD", json.dumps(marked).encode(), if_match=etag)
        self.backend.delete([f"{product}/versions/{v:06d}.json" for v in dropped])
        self.backend.delete([f"{product}/{k}" for k in sorted(doomed - live)])
        for _ in range(3):  # a rollback may have moved HEAD meanwhile: re-read and clear the mark
            try:
                current, etag = self._require_head(product)
                current.pop("cleanup", None)
                self.backend.write(f"{product}/HEAD", json.dumps(current).encode(), if_match=etag)
                break
            except StoreConflict:
                continue
        return dropped

    @staticmethod
    def _refs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
        return [*manifest["chunks"], *selection_refs(manifest).values()]

    def sweep_temp(self, product: str) -> list[str]:
        """Remove temporary files that killed writers left under ``product`` (local stores; S3 has none)."""
        sweep = getattr(self.backend, "sweep_temp", None)
        return sweep(f"{check_product_name(product)}/") if sweep is not None else []

    def repair(self, product: str) -> dict[str, Any]:
        """Rebuild a garbage or missing HEAD from the newest version that loads and verifies.

        A HEAD that is readable and whose version loads is left alone. Otherwise the new
        HEAD's history is every version whose manifest verifies, and its version the newest
        of them whose objects load with matching checksums. Stale temporary files are swept
        either way. Returns ``{"version", "history", "rebuilt", "swept"}``.
        """
        check_product_name(product)
        swept = self.sweep_temp(product)
        try:
            found = self._head(product)
        except StoreCorrupt:
            found = None
        if found is not None:
            head = found[0]
            try:
                self.get(product, int(head["version"]))
                return {"version": int(head["version"]), "history": head["history"], "rebuilt": False, "swept": swept}
            except StoreError:
                pass  # the head points at a version that does not load: rebuild
        listed = sorted(
            int(name)
            for k in self.backend.list(f"{product}/versions/")
            if k.endswith(".json") and (name := k.rsplit("/", 1)[1].removesuffix(".json")).isdigit()
        )
        history = []
        for v in listed:
            try:
                self.manifest(product, v)
                history.append(v)
            except StoreError:
                continue
        version = None
        for v in reversed(history):
            try:
                self.get(product, v)
                version = v
                break
            except StoreError:
                continue
        if version is None:
            raise ProductNotFound(
                f"product {product!r}: no version in {self.backend.describe()} loads; nothing to repair from"
            )
        try:
            _, etag = self.backend.read(f"{product}/HEAD")
        except KeyError:
            etag = None
        new_head = {"version": version, "history": history}
        self.backend.write(f"{product}/HEAD", json.dumps(new_head).encode(), if_none_match=etag is None, if_match=etag)
        self._record_move(product, "repair", None if found is None else int(found[0]["version"]), version)
        return {"version": version, "history": history, "rebuilt": True, "swept": swept}

    # --- the latest evaluation report (store/reports.py) --------------------------------------
    def put_report(self, product: str, files: Mapping[str, bytes], *, version: int) -> ReportRecord:
        """Store ``files`` (name -> bytes: ``index.html`` and its PNGs, ``reports.collect_report``) as
        ``product``'s latest report, tagged with ``version`` and the time now; it replaces the earlier
        one. ProductNotFound unless ``version`` is a stored version of ``product``; StoreError for a
        name or size the report rules refuse (store/reports.py), before anything is written."""
        self.manifest(product, version)
        return put_report(self.backend, product, files, version=version)

    def latest_report(self, product: str) -> ReportRecord | None:
        """``product``'s latest evaluation report (its version, time and files), or None."""
        return latest_report(self.backend, product)

    def get_report_file(self, product: str, name: str) -> bytes:
        """File ``name`` of ``product``'s latest report, checked against its recorded sha256.
        ProductNotFound without a report, or for a name outside its files."""
        return get_report_file(self.backend, product, name)

    def delete_product(self, product: str) -> None:
        """Remove a product: its head first (it disappears at once), then every object (its
        labels, record and report included)."""
        try:
            self._require_head(product)
        except StoreCorrupt:
            pass  # a garbage HEAD must not keep the operator from deleting the product
        self.backend.delete([f"{product}/HEAD"])
        self.backend.delete(list(self.backend.list(f"{product}/")))
