"""tests/crash_watch.py: a test process that dies says which test it died in. Each case
runs a small pytest session in a subprocess with the plugin, as ``make test`` runs the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

CASES = """
import ctypes
import os


def test_passes():
    assert True


def test_segfaults():
    ctypes.string_at(0)  # a read of address 0: SIGSEGV, as a native library's bug would


def test_exits_from_native_code():
    os._exit(1)  # as Ray's driver ends a process from C++: no exception, no summary


def test_after():
    assert True
"""


def _session(tmp_path: Path, *select: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    args = [f"test_cases.py::{name}" for name in select]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "crash_watch", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", ["test_segfaults", "test_exits_from_native_code"])
def test_a_dying_test_process_names_the_test(tmp_path, name):
    out = _session(tmp_path, "test_passes", name, "test_after")
    assert out.returncode != 0
    assert "passed" not in out.stdout.splitlines()[-1]  # no summary: the process died
    assert f"the test process died in test_cases.py::{name} " in out.stderr, out.stderr


def test_a_run_that_ends_normally_reports_nothing(tmp_path):
    out = _session(tmp_path, "test_passes", "test_after")
    assert out.returncode == 0 and "2 passed" in out.stdout
    assert "died" not in out.stderr


def test_the_report_says_where_outside_a_test():
    from crash_watch import report

    assert "before its first test started" in report(None, False, False)
    assert "after a.py::t ended" in report("a.py::t", True, False)
    assert "after pytest's summary" in report("a.py::t", True, True)
