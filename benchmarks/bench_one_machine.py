"""`hetmm serve` on one machine: how its Detector is scaled and threaded, and what each choice serves.

On a Ray that ``start_service`` starts on this machine, each application's Detector is one replica
of ``usable_cores()`` torch threads (``serve/run.one_machine_detector``). This measures that choice
against the alternatives on the same machine, in one run, alternating them (this host drifts over
minutes), each started the way ``hetmm serve`` starts the service:

- ``one machine``: what ``hetmm serve`` runs now (1 replica, threads = the machine's cores);
- ``deploy.yaml``: deploy.yaml's Detector as written (autoscaled from 1 replica of ``num_cpus`` 0.5,
  torch threads = its CPUs: 1), as before the change;
- ``3 x 1`` and ``3 x 2``: three replicas of 1 and of 2 threads (what autoscaling reaches on a
  2-core machine with deploy.yaml's ``num_cpus``: the local Ray has as many CPUs as cores).

Load: one PNG body per HTTP request (a bottle test PNG 900x900 when ../shared is there), closed-loop
clients at each ``--concurrency``; images/s and p50 are medians of ``--runs`` runs per round, and
the table's cells the medians over ``--rounds`` rounds.

    python benchmarks/bench_one_machine.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import body_png, drive, publish, request_sender
from common import free_port, table

from hetmm_ray.serve.app import DEPLOY_YAML, deployment_options, load_deploy_config
from hetmm_ray.serve.run import leave_ray, start_service, stop_service


def layouts() -> dict[str, dict | None]:
    """Name -> the ``deployments`` override given to ``start_service`` (None: what hetmm serve runs)."""
    app = next(a for a in load_deploy_config(DEPLOY_YAML)["applications"] if a["name"] == "hetmm")
    stated = deployment_options(app)["Detector"]
    return {
        "one machine": None,
        "deploy.yaml": {"Detector": {"autoscaling_config": stated["autoscaling_config"]}},
        "3 x 1": {"Detector": {"num_replicas": 3, "user_config": {**stated["user_config"], "threads": 1}}},
        "3 x 2": {"Detector": {"num_replicas": 3, "user_config": {**stated["user_config"], "threads": 2}}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="mobilenet_v2")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--requests", type=int, default=120, help="requests per run")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", nargs="+", default=list(layouts()))
    args = parser.parse_args()

    store = tempfile.mkdtemp(prefix="bench-one-machine-")
    product = publish(store, args.backbone, "auto")
    body, source = body_png()
    options = layouts()
    seen: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for round_ in range(args.rounds):
        for name in args.layouts:
            running = start_service(store=store, port=free_port(), deployments=options[name])
            try:
                send = request_sender("HTTP", 1, running)
                send(product, body, 1, 4)  # the product loaded, the first batches run
                for conc in args.concurrency:
                    send(product, body, conc, 4 * conc)
                    runs = [drive(send, product, body, conc, args.requests) for _ in range(args.runs)]
                    rps = statistics.median(r["rps"] for r in runs)
                    p50 = statistics.median(r["p50"] for r in runs)
                    fails = sum(int(r["failures"]) for r in runs)
                    seen.setdefault((name, conc), []).append((rps, p50, fails))
                    print(f"round {round_ + 1} {name} ({running.detector}) c{conc}: {rps:.1f} images/s", flush=True)
            finally:
                stop_service(running)
                leave_ray()
    rows = []
    for name in args.layouts:
        for conc in args.concurrency:
            cells = seen[(name, conc)]
            base = (
                statistics.median(r for r, _, _ in seen[("one machine", conc)]) if "one machine" in args.layouts else 0
            )
            rps = statistics.median(r for r, _, _ in cells)
            rows.append(
                [
                    name,
                    conc,
                    " / ".join(f"{r:.1f}" for r, _, _ in cells),
                    f"{rps:.1f}",
                    f"{100 * rps / base:.0f} %" if base else "-",
                    f"{statistics.median(p for _, p, _ in cells):.0f}",
                    sum(f for _, _, f in cells),
                ]
            )
    print()
    print(f"HTTP, {source} bodies, {args.backbone}; medians of {args.runs} runs x {args.rounds} rounds, alternating")
    print(table(["Detector", "clients", "images/s by round", "images/s", "of one machine", "p50 ms", "failed"], rows))


if __name__ == "__main__":
    main()
