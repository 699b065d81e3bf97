"""The one place that imports torchvision (docs/design.md, environment facts).

The registry's torchvision wheel is a CUDA build. Against a CPU torch its C++
extension cannot load, and ``import torchvision`` then fails while registering
fake kernels for ``torchvision::nms``/``qnms`` ("operator ... does not exist").
We only need the pure-Python model definitions and ``feature_extraction``, so
when the extension is missing we declare those two operator schemas first.
No torchvision image op (``torchvision.io``, nms kernels) is usable then.
Every process (Ray workers and replicas included) must import torchvision
through this module.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

__all__ = ["feature_extraction", "models", "torchvision"]

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_shim_library: Any = None  # kept alive: a collected Library deregisters its schemas


def _declare_missing_ops() -> None:
    global _shim_library
    missing = [op for op in _SCHEMAS if not _op_exists(op)]
    if not missing:
        return
    _shim_library = torch.library.Library("torchvision", "FRAGMENT")
    for op in missing:
        _shim_library.define(_SCHEMAS[op])


def _op_exists(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def _import() -> ModuleType:
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    # Partially imported modules would keep the failed state: drop them and retry.
    import sys

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _declare_missing_ops()
    return importlib.import_module("torchvision")


torchvision = _import()
models = importlib.import_module("torchvision.models")
feature_extraction = importlib.import_module("torchvision.models.feature_extraction")
