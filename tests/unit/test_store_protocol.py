"""``store.Store``, the surface callers type a store with, is what ``VersionedStore`` offers: every member
exists with the same signature, and a real store on disk is one (mypy checks the callers against it)."""

from __future__ import annotations

import inspect

from hetmm_ray.store import Store, VersionedStore, open_store


def _members(cls: type) -> list[str]:
    return [name for name in vars(cls) if not name.startswith("_")]


def test_every_protocol_method_is_the_store_method() -> None:
    methods = [name for name in _members(Store) if callable(vars(Store)[name])]
    assert {"put", "get", "versions", "products", "head", "record"} <= set(methods)
    for name in methods:
        ours, theirs = inspect.signature(vars(Store)[name]), inspect.signature(getattr(VersionedStore, name))
        assert ours == theirs, f"Store.{name}{ours} is not VersionedStore.{name}{theirs}"


def test_a_store_on_disk_has_every_member(tmp_path) -> None:
    store = open_store(tmp_path / "store")
    missing = [name for name in _members(Store) if not hasattr(store, name)]
    assert missing == []
    assert store.backend is not None  # the one attribute: the object backend under the store
    assert store.products() == []
