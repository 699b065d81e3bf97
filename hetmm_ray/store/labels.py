"""Labelled images of a product, kept in the template store: a validation set that grows as people teach.

The inspection console (``GET /ui/``) records a label whenever someone says of an
inspected image "good part (false alarm)" or "confirmed defect". Each label is two
objects beside the product's versions, so they live (and are deleted) with the product
and every service and the CLI on the same store see the same set::

    {product}/labels/{id}.img    the image exactly as it was uploaded (PNG/JPEG/BMP/TIFF bytes)
    {product}/labels/{id}.json   {"id", "label": "good"|"defective", "name", "created", "version", "note"}

``id`` is the first 16 hex digits of the image's sha256: the same image labelled again
replaces its earlier label (the latest word wins) instead of counting twice. The image is
written before its record, so a reader never sees a record without its image; listing
reads only records. Nothing here is unpickled: images are decoded by ``data/decode.py``
with its checks, records are JSON.

:meth:`LabelSet.labelled` gives ``(name, bytes, 0|1)`` for the labelled calibration
(``POST /v1/products/{p}/calibrate`` with ``{"source": "store:labels"}``, and
``hetmm calibrate --val-store``). A "good part" label is usually also inserted as a
normal (the console does both), so its later scores are in-sample (near zero): it still
counts for the false-alarm side of the validation set, as a part that must pass.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from .base import Backend, StoreError, check_product_name

__all__ = ["LABELS", "STORED_LABELS", "LabelSet"]

LABELS = ("good", "defective")
STORED_LABELS = "store:labels"
"""The calibrate route's ``source`` (and what ``--val-store`` stands for): this module's set."""


class LabelSet:
    """The labelled images of every product in one store backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @staticmethod
    def _prefix(product: str) -> str:
        return f"{check_product_name(product)}/labels/"

    @staticmethod
    def _check_id(label_id: str) -> str:
        if len(label_id) != 16 or any(c not in "0123456789abcdef" for c in label_id):
            raise StoreError(f"label id {label_id!r}: expected 16 lower-case hex digits")
        return label_id

    def add(
        self, product: str, image: bytes, label: str, *, name: str = "", version: int | None = None, note: str = ""
    ) -> dict[str, Any]:
        """Label ``image`` (encoded bytes) as ``good`` or ``defective``; returns the record."""
        if label not in LABELS:
            raise StoreError(f"label {label!r}: choose one of {', '.join(LABELS)}")
        prefix = self._prefix(product)
        label_id = hashlib.sha256(image).hexdigest()[:16]
        record = {
            "id": label_id,
            "label": label,
            "name": str(name)[:200],
            "created": time.time(),
            "version": version,
            "note": str(note)[:500],
        }
        self.backend.write(f"{prefix}{label_id}.img", image)
        self.backend.write(f"{prefix}{label_id}.json", json.dumps(record).encode())
        return record

    def records(self, product: str) -> list[dict[str, Any]]:
        """Every label of ``product``, oldest first."""
        prefix = self._prefix(product)
        out = []
        for key in self.backend.list(prefix.rstrip("/")):
            if not key.endswith(".json"):
                continue
            try:
                record = json.loads(self.backend.read(key)[0])
            except KeyError:
                continue  # deleted while listing
            except ValueError:
                raise StoreError(f"{self.backend.describe()}/{key}: unreadable label record") from None
            if isinstance(record, dict) and record.get("label") in LABELS:
                out.append(record)
        return sorted(out, key=lambda r: (r.get("created") or 0, r["id"]))

    def image(self, product: str, label_id: str) -> bytes:
        """The labelled image's bytes (KeyError if there is no such label)."""
        return self.backend.read(f"{self._prefix(product)}{self._check_id(label_id)}.img")[0]

    def delete(self, product: str, label_id: str) -> None:
        prefix = self._prefix(product) + self._check_id(label_id)
        self.backend.delete([f"{prefix}.json", f"{prefix}.img"])

    def labelled(self, product: str) -> list[tuple[str, bytes, int]]:
        """``(name, image bytes, 1 if defective else 0)`` of every label, oldest first."""
        out = []
        for record in self.records(product):
            try:
                data = self.image(product, record["id"])
            except KeyError:
                continue
            out.append((record.get("name") or record["id"], data, int(record["label"] == "defective")))
        return out
