"""Ray Serve HTTP service (docs/design.md, "The service"): ingress, detector replicas, metrics."""

from __future__ import annotations

from ..distributed.runtime import serve_grpc_on_loopback
from .app import build_app, load_deploy_config

serve_grpc_on_loopback()  # in replicas of the embedded Ray: before Serve binds its gRPC server

__all__ = ["build_app", "load_deploy_config"]
