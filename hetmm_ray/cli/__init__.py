"""The ``hetmm`` command: fit, predict, update, compress, region, evaluate, serve, demo.

Every expected failure (bad image, bad config, missing weights, unknown
product, unreadable store) ends with a one-line ``hetmm: error: ...`` and exit
status 2; ``--debug`` shows tracebacks.

Here: the entry point (``main``, the parser's top level, the error line). Each command's parser
is built beside its handler, in its group's module:

- ``products.py``: fit, update, compress (templates from good images)
- ``calibration.py``: calibrate, region (a new threshold or region over the same templates)
- ``scoring.py``: predict, evaluate, inspect
- ``candidates.py``: promote, discard, compare
- ``store_admin.py``: versions, delete, rollback, repair, migrate
- ``service.py``: serve, and the gRPC client of ``predict --grpc``
- ``station.py``: station check
- ``demo.py``: demo
- ``common.py``: what several commands share (flags, configuration, images, store, publishing)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from .. import __version__
from ..errors import describe
from . import calibration, candidates, demo, products, scoring, service, station, store_admin
from .common import Subcommands

__all__ = ["main"]

# Every subcommand, in the order ``hetmm --help`` lists them (the order of the single-module CLI,
# not grouped by module).
COMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    products.add_fit,
    scoring.add_predict,
    scoring.add_inspect,
    scoring.add_evaluate,
    calibration.add_calibrate,
    calibration.add_region,
    products.add_update,
    products.add_drop,
    products.add_compress,
    store_admin.add_versions,
    store_admin.add_delete,
    store_admin.add_rollback,
    candidates.add_promote,
    candidates.add_discard,
    candidates.add_compare,
    store_admin.add_repair,
    store_admin.add_migrate,
    service.add_serve,
    station.add_station,
    demo.add_demo,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetmm", description="Training-free industrial anomaly detection (HETMM).")
    parser.add_argument("--version", action="version", version=f"hetmm-ray {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)  # each binds its handler (func) when main builds the parser
    return parser


def error_line(exc: BaseException) -> str:
    """The one line ``hetmm: error: ...`` says for ``exc``: a project error (``hetmm_ray/errors.py``,
    the table HTTP maps too) or an OS error says its own message; anything else is unexpected."""
    known = describe(exc)
    if known is not None:
        return known[2]
    if isinstance(exc, OSError):  # a local file the user named: their message is the useful one
        msg = str(exc)
        return msg.splitlines()[0] if msg else type(exc).__name__
    return f"unexpected {type(exc).__name__}: {exc} (run with --debug for a traceback)".splitlines()[0]


EXIT_READER_GONE = 141  # 128 + SIGPIPE: what a Unix tool's exit status is when its reader goes


def _reader_gone() -> bool:
    """Whether standard output's reader has gone (``hetmm versions | head``). If so, standard output
    is pointed at /dev/null, so that Python's own flush at exit does not report the pipe again."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return gone


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is seen below
    except KeyboardInterrupt:
        print("hetmm: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _reader_gone():
            return EXIT_READER_GONE  # quietly, as Unix tools stop when their reader does
        if args.debug:
            raise
        print(f"hetmm: error: {error_line(exc)}", file=sys.stderr)
        return 2
    if args.debug:
        print(f"hetmm: {args.command} took {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return code
