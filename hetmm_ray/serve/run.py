"""Start and stop the service from Python (``hetmm serve``, the demo, tests, benchmarks).

The application and its deployment options come from ``deploy.yaml``, so this
runs exactly what ``serve run deploy.yaml`` runs, with the store, host and
port overridable, and one exception: on a Ray that :func:`start_service` starts on
this machine (no ``address``), each application's Detector is one replica whose torch
threads are the machine's usable cores (:func:`one_machine_detector`), not deploy.yaml's
autoscaled replicas of half a CPU. deploy.yaml's range is for a cluster, where new replicas
land on other nodes; on one machine they only share its cores, and one replica using all of them
serves more images/s than several sharing them (``benchmarks/bench_cluster.py one-machine``;
docs/performance.md). A caller that gives
the Detector ``num_replicas`` or ``autoscaling_config`` keeps its own scaling and deploy.yaml's threads.
"""

from __future__ import annotations

import copy
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve

from ..config import GRPC_APP_NAME, GRPC_ROUTE_PREFIX, GRPC_SERVICER, HTTP_APP_NAME, ConfigError, ServiceConfig
from ..core.device import usable_cores
from ..distributed import runtime
from ..distributed.registry import registry_name
from ..distributed.runtime import NAMESPACE, connect, started_local_ray, starts_local_ray
from .app import DEPLOY_YAML, build_application, deployment_options, load_deploy_config
from .security import refuse_open_bind

__all__ = [
    "RunningService",
    "check_ports_free",
    "leave_ray",
    "one_machine_detector",
    "start_service",
    "stop_service",
]

APP_NAME = HTTP_APP_NAME


@dataclass(frozen=True)
class RunningService:
    url: str
    store: str
    app_name: str
    grpc_target: str | None = None  # host:port of hetmm.v1.Inspection when it was started
    detector: str = ""  # how each application's Detector is scaled and threaded (hetmm serve prints it)


def _app_entry(config: dict[str, Any], name: str) -> dict[str, Any]:
    for app in config["applications"]:
        if app.get("name") == name:
            return app
    raise ConfigError(f"the Serve config has no application named {name!r}")


