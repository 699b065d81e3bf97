"""TemplateSet serialisation and selection, and the versioned local template store."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save as st_save
from template_bytes import FORMAT_VERSION, from_bytes, to_bytes

from hetmm_ray.config import BackboneConfig, DetectorConfig, ScoringConfig
from hetmm_ray.core.scoring import Calibration
from hetmm_ray.core.templates import TemplateError, TemplateSet
from hetmm_ray.store import StoreError, VersionedStore, open_store
from hetmm_ray.store.local import LocalBackend

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
    data = to_bytes(ts)
    back = from_bytes(data)
    assert_same(ts, back)
    assert to_bytes(back) == data
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
    back = from_bytes(_with_header(ts, _valid_header(ts)))
    assert_same(replace(ts, meta={}), back)


def corruptions():
    ts = make_set(k=2)
    data = to_bytes(ts)
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
        from_bytes(data, source="unit.safetensors")
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
        from_bytes(_with_header(ts, header))


# --- LocalStore -------------------------------------------------------------------------------
# The versioned store's behaviour (versions, corruption, races, crashes) is tested on both backends
# in test_store.py; here: opening a local store, and what a publish leaves on disk.
def test_open_store_gives_a_local_store(tmp_path):
    store = open_store(tmp_path / "store")
    assert isinstance(store, VersionedStore) and isinstance(store.backend, LocalBackend)
    assert store.backend.root == tmp_path / "store"
    assert store.products() == []  # the folder need not exist yet...
    assert not (tmp_path / "store").exists()  # ...and reading does not create it
    assert open_store(str(tmp_path)).backend.root == tmp_path
    via_uri = open_store(f"file://{tmp_path / 'u'}")
    assert isinstance(via_uri.backend, LocalBackend)
    assert via_uri.backend.root == tmp_path / "u"


@pytest.mark.parametrize("uri", ["gs://b/p", "http://host/x", "https://host/x", "ftp://host/x", "azure://c/p"])
def test_open_store_refuses_unsupported_schemes(uri):
    with pytest.raises(StoreError, match="use a local path or s3://"):
        open_store(uri)


def test_store_on_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        open_store(f)
    with pytest.raises(StoreError, match="not a directory"):
        open_store(f"file://{f}")


def test_local_layout_on_disk(tmp_path):
    import hashlib

    store = open_store(tmp_path)
    first, second = make_set(k=2), make_set(n=3, seed=1)
    assert store.put("p", first) == 1
    assert store.put("p", second) == 2
    root = tmp_path / "p"
    files = sorted(x.relative_to(root).as_posix() for x in root.rglob("*") if x.is_file())
    visible = [f for f in files if not f.rsplit("/", 1)[-1].startswith(".")]
    assert [f for f in files if f not in visible] == [".HEAD.lock"]  # no temporary files are left behind
    objects = [f for f in visible if f.startswith("objects/")]
    assert visible == ["HEAD", *objects, "versions/000001.json", "versions/000002.json"]
    for name in objects:  # content-addressed
        assert name == f"objects/{hashlib.sha256((root / name).read_bytes()).hexdigest()}.safetensors"
    assert json.loads((root / "HEAD").read_text()) == {"version": 2, "history": [1, 2]}
    manifest = json.loads((root / "versions" / "000001.json").read_text())
    assert manifest["format"] == 2 and manifest["product"] == "p" and manifest["version"] == 1
    assert manifest["images"] == 5 and manifest["parent"] is None and manifest["weights_id"] == first.weights_id
    assert {r["layer"] for r in manifest["chunks"]} == set(first.layers)  # one object per layer (format 2)
    for ref in [*manifest["chunks"], *manifest["selection"].values()]:
        data = (root / ref["key"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == ref["sha256"] and len(data) == ref["size"]
    # per layer: first's bank and selection, second's bank
    assert len(objects) == 3 * len(first.layers)
    got = store.get("p", 1)
    assert got.meta == {**first.meta, "version": 1, "parent": None}
    assert_same(replace(got, meta=first.meta), first)
