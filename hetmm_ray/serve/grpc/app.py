"""The gRPC application: ``InspectionDetector`` replicas behind Serve's gRPC proxy.

``deploy.yaml``'s second application (``config.GRPC_APP_NAME``) points Serve at
:func:`build_grpc_app` with the same ``args`` as the HTTP application (a YAML alias), and its
top-level ``grpc_options`` register ``config.GRPC_SERVICER`` on ``grpc_options.port``. ``hetmm serve
--grpc-port`` deploys the same application (``serve/run.py``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ray.serve import Application

from ...config import ConfigError, ServiceConfig
from .service import InspectionDetector

__all__ = ["build_grpc_app", "build_grpc_application"]


def build_grpc_app(args: dict[str, Any]) -> Application:
    """Serve application builder (``import_path: hetmm_ray.serve.grpc.app:build_grpc_app``)."""
    return build_grpc_application(args)


def build_grpc_application(args: dict[str, Any], deployments: dict[str, dict[str, Any]] | None = None) -> Application:
    """The gRPC application, with ``deployments`` (name -> ``.options()``) applied as ``serve run`` would."""
    service = ServiceConfig.from_dict(dict(args or {}))
    if "://" not in service.store:  # replicas may run elsewhere: pin the folder where the app was built
        service = dataclasses.replace(service, store=os.path.abspath(service.store))
    options = deployments or {}
    unknown = set(options) - {"Detector"}
    if unknown:
        raise ConfigError(f"deployments: unknown deployment(s) {sorted(unknown)}; the gRPC application has Detector")
    detector = InspectionDetector.options(**options.get("Detector", {}))
    return detector.bind(service.store, service.max_products_per_replica, dataclasses.asdict(service))
