"""Per-layer store layout: one layer of one version is read without the others.

Locally and on a real HTTP S3 endpoint (moto server), as tests/integration/store/test_store.py. The bytes and
objects a read fetches are counted by a thin wrapper over the real backend (it forwards
every call; nothing is faked). Old (format-1) stores stay readable and migrate with
``hetmm migrate``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import torch
from store_format1 import put_format1
from test_store import assert_identical, grow, make_set

from hetmm_ray.cli import main
from hetmm_ray.core.scoring import operating_point
from hetmm_ray.store import VersionedStore, open_store
from hetmm_ray.store.layout import selection_refs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class CountingBackend:
    """The real backend, with the objects and bytes read through it counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bytes_read: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> tuple[bytes, str]:
        data, etag = self.inner.read(key)
        self.bytes_read[key] += len(data)
        return data, etag

    def read_into(self, key: str, buffer: memoryview) -> None:
        self.inner.read_into(key, buffer)
        self.bytes_read[key] += len(buffer)

    def object_bytes(self) -> int:
        return sum(n for k, n in self.bytes_read.items() if "/objects/" in k)


def _object_keys(manifest: dict[str, Any], layer: str | None = None) -> set[str]:
    chunks = [r for r in manifest["chunks"] if layer is None or r.get("layer", layer) == layer]
    sels = [r for k, r in selection_refs(manifest).items() if layer is None or k in ("", layer)]
    return {f"p/{r['key']}" for r in [*chunks, *sels]}


def test_one_layer_is_read_without_the_others(location) -> None:
    base = make_set(6, seed=1, k=2)
    grown = grow(base, 3, seed=4)
    writer = open_store(location)
    assert writer.put("p", base) == 1 and writer.put("p", grown) == 2
    m2 = writer.manifest("p", 2)
    assert m2["format"] == 2

    for layer in grown.layers:
        counting = CountingBackend(writer.backend)
        got = VersionedStore(counting).get_layer("p", layer)
        assert got.version == 2 and torch.equal(got.bank, grown.bank[layer])
        assert got.indices is None  # appending reset the selection
        objects = {k for k in counting.bytes_read if "/objects/" in k}
        assert objects == _object_keys(m2, layer)  # this layer's chunks only
        assert objects.isdisjoint(_object_keys(m2) - _object_keys(m2, layer))
        assert counting.object_bytes() == sum(r["size"] for r in m2["chunks"] if r["layer"] == layer)

    m1 = writer.manifest("p", 1)
    counting = CountingBackend(writer.backend)
    got = VersionedStore(counting).get_layer("p", "layer2", 1)  # an older version, with a selection
    assert torch.equal(got.bank, base.bank["layer2"]) and torch.equal(got.indices, base.indices["layer2"])
    assert {k for k in counting.bytes_read if "/objects/" in k} == _object_keys(m1, "layer2")
    full = CountingBackend(writer.backend)
    assert_identical(VersionedStore(full).get("p", 1), base, version=1)
    assert counting.object_bytes() < full.object_bytes()  # the whole version reads every layer


