"""TemplateSet: a product's per-layer feature bank, its selection, and provenance.

The bank holds every good image's features (the "ALL" set, docs/algorithm.md §2).
A compressed tiny set is stored as per-pixel bank indices ``(K, H, W)`` per
layer, so it is derivable, checkable and cheap to keep next to the bank; only
selections that are not bank vectors (``pc_k`` k-means centres) keep their
``(K, C, H, W)`` centres instead.
The store (``store/``) keeps it as safetensors objects per layer plus a JSON manifest
(never pickle).

:class:`TemplateMeta` is the set's provenance (the manifest's ``meta``, plus the ``version``
and ``parent`` the store adds on read): typed accessors over the JSON object as it is stored,
so what is on disk stays byte for byte what older versions wrote and read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ..config import DetectorConfig
from ..errors import HetmmError
from .pts import select_templates
from .scoring import Calibration

__all__ = ["SheetsAuto", "TemplateError", "TemplateMeta", "TemplateSet", "unseen_positions"]


def unseen_positions(
    known: tuple[str, ...] | list[str],
    digests: list[str] | tuple[str, ...],
    aliases: Sequence[str] | None = None,
) -> list[int]:
    """Positions in ``digests`` of images not in ``known`` and not repeated earlier in ``digests``.

    Hot updates keep only these, so sending the same good images twice (a client's retry)
    changes nothing: the bank, the selection and the threshold stay as they are. ``aliases[i]``:
    another digest image ``i`` may be known by (``data.decode.canvas_digest``: what older
    ``hetmm fit`` stored); an image whose alias is in ``known`` is held too.
    """
    bank = frozenset(known)
    seen = set(bank)  # grows with the new images kept
    keep = []
    for i, d in enumerate(digests):
        if d not in seen and (aliases is None or aliases[i] not in bank):
            seen.add(d)
            keep.append(i)
    return keep


class TemplateError(HetmmError, ValueError):
    """Stored templates are unreadable or do not fit the detector."""


@dataclass(frozen=True)
class SheetsAuto:
    """How ``templates.sheets: auto`` chose K (``core/auto_sheets.py``): stored in ``meta["sheets_auto"]``."""

    chosen: int  # the K chosen
    images: int  # bank images it was measured on
    why: str
    all_ms_per_image: float  # ALL's out-of-fold ATMM scoring time per image
    ladder: tuple[dict[str, Any], ...]  # each rung measured (``Rung.to_dict``), in order
    tolerance: dict[str, float]  # the agreement bounds it was measured against

    def to_dict(self) -> dict[str, Any]:
        """The stored JSON object (the keys and order fit and the service always wrote)."""
        return {
            "chosen": self.chosen,
            "images": self.images,
            "why": self.why,
            "all_ms_per_image": self.all_ms_per_image,
            "ladder": [dict(r) for r in self.ladder],
            "tolerance": dict(self.tolerance),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SheetsAuto:
        return cls(
            chosen=int(data["chosen"]),
            images=int(data["images"]),
            why=str(data["why"]),
            all_ms_per_image=float(data["all_ms_per_image"]),
            ladder=tuple(dict(r) for r in data.get("ladder", ())),
            tolerance=dict(data.get("tolerance", {})),
        )


class TemplateMeta(Mapping[str, Any]):
    """A template set's provenance: typed accessors over its stored JSON object (read-only).

    As a mapping it is that JSON object exactly (the store writes ``dict(meta)`` minus
    ``version`` and ``parent``), so manifests written before this class read unchanged and
    unknown keys (``migrated_from``, notes) are kept. Make changed copies with :meth:`with_`
    and :meth:`without`.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"TemplateMeta({self._data!r})"

    def with_(self, **changes: Any) -> TemplateMeta:
        """A copy with ``changes`` set (typed values are stored in their JSON form)."""
        data = dict(self._data)
        for key, value in changes.items():
            if key == "image_boxes" and value is not None:
                value = [list(b) for b in value]
            elif key == "sheets_auto" and isinstance(value, SheetsAuto):
                value = value.to_dict()
            data[key] = value
        return TemplateMeta(data)

    def without(self, *keys: str) -> TemplateMeta:
        return TemplateMeta({k: v for k, v in self._data.items() if k not in keys})

    @property
    def version(self) -> int | None:
        """The stored version this set was read as (set by the store; None before a save)."""
        v = self._data.get("version")
        return None if v is None else int(v)

    @property
    def parent(self) -> int | None:
        v = self._data.get("parent")
        return None if v is None else int(v)

    @property
    def created(self) -> float | None:
        """When the fit that made the bank ran (seconds since the epoch)."""
        v = self._data.get("created")
        return None if v is None else float(v)

    @property
    def image_boxes(self) -> list[tuple[int, int, int, int]] | None:
        """Each bank image's canvas box (letterbox), in bank order, when fit/update knew them."""
        v = self._data.get("image_boxes")
        return None if v is None else [tuple(b) for b in v]  # type: ignore[misc]

    @property
    def sheets_auto(self) -> SheetsAuto | None:
        """How ``sheets: auto`` chose K for this selection; None for a K that was given."""
        v = self._data.get("sheets_auto")
        return None if v is None else SheetsAuto.from_dict(v)

    @property
    def tiny(self) -> bool:
        """A replica's serving set: the bank holds the selected sheets, not images."""
        return bool(self._data.get("tiny", False))


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
    meta: TemplateMeta = field(default_factory=TemplateMeta)  # provenance; a plain dict is taken as its JSON

    def __post_init__(self) -> None:
        if not isinstance(self.meta, TemplateMeta):
            object.__setattr__(self, "meta", TemplateMeta(self.meta))
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
