"""The create request's ``tiles`` (form field or JSON body) as ``geometry`` settings (serve/bodies.py)."""

from __future__ import annotations

import pytest

from hetmm_ray.errors import Refused
from hetmm_ray.serve import bodies


@pytest.mark.parametrize(
    ("given", "tiles"),
    [("auto", "auto"), (" 2x3 ", [2, 3]), ("4X4", [4, 4]), ("[2, 2]", [2, 2]), ([1, 2], [1, 2])],
)
def test_tiles_field_forms(given, tiles) -> None:
    assert bodies.tiles_field(given) == {"tiles": tiles}


@pytest.mark.parametrize("given", ["2y2", "", "{}", 3, None, "x2"])
def test_tiles_field_refusals_are_400(given) -> None:
    with pytest.raises(Refused) as err:
        bodies.tiles_field(given)
    assert err.value.status == 400 and "RxC" in err.value.message


@pytest.mark.parametrize(
    ("tiles", "min_defect", "geometry"),
    [
        (None, None, {}),
        ("2x2", None, {"tiles": [2, 2]}),
        (None, 4, {"min_defect_px": 4}),  # as given: the fit's rule picks the grid from it (choose_geometry)
        (None, " 6 ", {"min_defect_px": 6}),  # a form field's text
        ("auto", "8", {"tiles": "auto", "min_defect_px": 8}),
        ("3x1", 8, {"tiles": [3, 1], "min_defect_px": 8}),  # a given grid stays given
    ],
)
def test_create_geometry_fields(tiles, min_defect, geometry) -> None:
    assert bodies.geometry_fields(tiles, min_defect) == geometry


def test_a_min_defect_field_that_is_not_pixels_is_400() -> None:
    with pytest.raises(Refused) as err:
        bodies.geometry_fields(None, "4px")
    assert err.value.status == 400 and "min_defect_px" in err.value.message
