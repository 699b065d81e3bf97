"""The ``hetmm`` side of the running service: ``hetmm serve`` (the HTTP service, and gRPC with
``--grpc-port``, until a stop signal: the signal handling while it starts and while it drains) and
the gRPC client of ``hetmm predict --grpc`` (its parser and checks are cli/scoring.py's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..config import GRPC_CLIENT_WAIT_S
from .common import CLIError, Subcommands, _add_address_flag, _image_paths, _write_json


# --- serve -----------------------------------------------------------------------------
def add_serve(sub: Subcommands) -> None:
    p = sub.add_parser("serve", help="run the HTTP service (deploy.yaml's application) until Ctrl-C")
    p.add_argument("--serve-config", metavar="FILE", help="Serve config file (default: the repository's deploy.yaml)")
    p.add_argument("--store", metavar="URI", help="template store (default: deploy.yaml's args.store)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need an admin token)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, help="also serve hetmm.v1.Inspection over gRPC on this port (e.g. 9000)")
    _add_address_flag(p, "run on")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from ..distributed.runtime import ray_reachable
    from ..serve.app import DEPLOY_YAML
    from ..serve.run import leave_ray, start_service, stop_service

    # Stop signals are taken from the start: a Ctrl-C while Ray and Serve start is acted on once they are
    # up, with the same clean stop (before, it broke off the start wherever it fell); a second one while
    # starting gives up at once. ray.init sets a SIGTERM handler of Ray's own (it stops Ray's processes
    # and exits 1), so SIGTERM is ours again once the service is up.
    stop, started = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not started.is_set():
            if stop.is_set():
                raise KeyboardInterrupt  # main(): "hetmm: interrupted", exit 130
            print("hetmm: stop asked while starting: stopping once the service is up (again: at once)", flush=True)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        running = start_service(
            config_path=args.serve_config or DEPLOY_YAML,
            store=args.store,
            host=args.host,
            port=args.port,
            address=args.address,
            grpc_port=args.grpc_port,
        )
    except BaseException:  # refused or interrupted: the caller's handlers back (tests call main())
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    started.set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    print(f"hetmm: detector per application: {running.detector}", flush=True)
    if running.grpc_target:
        print(f"hetmm: gRPC hetmm.v1.Inspection on {running.grpc_target}", flush=True)
    print(f"hetmm: serving {running.url} (store {running.store}), console {running.url}/ui/; Ctrl-C stops", flush=True)
    stop.wait()
    print("hetmm: stopping (in-flight requests finish first)", flush=True)
    # Drained in a thread while this one watches Ray: a stop signal sent to the whole process group
    # (systemd's default KillMode, `timeout`, `kill -- -PGID`) stops Ray's own processes too, and every
    # call into a Ray whose GCS is gone waits about 60 s before it fails.
    drained, failed = threading.Event(), []

    def drain() -> None:
        try:
            stop_service(running)
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the command's thread
            failed.append(exc)
        finally:
            drained.set()

    threading.Thread(target=drain, name="hetmm-drain", daemon=True).start()
    while not drained.wait(0.5):
        if not ray_reachable():
            print(
                "hetmm: Ray's own processes were stopped by the same signal, so in-flight requests were not "
                "drained (send it to this process only: systemd KillMode=mixed); exiting",
                flush=True,
            )
            os._exit(1)  # no atexit: Ray's would wait for the GCS that is gone
    if failed:
        raise failed[0]
    leave_ray()
    print("hetmm: stopped", flush=True)
    return 0


# --- predict --grpc --------------------------------------------------------------------
def _predict_grpc(args: argparse.Namespace) -> int:
    """``hetmm predict --grpc HOST:PORT``: the images scored by a service's hetmm.v1.Inspection
    (serve/grpc/) through ``InspectionClient.predict_all`` (files read as they are sent, requests within
    the service's limits, two in flight); the same lines as in process."""
    import os
    import threading

    import grpc

    from ..serve.grpc.client import ImageRefused, InspectionClient
    from ..serve.grpc.messages import record_of

    found = _image_paths(args.images)  # (path, the name its outputs are written by), as in process
    if not found:
        raise CLIError("no images to score")
    token = os.environ.get("HETMM_ADMIN_TOKEN") or None
    records, out, failed = [], Path(args.out) if args.out else None, 0
    uploads = ((str(path), path.read_bytes()) for path, _ in found)
    wait_s = GRPC_CLIENT_WAIT_S if args.wait_s is None else args.wait_s
    if not 0 <= wait_s <= 3600:  # NaN too
        raise CLIError(f"--wait-s must be between 0 and 3600 seconds, not {wait_s}")
    told = threading.Event()

    def waiting(refusal: grpc.RpcError) -> None:  # said once: the service may be starting
        if not told.is_set():
            told.set()
            why = (refusal.details() or "").splitlines()[0][:200]  # type: ignore[attr-defined]
            print(f"hetmm: {args.grpc}: UNAVAILABLE ({why}); trying again for up to {wait_s:g} s", file=sys.stderr)

    with InspectionClient(args.grpc, token=token, wait_s=wait_s, on_wait=waiting) as client:
        results = client.predict_all(
            args.product,
            uploads,
            heatmap=out is not None,
            version=args.version,
            threshold=args.threshold,
            skip_bad_images=True,
        )
        try:
            # in the order sent: each result is its file's, and written by that file's unique name
            for (path, name), r in zip(found, results, strict=True):
                if isinstance(r, ImageRefused):
                    print(f"hetmm: skipped: {r.details.split(': ', 1)[-1]}", file=sys.stderr)
                    failed += 1
                    continue
                rec: dict[str, Any] = {"image": str(path), **record_of(r)}  # the result record, as in process
                if out is not None and r.heatmap_png:
                    target = out / name.parent / f"{name.name}_heatmap.png"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(r.heatmap_png)
                    rec["heatmap"] = str(target)
                records.append(rec)
                print(f"{rec['score']:.4f}  {rec['verdict']:<7}  {path}")
        except grpc.RpcError as exc:
            raise CLIError(f"{args.grpc}: {exc.code().name}: {exc.details()}") from None
    if not records:
        raise CLIError("no readable images to score")
    print(f"{len(records)} images, product {args.product} v{records[-1]['version']} (gRPC {args.grpc})")
    if args.json:
        _write_json(args.json, records)
    return 1 if failed else 0
