"""Products stored before one detector interface (tests/data/pre38/, written by the code of
commit f686468, see its make_store.py) load with today's single loader as the detector they were,
read back exactly, rewrite nothing, and score as that code scored them: a frame on one canvas (a
fit, a version under a region, a compressed candidate) and a tiled product with the whole view (a
fit, and a candidate under a region). Exact where no CPU kernel is involved, to stated tolerances
where one is (tests/stored_products.py), under both CPU runtimes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from stored_products import RUNTIMES, check_replayed, check_through_backbone, store_copy

from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.interface import Detector
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[1] / "data" / "pre38"
VERSIONS = [("plain", 1), ("plain", 2), ("plain", 3), ("tiled", 1), ("tiled", 2)]
KIND = {"plain": HETMM, "tiled": TiledHETMM}


def _stored(store_root: Path, product: str, manifest: dict, key: str) -> dict[str, torch.Tensor]:
    """The slow obvious reader: every object a manifest's ``key`` names, read with safetensors."""
    entries = manifest[key] if isinstance(manifest[key], list) else list(manifest[key].values())
    out: dict[str, torch.Tensor] = {}
    for entry in entries:
        out.update(load_file(str(store_root / product / entry["key"])))
    return out


@pytest.mark.parametrize(("product", "version"), VERSIONS)
def test_a_pre_interface_product_reads_back_exactly(tmp_path, product, version):
    """Exact on every machine: the class, the head and candidates, the bank, the selection, the
    digests, the calibration and the threshold, and a template set that the store would write back
    byte for byte (what a promote or a republish reads)."""
    data = DATA / product
    with store_copy(data, tmp_path) as root:
        store = open_store(root)
        manifest = store.manifest(product, version)
        det = load_detector(store, product, version, device="cpu", backbone_runtime="torch")
        assert type(det) is KIND[product] and isinstance(det, Detector) and det.version == version
        head, candidates = store.head_and_candidates(product)
        assert (head, candidates) == ((2, [3]) if product == "plain" else (1, [2]))
        ts = det.template_set()
        bank = _stored(root, product, manifest, "chunks")
        assert sorted(ts.bank) == sorted(bank) == sorted(manifest["layers"])
        for key, stored in bank.items():
            assert ts.bank[key].dtype == stored.dtype and torch.equal(ts.bank[key], stored)
        if manifest.get("selection"):  # plain v3: PTS indices
            for name, stored in _stored(root, product, manifest, "selection").items():
                assert torch.equal(ts.indices[name.removeprefix("indices/")], stored)
        assert list(ts.image_digests) == manifest["image_digests"] == list(det.template_set().image_digests)
        assert list(ts.calibration.scores) == manifest["calibration"]
        assert ts.config.region == manifest["config"].get("region")
        want = json.loads((data / "expected.json").read_text())[str(version)]
        assert float(det.operating_point().threshold).hex() == want["threshold"]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(("product", "version"), VERSIONS)
def test_a_pre_interface_product_scores_as_it_did(tmp_path, product, version, runtime):
    """The old backbone's features scored as the old code scored them (1e-5), and the test frames
    through today's backbone (either runtime) as the old machine scored them (1e-3)."""
    data = DATA / product
    with store_copy(data, tmp_path) as root:
        det = load_detector(open_store(root), product, version, device="cpu", backbone_runtime=runtime)
        assert det.backbone.runtime == runtime
        replayed = check_replayed(det, data, version)
        expected = json.loads((data / "expected.json").read_text())[str(version)]
        check_through_backbone(det, data, expected, replayed)
        assert np.isfinite(replayed.scores).all()
