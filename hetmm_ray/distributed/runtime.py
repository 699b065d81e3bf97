"""One place that starts or joins Ray, for the CLI, the Python API and the service.

``connect()`` reuses a Ray this process already joined, else starts a local one of its own
(never the cluster a ``ray start`` on this machine left in Ray's ``ray_current_cluster`` file;
listening on 127.0.0.1 only, no dashboard, worker logs kept out of the driver's terminal, namespace
``hetmm`` so named actors such as the registry are found again, Ray Serve's settings of
``config.SERVE_ENVIRONMENT`` in its processes' environment). Given an
address (or ``RAY_ADDRESS``) it joins that cluster instead.

Ray itself, given an address where nothing listens, retries for minutes before
giving up; a reachability probe with a short timeout turns that into one clear
:class:`ClusterUnavailable` line within seconds.
"""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator

import ray

from ..compat.ray import disable_cluster_mode, serve_replica_module
from ..config import SERVE_ENVIRONMENT
from ..errors import HetmmError

__all__ = [
    "NAMESPACE",
    "ClusterUnavailable",
    "as_completed",
    "connect",
    "serve_environment",
    "serve_grpc_on_loopback",
    "ray_reachable",
    "shutdown_ray",
    "started_local_ray",
    "starts_local_ray",
    "task_slots",
    "use_assigned_cpus",
]

NAMESPACE = "hetmm"
PROBE_TIMEOUT_S = 3.0
DEFAULT_CLIENT_PORT = 10001  # Ray Client's default when a ray:// address has no port

_started_gcs: str | None = None  # the GCS address of the local Ray that connect() started, if it did
_collecting = False  # a cyclic garbage collection is running (in any thread): gc.callbacks say so
GC_SETTLE_S = 10.0  # at most this long for another thread's collection to end before leaving Ray


class ClusterUnavailable(HetmmError, RuntimeError):
    """The Ray cluster at the given address cannot be reached."""


def as_completed(refs: Iterable[ray.ObjectRef]) -> Iterator[ray.ObjectRef]:
    """Each of ``refs`` as its task finishes (``ray.wait``, one at a time): a fan-out places its
    results and counts its progress as they come, not in the order it submitted them."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        yield from ready


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``host:port`` or ``ray://host[:port]`` address; None for ``auto``."""
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep:
        if address.startswith("ray://"):
            return rest, DEFAULT_CLIENT_PORT
        raise ClusterUnavailable(f"ray address {address!r}: expected host:port, ray://host:port or auto")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ClusterUnavailable(f"ray address {address!r}: port {port!r} is not a number") from None


