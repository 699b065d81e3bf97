"""A product stored by older code (no tiles, no region: tests/data/pre22/, written by the code of
commit 8c31f0d, see its make_store.py) loads with today's code as the same untiled product, reads
back its templates and calibration exactly, rewrites nothing, and scores as that code scored it:
exactly where no CPU kernel is involved, to stated tolerances where one is (tests/stored_products.py
says which and why), under both CPU runtimes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from stored_products import RUNTIMES, check_replayed, check_through_backbone, store_copy

from hetmm_ray.config import GeometryConfig
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[1] / "data" / "pre22"


def _stored_tensors(store_root: Path, manifest: dict, key: str) -> dict[str, torch.Tensor]:
    """The slow obvious reader: every object a manifest's ``key`` names, read with safetensors."""
    entries = manifest[key] if isinstance(manifest[key], list) else list(manifest[key].values())
    out: dict[str, torch.Tensor] = {}
    for entry in entries:
        out.update(load_file(str(store_root / "old" / entry["key"])))
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_a_pre_issue_product_reads_back_exactly(tmp_path, version):
    """Part 1 (exact on every machine): settings, bank, selection, digests and calibration."""
    with store_copy(DATA, tmp_path) as root:
        store = open_store(root)
        manifest = store.manifest("old", version)
        assert "geometry" not in manifest["config"] and "region" not in manifest["config"]  # as written then
        record = store.record("old", version)
        assert record.config.geometry == GeometryConfig(canvas="fixed", tile_large_frames=False)  # resolved
        assert record.config.region is None
        det = load_detector(store, "old", version, device="cpu", backbone_runtime="torch")
        assert type(det) is HETMM and det.version == version
        ts = det.templates
        bank = _stored_tensors(root, manifest, "chunks")
        assert sorted(ts.bank) == sorted(bank) == sorted(manifest["layers"])
        for layer, stored in bank.items():
            assert ts.bank[layer].dtype == stored.dtype and torch.equal(ts.bank[layer], stored)
        if manifest.get("selection"):  # v2: PTS indices
            for name, stored in _stored_tensors(root, manifest, "selection").items():
                assert torch.equal(ts.indices[name.removeprefix("indices/")], stored)
        else:
            assert ts.indices is None
        assert list(ts.image_digests) == manifest["image_digests"]
        assert list(ts.calibration.scores) == manifest["calibration"]
        want = json.loads((DATA / "expected.json").read_text())[str(version)]
        assert float(det.operating_point().threshold).hex() == want["threshold"]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("version", [1, 2])
def test_a_pre_issue_product_scores_as_it_did(tmp_path, version, runtime):
    """Parts 2 and 3: the old backbone's features scored as the old code scored them, and the
    images scored through today's backbone (either runtime) as the old machine scored them."""
    with store_copy(DATA, tmp_path) as root:
        det = load_detector(open_store(root), "old", version, device="cpu", backbone_runtime=runtime)
        assert det.backbone.runtime == runtime
        replayed = check_replayed(det, DATA, version)
        expected = json.loads((DATA / "expected.json").read_text())[str(version)]
        check_through_backbone(det, DATA, expected, replayed)
        assert np.isfinite(replayed.scores).all()
