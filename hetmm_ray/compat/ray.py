"""The one place that reaches into Ray's private modules (``ray._private``, ``ray.serve._private``).

Ray has no public API for three things the embedded service and its tests need, so they are
reached here, each through :func:`_symbol` (tests/unit/test_structure.py forbids ``_private``
imports and attributes everywhere else in hetmm_ray, benchmarks and tests):

- :func:`disable_cluster_mode`: Ray's single-machine mode, so a local Ray binds 127.0.0.1
  (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``, read once at Ray's import:
  ``distributed.runtime._loopback_only``);
- :func:`serve_replica_module`: the module whose ``add_port_to_grpc_server`` binds a Serve
  replica's inter-deployment gRPC server (``ray.serve._private.replica``:
  ``distributed.runtime.serve_grpc_on_loopback``);
- :func:`driver_node`: this driver's Ray node (``ray._private.worker.global_worker.node``): its
  processes and session directory, for tests that list listeners or read replica logs.

Where a symbol moved (another Ray version), the call raises :class:`ImportError` naming the
symbol, the installed Ray and :data:`SUPPORTED_RAY`, instead of failing deep inside a patch.
"""

from __future__ import annotations

import importlib
from typing import Any

import ray

__all__ = ["SUPPORTED_RAY", "disable_cluster_mode", "driver_node", "serve_replica_module"]

SUPPORTED_RAY = "Ray 2.60 (the version tested; pyproject allows ray[serve]>=2.40)"


def _symbol(module: str, attr: str) -> tuple[Any, Any]:
    """``(module, module.attr)`` of a private Ray module, or an ImportError naming the versions."""
    try:
        mod = importlib.import_module(module)
        return mod, getattr(mod, attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"hetmm_ray needs {module}.{attr}, which Ray {ray.__version__} does not have ({exc}); "
            f"supported: {SUPPORTED_RAY}"
        ) from None


def disable_cluster_mode() -> None:
    """Turn off Ray's multi-node mode in this process (``ray_constants.ENABLE_RAY_CLUSTER``)."""
    constants, _ = _symbol("ray._private.ray_constants", "ENABLE_RAY_CLUSTER")
    constants.ENABLE_RAY_CLUSTER = False


def serve_replica_module() -> Any:  # a module whose attributes are patched
    """``ray.serve._private.replica``, checked to bind through ``add_port_to_grpc_server``."""
    module, _ = _symbol("ray.serve._private.replica", "add_port_to_grpc_server")
    return module


def driver_node() -> Any:
    """This driver's Ray node (``all_processes``, ``get_session_dir_path()``); needs ``ray.init``."""
    _, worker = _symbol("ray._private.worker", "global_worker")
    return worker.node
