"""Versioned template sets in a local directory.

``<root>/<product>/v<NNNNNN>/templates.safetensors`` plus ``manifest.json``
(sha256 of the data), then ``<root>/<product>/HEAD`` naming the version,
replaced atomically and written last: a crash mid-publish leaves the old head.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from ..core.templates import TemplateError, TemplateSet
from .base import ProductNotFound, StoreError, check_product_name

__all__ = ["LocalStore"]

DATA = "templates.safetensors"
MANIFEST = "manifest.json"


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is not a directory")

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _product_dir(self, product: str) -> Path:
        return self.root / check_product_name(product)

    def products(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "HEAD").is_file())

    def versions(self, product: str) -> list[int]:
        d = self._product_dir(product)
        if not (d / "HEAD").is_file():
            raise ProductNotFound(f"unknown product {product!r} in store {self.root}")
        return sorted(int(p.name[1:]) for p in d.glob("v*") if p.name[1:].isdigit() and (p / MANIFEST).is_file())

    def head(self, product: str) -> int:
        head = self._product_dir(product) / "HEAD"
        try:
            return int(head.read_text().strip())
        except FileNotFoundError:
            raise ProductNotFound(f"unknown product {product!r} in store {self.root}") from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{head}: unreadable head pointer ({exc})") from None

    def put(self, product: str, template_set: TemplateSet) -> int:
        d = self._product_dir(product)
        d.mkdir(parents=True, exist_ok=True)
        existing = [int(p.name[1:]) for p in d.glob("v*") if p.name[1:].isdigit()]
        version = max(existing, default=0) + 1
        vdir = d / f"v{version:06d}"
        try:
            vdir.mkdir()
        except FileExistsError:
            raise StoreError(f"version {version} of {product!r} is being written by another writer; retry") from None
        data = template_set.to_bytes()
        _atomic_write(vdir / DATA, data)
        manifest = {
            "product": product,
            "version": version,
            "created": time.time(),
            "files": {DATA: hashlib.sha256(data).hexdigest()},
            "images": template_set.n_images,
            "weights_id": template_set.weights_id,
        }
        _atomic_write(vdir / MANIFEST, json.dumps(manifest, indent=1).encode())
        _atomic_write(d / "HEAD", f"{version}\n".encode())
        return version

    def get(self, product: str, version: int | None = None) -> TemplateSet:
        if version is None:
            version = self.head(product)
        vdir = self._product_dir(product) / f"v{version:06d}"
        try:
            manifest = json.loads((vdir / MANIFEST).read_text())
            data = (vdir / DATA).read_bytes()
        except FileNotFoundError:
            raise ProductNotFound(f"product {product!r} has no version {version} in store {self.root}") from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{vdir}: unreadable ({exc})") from None
        if hashlib.sha256(data).hexdigest() != manifest["files"][DATA]:
            raise StoreError(f"{vdir / DATA}: checksum mismatch, the stored templates are corrupt")
        try:
            return TemplateSet.from_bytes(data, source=str(vdir / DATA))
        except TemplateError as exc:
            raise StoreError(str(exc)) from None
