"""Issue 25's two bar rows against in-process, interleaved: each row's share is of an in-process run
measured seconds before it, not minutes.

``bench_serve.py`` measures in-process before the service starts and after it has gone, minutes
away from the service rows; this host's speed drifts by more than the gap to the bars over minutes
(BENCHMARKS.md, issue 25, sessions 12-15). Here one process starts the service of deploy.yaml on a
local Ray (one detector replica per application, 2 torch threads, as ``bench_serve.py``), publishes
its efficientnet_lite0 product of 60 sheets and then, ``--rounds`` times:

1. in-process: ``HETMM.predict`` of 24 copies of the body per call for ``--seconds``, with every
   process of the local Ray stopped (SIGSTOP, then SIGCONT: the baseline shares the machine with
   nothing, as in ``bench_serve.py``; ``--no-freeze`` leaves the idle service running beside it);
2. gRPC, one image per request, 8 clients (bar: 80 % of in-process);
3. HTTP, 8 images per request, 2 clients (bar: 85 %);

each service row about ``--seconds`` long. Prints each round's images/s, CPU ms per image (in-process:
this process; a service row: every process of the session, as ``bench_serve.py``) and shares, then the
median share of each row.

    python benchmarks/bench_serve_interleaved.py [--rounds 5] [--seconds 10] [--no-freeze]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_serve
from common import free_port

ROWS = (("gRPC", 1, 8), ("HTTP", 8, 2))  # (path, images per request, clients): the two bar rows


@contextmanager
def frozen(pids: set[int]):
    """Every process of ``pids`` stopped for the block (SIGSTOP), then continued (SIGCONT)."""
    stopped = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except ProcessLookupError:
                continue
        yield
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-freeze", action="store_true", help="leave the idle service running during in-process")
    args = parser.parse_args()

    import torch
    from ray import serve

    from hetmm_ray.detector import HETMM
    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.serve.run import start_service, stop_service
    from hetmm_ray.store import open_store

    store = tempfile.mkdtemp(prefix="bench-interleaved-")
    product = bench_serve.publish(store, "efficientnet_lite0", "auto")
    body, source = bench_serve.body_png()
    detector = HETMM.load(open_store(store), product, device="auto")
    images = [body] * 24
    detector.predict(images[:8])
    user = {"threads": torch.get_num_threads()}
    running = start_service(
        store=store,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": user}},
        grpc_port=free_port(),
    )
    shares: dict[str, list[float]] = {f"{p} c{c} x{n}": [] for p, n, c in ROWS}
    by_group: dict[str, dict[str, list[float]]] = {}  # process group -> row -> CPU ms per image, per round
    print(
        f"efficientnet_lite0, 60 sheets, {source} bodies; "
        f"in-process with the local Ray {'running' if args.no_freeze else 'stopped'}"
    )
    print(
        "| round | in-process images/s (CPU ms/image) | "
        + " | ".join(f"{k} images/s (CPU ms/image), share" for k in shares)
        + " |"
    )
    print("|---|---|" + "---|" * len(shares))
    try:
        senders = {}
        for path, per_request, clients in ROWS:  # warm-up: every score worker has run at this load
            senders[path] = bench_serve.request_sender(path, per_request, running)
            senders[path](product, body, clients, 4 * clients)
        for round_ in range(1, args.rounds + 1):
            with frozen(set() if args.no_freeze else bench_serve.descendants()):
                rate, cpu = bench_serve.predict_for(detector, images, args.seconds)
            cells = [f"{rate:.2f} ({cpu:.1f})"]
            for (path, per_request, clients), key in zip(ROWS, shares, strict=True):
                requests = max(2 * clients, int(args.seconds * rate * 0.8 / per_request))
                row = bench_serve.drive(senders[path], product, body, clients, requests, per_request)
                share = 100 * row["rps"] / rate
                shares[key].append(share)
                for k, v in row.items():
                    if k.startswith("cpu:"):
                        by_group.setdefault(k[4:], {}).setdefault(key, []).append(v)
                cells.append(
                    f"{row['rps']:.2f} ({row['cpu_ms']:.1f}), {share:.0f} %"
                    + (f", {row['failures']} failed" if row["failures"] else "")
                )
            print(f"| {round_} | " + " | ".join(cells) + " |", flush=True)
    finally:
        stop_service(running)
        serve.shutdown()
        shutdown_ray()
    print("| median | | " + " | ".join(f"{statistics.median(v):.0f} %" for v in shares.values()) + " |")
    print("\nCPU ms per image by process (median over the rounds)")
    print("| process | " + " | ".join(shares) + " |")
    print("|---|" + "---|" * len(shares))
    for group, rows in sorted(by_group.items(), key=lambda g: -sum(statistics.median(v) for v in g[1].values())):
        print(f"| {group} | " + " | ".join(f"{statistics.median(rows.get(k, [0.0])):.1f}" for k in shares) + " |")


if __name__ == "__main__":
    main()
