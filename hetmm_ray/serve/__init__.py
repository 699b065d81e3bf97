"""Ray Serve HTTP service (docs/design.md, "The service"): ingress, detector replicas, metrics."""

from __future__ import annotations

from .app import build_app, load_deploy_config

__all__ = ["build_app", "load_deploy_config"]
