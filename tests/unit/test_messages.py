"""Typed records at the process seams: one calibration conversion, the registry's
snapshot built the same from a template set and from its stored manifest, and the product
descriptions' JSON exactly the keys the HTTP API has always sent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetmm_ray.config import DetectorConfig, TemplateConfig
from hetmm_ray.core.scoring import Calibration, calibration_json
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.distributed.registry import _snapshot
from hetmm_ray.messages import ProductDescription, ProductSnapshot, UnreadableProduct
from hetmm_ray.store import open_store

# The keys of one GET /v1/products entry, in the order the registry has sent them (the HTTP reference).
DESCRIPTION_KEYS = [
    "product",
    "version",
    "images",
    "templates",
    "sheets",
    "backbone",
    "weights_id",
    "image_size",
    "geometry",
    "sheets_auto",
    "threshold",
    "threshold_rule",
    "rule_target",
    "estimated_false_alarm_rate",
    "created",
    "region",  # whether it has an inspection region, and its tile grid
    "tiles",
    "threshold_warning",  # why the threshold may flag few defects (OperatingPoint.warning), or None
    "false_alarm_estimate",  # the estimate's interval and the good scores above (FalseAlarmEstimate), or None
]


@pytest.mark.parametrize(
    "cal",
    [None, Calibration((0.5, 1.0, 2.0)), Calibration((1.0, 2.0), validation={"threshold": 1.5, "objective": "f1"})],
)
def test_calibration_json_round_trips(cal: Calibration | None) -> None:
    stored = calibration_json(cal)
    assert Calibration.from_json(stored) == cal
    if cal is not None and cal.validation is None:
        assert stored == [0.5, 1.0, 2.0]  # the original stored format: a plain list of scores


def test_descriptions_send_the_api_keys() -> None:
    d = ProductDescription(
        product="gear",
        version=3,
        images=6,
        templates="pts_o",
        sheets=6,
        backbone="resnet18",
        weights_id="w",
        image_size=64,
        geometry="squash",
        sheets_auto=None,
        threshold=1.25,
        threshold_rule="far",
        rule_target=0.01,
        estimated_false_alarm_rate=0.02,
        created=12.5,
    )
    assert list(d.to_json()) == DESCRIPTION_KEYS
    assert d.to_json()["threshold"] == 1.25 and d.to_json()["sheets_auto"] is None
    assert UnreadableProduct("bad", 2, "StoreCorrupt: x").to_json() == {
        "product": "bad",
        "version": 2,
        "error": "StoreCorrupt: x",
    }


def test_a_snapshot_is_the_same_from_the_template_set_and_from_its_manifest(tmp_path: Path) -> None:
    """The registry publishes right after a write (from the template set) and after a load or
    restart (from the manifest): replicas must get the same record either way."""
    config = DetectorConfig(templates=TemplateConfig(kind="pts_o", sheets=2), batch_size=3, device="cpu")
    g = torch.Generator().manual_seed(0)
    bank = {"layer2": torch.randn(4, 3, 2, 2, generator=g), "layer3": torch.randn(4, 5, 1, 1, generator=g)}
    ts = TemplateSet(
        bank=bank,
        config=config,
        weights_id="w1",
        image_digests=("a", "b", "c", "d"),
        calibration=Calibration((0.1, 0.4, 0.2, 0.3), validation={"threshold": 0.35, "objective": "f1"}),
    )
    store = open_store(tmp_path / "store")
    version = store.put("gear", ts)
    tiny = {"layer2": "ref2", "layer3": "ref3"}
    written = _snapshot("gear", version, ts, tiny)
    loaded = _snapshot("gear", version, store.record("gear", version), tiny)
    assert isinstance(loaded, ProductSnapshot)
    assert loaded == written
    assert loaded.config.device == DetectorConfig().device  # run-time settings are the host's, never stored
