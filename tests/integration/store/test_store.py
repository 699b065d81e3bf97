"""The versioned template store: one suite over both backends.

Every test taking the ``store``/``location`` fixtures runs twice: on a local
directory, and on a real HTTP S3 endpoint (moto's server mode, started on
127.0.0.1 by this module and stopped at the end). boto3 is never mocked: the
S3 backend talks HTTP to that server. The failure tests kill a publish midway
(a process SIGKILLed between its data and its head, an endpoint stopped
mid-upload), race writers, flip bytes in stored objects and point at a dead
endpoint; each checks that the previous head still loads bit-identically.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, free_port
from s3_server import new_bucket, port_is_free, start_moto
from safetensors.torch import load as st_load
from template_bytes import to_bytes

from hetmm_ray.config import BackboneConfig, ConfigError, DetectorConfig, ScoringConfig, ThresholdConfig, stored_config
from hetmm_ray.core.scoring import Calibration
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import (
    ProductNotFound,
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    VersionedStore,
    check_product_name,
    open_store,
)
from hetmm_ray.store.layout import selection_refs

LAYERS = {"layer1": (8, 6, 5), "layer2": (16, 3, 3)}  # (C, H, W)
CONFIG = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=64, layers=tuple(LAYERS)),
    scoring=ScoringConfig(forward_windows=(5, 3), backward_windows=(5, 3), alphas=(0.3, 0.5), layer_weights=(1, 1)),
    device="cpu",
)


# --- template sets and comparisons ------------------------------------------------------------
def _digests(seed: int, n: int) -> tuple[str, ...]:
    return tuple(f"{seed:04x}{i:028x}" for i in range(n))


def _bank(n: int, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: F.normalize(torch.randn(n, c, h, w, generator=g), dim=1).to(dtype) for name, (c, h, w) in LAYERS.items()
    }


def _calibration(n: int, seed: int) -> Calibration:
    return Calibration(tuple(0.1 + 0.01 * i + 0.001 * seed for i in range(n)))


def make_set(n: int = 4, *, seed: int = 0, k: int | None = None, dtype: torch.dtype = torch.float32) -> TemplateSet:
    """A small set with distinct images per seed; ``k`` adds a selection (indices) object."""
    indices = None
    if k is not None:
        g = torch.Generator().manual_seed(1000 + seed)
        indices = {name: torch.randint(0, n, (k, h, w), generator=g) for name, (_, h, w) in LAYERS.items()}
    return TemplateSet(
        bank=_bank(n, seed, dtype),
        config=CONFIG,
        weights_id="random:seed=0",
        image_digests=_digests(seed, n),
        calibration=_calibration(n, seed),
        indices=indices,
        meta={"note": f"set {seed}", "created": 1234.5 + seed},
    )


def grow(ts: TemplateSet, m: int, *, seed: int) -> TemplateSet:
    """``ts`` with ``m`` more images appended (a hot update), recalibrated."""
    return ts.appended(
        _bank(m, seed, ts.bank["layer1"].dtype), _digests(seed, m), calibration=_calibration(ts.n_images + m, seed)
    )


def per_image_bytes(ts: TemplateSet) -> int:
    return sum(v[0].numel() * v.element_size() for v in ts.bank.values())


def _plain(ts: TemplateSet) -> TemplateSet:
    """The set without the provenance keys the store adds on ``get``."""
    return replace(ts, meta={k: v for k, v in ts.meta.items() if k not in ("version", "parent")})


def fingerprint(ts: TemplateSet) -> bytes:
    return to_bytes(_plain(ts))


def assert_identical(got: TemplateSet, expected: TemplateSet, *, version: int | None = None) -> None:
    """``got`` is bit-identical to ``expected`` (store provenance in ``meta`` aside)."""
    assert got.layers == expected.layers
    for name in expected.layers:
        assert got.bank[name].dtype == expected.bank[name].dtype
        assert torch.equal(got.bank[name], expected.bank[name]), name
    if expected.indices is None:
        assert got.indices is None
    else:
        assert got.indices is not None
        for name in expected.layers:
            assert got.indices[name].dtype == expected.indices[name].dtype
            assert torch.equal(got.indices[name], expected.indices[name]), name
    assert got.config == expected.config
    assert got.weights_id == expected.weights_id
    assert got.image_digests == expected.image_digests
    assert got.calibration == expected.calibration
    assert _plain(got).meta == _plain(expected).meta
    assert fingerprint(got) == fingerprint(expected)
    if version is not None:
        assert got.meta["version"] == version


def refs(manifest: dict) -> list[dict]:
    """Every object a manifest points at: bank chunks and the selection."""
    return [*manifest["chunks"], *selection_refs(manifest).values()]


def version_files(store: VersionedStore, product: str) -> list[int]:
    return sorted(int(k.rsplit("/", 1)[1].split(".")[0]) for k in store.backend.list(f"{product}/versions/"))


@pytest.fixture
def store(location) -> VersionedStore:
    return open_store(location)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- 1. publish and read ------------------------------------------------------------------------
def test_put_get_head_versions_products(store, location):
    assert store.products() == []
    sets = [make_set(3, seed=1), make_set(4, seed=2, k=2), make_set(2, seed=3, dtype=torch.bfloat16)]
    sets.append(make_set(3, seed=4, k=5, dtype=torch.float16))
    assert [store.put("bottle", ts) for ts in sets] == [1, 2, 3, 4]
    assert store.head("bottle") == 4
    assert store.versions("bottle") == [1, 2, 3, 4]
    assert store.put("cable", sets[0]) == 1
    assert store.products() == ["bottle", "cable"]
    for v, ts in enumerate(sets, start=1):
        got = store.get("bottle", v)
        assert_identical(got, ts, version=v)
        assert got.meta["parent"] == (v - 1 or None)
        assert store.manifest("bottle", v)["parent"] == (v - 1 or None)
    assert_identical(store.get("bottle"), sets[-1], version=4)
    assert_identical(store.get("bottle", None), sets[-1], version=4)
    assert_identical(store.get("bottle", weights_id="random:seed=0"), sets[-1])
    with pytest.raises(StoreError, match="built with weights"):
        store.get("bottle", weights_id="torchvision:resnet18.DEFAULT")
    # A second store object over the same location sees the same state.
    again = open_store(location)
    assert again.products() == ["bottle", "cable"]
    assert again.head("bottle") == 4 and again.versions("bottle") == [1, 2, 3, 4]
    assert_identical(again.get("cable"), sets[0], version=1)
    assert_identical(again.get("bottle", 2), sets[1], version=2)


def test_float64_bank_round_trips(store):
    ts = make_set(3, seed=1, dtype=torch.float64)
    assert store.put("p", ts) == 1
    assert_identical(store.get("p"), ts)


def test_unknown_product_and_version(store):
    calls = (
        lambda: store.get("nope"),
        lambda: store.head("nope"),
        lambda: store.versions("nope"),
        lambda: store.rollback("nope", 1),
        lambda: store.retain("nope", 1),
        lambda: store.delete_product("nope"),
    )
    for call in calls:
        with pytest.raises(ProductNotFound, match="nope") as info:
            call()
        # Usable both as a StoreError and as a KeyError; the message is not quoted.
        assert isinstance(info.value, StoreError) and isinstance(info.value, KeyError)
        assert str(info.value).startswith("unknown product")
    store.put("p", make_set(2))
    for call in (lambda: store.get("p", 7), lambda: store.manifest("p", 7)):
        with pytest.raises(ProductNotFound, match="no version 7") as info:
            call()
        assert not str(info.value).startswith(("'", '"'))


def test_objects_without_a_head_are_not_a_product(store):
    store.backend.write("half-written/versions/000001.json", b"{}")
    assert store.products() == []
    with pytest.raises(ProductNotFound):
        store.get("half-written")


INVALID_NAMES = ["../x", "", "a/b", "..", ".", ".hidden", "a.", "a b", "a\\b", "x" * 65, "/abs", "é", None, 7]
VALID_NAMES = ["bottle", "a", "Metal_nut-2.v1", "x" * 64, "0"]


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_product_names_are_refused(name):
    with pytest.raises(StoreError, match="invalid product name"):
        check_product_name(name)


def test_invalid_product_names_touch_nothing(store):
    for name in INVALID_NAMES:
        _refuse_everywhere(store, name)
    assert list(store.backend.list("")) == []  # nothing was written anywhere


def _refuse_everywhere(store: VersionedStore, name) -> None:
    calls = (
        lambda: store.put(name, make_set(2)),
        lambda: store.get(name),
        lambda: store.head(name),
        lambda: store.versions(name),
        lambda: store.manifest(name, 1),
        lambda: store.rollback(name, 1),
        lambda: store.retain(name, 1),
        lambda: store.delete_product(name),
    )
    for call in calls:
        with pytest.raises(StoreError, match="invalid product name"):
            call()


def test_valid_product_names(store):
    ts = make_set(2)
    for name in VALID_NAMES:
        assert check_product_name(name) == name
        assert store.put(name, ts) == 1
    assert store.products() == sorted(VALID_NAMES)
    for name in VALID_NAMES:
        assert_identical(store.get(name), ts, version=1)


# --- 2. appended chunks ------------------------------------------------------------------------
def _chunk_tensors(store: VersionedStore, product: str, ref: dict) -> dict[str, torch.Tensor]:
    data, _ = store.backend.read(f"{product}/{ref['key']}")
    assert hashlib.sha256(data).hexdigest() == ref["sha256"] and len(data) == ref["size"]
    return st_load(data)


def test_appended_images_go_to_new_chunks_only(store):
    base = make_set(5, seed=1, k=2)
    grown = grow(base, 3, seed=7)
    assert store.put("p", base) == 1
    assert store.put("p", grown) == 2
    m1, m2 = store.manifest("p", 1), store.manifest("p", 2)
    n1 = len(m1["chunks"])
    assert m2["chunks"][:n1] == m1["chunks"]  # the parent's chunk refs, reused as they are
    new = m2["chunks"][n1:]
    assert new and new[0]["images"][0] == 5 and new[-1]["images"][1] == 8
    assert {r["key"] for r in new}.isdisjoint(r["key"] for r in m1["chunks"])
    for ref in new:  # a new chunk holds exactly the new images
        lo, hi = ref["images"]
        assert lo >= 5
        for name, t in _chunk_tensors(store, "p", ref).items():
            assert torch.equal(t, grown.bank[name][lo:hi])
    assert m2["selection"] is None and m1["selection"] is not None  # appending resets the selection
    assert_identical(store.get("p", 1), base, version=1)
    assert_identical(store.get("p", 2), grown, version=2)


def test_small_chunks_split_the_bank_and_load_bit_identically(store, location):
    base = make_set(7, seed=1)
    # Format 2 cuts each layer's rows on its own: two images of the largest layer per chunk.
    row = max(v[0].numel() * v.element_size() for v in base.bank.values())
    small = VersionedStore(store.backend, chunk_bytes=2 * row)
    assert small.put("p", base) == 1
    m1 = small.manifest("p", 1)
    widest = max(base.bank, key=lambda k: base.bank[k][0].numel())

    def ranges(m: dict, layer: str) -> list[list[int]]:
        return [r["images"] for r in m["chunks"] if r["layer"] == layer]

    assert ranges(m1, widest) == [[0, 2], [2, 4], [4, 6], [6, 7]]
    assert len({r["key"] for r in m1["chunks"] if r["layer"] == widest}) == 4
    grown = grow(base, 3, seed=2)
    assert small.put("p", grown) == 2
    m2 = small.manifest("p", 2)
    for layer in base.layers:  # each layer keeps its parent's chunks and appends its own
        assert [r for r in m2["chunks"] if r["layer"] == layer][: len(ranges(m1, layer))] == [
            r for r in m1["chunks"] if r["layer"] == layer
        ]
    assert ranges(m2, widest)[4:] == [[7, 9], [9, 10]]
    # Chunking is a writer's choice: any store object reads it back.
    for reader in (small, open_store(location)):
        assert_identical(reader.get("p", 1), base, version=1)
        assert_identical(reader.get("p", 2), grown, version=2)


def test_new_features_for_the_same_images_are_stored(store):
    base = make_set(4, seed=1)
    # Same images, same weights_id, same layout, different features (as a refit with pre_relu=False gives).
    refit = replace(base, bank={k: -v for k, v in base.bank.items()})
    store.put("p", base)
    assert store.put("p", refit) == 2
    assert_identical(store.get("p", 2), refit)


# --- 3. corruption ------------------------------------------------------------------------------
def _published_with_exclusive_chunk(store: VersionedStore) -> tuple[TemplateSet, dict]:
    """v1, then v2 = v1 + appended images: v2's last chunk is used by v2 only. Returns v1, that chunk."""
    base = make_set(4, seed=1, k=2)
    store.put("p", base)
    store.put("p", grow(base, 2, seed=5))
    m1, m2 = store.manifest("p", 1), store.manifest("p", 2)
    last = m2["chunks"][-1]
    assert last["key"] not in {r["key"] for r in refs(m1)}
    return base, last


