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
