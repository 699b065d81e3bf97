"""``Store``: what the code outside ``hetmm_ray/store/`` may call on a template store.

A structural type (``typing.Protocol``): :class:`~hetmm_ray.store.versioned.VersionedStore` is one, and
so is anything else with these members and signatures; the semantics of each member are
``VersionedStore``'s (module docstring of ``store/versioned.py``). A version is read through its
typed record (``record``), never as the raw manifest. Callers take a ``Store``, not the
class, so that the workflows, the CLI and the service depend on this surface only. The store's own
helpers (``store/layout.py``) take the class, whose private members they share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.templates import TemplateSet
    from .base import Backend
    from .layout import LayerData
    from .manifest import VersionRecord
    from .reports import ReportRecord


class Store(Protocol):
    """Products, their versions, and the template set of each version."""

    @property
    def backend(self) -> Backend:
        """The flat object backend under the store (the inspection record and labels live there too)."""
        ...

    # --- reading -------------------------------------------------------------------------
    def products(self) -> list[str]: ...

    def head(self, product: str) -> int: ...

    def versions(self, product: str) -> list[int]: ...

    def record(self, product: str, version: int | None = None) -> VersionRecord: ...

    def get(self, product: str, version: int | None = None, *, weights_id: str | None = None) -> TemplateSet: ...

    def get_layer(self, product: str, layer: str, version: int | None = None) -> LayerData: ...

    def moves(self, product: str, *, last: int | None = None) -> list[dict[str, Any]]: ...

    def candidates(self, product: str) -> list[int]: ...

    def head_and_candidates(self, product: str) -> tuple[int, list[int]]: ...

    def latest_report(self, product: str) -> ReportRecord | None: ...

    def get_report_file(self, product: str, name: str) -> bytes: ...

    # --- writing -------------------------------------------------------------------------
    def put(
        self, product: str, template_set: TemplateSet, *, expect_head: int | None = None, candidate: bool = False
    ) -> int: ...

    def republish(
        self,
        product: str,
        *,
        config: dict[str, Any],
        expect_head: int,
        meta: dict[str, Any] | None = None,
        candidate: bool = False,
    ) -> int: ...

    def rollback(self, product: str, version: int) -> int: ...

    def promote(self, product: str, version: int, *, expect_head: int | None = None) -> int: ...

    def discard(self, product: str, version: int) -> int: ...

    def retain(self, product: str, keep: int) -> list[int]: ...

    def migrate(self, product: str) -> dict[str, Any]: ...

    def repair(self, product: str) -> dict[str, Any]: ...

    def put_report(self, product: str, files: Mapping[str, bytes], *, version: int) -> ReportRecord: ...

    def delete_product(self, product: str) -> None: ...