def one_machine_detector(stated: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A Detector's options on a Ray started on this machine (module doc): ``stated`` (deploy.yaml's)
    as one replica of ``usable_cores()`` torch threads where ``threads`` is 0, unless ``overrides``
    (the caller's) take charge of scaling; then ``overrides`` on top."""
    detector = copy.deepcopy(stated)
    if not {"num_replicas", "autoscaling_config"} & set(overrides):  # the caller's own scaling stands
        detector.pop("autoscaling_config", None)
        detector["num_replicas"] = 1
        user = detector.setdefault("user_config", {})
        if not user.get("threads"):
            user["threads"] = usable_cores()
    return _with_overrides(detector, overrides)


def _detector_options(stated: dict[str, Any], overrides: dict[str, Any], *, one_machine: bool) -> dict[str, Any]:
    """An application's Detector options: ``stated`` with the caller's ``overrides``, on one machine
    through :func:`one_machine_detector` (the HTTP and gRPC applications alike)."""
    return one_machine_detector(stated, overrides) if one_machine else _with_overrides(stated, overrides)


def _describe_detector(options: dict[str, Any], *, one_machine: bool) -> str:
    """One line on a Detector's ``options``: its replicas and torch threads, and whether they run on
    a Ray of this machine (docs/service.md, "On one machine")."""
    threads = (options.get("user_config") or {}).get("threads") or 0
    per = f"{threads} torch thread{'s' if threads != 1 else ''}" if threads else "torch threads = its CPUs"
    auto = options.get("autoscaling_config")
    if auto:
        count = f"{auto.get('min_replicas', 1)}-{auto.get('max_replicas', 1)} replicas (autoscaled)"
    else:
        n = options.get("num_replicas", 1)
        count = f"{n} replica{'s' if n != 1 else ''}"
    where = " (a Ray on this machine)" if one_machine else ""
    return f"{count}, {per}{where}"


def _with_overrides(options: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``overrides`` key by key; a scaling override replaces the other kind."""
    merged = {**options, **copy.deepcopy(overrides)}
    if "num_replicas" in overrides:
        merged.pop("autoscaling_config", None)
    elif "autoscaling_config" in overrides:
        merged.pop("num_replicas", None)
    return merged


def _with_env(options: dict[str, Any], name: str, value: str) -> dict[str, Any]:
    """A copy of a deployment's ``options`` whose actors have ``name=value`` in their environment."""
    options = copy.deepcopy(options)
    actor = options.setdefault("ray_actor_options", {})
    actor.setdefault("runtime_env", {}).setdefault("env_vars", {})[name] = value
    return options


def check_ports_free(ports: dict[str, tuple[str, int]]) -> None:
    """Refuse with ``ConfigError`` a port that another program holds (``ports``: the option that named
    it -> (host, port)). Serve's proxy would fail to bind it only after Ray and Serve had started, and
    say so as ``RayTaskError(RuntimeError): ray::ProxyActor.ready()``. The probe sets SO_REUSEADDR as
    servers do, so a port a stopped service left in TIME_WAIT passes, and listens on nothing."""
    for option, (host, port) in ports.items():
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise ConfigError(f"{option} {port}: cannot bind {host}:{port} ({exc.strerror})") from None
                where = "" if host in ("0.0.0.0", "::") else f" on {host}"
                raise ConfigError(
                    f"{option} {port}: port {port} is in use by another program{where}; stop it or choose another port"
                ) from None


def start_service(
    *,
    config_path: str | Path = DEPLOY_YAML,
    store: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    args: dict[str, Any] | None = None,
    deployments: dict[str, dict[str, Any]] | None = None,
    num_cpus: int | None = None,
    grpc_port: int | None = None,
) -> RunningService:
    """Deploy the ``hetmm`` application of ``config_path`` and return its URL once it is up.

    ``args`` and ``deployments`` (name -> options) override the file's entries key by key.
    With ``grpc_port``, the gRPC application (``serve/grpc/``, deploy.yaml's ``hetmm-grpc``) is
    deployed too, behind Serve's gRPC proxy on that port; its Detector takes the same overrides.
    """
    config = load_deploy_config(config_path)
    entry = _app_entry(config, APP_NAME)
    app_args = {**(entry.get("args") or {}), **(args or {})}
    if store is not None:
        app_args["store"] = store
    app_args["http_host"] = host  # the ingress checks the bind it is served on (ServiceConfig.http_host)
    service = ServiceConfig.from_dict(app_args)
    token = os.environ.get(service.admin_token_env)
    refuse_open_bind(host, token, service.admin_token_env)
    if grpc_port is not None:  # the gRPC replicas would refuse to start: say it here, once
        refuse_open_bind(service.grpc_host, token, service.admin_token_env)
        if grpc_port == port:  # both proxies bind it (one on host, one on every interface): neither is sure
            raise ConfigError(f"--grpc-port {grpc_port}: the same port as --port; give HTTP and gRPC a port each")

    one_machine = starts_local_ray(address)
    options = deployment_options(entry)
    overrides = deployments or {}
    for name, extra in overrides.items():
        if name != "Detector":
            options[name] = _with_overrides(options.get(name, {}), extra)
    detector_overrides = overrides.get("Detector", {})
    options["Detector"] = _detector_options(options.get("Detector", {}), detector_overrides, one_machine=one_machine)
    if token:  # a cluster started elsewhere does not have this shell's environment
        options["Ingress"] = _with_env(options.get("Ingress", {}), service.admin_token_env, token)

    if one_machine:
        # A new local Ray, so nothing of this service holds them yet. Ray 2.60's gRPC proxy listens on
        # every interface (deploy.yaml), so that port must be free on all of them.
        ports = {"--port": (host, port)}
        if grpc_port is not None:
            ports["--grpc-port"] = ("0.0.0.0", grpc_port)
        check_ports_free(ports)
    connect(address, num_cpus=num_cpus if address is None else None)
    http = {**(config.get("http_options") or {}), "host": host, "port": port}
    grpc = None
    if grpc_port is not None:
        grpc = {**(config.get("grpc_options") or {}), "port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER]}
    serve.start(http_options=http, grpc_options=grpc)
    app = build_application(app_args, options)
    serve.run(app, name=APP_NAME, route_prefix=entry.get("route_prefix", "/"))
    grpc_target = None
    if grpc_port is not None:
        _run_grpc_app(config, app_args, detector_overrides, token, service.admin_token_env, one_machine=one_machine)
        grpc_target = f"{service.grpc_host}:{grpc_port}"
    store_uri = ServiceConfig.from_dict(app_args).store
    return RunningService(
        url=f"http://{host}:{port}",
        store=store_uri,
        app_name=APP_NAME,
        grpc_target=grpc_target,
        detector=_describe_detector(options["Detector"], one_machine=one_machine),
    )


def _run_grpc_app(
    config: dict[str, Any],
    app_args: dict[str, Any],
    overrides: dict[str, Any],
    token: str | None,
    env: str,
    *,
    one_machine: bool,
) -> None:
    """Deploy the gRPC application with the HTTP application's args; its Detector's options are
    deploy.yaml's ``hetmm-grpc`` entry (the HTTP application's Detector when there is none), then
    this call's Detector ``overrides`` (on one machine, as the HTTP application's: module doc)."""
    from .grpc.app import build_grpc_application  # the gRPC modules only where gRPC is served

    entries = {a.get("name"): a for a in config["applications"]}
    stated = deployment_options(entries.get(GRPC_APP_NAME) or entries[APP_NAME]).get("Detector", {})
    detector = _detector_options(stated, overrides, one_machine=one_machine)
    if token:  # the threshold override's admin token, as the ingress gets it
        detector = _with_env(detector, env, token)
    app = build_grpc_application(app_args, {"Detector": detector})
    serve.run(app, name=GRPC_APP_NAME, route_prefix=GRPC_ROUTE_PREFIX)


def stop_service(running: RunningService, *, shutdown_ray: bool = False) -> None:
    """Delete the applications and the registry (the store keeps every version); with ``shutdown_ray``,
    also stop Serve and leave Ray (a local Ray of this process stops)."""
    serve.delete(running.app_name)
    if running.grpc_target is not None:
        serve.delete(GRPC_APP_NAME)
    store = running.store if "://" in running.store else os.path.abspath(running.store)
    try:
        ray.kill(ray.get_actor(registry_name(store), namespace=NAMESPACE))
    except ValueError:
        pass  # never created
    if shutdown_ray:
        leave_ray()


def leave_ray() -> None:
    """Stop Serve and leave Ray: a local Ray that connect() started stops, and takes every Serve process
    down with it (serve.shutdown() there would only add Ray's "Task ServeController.graceful_shutdown
    failed ... will be retried", Ray 2.60 killing the controller inside that call, to a clean stop);
    a cluster outlives this process, so Serve is taken off it first."""
    if not started_local_ray():
        serve.shutdown()
    runtime.shutdown_ray()  # not the name: stop_service's keyword of that name would shadow it
