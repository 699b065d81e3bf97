"""A restarted ``hetmm inspect`` with the same DEST writes only what is missing: every file once.

Two honest interruptions: a first run over a subset of the archive (a list file), then the whole
folder; and a ``hetmm inspect`` process interrupted with SIGINT once some parts exist, then run again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from archive_helpers import PRODUCT, read_rows, write_bad_files, write_images
from helpers import REPO

from hetmm_ray.archive import JobOptions, inspect_archive
from hetmm_ray.archive.listing import part_files
from hetmm_ray.archive.locations import FsSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_run_over_a_subset_then_the_whole_folder_scores_each_file_once(
    gear_store: str, tmp_path: Path, local_ray
) -> None:
    images = write_images(tmp_path / "in", 16)
    write_bad_files(tmp_path / "in", huge=False)
    first = sorted(images)[:6]
    listing = tmp_path / "first.txt"
    listing.write_text("# the first six\n" + "".join(f"{tmp_path / 'in' / n}\n" for n in first) + "\n")
    dest = str(tmp_path / "out")
    opts = JobOptions(store=gear_store, batch_size=4)
    one = inspect_archive(str(listing), PRODUCT, dest, opts)
    assert (one.listed, one.written, one.skipped) == (6, 6, 0)
    before = {r["path"]: r["score"] for r in read_rows(dest)}
    two = inspect_archive(str(tmp_path / "in"), PRODUCT, dest, opts)
    total = 16 + 4
    assert (two.skipped, two.written) == (6, total - 6)
    rows = read_rows(dest)
    paths = Counter(r["path"] for r in rows)
    assert len(paths) == total and max(paths.values()) == 1
    assert {p: s for p, s in ((r["path"], r["score"]) for r in rows) if p in before} == before  # not redone
    three = inspect_archive(str(tmp_path / "in"), PRODUCT, dest, opts)
    assert (three.skipped, three.written) == (total, 0)


def _rows_on_disk(dest: Path) -> int:
    import pyarrow.parquet as pq

    n = 0
    for p in part_files(str(dest), FsSpec()):
        try:
            n += pq.ParquetFile(p).metadata.num_rows
        except OSError:  # renamed away by nothing: parts are final once named; keep counting the others
            pass
    return n


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def test_sigint_midway_then_restart_completes_without_duplicates(gear_store: str, tmp_path: Path) -> None:
    n = 40
    write_images(tmp_path / "in", n)
    dest = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "hetmm_ray.cli", "inspect", str(tmp_path / "in"), "--product", PRODUCT]
    argv += [
        "--out",
        str(dest),
        "--store",
        gear_store,
        "--batch-size",
        "1",
        "--block-size",
        "2",
        "--concurrency",
        "1,1",
    ]
    # SIGINT's default restored in the job: under a shell that started this run in the background,
    # SIGINT is inherited as ignored and Python keeps it so (the Ctrl-C below would do nothing)
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for(lambda: _rows_on_disk(dest) > 0 or proc.poll() is not None, 300, "the first part")
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:] if proc.stdout else ""
        proc.send_signal(signal.SIGINT)
        _wait_for(lambda: proc.poll() is not None, 180, "hetmm inspect to stop on SIGINT")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what this test started
            proc.wait()
    output = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.returncode == 130, output[-2000:]  # "hetmm: interrupted"
    done = _rows_on_disk(dest)
    assert 0 < done < n, f"{done} of {n} rows written before SIGINT: not an interruption half-way"
    (dest / ".part-stale.parquet.0000.tmp").write_bytes(b"half a part")  # as a killed writer leaves it
    rest = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert rest.returncode == 0, rest.stdout[-2000:] + rest.stderr[-2000:]
    assert f"{done} already done" in rest.stdout
    paths = Counter(r["path"] for r in read_rows(str(dest)))
    assert len(paths) == n and max(paths.values()) == 1
    assert not list(dest.glob(".part-*.tmp"))
