"""``hetmm evaluate``'s layout rules: sets without pixel masks, and the layout checked before any work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_cli_flags

from hetmm_ray.cli import main
from hetmm_ray.data.mvtec import DatasetError, MVTecCategory
from hetmm_ray.data.synthetic import write_mvtec_layout

SIZE = 32
FLAGS = tiny_cli_flags(SIZE)


def _layout(root: Path, *, masks: bool = True) -> Path:
    return write_mvtec_layout(root, n_train=6, n_test_good=3, n_test_per_defect=2, size=SIZE, masks=masks)


def test_a_set_without_masks_is_measured_on_its_image_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with_masks, without = _layout(tmp_path / "masked"), _layout(tmp_path / "labels", masks=False)
    assert not (without / "ground_truth").exists() and MVTecCategory(without).has_pixel_masks is False
    results = {}
    for name, data in (("masked", with_masks), ("labels", without)):
        out = tmp_path / f"{name}.json"
        assert main(["evaluate", "--data", str(data), "--json", str(out), *FLAGS]) == 0
        results[name] = (json.loads(out.read_text()), capsys.readouterr().out)
    (masked, _), (labels, table) = results["masked"], results["labels"]
    assert labels["pixel_auroc"] is None and labels["pro"] is None
    assert masked["pixel_auroc"] is not None and masked["pro"] is not None
    # The same images, so the same image figures and operating point: only the pixel metrics are absent.
    for key in ("image_auroc", "threshold", "true_positives", "false_positives", "recall", "false_alarm_rate"):
        assert labels[key] == pytest.approx(masked[key], abs=1e-9), key
    assert "pixel AUROC" in table and "absent (no ground-truth masks" in table


def test_the_layout_is_checked_before_any_fitting(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A set that cannot be measured is refused at once: a corrupt training image would fail the fit, so
    the layout error (not the image error) shows the check ran first."""
    data = _layout(tmp_path / "data")
    (data / "train" / "good" / "000.png").write_bytes(b"not a png")
    for kind in [p.name for p in (data / "test").iterdir() if p.name != "good"]:
        shutil.rmtree(data / "test" / kind)
    assert main(["evaluate", "--data", str(data), *FLAGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "defective test images" in err[0] and "not a png" not in err[0]


def test_masks_for_some_defect_types_only_are_refused(tmp_path: Path):
    data = _layout(tmp_path / "data")
    kinds = sorted(p.name for p in (data / "ground_truth").iterdir())
    shutil.rmtree(data / "ground_truth" / kinds[0])
    with pytest.raises(DatasetError, match=f"not for {kinds[0]}"):
        MVTecCategory(data).test_samples()
    # a missing mask inside a type that has masks is still named
    shutil.rmtree(data / "ground_truth")
    _layout(tmp_path / "fresh")
    shutil.copytree(tmp_path / "fresh" / "ground_truth", data / "ground_truth")
    next((data / "ground_truth" / kinds[1]).iterdir()).unlink()
    with pytest.raises(DatasetError, match="has no ground-truth mask"):
        MVTecCategory(data).test_samples()


def test_sample_order_and_masks_are_unchanged_for_a_masked_set(tmp_path: Path):
    data = _layout(tmp_path / "data")
    samples = MVTecCategory(data).measurable_samples()
    types = [s.defect_type for s in samples]
    assert types == sorted(types) and types.count("good") == 3
    for s in samples:
        assert (s.mask_path is None) == (s.label == 0)
        mask = MVTecCategory(data).load_mask(s, SIZE)
        assert mask.shape == (SIZE, SIZE) and (mask.any() if s.label else not mask.any())
    assert np.all([s.path.is_file() for s in samples])


@pytest.mark.parametrize("tiles", [None, "[2,2]"], ids=["one canvas", "tiled"])
def test_streamed_evaluation_equals_one_pass_over_all_frames(tmp_path: Path, monkeypatch, tiles):
    """``evaluate`` scores the test frames a chunk at a time and reduces each map as it comes;
    every figure (timings aside) is the one a single pass over all frames holding every map gives,
    computed here the slow obvious way from one ``predict`` of all test frames."""
    from hetmm_ray.core.metrics import pixel_auroc, pro_score
    from hetmm_ray.detection.detector_choice import new_detector
    from hetmm_ray.workflows import evaluation

    data = write_mvtec_layout(tmp_path / "set", n_train=6, n_test_good=4, n_test_per_defect=3, size=64)
    flags = [*FLAGS, "--set", "batch_size=2", *(["--set", f"geometry.tiles={tiles}"] if tiles else [])]
    monkeypatch.setattr(evaluation, "STREAM_FRAMES", 3)  # 3 -> 2 frames per chunk: several chunks
    out = tmp_path / "streamed.json"
    assert main(["evaluate", "--data", str(data), "--json", str(out), *flags]) == 0
    streamed = json.loads(out.read_text())

    from hetmm_ray.cli import build_parser
    from hetmm_ray.cli.common import _config_from

    config = _config_from(build_parser().parse_args(["evaluate", "--data", str(data), *flags]))
    category = MVTecCategory(data)
    samples = category.measurable_samples()
    det = new_detector(config, category.train_paths())
    det.fit(category.train_paths())
    pred = det.predict([s.path for s in samples])  # every frame at once, every map held
    masks = [category.load_mask(s, m.shape) for s, m in zip(samples, pred.maps, strict=True)]
    labels = np.array([s.label for s in samples])
    assert streamed["pixel_auroc"] == 100 * pixel_auroc(list(pred.maps), masks)
    assert streamed["pro"] == 100 * pro_score(list(pred.maps), masks)
    assert streamed["threshold"] == pred.threshold
    assert streamed["true_positives"] == int((pred.is_anomaly & (labels == 1)).sum())
    assert streamed["score_summary"]["test good"]["max"] == float(pred.scores[labels == 0].max())
