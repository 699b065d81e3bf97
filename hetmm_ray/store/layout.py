"""Per-layer store layout (manifest format 2): one layer of one version, read without the others.

A template host holds (product, layer) shards of many products (distributed/hosts.py). Each
loads its layer from the store, so a read of one layer must not fetch the other layers'
bytes: with a wide backbone, layer3 alone is a fraction of a product's bank, and a
three-layer product was read three times over when every chunk held every layer.

Format 2 (what :class:`~hetmm_ray.store.versioned.VersionedStore` writes):

- ``chunks``: one object per (layer, image range); each ref is ``{"key", "sha256", "size",
  "images": [lo, hi], "layer": name}`` and the object holds one tensor named after the layer.
  Ranges are cut per layer at ``chunk_bytes`` of that layer's rows. An append keeps the
  parent's ranges for each layer, so unchanged rows hash to the parent's objects.
- ``selection``: ``{layer: ref}``, each object holding ``indices/<layer>`` and/or
  ``centres/<layer>`` (the names of ``TemplateSet.selection_tensors``), or None for ALL.

Format 1 (older stores) stays readable: :func:`read_layer` reads its whole chunks and keeps
the one layer. ``hetmm migrate`` republishes a format-1 head in format 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ..core.templates import TemplateSet
from .base import ProductNotFound, StoreCorrupt


class VersionedStore(Protocol):
    """What this module needs of :class:`~hetmm_ray.store.versioned.VersionedStore` (a protocol,
    so that the store imports this module and not the other way round)."""

    chunk_bytes: int

    def head(self, product: str) -> int: ...
    def manifest(self, product: str, version: int) -> dict[str, Any]: ...
    def _put_object(self, product: str, tensors: dict[str, Tensor]) -> dict[str, Any]: ...
    def _read_object(self, product: str, ref: dict[str, Any]) -> bytearray: ...
    @staticmethod
    def _extends(parent: dict[str, Any], ts: TemplateSet) -> bool: ...


__all__ = ["LayerData", "layer_chunks", "read_layer", "selection_refs", "tensors_from"]


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def tensors_from(buffer: bytearray, key: str) -> dict[str, Tensor]:
    """Zero-copy views of a safetensors buffer (the caller copies them where they belong)."""
    try:
        n = int.from_bytes(buffer[:8], "little")
        header = json.loads(bytes(buffer[8 : 8 + n]))
        out = {}
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            start, stop = spec["data_offsets"]
            dtype = _DTYPES[spec["dtype"]]
            flat = torch.frombuffer(buffer, dtype=dtype, offset=8 + n + start, count=(stop - start) // dtype.itemsize)
            out[name] = flat.view(spec["shape"])
        return out
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise StoreCorrupt(f"{key}: not a readable tensor file ({exc})") from None


@dataclass(frozen=True)
class LayerData:
    """One layer of one stored version: what a (product, layer) shard holds."""

    product: str
    layer: str
    version: int
    bank: Tensor  # (N, C, H, W)
    indices: Tensor | None  # (K, H, W) int64 when the selection is PTS-style
    centres: Tensor | None  # (K, C, H, W) when the selection is centroid-style

    @property
    def nbytes(self) -> int:
        parts = (self.bank, self.indices, self.centres)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


def selection_refs(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The selection object refs of a manifest by layer (format 1: its one object under ``""``)."""
    sel = manifest.get("selection")
    if not sel:
        return {}
    return dict(sel) if manifest.get("format", 1) >= 2 else {"": sel}


def layer_chunks(
    store: VersionedStore, product: str, ts: TemplateSet, parent: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Format-2 chunk refs for ``ts``'s bank, uploading the objects not stored yet."""
    reuse = (
        parent is not None
        and parent.get("format") == 2
        and parent["images"] <= ts.n_images
        and store._extends(parent, ts)
    )
    refs: list[dict[str, Any]] = []
    for layer, bank in ts.bank.items():
        per_image = max(1, bank[0].numel() * bank.element_size())
        step = max(1, store.chunk_bytes // per_image)
        ranges: list[tuple[int, int]] = []
        if reuse:
            assert parent is not None
            ranges = [tuple(r["images"]) for r in parent["chunks"] if r["layer"] == layer]  # type: ignore[misc]
        start = ranges[-1][1] if ranges else 0
        ranges += [(lo, min(ts.n_images, lo + step)) for lo in range(start, ts.n_images, step)]
        for lo, hi in ranges:
            ref = store._put_object(product, {layer: bank[lo:hi].cpu()})
            refs.append({**ref, "images": [lo, hi], "layer": layer})
    # Image-range order (then layer): an appended version's refs start with its parent's.
    return sorted(refs, key=lambda r: (r["images"][0], list(ts.bank).index(r["layer"])))


def read_layer(store: VersionedStore, product: str, layer: str, version: int | None = None) -> LayerData:
    """One verified layer of ``product`` at ``version`` (None = head); see the module docstring."""
    if version is None:
        version = store.head(product)
    m = store.manifest(product, version)
    if layer not in m["layers"]:
        raise ProductNotFound(f"product {product!r} v{version} has no layer {layer!r} (it has {sorted(m['layers'])})")
    spec = m["layers"][layer]
    bank = torch.empty((int(m["images"]), *spec["shape"]), dtype=getattr(torch, spec["dtype"]))
    for ref in m["chunks"]:
        if ref.get("layer", layer) != layer:
            continue  # format 2: another layer's object, never fetched
        start, stop = ref["images"]
        bank[start:stop].copy_(tensors_from(store._read_object(product, ref), ref["key"])[layer])
    indices = centres = None
    refs = selection_refs(m)
    ref = refs.get(layer, refs.get(""))
    if ref is not None:
        sel = tensors_from(store._read_object(product, ref), ref["key"])
        if f"indices/{layer}" in sel:
            indices = sel[f"indices/{layer}"].clone()
        if f"centres/{layer}" in sel:
            centres = sel[f"centres/{layer}"].clone()
    return LayerData(product=product, layer=layer, version=version, bank=bank, indices=indices, centres=centres)
