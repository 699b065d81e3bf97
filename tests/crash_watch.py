"""A test process that cannot die silently: a pytest plugin (tests/conftest.py loads it,
so ``make test``, ``.ci/run`` and any ``pytest`` run have it) and the watcher process it starts.

A native crash (a segfault in a library's thread) or a library that ends the process itself (Ray's
driver exits with status 1 when its core worker is used after a shutdown) ends pytest before its
summary, and often before anything names the test: pytest's own faulthandler prints only the Python
stacks of a fatal signal, and nothing at all for an ``exit()`` from C++.

So at configure time the plugin starts a small watcher process that shares nothing with pytest but
a pipe. pytest writes a line to it as each test starts (``start <id>``, then the names of the
Python threads alive: a native crash is often another thread's) and ends (``end <id>``),
after its summary (``summary``) and last of all (``exit``). When the pipe closes, or the pytest
process is gone, without ``exit``, the watcher writes to the run's standard error which test the
process died in (or after which one, or that it died after its summary, on its way out), and the
errors and exits that the newest Ray sessions' driver and raylet logged (Ray's own words when it
ended the process). A run therefore ends with pytest's summary or with the name of the test it
died in. The watcher ignores Ctrl-C (pytest still writes ``exit`` then) and leaves with the pipe.

``python tests/crash_watch.py PID`` is the watcher; nothing else calls it.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

RAY_SESSIONS = Path("/tmp/ray")
# a Ray log line of level E, F or C ("[2026-11-29 02:31:00,123 E 1234 1234] ..."), or an exit
RAY_ERROR = re.compile(r"^\[[0-9-]+ [0-9:,]+ [EFC] [0-9]+ [0-9]+\]|[Ee]xit(ing)? ")
RAY_NOISE = ("constructor arguments in the object store", "[state-dump]")


# --- the plugin (in the pytest process) -------------------------------------------------------
_pipe: IO[str] | None = None


def _say(line: str) -> None:
    global _pipe
    if _pipe is None:
        return
    try:
        _pipe.write(line + "\n")
        _pipe.flush()
    except (BrokenPipeError, ValueError, OSError):
        _pipe = None  # the watcher is gone: the run goes on unwatched


def pytest_configure(config) -> None:
    global _pipe
    if _pipe is not None or hasattr(config, "workerinput"):  # once per run, in the controlling process
        return
    watcher = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,  # its report goes to stderr, the run's (capture is off at configure)
        text=True,
        start_new_session=True,  # a Ctrl-C to the terminal's process group does not reach it
    )
    _pipe = watcher.stdin


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _say(f"start {nodeid}")
    # the Python threads alive as it starts: a native crash is often another thread's
    _say("threads " + ", ".join(sorted(t.name for t in threading.enumerate())))


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _say(f"end {nodeid}")


def pytest_terminal_summary(terminalreporter: object) -> None:
    _say("summary")


def pytest_unconfigure(config) -> None:
    global _pipe
    _say("exit")
    if _pipe is not None:
        _pipe.close()
        _pipe = None


# --- the watcher (its own process) ------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ray_errors(pid: int, sessions: int = 3, lines: int = 5) -> list[str]:
    """The last error and exit lines of the driver and raylet logs of the newest Ray sessions the
    test process ``pid`` started (Ray names a session after its driver's pid)."""
    out: list[str] = []
    for session in sorted(RAY_SESSIONS.glob(f"session_2*_{pid}"), reverse=True)[:sessions]:
        out.append(str(session))
        logs = [*sorted((session / "logs").glob("python-core-driver-*.log")), session / "logs" / "raylet.out"]
        for log in logs:
            try:
                text = log.read_text(errors="replace").splitlines()
            except OSError:
                continue
            hits = [line[:400] for line in text if RAY_ERROR.search(line) and not any(n in line for n in RAY_NOISE)]
            out.extend(f"  {log.name}: {line}" for line in hits[-lines:])
    return out


def report(last: str | None, ended: bool, summary: bool, threads: str = "", pid: int = 0) -> str:
    """What the watcher writes when the test process died before ``exit``."""
    if summary:
        where = "after pytest's summary, on its way out"
    elif last is None:
        where = "before its first test started"
    elif ended:
        where = f"after {last} ended, before the next test started"
    else:
        where = f"in {last} (its setup, call or teardown; the last test's teardown ends the session's fixtures)"
    # on a line of its own: pytest's progress dots may be mid-line
    lines = [f"\n--- hetmm tests: the test process died {where}, without pytest's exit"]
    if threads:
        lines.append(f"--- its Python threads when that test started: {threads}")
    ray = _ray_errors(pid)
    if ray:
        lines.append("--- errors and exits in the newest Ray sessions' driver and raylet logs:")
        lines.extend(ray)
    return "\n".join(lines) + "\n"


def watch(pid: int, stream: IO[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    last, ended, summary, threads = None, False, False, ""
    fd = stream.fileno()
    buffered = ""
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            if _alive(pid):
                continue
            chunk = ""  # gone while a child it forked still holds the pipe: as good as closed
        else:
            chunk = os.read(fd, 65536).decode(errors="replace")
        if chunk:
            buffered += chunk
            *complete, buffered = buffered.split("\n")
            for line in complete:
                kind, _, rest = line.partition(" ")
                if kind == "start":
                    last, ended = rest, False
                elif kind == "threads":
                    threads = rest
                elif kind == "end":
                    ended = True
                elif kind == "summary":
                    summary = True
                elif kind == "exit":
                    return 0
            continue
        sys.stderr.write(report(last, ended, summary, threads, pid))
        sys.stderr.flush()
        return 1


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1]), sys.stdin))
