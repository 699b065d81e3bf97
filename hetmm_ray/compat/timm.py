"""The one place that imports timm (after the torchvision shim, docs/design.md environment facts).

``import timm`` imports torchvision (its data transforms), so in a process that
has not yet gone through :mod:`hetmm_ray.compat.torchvision` it fails on this
machine's CPU torch with "operator torchvision::nms does not exist". Importing
timm through this module makes the order right in every process, Ray workers
and replicas included. timm is only needed by the EfficientNet-Lite backbones,
so it is imported only where one is built.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from . import torchvision as _torchvision  # noqa: F401 - must come first: declares torchvision's missing ops

__all__ = ["timm"]


def _import() -> ModuleType:
    try:
        return importlib.import_module("timm")
    except ImportError as exc:
        raise ImportError(
            f"the EfficientNet-Lite backbones need the timm package ({exc}); install it with `pip install timm`"
        ) from None


timm = _import()
