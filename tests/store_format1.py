"""A format-1 manifest writer, for tests only: stores as the writers of format 1 left them.

The library reads format 1 and never writes it (store/versioned.py). Tests that prove old
stores stay readable and migrate make one with :func:`put_format1`: the version is published
as the store publishes any version, then its manifest is rewritten in the old layout (each
chunk object holds every layer's rows of an image range; one selection object holds every
layer's indices/centres) and sealed again. The format-2 objects of that publish stay as
unreferenced objects, which no reader follows.
"""

from __future__ import annotations

import json
from typing import Any

from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.store import VersionedStore
from hetmm_ray.store.versioned import _canonical, _layout, _sha256

__all__ = ["put_format1"]


def _chunks(store: VersionedStore, product: str, ts: TemplateSet, parent: dict[str, Any] | None) -> list[dict]:
    """Format-1 chunk refs: an append keeps a format-1 parent's chunk boundaries, so the unchanged
    images hash to the parent's objects (as the old writer did)."""
    per_image = sum(v[0].numel() * v.element_size() for v in ts.bank.values())
    step = max(1, store.chunk_bytes // max(per_image, 1))
    ranges: list[tuple[int, int]] = []
    if parent is not None and parent["format"] == 1:
        n = int(parent["images"])
        if parent["layers"] == _layout(ts) and tuple(parent["image_digests"]) == ts.image_digests[:n]:
            ranges = [tuple(ref["images"]) for ref in parent["chunks"]]  # type: ignore[misc]
    start = ranges[-1][1] if ranges else 0
    ranges += [(lo, min(ts.n_images, lo + step)) for lo in range(start, ts.n_images, step)]
    return [
        {**store._put_object(product, {k: v[lo:hi].cpu() for k, v in ts.bank.items()}), "images": [lo, hi]}
        for lo, hi in ranges
    ]


def put_format1(store: VersionedStore, product: str, ts: TemplateSet) -> int:
    """Publish ``ts`` as a new head of ``product`` in manifest format 1; returns its version."""
    version = store.put(product, ts)
    manifest = store.manifest(product, version)
    parent = store.manifest(product, manifest["parent"]) if manifest["parent"] else None
    sel = ts.selection_tensors()
    manifest = {
        **manifest,
        "format": 1,
        "chunks": _chunks(store, product, ts, parent),
        "selection": store._put_object(product, sel) if sel else None,
    }
    sealed = {**manifest, "sha256": _sha256(_canonical(manifest))}
    store.backend.write(f"{product}/versions/{version:06d}.json", json.dumps(sealed).encode())
    return version
