"""The one place that imports torchvision (docs/design.md, environment facts).

The registry's torchvision wheel is a CUDA build. Against a CPU torch its C++
extension cannot load, and ``import torchvision`` then fails while registering
fake kernels for ``torchvision::nms``/``qnms`` ("operator ... does not exist").
We only need the pure-Python model definitions and ``feature_extraction``, so
when the extension is missing we declare those two operator schemas first.
No torchvision image op (``torchvision.io``, nms kernels) is usable then.
Every process (Ray workers and replicas included) must import torchvision
through this module.

Import cost: ``torchvision.ops.roi_align`` imports ``torch._dynamo.utils`` at
import time for one function (``is_compile_supported``) that it calls only when
``roi_align`` runs. Importing dynamo costs seconds of CPU (sympy, fx symbolic
shapes), in every process that imports torchvision: each Serve replica, Ray
worker and CLI run, before it can answer. While torchvision imports, and only
if dynamo is not imported yet, that one name is served by a stand-in that
imports the real function on first call; the stand-in is then removed from
``sys.modules``, so any later ``import torch._dynamo`` (``torch.compile``,
``roi_align``) imports the real package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


def _is_compile_supported(device_type: Any) -> Any:
    """``torch._dynamo.utils.is_compile_supported``, imported when first called (module doc)."""
    from torch._dynamo.utils import is_compile_supported

    return is_compile_supported(device_type)


@contextmanager
def _dynamo_deferred() -> Iterator[None]:
    """While torchvision imports, ``torch._dynamo.utils`` is a stand-in with the one name it takes
    (module doc); a dynamo imported already is left as it is."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    package, utils = ModuleType("torch._dynamo"), ModuleType("torch._dynamo.utils")
    utils.is_compile_supported = _is_compile_supported  # type: ignore[attr-defined]
    package.utils = utils  # type: ignore[attr-defined]
    sys.modules["torch._dynamo"], sys.modules["torch._dynamo.utils"] = package, utils
    try:
        yield
    finally:
        for name, stand_in in (("torch._dynamo", package), ("torch._dynamo.utils", utils)):
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


def _import() -> ModuleType:
    with _dynamo_deferred():
        try:
            return importlib.import_module("torchvision")
        except RuntimeError as exc:
            if "torchvision::" not in str(exc):
                raise
        # Partially imported modules would keep the failed state: drop them and retry.
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _declare_missing_ops()
        return importlib.import_module("torchvision")


torchvision = _import()
models = importlib.import_module("torchvision.models")
feature_extraction = importlib.import_module("torchvision.models.feature_extraction")
