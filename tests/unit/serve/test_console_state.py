"""What the console keeps, without a browser or Ray: the recent-predictions ring
(serve/recent.py), the store's labelled set (store/labels.py) and ``hetmm calibrate --val-store``."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
from helpers import png

from hetmm_ray.cli import main
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.serve.recent import RecentPredictions, image_media_type
from hetmm_ray.store import StoreError, open_store
from hetmm_ray.store.labels import LabelSet
from hetmm_ray.workflows.validation import choose_threshold


# --- the recent ring ----------------------------------------------------------------------------
def test_recent_ring_matches_an_obvious_model_under_random_traffic() -> None:
    """Per-product and byte bounds, newest-first order, flagged filter and counters, against a
    slow model: the full log, then drop oldest-of-product / oldest-overall as the docstring says."""
    rng = random.Random(5)
    ring = RecentPredictions(per_product=7, max_bytes=600)
    log: list[tuple[str, str, int, bool]] = []  # what should be held: (id, product, nbytes, flagged), oldest first
    scored: dict[str, list[int]] = {}
    for _ in range(400):
        product = rng.choice(["a", "b", "c"])
        size = rng.randint(1, 90)
        flagged = rng.random() < 0.3
        heat = b"h" * rng.randint(0, 20) if rng.random() < 0.5 else None
        item_id = ring.record(product, "x", b"i" * size, {"is_anomaly": flagged, "score": 1.0, "version": 1}, heat)
        log.append((item_id, product, size + len(heat or b""), flagged))
        counts = scored.setdefault(product, [0, 0])
        counts[0] += 1
        counts[1] += int(flagged)
        mine = [e for e in log if e[1] == product]
        if len(mine) > 7:  # the oldest of this product goes
            log.remove(mine[0])
        while sum(e[2] for e in log) > 600 and len(log) > 1:  # then the oldest of any product
            log.pop(0)
        for p in ("a", "b", "c"):
            want = [e[0] for e in reversed(log) if e[1] == p]
            assert [x["id"] for x in ring.items(p)] == want
            assert [x["id"] for x in ring.items(p, flagged_only=True)] == [
                e[0] for e in reversed(log) if e[1] == p and e[3]
            ]
    for p, (n, f) in scored.items():
        c = ring.counts()[p]
        assert (c["scored"], c["flagged"], c["held"]) == (n, f, len(ring.items(p)))
    assert len({x["id"] for p in "abc" for x in ring.items(p)}) == sum(len(ring.items(p)) for p in "abc")


def test_recent_items_have_no_heavy_fields_and_ids_differ_across_restarts() -> None:
    ring = RecentPredictions(per_product=3, max_bytes=10**6)
    item_id = ring.record(
        "p", "n.png", png(np.zeros((8, 8), np.uint8)), {"score": 0.5, "heatmap_png": "QUJD", "version": 2}
    )
    (summary,) = ring.items("p")
    assert "heatmap_png" not in summary and summary["score"] == 0.5 and summary["name"] == "n.png"
    assert ring.get("p", item_id) is not None and ring.get("q", item_id) is None
    assert RecentPredictions(per_product=3, max_bytes=10).boot != ring.boot
    assert image_media_type(png(np.zeros((8, 8), np.uint8))) == "image/png"
    assert image_media_type(b"\xff\xd8\xff") == "image/jpeg" and image_media_type(b"??") == "application/octet-stream"


# --- the labelled set ---------------------------------------------------------------------------
def test_label_set_in_the_store(tmp_path) -> None:
    store = open_store(tmp_path / "store")
    labels = LabelSet(store.backend)
    a, b = png(np.full((8, 8), 10, np.uint8)), png(np.full((8, 8), 200, np.uint8))
    first = labels.add("gear", a, "defective", name="a.png", version=1)
    labels.add("gear", b, "good", name="b.png", version=1)
    assert [r["label"] for r in labels.records("gear")] == ["defective", "good"]
    assert labels.image("gear", first["id"]) == a
    again = labels.add("gear", a, "good", name="a.png", version=2)  # relabelled: replaces, never counts twice
    assert again["id"] == first["id"] and len(labels.records("gear")) == 2
    assert sorted((n, d == a, y) for n, d, y in labels.labelled("gear")) == [("a.png", True, 0), ("b.png", False, 0)]
    assert labels.records("other") == []
    with pytest.raises(StoreError, match="choose one of good, defective"):
        labels.add("gear", a, "fine")
    with pytest.raises(StoreError, match="16 lower-case hex"):
        labels.image("gear", "../HEAD")
    with pytest.raises(StoreError):
        labels.records("../x")
    labels.delete("gear", first["id"])
    assert [r["name"] for r in labels.records("gear")] == ["b.png"]


# --- hetmm calibrate --val-store ----------------------------------------------------------------
def test_cli_calibrate_val_store_uses_the_labelled_set(tmp_path, capsys) -> None:
    from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig

    gear = SyntheticProduct(seed=1, size=48)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        threshold=ThresholdConfig(max_images=6, folds=3),
    )
    uri = str(tmp_path / "store")
    store = open_store(uri)
    HETMM(config).fit([gear.good(i) for i in range(6)]).save(store, "gear")
    val = [gear.good(200 + i) for i in range(3)] + [gear.defective(300 + i, "hole")[0] for i in range(3)]
    truth = [0, 0, 0, 1, 1, 1]
    for i, (image, y) in enumerate(zip(val, truth, strict=True)):
        LabelSet(store.backend).add("gear", png(image), "defective" if y else "good", name=f"{i}.png")
    argv = ["calibrate", "--product", "gear", "--store", uri, "--val-store", "--objective", "recall"]
    assert main([*argv, "--max-false-alarm-rate", "0.34"]) == 0
    assert "on 3 good + 3 defective images" in capsys.readouterr().out
    scores = load_detector(open_store(uri), "gear", 1).predict(val).scores.tolist()
    want = choose_threshold(scores, truth, objective="recall", max_false_alarm_rate=0.34)["threshold"]
    assert load_detector(open_store(uri), "gear", 2).operating_point().threshold == pytest.approx(want, rel=1e-6)
    # neither or both sources: one line, exit 2
    assert main(["calibrate", "--product", "gear", "--store", uri]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == "hetmm: error: give one of --val DIR, --val-store or --far RATE"
    shutil.rmtree(tmp_path / "store")
