"""Backbone features written to a file, and replayed in place of the backbone.

Why: a stored product's scores pass through two kinds of arithmetic. The backbone's convolutions
run in kernels chosen for the CPU (oneDNN's AVX-512 or AVX2 paths, OpenVINO's plugins), so its
features differ between machines by float32 rounding (about 1e-4 relative was seen between an
Intel Xeon and an AMD EPYC), and no score through it is bit-equal on another CPU. What follows the
backbone (ATMM over the stored templates, fusion, the image score, the threshold from the stored
calibration) is the product's own logic: given the same features it must give the same scores.

So a store's regeneration script (``tests/data/*/make_store.py``, run once with the code of the
time) records every image row the backbone saw and the features it returned (:func:`recording`),
and today's tests replay them (:func:`replaying`): ``Backbone.forward`` then answers each input row
with the recorded features of the same row, whatever the batching, and the scoring of those
features is compared with what the old code scored on them.

A recorded row matches an input row when they are equal to 1e-6 (they are the same image's canvas:
decoding and resizing are integer work, ``/ 255`` is one IEEE division). An input row that matches
no recorded row is an error, except an all-zero one (``Backbone.feature_shapes``'s dry run), which
the real network answers. Only ``torch`` and ``hetmm_ray.core.backbone.Backbone`` are used here,
so a regeneration script runs this module against old code too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from hetmm_ray.core.backbone import Backbone

__all__ = ["FeatureRecord", "recording", "replaying"]

ROW_TOLERANCE = 1e-6


class FeatureRecord:
    """Input rows (N, 3, H, W) and, per layer, the features the backbone gave each row."""

    def __init__(self) -> None:
        self.inputs: list[Tensor] = []
        self.features: list[dict[str, Tensor]] = []
        self.replayed = 0  # rows answered from the record
        self.computed = 0  # all-zero rows answered by the network

    def add(self, images: Tensor, feats: dict[str, Tensor]) -> None:
        for i in range(images.shape[0]):
            if not bool(images[i].any()):
                continue  # a dry run: not the product's images
            self.inputs.append(images[i].detach().float().cpu().clone())
            self.features.append({k: v[i].detach().cpu().clone() for k, v in feats.items()})

    def find(self, row: Tensor) -> dict[str, Tensor] | None:
        row = row.detach().float().cpu()
        for x, f in zip(self.inputs, self.features, strict=True):
            if x.shape == row.shape and float((x - row).abs().max()) <= ROW_TOLERANCE:
                return f
        return None

    def save(self, path: Path) -> None:
        tensors: dict[str, Tensor] = {}
        for i, (x, f) in enumerate(zip(self.inputs, self.features, strict=True)):
            tensors[f"{i}/input"] = x.contiguous()
            tensors.update({f"{i}/{k}": v.contiguous() for k, v in f.items()})
        save_file(tensors, str(path))

    @classmethod
    def load(cls, path: Path) -> FeatureRecord:
        tensors = load_file(str(path))
        record = cls()
        for i in range(len({k.split("/", 1)[0] for k in tensors})):
            record.inputs.append(tensors[f"{i}/input"])
            record.features.append(
                {
                    k.split("/", 1)[1]: v
                    for k, v in tensors.items()
                    if k.startswith(f"{i}/") and not k.endswith("/input")
                }
            )
        return record


@contextmanager
def recording(path: Path) -> Iterator[FeatureRecord]:
    """Run the real backbone and write every product image row it saw, with its features, to ``path``."""
    record = FeatureRecord()
    real = Backbone.forward

    def forward(self: Backbone, images: Tensor) -> dict[str, Tensor]:
        feats = real(self, images)
        record.add(images, feats)
        return feats

    Backbone.forward = forward  # type: ignore[method-assign]
    try:
        yield record
    finally:
        Backbone.forward = real  # type: ignore[method-assign]
    record.save(path)


@contextmanager
def replaying(path: Path) -> Iterator[FeatureRecord]:
    """``Backbone.forward`` answers from the record at ``path`` (see the module's docstring)."""
    record = FeatureRecord.load(path)
    real = Backbone.forward

    def forward(self: Backbone, images: Tensor) -> dict[str, Tensor]:
        rows: list[dict[str, Tensor]] = []
        for i in range(images.shape[0]):
            if not bool(images[i].any()):
                rows.append({k: v[0] for k, v in real(self, images[i : i + 1]).items()})
                record.computed += 1
                continue
            found = record.find(images[i])
            if found is None:
                raise AssertionError(
                    f"an input row the record at {path} does not hold (shape {tuple(images[i].shape)})"
                )
            rows.append(found)
            record.replayed += 1
        return {k: torch.stack([r[k] for r in rows]).to(images.device) for k in rows[0]}

    Backbone.forward = forward  # type: ignore[method-assign]
    try:
        yield record
    finally:
        Backbone.forward = real  # type: ignore[method-assign]
