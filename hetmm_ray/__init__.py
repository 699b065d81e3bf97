"""hetmm-ray: training-free industrial anomaly detection (HETMM), from one process to a Ray cluster."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["HETMM", "DetectorConfig", "__version__"]


def __getattr__(name: str):  # lazy: `import hetmm_ray` stays cheap (no torch import)
    if name == "HETMM":
        from .detector import HETMM

        return HETMM
    if name == "DetectorConfig":
        from .config import DetectorConfig

        return DetectorConfig
    raise AttributeError(name)
