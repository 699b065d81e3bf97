"""TemplateSet serialisation and selection, and the versioned local template store."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save as st_save

from hetmm_ray.config import BackboneConfig, DetectorConfig, ScoringConfig
from hetmm_ray.core.scoring import Calibration
from hetmm_ray.core.templates import FORMAT_VERSION, TemplateError, TemplateSet
from hetmm_ray.store import LocalStore, ProductNotFound, StoreError, check_product_name, open_store

LAYERS = {"layer1": (8, 6, 5), "layer2": (16, 3, 3)}  # (C, H, W)


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64, layers=tuple(LAYERS)),
        scoring=ScoringConfig(forward_windows=(5, 3), backward_windows=(5, 3), alphas=(0.3, 0.5), layer_weights=(1, 1)),
        device="cpu",
    )


def make_set(n: int = 5, *, seed: int = 0, k: int | None = None, calibrated: bool = True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    bank = {
        name: F.normalize(torch.randn(n, c, h, w, generator=g), dim=1).to(dtype) for name, (c, h, w) in LAYERS.items()
    }
    indices = None
    if k is not None:
        indices = {name: torch.randint(0, n, (k, h, w), generator=g) for name, (_, h, w) in LAYERS.items()}
    return TemplateSet(
        bank=bank,
        config=config(),
        weights_id=f"random:seed={seed}",
        image_digests=tuple(f"{seed:04d}{i:028x}" for i in range(n)),
        calibration=Calibration(tuple(0.1 + 0.01 * i + 1e-9 * seed for i in range(n))) if calibrated else None,
        indices=indices,
        meta={"parent": None, "note": "unit test", "created": 1234.5},
    )


def assert_same(a: TemplateSet, b: TemplateSet) -> None:
    assert a.layers == b.layers
    for name in a.layers:
        assert a.bank[name].dtype == b.bank[name].dtype
        assert torch.equal(a.bank[name], b.bank[name])
    if a.indices is None:
        assert b.indices is None
    else:
        assert b.indices is not None
        for name in a.layers:
            assert a.indices[name].dtype == b.indices[name].dtype
            assert torch.equal(a.indices[name], b.indices[name])
    assert a.calibration == b.calibration
    assert a.config == b.config
    assert a.weights_id == b.weights_id
    assert a.image_digests == b.image_digests
    assert a.meta == b.meta


# --- TemplateSet ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [{}, {"k": 3}, {"calibrated": False}, {"dtype": torch.float16}, {"k": 7, "dtype": torch.bfloat16}]
)
def test_bytes_round_trip_is_bit_identical(kwargs):
    ts = make_set(**kwargs)
    data = ts.to_bytes()
    back = TemplateSet.from_bytes(data)
    assert_same(ts, back)
    assert back.to_bytes() == data
    assert back.n_images == 5
    assert back.sheets == (kwargs.get("k") or 5)


def test_templates_without_indices_is_the_bank():
    ts = make_set()
    for name in ts.layers:
        assert ts.templates(name) is ts.bank[name]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_templates_gather_matches_a_loop(k):
    ts = make_set(n=4, k=k, seed=k)
    assert ts.sheets == k
    for name in ts.layers:
        bank, idx = ts.bank[name], ts.indices[name]
        got = ts.templates(name)
        _, c, h, w = bank.shape
        assert got.shape == (k, c, h, w)
        slow = torch.empty(k, c, h, w)
        for kk in range(k):
            for y in range(h):
                for x in range(w):
                    slow[kk, :, y, x] = bank[idx[kk, y, x], :, y, x]
        assert torch.equal(got, slow)


def test_appended_grows_the_bank_and_keeps_digests():
    ts = make_set(n=4, k=2)
    extra = make_set(n=3, seed=9, dtype=torch.float64)
    grown = ts.appended(extra.bank, extra.image_digests, meta={"parent": 1})
    assert grown.n_images == 7
    assert grown.image_digests == ts.image_digests + extra.image_digests
    assert grown.indices is None  # selection reset
    assert grown.meta == {"parent": 1}
    for name in ts.layers:
        assert grown.bank[name].dtype == ts.bank[name].dtype
        assert torch.equal(grown.bank[name][:4], ts.bank[name])
        assert torch.equal(grown.bank[name][4:], extra.bank[name].float())
    # The original is untouched.
    assert ts.n_images == 4 and ts.indices is not None
    assert ts.bank["layer1"].shape[0] == 4


def test_appended_refuses_other_layers():
    ts = make_set()
    with pytest.raises(TemplateError, match="layer"):
        ts.appended({"layer1": ts.bank["layer1"]}, ts.image_digests)


def test_inconsistent_sets_are_refused():
    ts = make_set(n=3)
    with pytest.raises(TemplateError, match="digests"):
        replace(ts, image_digests=ts.image_digests[:2])
    with pytest.raises(TemplateError, match="image count"):
        replace(ts, bank={"layer1": ts.bank["layer1"], "layer2": ts.bank["layer2"][:2]})


def _valid_header(ts: TemplateSet) -> dict:
    return {
        "format": FORMAT_VERSION,
        "layers": list(ts.bank),
        "config": ts.config.to_dict(),
        "weights_id": ts.weights_id,
        "image_digests": list(ts.image_digests),
        "calibration": None,
        "meta": {},
    }


def _with_header(ts: TemplateSet, header: dict | None) -> bytes:
    tensors = {f"bank/{k}": v for k, v in ts.bank.items()}
    return st_save(tensors, metadata=None if header is None else {"hetmm": json.dumps(header)})


def test_handmade_valid_bytes_load():
    ts = make_set(calibrated=False)
    back = TemplateSet.from_bytes(_with_header(ts, _valid_header(ts)))
    assert_same(replace(ts, meta={}), back)


def corruptions():
    ts = make_set(k=2)
    data = ts.to_bytes()
    n = int.from_bytes(data[:8], "little")
    flipped_header = bytearray(data)
    flipped_header[8 + n // 2] ^= 0xFF
    header = _valid_header(ts)
    return {
        "empty": b"",
        "garbage": b"\x00\x01not a safetensors file at all" * 3,
        "truncated": data[: len(data) // 2],
        "header only": data[: 8 + n],
        "huge length": (10**12).to_bytes(8, "little") + data[8:],
        "flipped header byte": bytes(flipped_header),
        "no metadata": _with_header(ts, None),
        "wrong format": _with_header(ts, {**header, "format": FORMAT_VERSION + 1}),
        "bad config": _with_header(ts, {**header, "config": {"scoring": {"alphas": [2, 2]}}}),
    }


@pytest.mark.parametrize("case", list(corruptions()))
def test_corrupt_bytes_raise_template_error(case):
    data = corruptions()[case]
    with pytest.raises(TemplateError) as info:
        TemplateSet.from_bytes(data, source="unit.safetensors")
    assert "unit.safetensors" in str(info.value)


@pytest.mark.parametrize("missing", ["weights_id", "image_digests", "layers", "config", "bank tensor"])
def test_incomplete_header_raises_template_error(missing):
    ts = make_set()
    header = _valid_header(ts)
    if missing == "bank tensor":
        header["layers"] = [*header["layers"], "layer3"]
    else:
        del header[missing]
    with pytest.raises(TemplateError):
        TemplateSet.from_bytes(_with_header(ts, header))


# --- LocalStore -------------------------------------------------------------------------------
def test_open_store_gives_a_local_store(tmp_path):
    store = open_store(tmp_path / "store")
    assert isinstance(store, LocalStore)
    assert store.products() == []  # the folder need not exist yet
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    via_uri = open_store(f"file://{tmp_path / 'u'}")
    assert isinstance(via_uri, LocalStore)
    assert via_uri.root == tmp_path / "u"


@pytest.mark.parametrize("uri", ["s3://x", "s3://bucket/prefix", "gs://b/p", "http://host/x"])
def test_open_store_refuses_unsupported_schemes(uri):
    with pytest.raises(StoreError, match="not supported"):
        open_store(uri)


def test_store_on_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        open_store(f)


def test_put_get_versions_head_products(tmp_path):
    store = open_store(tmp_path / "store")
    sets = [make_set(n=3 + i, seed=i, k=(2 if i == 1 else None)) for i in range(3)]
    assert [store.put("bottle", ts) for ts in sets] == [1, 2, 3]
    assert store.head("bottle") == 3
    assert store.versions("bottle") == [1, 2, 3]
    assert store.put("cable", sets[0]) == 1
    assert store.products() == ["bottle", "cable"]
    for v, ts in enumerate(sets, start=1):
        got = store.get("bottle", v)
        assert_same(ts, got)
        assert got.to_bytes() == ts.to_bytes()
    assert_same(store.get("bottle"), sets[2])
    assert_same(store.get("bottle", None), sets[2])
    # A fresh store object over the same folder sees the same state.
    again = LocalStore(tmp_path / "store")
    assert again.products() == ["bottle", "cable"]
    assert again.get("cable").to_bytes() == sets[0].to_bytes()


def test_manifest_records_the_data(tmp_path):
    import hashlib

    store = open_store(tmp_path)
    ts = make_set()
    store.put("p", ts)
    vdir = tmp_path / "p" / "v000001"
    manifest = json.loads((vdir / "manifest.json").read_text())
    data = (vdir / "templates.safetensors").read_bytes()
    assert data == ts.to_bytes()
    assert manifest["files"]["templates.safetensors"] == hashlib.sha256(data).hexdigest()
    assert manifest["version"] == 1 and manifest["product"] == "p" and manifest["images"] == 5
    assert (tmp_path / "p" / "HEAD").read_text().strip() == "1"
    # No temporary files are left behind.
    assert sorted(x.name for x in vdir.iterdir()) == ["manifest.json", "templates.safetensors"]


@pytest.mark.parametrize("where", [0, 100, -1])
def test_flipped_byte_is_a_checksum_error(tmp_path, where):
    store = open_store(tmp_path)
    store.put("p", make_set())
    f = tmp_path / "p" / "v000001" / "templates.safetensors"
    data = bytearray(f.read_bytes())
    data[where] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="checksum") as info:
        store.get("p")
    assert str(f) in str(info.value)


def test_unreadable_data_with_a_matching_checksum_is_a_store_error(tmp_path):
    import hashlib

    store = open_store(tmp_path)
    store.put("p", make_set())
    vdir = tmp_path / "p" / "v000001"
    junk = b"definitely not safetensors"
    (vdir / "templates.safetensors").write_bytes(junk)
    manifest = json.loads((vdir / "manifest.json").read_text())
    manifest["files"]["templates.safetensors"] = hashlib.sha256(junk).hexdigest()
    (vdir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="not a readable template set"):
        store.get("p")


def test_unknown_product_and_version(tmp_path):
    store = open_store(tmp_path)
    for call in (lambda: store.get("nope"), lambda: store.head("nope"), lambda: store.versions("nope")):
        with pytest.raises(ProductNotFound, match="nope") as info:
            call()
        # Usable both as a StoreError and as a KeyError; the message is not quoted.
        assert isinstance(info.value, StoreError) and isinstance(info.value, KeyError)
        assert str(info.value).startswith("unknown product")
    store.put("p", make_set())
    with pytest.raises(ProductNotFound, match="no version 7"):
        store.get("p", 7)


def test_broken_head_pointer(tmp_path):
    store = open_store(tmp_path)
    store.put("p", make_set())
    (tmp_path / "p" / "HEAD").write_text("garbage\n")
    with pytest.raises(StoreError, match="head"):
        store.get("p")


def test_product_folder_without_head_is_not_a_product(tmp_path):
    store = open_store(tmp_path)
    (tmp_path / "half-written" / "v000001").mkdir(parents=True)
    assert store.products() == []
    with pytest.raises(ProductNotFound):
        store.get("half-written")


@pytest.mark.parametrize("name", ["../x", "", "a/b", "..", ".", ".hidden", "a.", "a b", "a\\b", "x" * 65, "/abs", "é"])
def test_invalid_product_names(tmp_path, name):
    store = open_store(tmp_path / "store")
    with pytest.raises(StoreError, match="invalid product name"):
        check_product_name(name)
    with pytest.raises(StoreError, match="invalid product name"):
        store.put(name, make_set())
    for call in (lambda: store.get(name), lambda: store.head(name), lambda: store.versions(name)):
        with pytest.raises(StoreError, match="invalid product name"):
            call()
    # Nothing was written anywhere.
    assert not (tmp_path / "store").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["bottle", "a", "Metal_nut-2.v1", "x" * 64, "0"])
def test_valid_product_names(tmp_path, name):
    assert check_product_name(name) == name
    store = open_store(tmp_path)
    assert store.put(name, make_set(n=2)) == 1
    assert store.products() == [name]
