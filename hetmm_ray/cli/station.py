"""``hetmm station``: a line's stations (hetmm_ray/station/); ``check`` reads a line file and says
what is wrong in it, one line per problem, without starting anything; ``run`` runs its stations in
this process (a thread each) until Ctrl-C, printing each result, and reports them to the service's
console when the line has one (``station/report.py``)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .common import Subcommands

if TYPE_CHECKING:
    from ..station.runner import PartResult


def add_station(sub: Subcommands) -> None:
    p = sub.add_parser("station", help="a line's stations: check a line file")
    actions = p.add_subparsers(dest="station_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="say what is wrong in a line file, one line per problem, starting nothing")
    check.add_argument("line", help="the line file (YAML; docs: hetmm_ray/config/station.py)")
    check.set_defaults(func=cmd_station_check)
    run = actions.add_parser("run", help="run a line file's stations in this process until Ctrl-C")
    run.add_argument("line", help="the line file (YAML)")
    run.add_argument("--station", action="append", help="run only this station (repeatable; default: all)")
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve the stations' Prometheus metrics on 127.0.0.1:PORT/metrics (default: not served)",
    )
    run.set_defaults(func=cmd_station_run)


def cmd_station_check(args: argparse.Namespace) -> int:
    from ..station import line_problems, load_line

    problems = line_problems(args.line)
    if problems:
        for problem in problems:
            print(f"hetmm: {args.line}: {problem}", file=sys.stderr)
        print(f"hetmm: error: {args.line}: {len(problems)} problem(s)", file=sys.stderr)
        return 2
    line = load_line(args.line)
    print(f"{args.line}: line {line.name!r}, {len(line.stations)} station(s), no problem found")
    if line.console is not None:
        print(f"  reports to the console at {line.console.url} every {line.console.every_s:g} s")
    for st in line.stations:
        target = st.service.grpc or st.service.http or f"in process ({st.service.in_process})"
        sinks = ", ".join(s.kind for s in st.sinks)
        version = "" if st.head.version is None else f" v{st.head.version}"
        print(f"  {st.head.name}: {st.source.kind} -> {st.head.product}{version} on {target} -> {sinks}")
    return 0


def cmd_station_run(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..station import load_line
    from ..station.runner import build_station

    line = load_line(args.line)
    chosen = [st for st in line.stations if not args.station or st.head.name in args.station]
    unknown = sorted(set(args.station or ()) - {st.head.name for st in line.stations})
    if unknown:
        raise ConfigError(f"--station {', '.join(unknown)}: not in {args.line}")
    base = Path(args.line).resolve().parent
    runners = [build_station(st, base, line=line.name) for st in chosen]  # every kind checked before any starts
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=r.run, args=(stop,), name=f"station-{r.station.head.name}") for r in runners]
    metrics = None
    if args.metrics_port is not None:
        from ..station.metrics import StationMetrics

        metrics = StationMetrics()
        metrics.serve(args.metrics_port)
        print(f"metrics on http://127.0.0.1:{args.metrics_port}/metrics", flush=True)
    for r in runners:
        r.on_result = _print_result
        r.metrics = metrics
        r.report()
    reporter = None
    if line.console is not None:
        from ..station.report import ConsoleReporter

        reporter = ConsoleReporter(line.console, line.name, runners)
        reporter.start()
        print(f"reporting to the console at {line.console.url} every {line.console.every_s:g} s", flush=True)
    for t in threads:
        t.start()
    print(f"{args.line}: {len(runners)} station(s) running; Ctrl-C stops", flush=True)
    try:
        while any(t.is_alive() for t in threads) and not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for t in threads:
            t.join()
        if reporter is not None:
            reporter.stop()
        signal.signal(signal.SIGTERM, previous)
    for r in runners:
        counts = ", ".join(f"{n} {v}" for v, n in sorted(r.counts.items())) or "no parts"
        print(f"{r.station.head.name}: {counts}")
    return 0


def _print_result(result: PartResult) -> None:
    score = "-" if result.score is None else f"{result.score:.6f}"
    late = " (late)" if result.late else ""
    error = f" {result.error}" if result.error else ""
    where = f"{result.station} {result.part_id}"
    print(
        f"{where}: {result.outcome}{late} score {score} v{result.version} {result.latency_ms:.0f} ms{error}", flush=True
    )
