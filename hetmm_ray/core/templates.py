"""TemplateSet: a product's per-layer feature bank, its selection, and provenance.

The bank holds every good image's features (the "ALL" set, docs/algorithm.md §2).
A compressed tiny set is stored as per-pixel bank indices ``(K, H, W)`` per
layer, so it is derivable, checkable and cheap to keep next to the bank; only
selections that are not bank vectors (``pc_k`` k-means centres) keep their
``(K, C, H, W)`` centres instead.
The store (``store/``) keeps it as safetensors objects per layer plus a JSON manifest
(never pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ..config import DetectorConfig
from ..errors import HetmmError
from .pts import select_templates
from .scoring import Calibration

__all__ = ["TemplateError", "TemplateSet"]


def unseen_positions(known: tuple[str, ...] | list[str], digests: list[str] | tuple[str, ...]) -> list[int]:
    """Positions in ``digests`` of images not in ``known`` and not repeated earlier in ``digests``.

    Hot updates keep only these, so sending the same good images twice (a client's retry)
    changes nothing: the bank, the selection and the threshold stay as they are.
    """
    seen = set(known)
    keep = []
    for i, d in enumerate(digests):
        if d not in seen:
            seen.add(d)
            keep.append(i)
    return keep


class TemplateError(HetmmError, ValueError):
    """Stored templates are unreadable or do not fit the detector."""


@dataclass(frozen=True)
class TemplateSet:
    """Everything needed to score a product, independent of where it is stored."""

    bank: dict[str, Tensor]  # layer -> (N, C, H, W), L2-normalised per pixel
    config: DetectorConfig
    weights_id: str
    image_digests: tuple[str, ...]
    calibration: Calibration | None = None
    indices: dict[str, Tensor] | None = None  # layer -> (K, H, W) bank indices; None = ALL
    centres: dict[str, Tensor] | None = None  # layer -> (K, C, H, W) templates that are not bank vectors
    meta: dict[str, Any] = field(default_factory=dict)  # free-form provenance (parent, created, ...)

    def __post_init__(self) -> None:
        # A template set is the product: it never carries the run-time settings (device, dtype,
        # batch sizes) of the process that built it (config.RUN_TIME_SETTINGS).
        object.__setattr__(self, "config", self.config.product_only())
        n = {v.shape[0] for v in self.bank.values()}
        if len(n) != 1:
            raise TemplateError(f"bank layers disagree on the image count: {sorted(n)}")
        if n.pop() != len(self.image_digests):
            raise TemplateError("bank image count and image digests disagree")

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(self.bank)

    @property
    def n_images(self) -> int:
        return len(self.image_digests)

    @property
    def sheets(self) -> int:
        chosen = self.indices or self.centres
        return self.n_images if chosen is None else next(iter(chosen.values())).shape[0]

    def templates(self, layer: str) -> Tensor:
        """The (K, C, H, W) templates ATMM matches against for ``layer``."""
        if self.centres is not None:
            return self.centres[layer]
        bank = self.bank[layer]
        if self.indices is None:
            return bank
        return select_templates(bank, self.indices[layer])  # the one gather (core/pts.py)

    def appended(self, bank: dict[str, Tensor], digests: tuple[str, ...], **changes: Any) -> TemplateSet:
        """A new set with more images' features appended to the bank (selection reset)."""
        if set(bank) != set(self.bank):
            raise TemplateError(f"new features have layers {sorted(bank)}, the set has {sorted(self.bank)}")
        grown = {k: torch.cat([self.bank[k], bank[k].to(self.bank[k].dtype)]) for k in self.bank}
        return replace(
            self, bank=grown, image_digests=self.image_digests + digests, indices=None, centres=None, **changes
        )

    def selection_tensors(self) -> dict[str, Tensor]:
        """The selection as named tensors (``indices/<layer>`` or ``centres/<layer>``); empty for ALL."""
        out = {f"indices/{k}": v.contiguous().cpu() for k, v in (self.indices or {}).items()}
        out.update({f"centres/{k}": v.contiguous().cpu() for k, v in (self.centres or {}).items()})
        return out

    @staticmethod
    def parse_selection(tensors: dict[str, Tensor], layers: list[str]) -> dict[str, Any]:
        """Inverse of :meth:`selection_tensors`: ``indices=`` and ``centres=`` keyword arguments."""
        return {
            kind: {k: tensors[f"{kind}/{k}"] for k in layers} if f"{kind}/{layers[0]}" in tensors else None
            for kind in ("indices", "centres")
        }
