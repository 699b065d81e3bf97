"""``hetmm station``: a line's stations (hetmm_ray/station/); ``check`` reads a line file and says
what is wrong in it, one line per problem, without starting anything."""

from __future__ import annotations

import argparse
import sys

from .common import Subcommands


def add_station(sub: Subcommands) -> None:
    p = sub.add_parser("station", help="a line's stations: check a line file")
    actions = p.add_subparsers(dest="station_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="say what is wrong in a line file, one line per problem, starting nothing")
    check.add_argument("line", help="the line file (YAML; docs: hetmm_ray/config/station.py)")
    check.set_defaults(func=cmd_station_check)


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
    for st in line.stations:
        target = st.service.grpc or st.service.http or f"in process ({st.service.in_process})"
        sinks = ", ".join(s.kind for s in st.sinks)
        version = "" if st.head.version is None else f" v{st.head.version}"
        print(f"  {st.head.name}: {st.source.kind} -> {st.head.product}{version} on {target} -> {sinks}")
    return 0