def test_flipped_byte_is_a_checksum_error_and_the_previous_version_loads(store):
    base, last = _published_with_exclusive_chunk(store)
    key = f"p/{last['key']}"
    good = store.backend.read(key)[0]
    for where in (0, 8, len(good) // 2, len(good) - 1):  # length prefix, header, tensor data, last byte
        data = bytearray(good)
        data[where] ^= 0x01
        store.backend.write(key, bytes(data))
        for call in (lambda: store.get("p", 2), lambda: store.get("p")):
            with pytest.raises(StoreCorrupt, match="checksum") as info:
                call()
            assert last["key"] in str(info.value)
        assert_identical(store.get("p", 1), base, version=1)
    assert store.rollback("p", 1) == 1  # serve the previous version again
    assert_identical(store.get("p"), base, version=1)
    with pytest.raises(StoreCorrupt, match="checksum"):
        store.rollback("p", 2)  # rollback verifies before pointing readers anywhere
    assert store.head("p") == 1
    store.backend.write(key, good)
    assert_identical(store.get("p", 2), grow(base, 2, seed=5), version=2)  # the intact bytes load again


def test_missing_object_is_corrupt(store):
    base, last = _published_with_exclusive_chunk(store)
    store.backend.delete([f"p/{last['key']}"])
    with pytest.raises(StoreCorrupt, match="missing"):
        store.get("p")
    assert_identical(store.get("p", 1), base, version=1)


def test_unreadable_object_with_a_matching_checksum_is_corrupt(store):
    base, _ = _published_with_exclusive_chunk(store)
    junk = b"definitely not a safetensors file"
    digest = hashlib.sha256(junk).hexdigest()
    store.backend.write(f"p/objects/{digest}.safetensors", junk)
    manifest = store.manifest("p", 2)
    manifest["chunks"][-1].update(key=f"objects/{digest}.safetensors", sha256=digest, size=len(junk))
    # Re-seal the edited manifest with its own checksum, as a writer would.
    seal = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    store.backend.write("p/versions/000002.json", json.dumps({**manifest, "sha256": seal}).encode())
    with pytest.raises(StoreCorrupt, match="not a readable tensor file"):
        store.get("p")
    assert_identical(store.get("p", 1), base, version=1)


def test_corrupt_manifest_and_head(store):
    base, _ = _published_with_exclusive_chunk(store)
    data = bytearray(store.backend.read("p/versions/000002.json")[0])
    data[0] ^= 0xFF  # no longer JSON
    store.backend.write("p/versions/000002.json", bytes(data))
    for call in (lambda: store.get("p"), lambda: store.manifest("p", 2)):
        with pytest.raises(StoreCorrupt, match="manifest"):
            call()
    assert store.versions("p") == [1, 2]
    assert_identical(store.get("p", 1), base, version=1)

    store.backend.write("p/HEAD", b"garbage\n")
    for call in (lambda: store.get("p"), lambda: store.head("p"), lambda: store.put("p", base)):
        with pytest.raises(StoreCorrupt, match="head"):
            call()
    assert_identical(store.get("p", 1), base, version=1)  # an explicit version does not need the head


def test_flipped_bit_in_a_manifest_is_detected(store):
    store.put("p", make_set(3, seed=1))
    data = bytearray(store.backend.read("p/versions/000001.json")[0])
    start = data.index(b'"calibration": [') + len(b'"calibration": [')
    stop = min(data.index(b",", start), data.index(b"]", start))
    data[stop - 1] ^= 0x01  # the first score's last digit: still a digit, still valid JSON
    store.backend.write("p/versions/000001.json", bytes(data))
    with pytest.raises(StoreCorrupt):
        store.get("p")


# --- 4. rollback --------------------------------------------------------------------------------
def test_rollback(store, location):
    sets = [make_set(3, seed=s) for s in (1, 2, 3)]
    assert [store.put("p", ts) for ts in sets] == [1, 2, 3]
    assert store.rollback("p", 1) == 1
    assert store.head("p") == 1
    assert store.versions("p") == [1, 2, 3]
    assert_identical(store.get("p"), sets[0], version=1)
    assert open_store(location).head("p") == 1  # every reader sees the rollback
    with pytest.raises(ProductNotFound, match="no kept version 7"):
        store.rollback("p", 7)
    assert store.head("p") == 1
    # A new version after a rollback gets a fresh number and records its parent.
    grown = grow(sets[0], 2, seed=9)
    assert store.put("p", grown) == 4
    assert store.head("p") == 4 and store.versions("p") == [1, 2, 3, 4]
    m4 = store.manifest("p", 4)
    assert m4["parent"] == 1
    assert m4["chunks"][: len(store.manifest("p", 1)["chunks"])] == store.manifest("p", 1)["chunks"]
    got = store.get("p")
    assert_identical(got, grown, version=4)
    assert got.meta["parent"] == 1
    assert store.rollback("p", 3) == 3
    assert_identical(store.get("p"), sets[2], version=3)


def test_rollback_moves_are_recorded_beside_head(store, location):
    """Each rollback is one JSON record under <product>/moves/ (read back by any reader, in order);
    HEAD keeps the format older readers parse, and a failed rollback records nothing."""
    for s in (1, 2, 3):
        store.put("p", make_set(3, seed=s))
    assert store.moves("p") == []  # publishing is not a move
    store.rollback("p", 1)
    store.rollback("p", 1)  # HEAD is there already: not a move
    with pytest.raises(ProductNotFound):
        store.rollback("p", 9)
    store.rollback("p", 2)
    moves = open_store(location).moves("p")  # another reader of the same store
    assert [(m["kind"], m["from"], m["to"]) for m in moves] == [("rollback", 3, 1), ("rollback", 1, 2)]
    assert moves[0]["time"] <= moves[1]["time"] <= time.time()
    assert store.moves("p", last=1) == moves[1:]
    keys = sorted(store.backend.list("p/moves/"))
    assert len(keys) == 2 and all(k.endswith(".json") for k in keys)
    for key in keys:  # plain JSON, never pickle
        assert set(json.loads(store.backend.read(key)[0])) == {"kind", "from", "to", "time"}
    head = json.loads(store.backend.read("p/HEAD")[0])
    assert set(head) == {"version", "history"} and head["version"] == 2  # what older readers parse
    store.backend.write("p/moves/99999999999999999999.json", b"not json", if_none_match=True)
    assert len(store.moves("p")) == 2  # one unreadable record does not hide the others
    store.delete_product("p")
    assert list(store.backend.list("p/")) == []  # the log goes with the product


def test_a_repair_that_repoints_head_is_recorded_as_a_move(store):
    for s in (1, 2):
        store.put("p", make_set(3, seed=s))
    store.backend.write("p/HEAD", b"garbage", if_match=store.backend.read("p/HEAD")[1])
    assert store.repair("p")["rebuilt"] and store.head("p") == 2
    assert [(m["kind"], m["from"], m["to"]) for m in store.moves("p")] == [("repair", None, 2)]
    assert not store.repair("p")["rebuilt"]  # a sound HEAD is left alone: no move
    assert len(store.moves("p")) == 1


def test_republish_changes_settings_and_reuses_every_object(store):
    """A new version with other stored settings (the console's far rule): same objects, nothing uploaded."""
    ts = make_set(3, seed=1, k=2)
    store.put("p", ts)
    before = sorted(store.backend.list("p/objects/"))
    m1 = store.manifest("p", 1)
    config = json.loads(json.dumps(m1["config"]))
    config["threshold"] = {**config.get("threshold", {}), "rule": "far", "false_alarm_rate": 0.05}
    assert store.republish("p", config=config, expect_head=1, meta={"note": "far 5%"}) == 2
    m2 = store.manifest("p", 2)
    assert m2["parent"] == 1 and m2["config"]["threshold"]["false_alarm_rate"] == 0.05
    assert m2["meta"]["note"] == "far 5%"
    assert {k: v for k, v in m2.items() if k not in ("version", "parent", "created", "config", "meta")} == {
        k: v for k, v in m1.items() if k not in ("version", "parent", "created", "config", "meta")
    }
    assert sorted(store.backend.list("p/objects/")) == before
    expected = replace(ts, config=stored_config(config), meta={**ts.meta, "note": "far 5%"})
    assert_identical(store.get("p"), expected, version=2)
    with pytest.raises(StoreConflict):
        store.republish("p", config=config, expect_head=1)
    bad = {**config, "threshold": {**config["threshold"], "false_alarm_rate": 0.9}}
    with pytest.raises(ConfigError, match=r"threshold\.false_alarm_rate"):
        store.republish("p", config=bad, expect_head=2)
    assert store.head("p") == 2 and store.versions("p") == [1, 2]


# --- 5. retention -------------------------------------------------------------------------------
def _four_versions(store: VersionedStore) -> tuple[list[TemplateSet], dict[int, dict]]:
    """v1 = a (with a selection), v2 = a + more, v3 = b (unrelated), v4 = b + more."""
    a = make_set(3, seed=1, k=2)
    b = make_set(4, seed=2)
    sets = [a, grow(a, 2, seed=11), b, grow(b, 1, seed=12)]
    assert [store.put("p", ts) for ts in sets] == [1, 2, 3, 4]
    return sets, {v: store.manifest("p", v) for v in (1, 2, 3, 4)}


def _expected_keys(manifests: dict[int, dict], kept: tuple[int, ...]) -> set[str]:
    keys = {"p/HEAD"} | {f"p/versions/{v:06d}.json" for v in kept}
    return keys | {f"p/{r['key']}" for v in kept for r in refs(manifests[v])}


def test_retain_deletes_the_oldest_and_their_objects(store):
    sets, manifests = _four_versions(store)
    store.put("other", sets[0])
    assert store.retain("p", keep=2) == [1, 2]
    assert store.versions("p") == [3, 4] and store.head("p") == 4
    for v in (1, 2):
        with pytest.raises(ProductNotFound):
            store.get("p", v)
    assert set(store.backend.list("p/")) == _expected_keys(manifests, (3, 4))
    assert_identical(store.get("p", 3), sets[2], version=3)
    assert_identical(store.get("p", 4), sets[3], version=4)
    assert_identical(store.get("other"), sets[0], version=1)  # other products are untouched
    assert store.retain("p", keep=2) == []
    with pytest.raises(StoreError, match="at least 1"):
        store.retain("p", keep=0)
    assert store.put("p", sets[0]) == 5  # numbers are never reused


def test_retain_never_deletes_the_head(store):
    sets, manifests = _four_versions(store)
    store.rollback("p", 1)
    assert store.retain("p", keep=1) == [2, 3]
    assert store.versions("p") == [1, 4] and store.head("p") == 1
    moves = set(store.backend.list("p/moves/"))  # the rollback's record stays: history, no objects
    assert len(moves) == 1
    assert set(store.backend.list("p/")) == _expected_keys(manifests, (1, 4)) | moves
    assert_identical(store.get("p"), sets[0], version=1)
    assert_identical(store.get("p", 4), sets[3], version=4)


def test_retain_racing_a_put_of_the_same_data_keeps_the_new_head_loadable(store, location):
    sets, manifests = _four_versions(store)
    writer = open_store(location)
    collector = open_store(location)
    delete = collector.backend.delete
    refused = []

    def delete_after_a_publish(keys):
        # retain has marked the head and chosen what to delete; a writer now publishes v1's data
        # again. Were it to find v1's objects present and reuse them, they would vanish under it:
        # it must be told to retry instead.
        if not refused and any("/objects/" in k for k in keys):
            with pytest.raises(StoreConflict, match="clean-up"):
                writer.put("p", sets[0])
            refused.append(True)
        delete(keys)

    collector.backend.delete = delete_after_a_publish
    assert collector.retain("p", keep=3) == [1]  # dooms v1's selection object (its chunk is v2's too)
    assert refused == [True]
    assert writer.put("p", sets[0]) == 5  # the retry after the clean-up re-uploads what was deleted
    assert {r["key"] for r in refs(writer.manifest("p", 5))} == {r["key"] for r in refs(manifests[1])}
    assert_identical(writer.get("p"), sets[0], version=5)


# --- 6. delete a product ------------------------------------------------------------------------
def test_delete_product(store):
    p1, q1 = make_set(3, seed=1, k=2), make_set(2, seed=2)
    store.put("p", p1)
    store.put("p", grow(p1, 1, seed=3))
    store.put("q", q1)
    store.delete_product("p")
    assert store.products() == ["q"]
    for call in (lambda: store.get("p"), lambda: store.head("p"), lambda: store.get("p", 1)):
        with pytest.raises(ProductNotFound):
            call()
    assert list(store.backend.list("p/")) == []
    assert_identical(store.get("q"), q1, version=1)
    with pytest.raises(ProductNotFound):
        store.delete_product("p")
    assert store.put("p", p1) == 1  # a new product from scratch
    assert_identical(store.get("p"), p1, version=1)


# --- 7. racing writers --------------------------------------------------------------------------
def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()


def test_two_writers_race_one_wins(location):
    first = open_store(location)
    for round_ in range(3):
        product = f"race{round_}"
        base = make_set(3, seed=10 * round_)
        first.put(product, base)
        writers = [open_store(location), open_store(location)]
        # One writer appends (reuses the v1 chunks), the other publishes unrelated images.
        sets = [grow(base, 1, seed=10 * round_ + 1), make_set(2, seed=10 * round_ + 2)]
        barrier = threading.Barrier(2, timeout=60)
        outcome: list[object] = [None, None]

        def write(i: int, writers=writers, sets=sets, barrier=barrier, outcome=outcome, product=product) -> None:
            try:
                assert writers[i].head(product) == 1
                barrier.wait()
                outcome[i] = writers[i].put(product, sets[i], expect_head=1)
            except Exception as exc:  # noqa: BLE001 - the main thread checks what happened
                outcome[i] = exc

        _run([threading.Thread(target=write, args=(i,)) for i in (0, 1)])
        winners = [i for i in (0, 1) if isinstance(outcome[i], int)]
        losers = [i for i in (0, 1) if isinstance(outcome[i], StoreConflict)]
        assert len(winners) == 1 and len(losers) == 1, outcome
        (w,), (lo,) = winners, losers
        assert first.head(product) == outcome[w]
        retry = writers[lo].put(product, sets[lo])
        assert retry > outcome[w]
        assert first.head(product) == retry
        history = first.versions(product)
        assert history == [1, outcome[w], retry]
        # Usually [1, 2, 3]; a number is skipped only when the loser had claimed it with a manifest
        # before losing the head swap: that orphan manifest is what no reader follows.
        assert set(range(1, retry + 1)) - set(history) <= set(version_files(first, product))
        assert_identical(first.get(product, 1), base, version=1)
        assert_identical(first.get(product, outcome[w]), sets[w])
        assert_identical(first.get(product), sets[lo], version=retry)
        with pytest.raises(StoreConflict, match="not v1"):
            writers[w].put(product, sets[w], expect_head=1)


def test_many_concurrent_writers_each_land_once(location):
    n_threads, per_thread = 4, 3
    sets = {seed: make_set(2, seed=seed) for seed in range(n_threads * per_thread)}
    landed: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads, timeout=60)

    def writer(t: int) -> None:
        try:
            mine = open_store(location)
            barrier.wait()
            for j in range(per_thread):
                seed = t * per_thread + j
                for _ in range(200):
                    try:
                        landed.append((mine.put("p", sets[seed]), seed))
                        break
                    except StoreConflict:
                        continue
                else:
                    raise AssertionError(f"put of set {seed} never landed")
        except BaseException as exc:  # noqa: BLE001 - the main thread checks what happened
            errors.append(exc)

    _run([threading.Thread(target=writer, args=(t,)) for t in range(n_threads)])
    assert not errors, errors
    versions = [v for v, _ in landed]
    assert sorted(seed for _, seed in landed) == sorted(sets)  # every put landed exactly once
    assert len(set(versions)) == len(versions)
    reader = open_store(location)
    assert reader.versions("p") == sorted(versions)
    assert reader.head("p") == max(versions)
    for v, seed in landed:
        assert_identical(reader.get("p", v), sets[seed], version=v)


