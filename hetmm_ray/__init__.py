"""hetmm-ray: training-free industrial anomaly detection (HETMM), from one process to a Ray cluster."""

from __future__ import annotations

import os

# OpenMP threads that spin while waiting collapse when a neighbour holds a core (hetmm_ray/detection/pipeline.py,
# "Polite waiting"). Read once, when torch
# loads its OpenMP runtime, so it is set here, before any torch import of this package (and of
# Ray workers, which import the package first); a value already in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

__all__ = ["HETMM", "Detector", "DetectorConfig", "__version__", "load_detector", "new_detector"]


def __getattr__(name: str):  # lazy: `import hetmm_ray` stays cheap (no torch import)
    if name == "HETMM":
        from .detection.detector import HETMM

        return HETMM
    if name in ("load_detector", "new_detector"):
        from .detection import detector_choice

        return getattr(detector_choice, name)
    if name == "Detector":
        from .detection.interface import Detector

        return Detector
    if name == "DetectorConfig":
        from .config import DetectorConfig

        return DetectorConfig
    raise AttributeError(name)
