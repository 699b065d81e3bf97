"""A good set's own outliers (core/good_outliers.py): ``hetmm fit`` names the good frames whose
out-of-fold score stands apart, with the far rule at a few rates; ``hetmm drop`` removes them from the
bank and the calibration as a new version, with the threshold before and after; nothing is dropped
unasked. On a synthetic product with one planted good frame carrying a mark."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.core.device import image_digest
from hetmm_ray.core.good_outliers import calibration_order
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 64
SETTINGS = [
    "--set",
    "backbone.name=resnet18",
    "--set",
    "backbone.weights=random",
    "--set",
    f"backbone.image_size={SIZE}",
    "--set",
    "threshold.folds=5",
    "--device",
    "cpu",
]


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("good")
    gear = SyntheticProduct(seed=2, size=SIZE)
    for i in range(24):
        Image.fromarray(gear.good(i)).save(d / f"good_{i:03d}.png")
    # a good frame with a mark: the kind of frame a real line's good set holds without anyone knowing
    Image.fromarray(gear.defective(300, "hole")[0]).save(d / "good_marked.png")
    return d


def test_fit_names_the_marked_frame_and_drop_makes_a_new_version_without_it(good_dir, tmp_path, capsys) -> None:
    uri = str(tmp_path / "store")
    marked = good_dir / "good_marked.png"
    code, out, err = run(capsys, "fit", str(good_dir), "--product", "gear", "--store", uri, *SETTINGS)
    assert code == 0, err
    store = open_store(uri)
    v1 = load_detector(store, "gear", 1)
    v1_set, v1_threshold = v1.template_set(), v1.operating_point().threshold
    assert v1_set.n_images == 25  # named, never dropped unasked
    digest = image_digest(np.asarray(Image.open(marked).convert("RGB")))
    by_digest = dict(
        zip(
            [v1_set.image_digests[i] for i in calibration_order(25, v1.config, v1_set.image_digests)],
            v1.calibration.scores,
            strict=True,
        )
    )
    score = by_digest[digest]
    assert score == max(v1.calibration.scores)
    assert "good frames standing apart: 1 of 25" in out, out
    assert f"  {marked}  {score:.4f}" in out, out
    without = TailModel([s for d, s in by_digest.items() if d != digest]).threshold(0.01)
    assert f"threshold (far) {v1_threshold:.4f} with them, {without:.4f} without them" in out, out
    # the far rule at 1, 2 and 5 %, each with the good frames above it
    for rate in (0.01, 0.02, 0.05):
        t = TailModel(v1.calibration.scores).threshold(rate)
        above = sum(1 for s in v1.calibration.scores if s > t)
        assert re.search(rf"^\s+{100 * rate:g}%\s+{t:.4f}\s+{above} of 25\s", out, re.M), out

    # what the console serves beside the histogram: the same rates and the same frame, by digest
    from hetmm_ray.serve.ui import _calibration_facts

    rec = store.record("gear", 1)
    assert rec.image_digests == v1_set.image_digests
    labelled = [{"score": score, "label": "defective"}, {"score": 0.0, "label": "good"}]
    facts = _calibration_facts(rec, list(rec.image_digests), labelled)
    assert [r["threshold"] for r in facts["rates"]] == [
        TailModel(v1.calibration.scores).threshold(r) for r in (0.01, 0.02, 0.05)
    ]
    assert all(r["recall"] == 1.0 and r["defective"] == 1 for r in facts["rates"])
    assert [(f["digest"], f["score"]) for f in facts["outliers"]["frames"]] == [(digest, score)]
    assert facts["outliers"]["threshold_without"] == pytest.approx(without)

    # by the printed digest prefix as well as by the file; a name the bank does not hold is refused
    code, _, err = run(capsys, "drop", "deadbeefdeadbeef", "--product", "gear", "--store", uri)
    assert code == 2 and "no frames of the bank" in err, err
    assert store.head("gear") == 1
    code, out, err = run(capsys, "drop", str(marked), "--product", "gear", "--store", uri)
    assert code == 0, err
    assert store.head("gear") == 2
    v2 = load_detector(store, "gear", 2)
    v2_set, v2_threshold = v2.template_set(), v2.operating_point().threshold
    assert v2_set.n_images == 24 and digest not in v2_set.image_digests
    assert f"version 2 (from v1) without 1 good frame(s) ({marked}), 24 in all; threshold {v1_threshold:.4f}" in out
    assert f"-> {v2_threshold:.4f} (rule far 1%" in out
    assert "good frames standing apart: none of 24" in out, out
    # the same product as a fit on the other frames: same bank, same folds, same out-of-fold scores
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(folds=5),
        device="cpu",
    )
    ref = HETMM(config).fit(sorted(str(p) for p in good_dir.glob("good_0*.png")))
    assert ref.templates.image_digests == v2_set.image_digests
    np.testing.assert_allclose(v2.calibration.scores, ref.calibration.scores, rtol=1e-5)
    assert v2_threshold == pytest.approx(ref.operating_point().threshold, rel=1e-5)


def test_the_stored_order_of_out_of_fold_scores_is_the_fold_plans(good_dir) -> None:
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(folds=4, max_images=20),
        device="cpu",
    )
    det = HETMM(config).fit(sorted(str(p) for p in good_dir.glob("*.png")))
    ts = det.template_set()
    oof = det.out_of_fold(ts)
    assert list(oof.images) == calibration_order(ts.n_images, ts.config, ts.image_digests)
    np.testing.assert_allclose(oof.scores, ts.calibration.scores, rtol=1e-6)


def test_a_tiled_product_drops_a_frame_from_every_position() -> None:
    from hetmm_ray.detection.tiled import TiledHETMM

    prod = SyntheticProduct(seed=0, size=96)
    train = [prod.good(i) for i in range(7)]
    tiled = {"geometry.tiles": [1, 2], "geometry.tile_overlap": 8, "geometry.tile_whole_view": False}
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        threshold=ThresholdConfig(folds=3),
        device="cpu",
    ).replace(**tiled)
    det = TiledHETMM(config).fit(train)
    gone = det.frame_digests[2]
    det.drop([gone])
    ref = TiledHETMM(config).fit(train[:2] + train[3:])
    assert det.frame_digests == ref.frame_digests and gone not in det.frame_digests
    assert all(d.templates.n_images == 6 for d in det.dets)
    np.testing.assert_allclose(det.scales, ref.scales, rtol=1e-5)
    np.testing.assert_allclose(det.calibration.scores, ref.calibration.scores, rtol=1e-5)
    with pytest.raises(ValueError, match="holds no frame"):
        det.drop(["0" * 32])


def test_the_job_record_names_the_frames_standing_apart(good_dir) -> None:
    # what the service's create and normals jobs note (distributed/registry_jobs.note_outliers)
    from hetmm_ray.distributed.jobs import JobProgress
    from hetmm_ray.distributed.registry_jobs import note_outliers
    from hetmm_ray.workflows.operations import good_outliers

    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(folds=5),
        device="cpu",
    )
    files = sorted(str(p) for p in good_dir.glob("*.png"))
    det = HETMM(config).fit(files)
    record: dict = {"id": "j1"}
    note_outliers(JobProgress(record), det.template_set())
    marked = files.index(str(good_dir / "good_marked.png"))
    assert [f["index"] for f in record["outliers"]["frames"]] == [marked]  # the upload's position
    assert record["outliers"] == good_outliers(det).to_json()


# --- a good frame held twice -------------------------------------------------------------
@pytest.fixture(scope="module")
def repeat_dir(tmp_path_factory) -> Path:
    """20 good frames and a second copy of frame 5 under another name (sorted last: bank frame 20)."""
    d = tmp_path_factory.mktemp("repeat")
    gear = SyntheticProduct(seed=4, size=SIZE)
    for i in range(20):
        Image.fromarray(gear.good(i)).save(d / f"good_{i:03d}.png")
    Image.fromarray(gear.good(5)).save(d / "good_zz_copy.png")
    return d


def test_fit_names_a_repeated_frame_and_drop_repeats_keeps_its_first_copy(repeat_dir, tmp_path, capsys) -> None:
    from hetmm_ray.core.calibration import TailModel

    uri = str(tmp_path / "store")
    first, copy = repeat_dir / "good_005.png", repeat_dir / "good_zz_copy.png"
    code, out, err = run(capsys, "fit", str(repeat_dir), "--product", "gear", "--store", uri, *SETTINGS)
    assert code == 0, err
    store = open_store(uri)
    v1 = load_detector(store, "gear", 1)
    v1_set, v1_threshold = v1.template_set(), v1.operating_point().threshold
    digest = image_digest(np.asarray(Image.open(first).convert("RGB")))
    assert v1_set.n_images == 21 and [i for i, d in enumerate(v1_set.image_digests) if d == digest] == [5, 20]
    order = calibration_order(21, v1.config, v1_set.image_digests)
    by_index = dict(zip(order, v1.calibration.scores, strict=True))
    assert max(by_index[5], by_index[20]) < min(s for i, s in by_index.items() if i not in (5, 20))
    assert "repeated good frames: 1 frame(s) held more than once, 1 later copy" in out, out
    each = (
        f"{by_index[5]:.4f} each"
        if f"{by_index[5]:.4f}" == f"{by_index[20]:.4f}"
        else f"{by_index[5]:.4f}, {by_index[20]:.4f}"
    )
    line = f"  {first} = {copy.name}  held twice, out-of-fold {each}: each copy's fold holds another copy"
    assert line in out, out
    without = TailModel([s for i, s in by_index.items() if i != 20]).threshold(0.01)
    assert f"threshold (far) {v1_threshold:.4f} with them, {without:.4f} without the later copies" in out, out
    assert "hetmm drop --product gear --repeats" in out, out
    assert store.head("gear") == 1  # named, never dropped unasked

    code, out, err = run(capsys, "drop", "--repeats", "--product", "gear", "--store", uri)
    assert code == 0, err
    assert store.head("gear") == 2
    v2 = load_detector(store, "gear", 2)
    v2_set, v2_threshold = v2.template_set(), v2.operating_point().threshold
    # the later copy gone, its twin (the first copy) kept: the bank is v1's without frame 20
    assert v2_set.image_digests == v1_set.image_digests[:20] and digest in v2_set.image_digests
    assert (
        f"version 2 (from v1) without 1 good frame(s) (the later copy of {digest[:12]} (v1's bank frame 20; "
        f"frame 5 kept)), 20 in all; threshold {v1_threshold:.4f}" in out
    ), out
    assert f"-> {v2_threshold:.4f} (rule far 1%" in out, out
    assert "repeated good frames" not in out, out
    # the same product as a fit on the frames without the copy: same bank, same out-of-fold scores
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        threshold=ThresholdConfig(folds=5),
        device="cpu",
    )
    ref = HETMM(config).fit(sorted(str(p) for p in repeat_dir.glob("good_0*.png")))
    assert ref.templates.image_digests == v2_set.image_digests
    np.testing.assert_allclose(v2.calibration.scores, ref.calibration.scores, rtol=1e-5)

    # nothing repeated any more: --repeats is refused, nothing written
    versions = store.versions("gear")
    code, _, err = run(capsys, "drop", "--repeats", "--product", "gear", "--store", uri)
    assert code == 2 and "holds no frame twice: --repeats has no later copy to drop" in err, err
    assert store.head("gear") == 2 and store.versions("gear") == versions
    code, _, err = run(capsys, "drop", "--product", "gear", "--store", uri)
    assert code == 2 and "name at least one frame" in err, err
    assert store.versions("gear") == versions


def test_a_tiled_product_drops_only_the_later_copy_from_every_position() -> None:
    from hetmm_ray.core.good_outliers import LaterCopies
    from hetmm_ray.detection.tiled import TiledHETMM

    prod = SyntheticProduct(seed=0, size=96)
    train = [prod.good(i) for i in range(6)]
    tiled = {"geometry.tiles": [1, 2], "geometry.tile_overlap": 8, "geometry.tile_whole_view": False}
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
        threshold=ThresholdConfig(folds=3),
        device="cpu",
    ).replace(**tiled)
    det = TiledHETMM(config).fit([*train, train[2]])
    twin = det.frame_digests[2]
    assert det.frame_digests[6] == twin
    det.drop([LaterCopies(twin)])
    ref = TiledHETMM(config).fit(train)
    assert det.frame_digests == ref.frame_digests
    assert all(d.templates.n_images == 6 for d in det.dets)
    np.testing.assert_allclose(det.scales, ref.scales, rtol=1e-5)
    np.testing.assert_allclose(det.calibration.scores, ref.calibration.scores, rtol=1e-5)
    with pytest.raises(ValueError, match="one copy of"):
        det.drop([LaterCopies(twin)])


@pytest.mark.shared
def test_battery_weld_fit_names_its_one_repeated_frame(tmp_path, capsys) -> None:
    """The real battery_weld good set holds one training image twice (its data README): the fit names
    exactly that one group, both copies' out-of-fold scores near 0, and the threshold without it."""
    from helpers import SHARED

    good = SHARED / "data" / "battery_weld" / "train" / "good"
    if not good.is_dir():
        pytest.skip(f"needs the real battery_weld data in {SHARED} (absent here)")
    files = sorted(good.glob("*.png"))
    digests = [image_digest(np.asarray(Image.open(p).convert("RGB"))) for p in files]
    twice = [(i, j) for i in range(len(files)) for j in range(i + 1, len(files)) if digests[i] == digests[j]]
    assert len(twice) == 1  # the data as its README describes it
    ((i, j),) = twice
    code, out, err = run(capsys, "fit", str(good), "--product", "weld", "--store", str(tmp_path / "store"))
    if code != 0 and "weights" in err:
        pytest.skip(f"the default backbone's weights are not usable here: {err.strip()}")
    assert code == 0, err
    assert "repeated good frames: 1 frame(s) held more than once, 1 later copy" in out, out
    line = next(x for x in out.splitlines() if x.startswith(f"  {files[i]} = {files[j].name}  held twice"))
    scores = [float(s) for s in re.findall(r"\d+\.\d{4}", line.split("out-of-fold", 1)[1])]
    median = float(re.search(r"median (\d+\.\d+)", out).group(1))
    assert scores and all(s < 0.05 * median for s in scores), line
    assert "without the later copies; to keep the first copy" in out and "--product weld --repeats" in out