# --- 8. readers during publishes ----------------------------------------------------------------
def test_readers_never_see_a_mix(location):
    sets = [make_set(3, seed=1, k=2)]
    for i in range(5):  # appends (shared chunks), a fresh set, a reselection
        sets.append(grow(sets[-1], 1, seed=20 + i) if i != 2 else make_set(4, seed=30, k=3))
    expected = [fingerprint(ts) for ts in sets]
    writer = open_store(location)
    assert writer.put("p", sets[0]) == 1
    stop = threading.Event()
    seen: list[tuple[int, bytes]] = []
    errors: list[BaseException] = []

    def read() -> None:
        reader = open_store(location)
        try:
            while not stop.is_set() or len(seen) < 2:
                got = reader.get("p")
                seen.append((got.meta["version"], fingerprint(got)))
        except BaseException as exc:  # noqa: BLE001 - the main thread checks what happened
            errors.append(exc)

    t = threading.Thread(target=read)
    t.start()
    try:
        for v, ts in enumerate(sets[1:], start=2):
            assert writer.put("p", ts) == v
    finally:
        stop.set()
        t.join(timeout=120)
    assert not errors, errors
    assert seen
    for v, fp in seen:
        assert fp == expected[v - 1], f"a read of v{v} is not what v{v} published"
    assert [v for v, _ in seen] == sorted(v for v, _ in seen)  # a reader never goes back