def _probe(address: str, host: str, port: int, timeout: float) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {timeout:g} s"
        raise ClusterUnavailable(f"ray cluster at {address} is unreachable ({reason})") from None


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class _TokenAuthNotice(logging.Filter):
    """Drops Ray's notice that token authentication is on (not the one that it is off)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled for this Ray cluster" not in record.getMessage()


def _quiet_token_notice() -> None:
    """Ray 2.60 turns token authentication on for a new local Ray when ``RAY_AUTH_MODE`` is unset and
    says so on every start ("... Set RAY_AUTH_MODE=disabled to opt out"), a line on every ``hetmm
    serve``, demo and command that starts Ray. The mode stays on; only that notice is dropped. (Setting
    ``RAY_AUTH_MODE=token`` instead does not work once Ray has read its config: the driver then
    has no token for the GCS it starts.)"""
    notices = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _TokenAuthNotice) for f in notices.filters):
        notices.addFilter(_TokenAuthNotice())


def _loopback_only() -> None:
    """Make the local Ray about to start listen on 127.0.0.1 only.

    Ray 2.60 binds its GCS, raylets, workers and agents to the node IP and ``*``, and
    turns a ``_node_ip_address`` of 127.0.0.1 back into the machine's reachable address.
    Its single-machine mode (what ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` selects; on
    Linux it changes nothing else) takes 127.0.0.1 as the node IP, and then every Ray
    process binds loopback (checked with ``ss -ltnp`` in tests/integration/test_hardening.py). The
    variable is set in this process's environment so Ray's child processes see it too;
    the constant is patched because Ray read the variable when it was imported.
    """
    os.environ[LOOPBACK_ENV] = "0"
    disable_cluster_mode()


def serve_grpc_on_loopback() -> None:
    """In a process of the embedded loopback Ray, bind Serve's inter-deployment gRPC server to
    127.0.0.1 instead of every interface.

    Ray 2.60 starts that server in every Serve replica on ``[::]:0`` whatever the node's address
    (``ray/serve/_private/replica.py``), and deployment handle calls travel over it
    (``config.SERVE_ENVIRONMENT``): on a laptop or line PC running the embedded service, a replica
    would take requests from the network, past the ingress's checks. The embedded Ray's node
    address is 127.0.0.1 (see :func:`_loopback_only`; its processes inherit ``LOOPBACK_ENV``), so
    handles reach the replicas there. A cluster's replicas, which must be reachable from other
    nodes, are left alone. Called when ``hetmm_ray.serve`` is imported, which every replica does
    before Serve starts the server; ``tests/integration/test_hardening.py`` lists the listeners.
    """
    if os.environ.get(LOOPBACK_ENV) != "0":
        return
    if ray.is_initialized() and ray.util.get_node_ip_address() != "127.0.0.1":
        return  # a node others must reach (handles connect to the node's address)
    replica = serve_replica_module()
    bind = replica.add_port_to_grpc_server
    if getattr(bind, "loopback_only", False):
        return

    def bind_loopback(server: object, address: str) -> int:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return bind(server, address)

    bind_loopback.loopback_only = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = bind_loopback


def serve_environment() -> None:
    """Put ``config.SERVE_ENVIRONMENT`` in this process's environment (values already there win),
    so the processes of a local Ray started next (raylet, Serve's controller, proxy and
    replicas) inherit them. Call before ``ray.init``."""
    for name, value in SERVE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def starts_local_ray(address: str | None) -> bool:
    """Whether :func:`connect` with ``address`` would start a new local Ray: this process has joined
    none, and neither ``address`` nor ``RAY_ADDRESS`` names a cluster."""
    return not ray.is_initialized() and not (address or os.environ.get("RAY_ADDRESS"))


@functools.cache  # once per process
def _collect_before_ray_exits() -> None:
    """At interpreter exit, collect Ray's garbage (and stop automatic collections) before Ray's own
    exit hook shuts the driver down (exit hooks run last registered first; Ray registers its hook when
    it is imported), for the reason :func:`shutdown_ray` gives: a command that ends without leaving
    Ray would otherwise risk exit status 1 after its work is done."""
    atexit.register(_collect_ray_garbage)


def connect(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Start or join Ray once for this process.

    ``address``: None (or empty) -> ``RAY_ADDRESS`` if set, else reuse a Ray this
    process already joined, else start a local one with ``num_cpus`` CPUs (all
    by default), always a new one: a cluster that ``ray start`` (or ``cluster/local_cluster.sh``)
    left running on this machine is joined only when asked for (``"auto"`` or its address),
    never by default (Ray's own ``ray.init()`` would join it). ``"auto"`` joins the cluster started on this machine by
    ``ray start``; ``"host:port"`` (the GCS) or ``"ray://host:port"`` (Ray
    Client) join that cluster. ``num_cpus`` only applies to a local Ray.

    Raises :class:`ClusterUnavailable` when the address cannot be reached.
    """
    if ray.is_initialized():
        return  # one Ray per process: a second connect is a no-op
    _collect_before_ray_exits()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if starts_local_ray(address):
        _loopback_only()
        serve_environment()
        _quiet_token_notice()
        ray.init(
            address="local",  # a new Ray of our own, not the one /tmp/ray/ray_current_cluster names
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            namespace=NAMESPACE,
            configure_logging=False,
        )
        global _started_gcs
        _started_gcs = ray.get_runtime_context().gcs_address
        return
    if num_cpus is not None:
        raise ValueError("num_cpus applies to a local Ray only; an existing cluster has its own CPUs")
    assert address is not None  # no address at all started a local Ray above
    target = _host_port(address)
    if target is not None:
        _probe(address, *target, PROBE_TIMEOUT_S)
    try:
        ray.init(address=address, log_to_driver=False, namespace=NAMESPACE, configure_logging=False)
    except ConnectionError as exc:  # "auto" with no cluster on this machine, a stale address file...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterUnavailable(f"ray cluster at {address} is unreachable ({first})") from None


def shutdown_ray(*, wait_for_processes: bool = False) -> None:
    """``ray.shutdown()`` with no Ray garbage left for another thread to finalize while it runs.

    Ray 2.60 destroys the driver's core worker inside ``ray.shutdown`` a moment before it drops the
    Python handle to it, and lets other threads run meanwhile. An ``ObjectRef`` or actor handle
    finalized in that moment calls into the destroyed core worker, and Ray then ends the whole
    process with status 1 and nothing on stderr ("The core worker has already been shutdown ... The
    process will exit"). Garbage in reference cycles is finalized by whichever thread's allocations
    start the cyclic GC, so any Python thread still running (a poller, a progress monitor) can do it:
    a test process died that way twice in CI (thread and stack seen under gdb in a reproduction).

    So automatic collections stop in every thread (``gc.disable``), one that another thread already
    runs is let finish (a process holds one at a time), and a full collection here finalizes the
    rest while the core worker is alive; automatic collections resume after the shutdown.
    """
    enabled = gc.isenabled()
    _collect_ray_garbage()
    try:
        ray.shutdown(wait_for_processes=wait_for_processes)
    finally:
        if enabled:
            gc.enable()


def _collect_ray_garbage() -> None:
    """Stop automatic collections, wait (bounded) for one that another thread runs, collect here."""
    gc.disable()
    deadline = time.monotonic() + GC_SETTLE_S
    while _collecting and time.monotonic() < deadline:
        time.sleep(0.001)
    gc.collect()


def _note_collection(phase: str, info: dict[str, int]) -> None:
    global _collecting
    _collecting = phase == "start"


gc.callbacks.append(_note_collection)  # what _collect_ray_garbage waits on


def ray_reachable(timeout_s: float = 1.0) -> bool:
    """Whether the GCS of the Ray this process joined still accepts connections (a TCP connect to its
    address). False once it has stopped: then every call into Ray waits for it (about 60 s) and fails."""
    if not ray.is_initialized():
        return False
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def started_local_ray() -> bool:
    """Whether the Ray this process is joined to is a local one that :func:`connect` started (it stops
    with this process), not a cluster that outlives it."""
    return ray.is_initialized() and _started_gcs is not None and ray.get_runtime_context().gcs_address == _started_gcs


def use_assigned_cpus(threads: int = 0) -> int:
    """Set this Ray worker's torch threads: ``threads`` when > 0, else the rule of
    ``core.device.compute_threads`` on the CPUs Ray assigned to the running task or actor.
    Ray sets ``OMP_NUM_THREADS=1`` in its workers, so every task and replica that computes calls
    this first. Returns the count set."""
    import torch

    from ..core.device import compute_threads

    n = threads if threads > 0 else compute_threads(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))
    torch.set_num_threads(n)
    return n


def task_slots(num_cpus: float) -> float:
    """How many tasks of ``num_cpus`` CPUs the connected cluster runs at once: its CPUs over a task's,
    at least 1."""
    return max(1.0, float(ray.cluster_resources().get("CPU", 1.0)) / max(num_cpus, 1e-9))
