"""The ``Detector`` interface (``hetmm_ray/detection/interface.py``): twelve members, what callers
outside the detection package need, whichever class answers; the facts of a configuration (its grid,
the frames ``predict`` batches, a streaming caller's chunk) are plain functions of it."""

from __future__ import annotations

import inspect

import pytest

from hetmm_ray.config import STREAM_FRAMES, DetectorConfig
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.interface import Detector, frame_grid, frames_per_pass, stream_chunk
from hetmm_ray.detection.tiled import TiledHETMM

MEMBERS = {
    "fit",
    "update",
    "drop",
    "compress",
    "with_region",
    "template_set",
    "save",
    "predict",
    "operating_point",
    "calibration",
    "input_view",
    "layout",
}


def test_the_interface_is_twelve_members_and_two_attributes() -> None:
    public = {name for name, _ in inspect.getmembers(Detector) if not name.startswith("_")}
    assert public == MEMBERS
    assert set(Detector.__annotations__) == {"config", "version"}
    assert issubclass(HETMM, Detector) and issubclass(TiledHETMM, Detector)


@pytest.mark.parametrize(
    ("tiles", "batch_size", "per_pass"),
    [((1, 1), 16, 16), ((1, 1), 4, 4), ((2, 2), 16, 4), ((2, 2), 12, 3), ((2, 3), 4, 1), ((4, 4), 4, 1)],
)
def test_the_facts_of_a_configuration(tiles: tuple[int, int], batch_size: int, per_pass: int) -> None:
    """A frame's tiles share the backbone's batch; a streaming caller takes whole passes, at least one."""
    config = DetectorConfig().replace(**{"geometry.tiles": list(tiles), "batch_size": batch_size})
    assert frame_grid(config) == tiles
    assert frames_per_pass(config) == per_pass
    for frames in (1, per_pass - 1, per_pass, per_pass + 1, STREAM_FRAMES, 3 * per_pass + 1):
        chunk = stream_chunk(config, frames)
        assert chunk % per_pass == 0 and chunk == max(per_pass, frames // per_pass * per_pass)


def test_a_grid_still_auto_has_no_facts_yet() -> None:
    config = DetectorConfig().replace(**{"geometry.tiles": "auto"})
    with pytest.raises(ValueError, match="resolved from frames first"):
        frame_grid(config)