# --- 9. a process killed between data and head --------------------------------------------------
_KILLED_PUBLISHER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))  # the tests' helper modules
    from template_bytes import from_bytes
    from hetmm_ray.store import open_store

    location, product, path = sys.argv[1:4]
    store = open_store(location)
    write = store.backend.write

    def write_then_die_before_head(key, data, **kwargs):
        if key.endswith("/HEAD"):
            os.kill(os.getpid(), signal.SIGKILL)  # data and manifest are written, the head is not
        return write(key, data, **kwargs)

    store.backend.write = write_then_die_before_head
    with open(path, "rb") as f:
        template_set = from_bytes(f.read())
    store.put(product, template_set)
    sys.exit(3)  # not reached
    """
)


def test_process_killed_between_data_and_head(location, tmp_path):
    store = open_store(location)
    base = make_set(4, seed=1, k=2)
    assert store.put("p", base) == 1
    grown = grow(base, 2, seed=3)
    blob = tmp_path / "grown.safetensors"
    blob.write_bytes(to_bytes(grown))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_PUBLISHER, location, "p", str(blob)],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert version_files(store, "p") == [1, 2]  # the orphan manifest is there...
    assert store.head("p") == 1 and store.versions("p") == [1]  # ...but nobody points at it
    assert_identical(open_store(location).get("p"), base, version=1)
    again = store.put("p", grown)
    assert again > 2
    assert store.versions("p") == [1, again] and store.head("p") == again
    assert store.manifest("p", again)["parent"] == 1
    assert_identical(store.get("p"), grown, version=again)
    assert_identical(store.get("p", 1), base, version=1)


# --- 10. an endpoint stopped mid-upload (S3 only) -----------------------------------------------
def test_endpoint_stopped_mid_upload(aws_env):
    server, endpoint = start_moto()
    try:
        port = int(endpoint.rsplit(":", 1)[1])
        bucket = new_bucket(endpoint)
        store = open_store(f"s3://{bucket}/templates?endpoint={endpoint}")
        base = make_set(4, seed=1)
        assert store.put("p", base) == 1

        class StopsTheEndpointMidUpload(VersionedStore):
            uploads = 0

            def _put_object(self, product, tensors):
                ref = super()._put_object(product, tensors)
                self.uploads += 1
                if self.uploads == 1:
                    server.stop()
                return ref

        update = make_set(5, seed=2)
        cut = StopsTheEndpointMidUpload(store.backend, chunk_bytes=per_image_bytes(update))  # 5 chunks
        with pytest.raises(StoreUnavailable) as info:
            cut.put("p", update)
        assert cut.uploads == 1
        assert endpoint in str(info.value)
    finally:
        server.stop()
    # moto keeps its state in-process: a server started again (on the same port if it is free) serves it.
    server, endpoint = start_moto(port if port_is_free(port) else 0)
    try:
        again = open_store(f"s3://{bucket}/templates?endpoint={endpoint}")
        assert again.head("p") == 1 and again.versions("p") == [1]
        assert version_files(again, "p") == [1]  # the broken publish got no further than data objects
        assert_identical(again.get("p"), base, version=1)
        assert again.put("p", update) == 2
        assert_identical(again.get("p"), update, version=2)
    finally:
        server.stop()


# --- 11. a dead endpoint ------------------------------------------------------------------------
def test_dead_endpoint_is_unavailable_and_the_live_store_is_unaffected(store, aws_env):
    base = make_set(3, seed=1)
    store.put("p", base)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    dead = open_store(f"s3://some-bucket/p?endpoint={endpoint}")
    calls = (
        dead.products,
        lambda: dead.get("p"),
        lambda: dead.put("p", base),
        lambda: dead.head("p"),
        lambda: dead.versions("p"),
    )
    for call in calls:
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert endpoint in str(info.value)
    assert store.head("p") == 1
    assert_identical(store.get("p"), base, version=1)


# --- 12. S3 locations ---------------------------------------------------------------------------
@pytest.mark.parametrize("uri", ["s3://", "s3:///templates"])
def test_s3_uri_needs_a_bucket(uri):
    with pytest.raises(StoreError, match="bucket"):
        open_store(uri)


def test_s3_uri_parts(aws_env):
    s = open_store("s3://my-bucket/some/prefix/?endpoint=http://127.0.0.1:1&region=eu-west-1")
    assert (s.backend.bucket, s.backend.prefix, s.backend.endpoint) == (
        "my-bucket",
        "some/prefix",
        "http://127.0.0.1:1",
    )
    assert s.backend.client.meta.region_name == "eu-west-1"
    assert "s3://my-bucket/some/prefix" in repr(s)
    explicit = open_store("s3://my-bucket?endpoint=http://127.0.0.1:1", endpoint_url="http://127.0.0.1:2")
    assert explicit.backend.endpoint == "http://127.0.0.1:2" and explicit.backend.prefix == ""


def test_unknown_bucket_is_a_store_error(s3_endpoint):
    bucket = f"hetmm-missing-{uuid.uuid4().hex[:8]}"
    missing = open_store(f"s3://{bucket}/templates?endpoint={s3_endpoint}")
    for call in (missing.products, lambda: missing.get("p"), lambda: missing.put("p", make_set(2))):
        with pytest.raises(StoreError, match=bucket) as info:
            call()
        assert not isinstance(info.value, (StoreUnavailable, ProductNotFound))


def test_prefixes_in_one_bucket_are_separate_stores(s3_endpoint):
    bucket = new_bucket(s3_endpoint)
    a = open_store(f"s3://{bucket}/a?endpoint={s3_endpoint}")
    ab = open_store(f"s3://{bucket}/a/b?endpoint={s3_endpoint}")
    root = open_store(f"s3://{bucket}?endpoint={s3_endpoint}")
    a.put("p", make_set(2, seed=1))
    ab.put("q", make_set(2, seed=2))
    root.put("r", make_set(2, seed=3))
    assert a.products() == ["p"]
    assert ab.products() == ["q"]
    assert root.products() == ["r"]
    assert_identical(ab.get("q"), make_set(2, seed=2), version=1)


# --- the detector through S3 --------------------------------------------------------------------
def test_detector_saved_to_s3_loads_and_scores_identically(s3_endpoint):
    from hetmm_ray.data.synthetic import SyntheticProduct
    from hetmm_ray.detection.detector import HETMM

    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=4,
        device="cpu",
    )
    product = SyntheticProduct(seed=0, size=64)
    location = f"s3://{new_bucket(s3_endpoint)}/templates?endpoint={s3_endpoint}"
    det = HETMM(config).fit([product.good(i) for i in range(6)])
    assert det.save(open_store(location), "gear") == 1
    queries = [product.good(10), product.defective(1, "scratch")[0]]
    expected = det.predict(queries)

    loaded = load_detector(open_store(location), "gear")
    assert loaded.version == 1
    assert_identical(loaded.templates, det.templates, version=1)
    got = loaded.predict(queries)
    np.testing.assert_array_equal(got.scores, expected.scores)
    np.testing.assert_array_equal(got.maps, expected.maps)
    assert got.threshold == expected.threshold and got.version == 1

    # A hot update publishes only the new images' features; the reload scores like the updated detector.
    det.update([product.good(6), product.good(7)])
    store = open_store(location)
    assert det.save(store, "gear") == 2
    m1, m2 = store.manifest("gear", 1), store.manifest("gear", 2)
    assert m2["chunks"][: len(m1["chunks"])] == m1["chunks"] and m2["images"] == 8
    reloaded = load_detector(open_store(location), "gear")
    assert reloaded.version == 2
    np.testing.assert_array_equal(reloaded.predict(queries).scores, det.predict(queries).scores)


# --- a slow endpoint: accepts connections, never answers ------------------------------------------
def test_slow_endpoint_times_out_with_a_clear_error(monkeypatch):

    from hetmm_ray.store.s3 import S3Backend
    from hetmm_ray.store.versioned import VersionedStore

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel accepts; nobody ever reads or replies
    port = silent.getsockname()[1]
    try:
        backend = S3Backend(
            "hetmm-slow",
            "p",
            endpoint_url=f"http://127.0.0.1:{port}",
            region="us-east-1",
            max_attempts=2,
            connect_timeout=0.5,
            read_timeout=0.5,
        )
        store = VersionedStore(backend)
        for call in (lambda: store.get("p"), lambda: store.products(), lambda: store.put("p", make_set(2))):
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}") as info:
                call()
            assert "timeout" in str(info.value).lower() or "timed out" in str(info.value).lower()
    finally:
        silent.close()
