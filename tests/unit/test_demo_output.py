"""`hetmm demo` run twice: its folder is emptied of the last run's store, never a folder it did not make.

A second `make demo` failed with ``unexpected HTTPStatusError: 409 Conflict``: the store left by the
first run already held the product the demo creates (``demo.fresh_output``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetmm_ray.config import ConfigError
from hetmm_ray.demo import MARKER, RUN_FOLDERS, fresh_output


def _last_run(out: Path) -> None:
    for name in RUN_FOLDERS:
        (out / name / "deep").mkdir(parents=True)
        (out / name / "deep" / "file.bin").write_bytes(b"x")


def test_a_new_folder_is_made_and_marked(tmp_path: Path) -> None:
    out = tmp_path / "a" / "demo"
    fresh_output(out)
    assert sorted(p.name for p in out.iterdir()) == [MARKER]


def test_the_last_run_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    fresh_output(out)
    _last_run(out)
    fresh_output(out)
    assert sorted(p.name for p in out.iterdir()) == [MARKER]


def test_a_run_from_before_the_marker_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    _last_run(out)  # data, store, heatmaps and nothing else: what the demo wrote before it marked its folder
    fresh_output(out)
    assert sorted(p.name for p in out.iterdir()) == [MARKER]


def test_a_folder_the_demo_did_not_make_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "work"
    _last_run(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"not a folder the demo made .*notes\.txt"):
        fresh_output(out)
    assert (out / "store" / "deep" / "file.bin").read_bytes() == b"x"  # nothing was deleted
    assert not (out / MARKER).exists()


def test_a_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    out.write_text("a file")
    with pytest.raises(ConfigError, match="not a folder"):
        fresh_output(out)
    assert out.read_text() == "a file"
