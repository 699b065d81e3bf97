"""``hetmm compare --on-ray``: two versions compared over a folder as the ``hetmm inspect`` job
 give the same flips, flagged counts, thresholds and score shift as the one-process
compare on the same images; unreadable files are counted and left out. Both ways the job runs: one
pass scoring each decoded batch with both versions (same canvas), and a pass per version joined on
path (the candidate fits images to another canvas)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from archive_helpers import PRODUCT, SIZE, tiny_config, write_bad_files, write_images

from hetmm_ray.archive import JobOptions, compare_archive
from hetmm_ray.cli import main
from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.store import open_store
from hetmm_ray.workflows.compare import compare_versions

pytestmark = pytest.mark.usefixtures("one_torch_thread")


LOOSE = {"max_images": 4, "folds": 2, "rule": "sigmas", "sigmas": 0.5}  # a lower threshold: verdicts flip


def compared_both_ways(gear_store: str, tmp_path: Path, candidate_config: DetectorConfig) -> tuple[dict, int]:
    """Version 1 of the gear store against a candidate fitted under ``candidate_config`` on other good
    images, compared on Ray over 16 images and 4 unreadable files; checked against the one-process
    compare on the same readable images. Returns the on-Ray result and the candidate's version."""
    store = open_store(gear_store)
    gear = SyntheticProduct(seed=0, size=SIZE)
    candidate = HETMM(candidate_config).fit([gear.good(i) for i in range(10, 16)]).save(store, PRODUCT)
    images = write_images(tmp_path / "in", 16)
    write_bad_files(tmp_path / "in", huge=False)

    ours = compare_archive(str(tmp_path / "in"), PRODUCT, candidate, JobOptions(store=gear_store), base=1)
    named = sorted((str((tmp_path / "in" / n).resolve()), img) for n, img in images.items())
    theirs = compare_versions(store, PRODUCT, candidate, named, base=1, maps=False)
    assert ours["images"] == theirs["images"] == len(images) and ours["unreadable"] == 4
    assert ours["flagged"] == theirs["flagged"] and ours["threshold"] == theirs["threshold"]
    assert [f["image"] for f in ours["flips"]] == [f["image"] for f in theirs["flips"]]
    assert ours["flips"], "the two versions should disagree somewhere, or the comparison shows nothing"
    for key in ("base", "candidate", "difference"):
        assert ours["score_shift"][key] == pytest.approx(theirs["score_shift"][key], rel=1e-5, abs=2e-6)
    assert ours["false_alarm_rate"] == theirs["false_alarm_rate"]
    return ours, candidate


def test_compare_on_ray_equals_the_one_process_compare(gear_store: str, tmp_path: Path, local_ray) -> None:
    # version 2: other templates and a lower threshold, on the same canvas
    ours, candidate = compared_both_ways(gear_store, tmp_path, tiny_config().replace(threshold=LOOSE))
    assert ours["passes"] == 1  # same canvas: decoded once, scored by both versions in one actor

    # the CLI: the same through --on-ray; the one-process options it cannot honour are refused
    out = tmp_path / "c.json"
    cli = ["compare", str(tmp_path / "in"), "--product", PRODUCT, "--candidate", str(candidate), "--store", gear_store]
    assert main([*cli, "--base", "1", "--on-ray", "--json", str(out)]) == 0
    assert [f["image"] for f in json.loads(out.read_text())["flips"]] == [f["image"] for f in ours["flips"]]
    assert main([*cli, "--on-ray", "--out", str(tmp_path / "maps")]) == 2


def test_compare_on_ray_across_canvases_equals_the_one_process_compare(
    gear_store: str, tmp_path: Path, local_ray
) -> None:
    # version 2 sees images on a smaller canvas: read_and_fit differs, so each version has its own pass
    other = tiny_config().replace(backbone={"image_size": SIZE - 16}, threshold=LOOSE)
    ours, _ = compared_both_ways(gear_store, tmp_path, other)
    assert ours["passes"] == 2
