"""``fitting.refit_all``: several template sets refit, their calibrations through one ``calibrate_all``
step where one is given (a tiled product's positions side by side on the service), exactly as one
refit after another."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.fit_steps import FitSteps, Progress
from hetmm_ray.detection.fitting import refit_all
from hetmm_ray.detection.tiled import TiledHETMM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=48),
    threshold=ThresholdConfig(max_images=6, folds=3),
    batch_size=4,
    device="cpu",
).replace(**{"geometry.tiles": [2, 2], "geometry.tile_overlap": 8, "templates.kind": "pts_o", "templates.sheets": 3})


class Recorded:
    """A ``calibrate_all`` step that calibrates in this process, one set after another, and records
    how many sets each call was handed."""

    def __init__(self, calibrate) -> None:
        self.calibrate = calibrate
        self.calls: list[int] = []

    def __call__(self, sets: Sequence[TemplateSet], *, progress: Progress | None = None) -> list[TemplateSet]:
        self.calls.append(len(sets))
        out = []
        for i, ts in enumerate(sets, 1):
            out.append(self.calibrate(ts))
            if progress is not None:
                progress(i, len(sets))
        return out


def _same(a: TemplateSet, b: TemplateSet) -> None:
    assert a.image_digests == b.image_digests and a.calibration == b.calibration
    assert sorted(a.bank) == sorted(b.bank)
    for k in a.bank:
        assert torch.equal(a.bank[k], b.bank[k]) and torch.equal(a.templates(k), b.templates(k))


def test_a_tiled_fit_with_its_calibrations_together_is_the_fit_of_one_position_after_another() -> None:
    part = SyntheticProduct(seed=3, size=96)
    frames = [part.good(i) for i in range(5)]
    plain = TiledHETMM(CONFIG).fit(frames)
    one_canvas = TiledHETMM(CONFIG)  # its positions' own in-process calibration, as the step
    step = Recorded(one_canvas.dets[0].pipeline.calibrated)
    together = TiledHETMM(CONFIG, steps=FitSteps(calibrate_all=step)).fit(frames)
    assert step.calls == [len(together.dets)] == [5]  # 4 tiles + the whole view, handed over at once
    _same(together.template_set(), plain.template_set())
    step.calls.clear()
    more = [part.good(i) for i in range(5, 7)]
    _same(together.update(more).template_set(), plain.update(more).template_set())
    assert step.calls == [5]


def test_refit_all_without_the_step_is_each_refit_and_refuses_unpaired_lists() -> None:
    part = SyntheticProduct(seed=4, size=96)
    frames = [part.good(i) for i in range(4)]
    det = TiledHETMM(CONFIG).fit(frames)
    pipelines = [d.pipeline for d in det.dets]
    sets = [d.scorer.require_templates() for d in det.dets]
    one_by_one = [p.refit(ts) for p, ts in zip(pipelines, sets, strict=True)]
    for got, want in zip(refit_all(pipelines, sets), one_by_one, strict=True):
        _same(got, want)
    with pytest.raises(ValueError, match="2 pipelines for 1 template sets"):
        refit_all(pipelines[:2], sets[:1])
