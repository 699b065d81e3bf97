"""What a Ray worker process costs doing nothing: the floor under an idle service (issue 25).

Starts a local Ray the way the service does (``distributed.runtime.connect``: no dashboard, no
log forwarding, ``config.SERVE_ENVIRONMENT``), creates ``--actors`` plain actors that do nothing
(one method returning its pid), waits until they have settled, then reads for ``--seconds`` each
actor's threads from ``/proc/<pid>/task``: CPU time (utime + stime) and voluntary context switches
(each is one wake-up after a sleep). Prints each actor's CPU ms per second, its main thread's share,
and that thread's wake-ups per second.

What it shows (BENCHMARKS.md, issue 25, session 15): Ray's core worker runs the Python worker's task
loop on the main thread with a periodic signal check every 10 ms (``CoreWorker::RunTaskExecutionLoop``,
"CoreWorker.CheckSignal", a constant of Ray's C++ with no setting), so every Ray worker process wakes
about 100 times a second. Serve's controller, proxy and replicas, the product registry and the
template hosts are each such a process.

    python benchmarks/bench_ray_idle.py [--actors 4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import thread_cpu


def wakeups(pid: int) -> int:
    """Voluntary context switches of the main thread of ``pid`` (each one wake-up after a sleep)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after the actors started")
    args = parser.parse_args()

    import ray

    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.distributed.runtime import connect

    @ray.remote(num_cpus=0)
    class Idle:
        def pid(self) -> int:
            return os.getpid()

    connect(None)
    try:
        actors = [Idle.remote() for _ in range(args.actors)]
        pids = ray.get([a.pid.remote() for a in actors])
        time.sleep(args.settle_s)
        before = {pid: (thread_cpu(pid), wakeups(pid)) for pid in pids}
        t0 = time.perf_counter()
        threading.Event().wait(args.seconds)
        wall = time.perf_counter() - t0
        after = {pid: (thread_cpu(pid), wakeups(pid)) for pid in pids}
    finally:
        shutdown_ray()

    print(f"{args.actors} idle Ray actors over {wall:.1f} s (CPU ms per second; main thread = the process id)")
    print("| actor pid | all threads | main thread | main thread wake-ups per s | threads |")
    print("|---|---|---|---|---|")
    totals, mains, wakes = [], [], []
    for pid in pids:
        (cpu0, woke0), (cpu1, woke1) = before[pid], after[pid]
        spent = {t: cpu1[t] - cpu0.get(t, 0.0) for t in cpu1}
        total = 1000 * sum(spent.values()) / wall
        main_ms = 1000 * spent.get(pid, 0.0) / wall
        woke = (woke1 - woke0) / wall
        totals.append(total)
        mains.append(main_ms)
        wakes.append(woke)
        print(f"| {pid} | {total:.1f} | {main_ms:.1f} | {woke:.0f} | {len(cpu1)} |")
    print(
        f"| median | {statistics.median(totals):.1f} | {statistics.median(mains):.1f} "
        f"| {statistics.median(wakes):.0f} | |"
    )


if __name__ == "__main__":
    main()
