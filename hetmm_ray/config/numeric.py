"""Every numeric setting's allowed range, by the name a config file, ``--set`` or the docs use.

Exact semantics: :data:`NUMERIC_RANGES` is derived from the ranges declared on the fields
(``setting(..., Range(lo, hi, kind))``), never written by hand: the product's and run-time
settings as in :class:`~hetmm_ray.config.DetectorConfig` (``backbone.image_size``,
``batch_size``), the service's as ``service.<field>``, the replicas' live settings as
``user_config.<field>``. Every value must be finite (no NaN, no Infinity), ``int`` ranges refuse
non-integers, booleans are never numbers; lists are checked element by element, and a setting
whose default is None may be null. tests/integration/test_hardening.py keeps the generated configuration
reference (hetmm_ray/reference.py) equal to this one.
"""

from __future__ import annotations

from typing import Any

from ._constraints import Range, ranges_of
from .detector import DetectorConfig
from .product import BackboneConfig, ScoringConfig, TemplateConfig, ThresholdConfig
from .replica import ReplicaSettings
from .service import ServiceConfig

__all__ = ["NUMERIC_RANGES", "check_number"]

_OWNERS: tuple[type[Any], ...] = (BackboneConfig, ScoringConfig, TemplateConfig, ThresholdConfig, DetectorConfig)
_OWNERS += (ServiceConfig, ReplicaSettings)
NUMERIC_RANGES: dict[str, tuple[float, float, type]] = {
    key: (r.lo, r.hi, r.kind) for cls in _OWNERS for key, r in ranges_of(cls, cls._prefix).items()
}
"""``dotted name -> (lo, hi, int or float)``: the closed range of each numeric setting."""


def check_number(key: str, value: Any) -> None:
    """Refuse ``value`` for the numeric setting ``key`` unless it is finite and in NUMERIC_RANGES[key]."""
    Range(*NUMERIC_RANGES[key])(key, value)
