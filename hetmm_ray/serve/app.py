"""The Serve application: ``Ingress`` in front of multiplexed ``Detector`` replicas.

``deploy.yaml`` points Serve at :func:`build_app` with its ``args`` (a
:class:`~hetmm_ray.config.ServiceConfig`); ``hetmm serve`` builds the same
application from the same file, so the CLI and ``serve run deploy.yaml`` run
one thing.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml
from ray.serve import Application

from ..config import ConfigError, ReplicaSettings, ServiceConfig
from .ingress import Ingress
from .replica import Detector

__all__ = ["DEPLOY_YAML", "build_app", "build_application", "deployment_options", "load_deploy_config"]

DEPLOY_YAML = Path(__file__).resolve().parents[2] / "deploy.yaml"


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder (``import_path: hetmm_ray.serve.app:build_app``).

    Serve applies the config file's ``deployments`` options itself.
    """
    return build_application(args)


def build_application(args: dict[str, Any], deployments: dict[str, dict[str, Any]] | None = None) -> Application:
    """The application, with ``deployments`` (name -> ``.options()``) applied as ``serve run`` would."""
    service = ServiceConfig.from_dict(dict(args or {}))
    if "://" not in service.store:  # replicas may run elsewhere: pin the folder where the app was built
        service = dataclasses.replace(service, store=os.path.abspath(service.store))
    options = deployments or {}
    unknown = set(options) - {"Ingress", "Detector"}
    if unknown:
        raise ConfigError(f"deployments: unknown deployment(s) {sorted(unknown)}; there are Ingress and Detector")
    # serve.deployment makes Deployments; Serve's stubs type the decorated classes as the classes
    detector = Detector.options(**options.get("Detector", {}))  # type: ignore[attr-defined]
    ingress = Ingress.options(**options.get("Ingress", {}))  # type: ignore[attr-defined]
    return ingress.bind(detector.bind(service.store, service.max_products_per_replica), dataclasses.asdict(service))


def deployment_options(app_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> ``.options()`` kwargs from one application entry of a Serve config file."""
    return {d["name"]: {k: v for k, v in d.items() if k != "name"} for d in app_config.get("deployments") or []}


def load_deploy_config(path: str | Path = DEPLOY_YAML) -> dict[str, Any]:
    """A Serve config file, with the hetmm application's args and user_config validated."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: cannot read the Serve config ({exc})") from None
    apps = data.get("applications") if isinstance(data, dict) else None
    if not apps:
        raise ConfigError(f"{p}: no 'applications' in the Serve config")
    for app in apps:
        ServiceConfig.from_dict(app.get("args") or {})
        for dep in app.get("deployments") or []:
            if dep.get("name") == "Detector" and dep.get("user_config") is not None:
                ReplicaSettings.from_dict(dep["user_config"])
    return data