def test_old_layout_stays_readable_and_migrates(location, capsys: pytest.CaptureFixture[str]) -> None:
    base = make_set(6, seed=2, k=2)
    grown = grow(base, 2, seed=5)
    store = open_store(location)  # a store written in format 1:
    assert put_format1(store, "p", base) == 1 and put_format1(store, "p", grown) == 2
    m2 = store.manifest("p", 2)
    assert m2["format"] == 1 and "layer" not in m2["chunks"][0]

    # Readable as it is: whole versions, and one layer (whose read fetches every layer's chunks).
    assert_identical(store.get("p", 1), base, version=1)
    assert_identical(store.get("p", 2), grown, version=2)
    counting = CountingBackend(store.backend)
    got = VersionedStore(counting).get_layer("p", "layer1")
    assert got.version == 2 and torch.equal(got.bank, grown.bank["layer1"])
    assert {k for k in counting.bytes_read if "/objects/" in k} == _object_keys(m2)

    # Migrate with the command: the head is republished per layer, as a new version.
    assert main(["migrate", "--store", location]) == 0
    assert "product p: v2 republished as v3 (per-layer layout)" in capsys.readouterr().out
    m3 = store.manifest("p", 3)
    assert m3["format"] == 2 and m3["parent"] == 2 and m3["meta"]["migrated_from"] == {"version": 2, "format": 1}
    v3 = store.get("p", 3)
    assert v3.image_digests == grown.image_digests and v3.calibration == grown.calibration
    for layer in grown.layers:
        assert torch.equal(v3.bank[layer], grown.bank[layer])
        counting = CountingBackend(store.backend)
        one = VersionedStore(counting).get_layer("p", layer)
        assert torch.equal(one.bank, grown.bank[layer])
        assert {k for k in counting.bytes_read if "/objects/" in k} == _object_keys(m3, layer)
    assert_identical(store.get("p", 1), base, version=1)  # older versions keep their layout and load
    assert main(["migrate", "--store", location, "--product", "p"]) == 0
    assert "v3 already has the per-layer layout, left alone" in capsys.readouterr().out
    assert store.head("p") == 3

    # Appending to the migrated head reuses its per-layer chunks.
    more = grow(v3, 2, seed=9)
    assert store.put("p", more) == 4
    m4 = store.manifest("p", 4)
    assert m4["chunks"][: len(m3["chunks"])] == m3["chunks"]
    assert_identical(store.get("p", 4), more, version=4)


def test_the_record_reads_every_manifest_the_store_writes(location) -> None:
    """``store.record`` (store/manifest.py) for each way a version is published (put with and
    without a selection, an append, a republish, a migrated format-1 head) and for old format-1
    versions: the same facts as the manifest and as the template set the version loads."""
    from hetmm_ray.store import VersionRecord

    store = open_store(location)
    base = make_set(6, seed=3, k=2)
    assert put_format1(store, "p", base) == 1  # an old store's version
    assert store.migrate("p")["version"] == 2
    assert store.put("p", grow(store.get("p"), 2, seed=6)) == 3  # an append resets the selection
    auto = {"chosen": 2, "why": "verdicts match ALL", "ladder": [1, 2]}
    assert store.put("p", replace(make_set(8, seed=7, k=2), meta={"sheets_auto": auto, "created": 1.0})) == 4
    config = store.record("p").config.stored_dict()
    config["threshold"] = {**config["threshold"], "rule": "far", "false_alarm_rate": 0.05}
    assert store.republish("p", config=config, expect_head=4) == 5
    for version in store.versions("p"):
        rec, m, ts = store.record("p", version), store.manifest("p", version), store.get("p", version)
        assert isinstance(rec, VersionRecord) and rec == VersionRecord.parse(m)
        assert (rec.product, rec.version, rec.format) == ("p", version, m["format"])
        assert rec.parent == (version - 1 or None) and rec.created == m["created"]
        assert rec.images == ts.n_images == m["images"] and rec.layers == ts.layers
        assert rec.config == ts.config and rec.weights_id == ts.weights_id and rec.calibration == ts.calibration
        assert rec.selected == (ts.indices is not None or ts.centres is not None)
        assert rec.sheets == ts.config.templates.sheets_of(ts.n_images) and rec.templates == ts.config.templates.kind
        assert rec.operating_point() == operating_point(ts.calibration, ts.config)
    formats = [store.record("p", v).format for v in store.versions("p")]
    assert formats == [1, 2, 2, 2, 2]
    assert store.record("p", 2).migrated_from == {"version": 1, "format": 1}
    assert store.record("p", 3).sheets_auto is None  # no selection: no ladder to report
    assert store.record("p", 4).sheets_auto == auto == store.record("p", 5).sheets_auto
    assert store.record("p", 5).operating_point().rule == "far"  # type: ignore[union-attr]
    assert store.record("p") == store.record("p", 5)
