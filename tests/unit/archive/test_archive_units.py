"""hetmm_ray/archive without Ray: what a SOURCE lists, what DEST holds, the endpoint rules, the peak."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hetmm_ray.archive import ArchiveError, FsSpec
from hetmm_ray.archive.listing import done_paths, iter_source
from hetmm_ray.archive.locations import read_bytes, write_atomic
from hetmm_ray.archive.stages import actor_threads, part_name, peak_of
from hetmm_ray.data.decode import ImageError


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "b" / "deep").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    for rel in ("a.png", "b/c.jpg", "b/deep/d.txt", ".e.png", ".hidden/f.png"):
        (tmp_path / rel).write_bytes(b"x" * 3)
    return tmp_path


def test_a_folder_lists_every_regular_file_sorted_and_hides_dot_names(tree: Path) -> None:
    listed = list(iter_source(str(tree), FsSpec()))
    assert listed == [(str(tree / r), 3) for r in ("a.png", "b/c.jpg", "b/deep/d.txt")]


def test_globs_and_list_files(tree: Path) -> None:
    assert [u for u, _ in iter_source(str(tree / "**" / "*.png"), FsSpec())] == [str(tree / "a.png")]
    lst = tree / "list.txt"
    lst.write_text(f"# comment\n\n{tree / 'a.png'}\n  b/c.jpg  \ns3://bucket/key.png\n")
    uris = [u for u, size in iter_source(str(lst), FsSpec())]
    assert uris == [str(tree / "a.png"), str(Path("b/c.jpg").resolve()), "s3://bucket/key.png"]
    table = pa.table({"n": [1, 2], "uri": [str(tree / "a.png"), "s3://b/k.png"]})
    pq.write_table(table, tree / "list.parquet")
    assert [u for u, _ in iter_source(str(tree / "list.parquet"), FsSpec())] == [str(tree / "a.png"), "s3://b/k.png"]


def test_unknown_schemes_and_missing_sources_are_one_line(tree: Path) -> None:
    with pytest.raises(ArchiveError, match="use a local path or s3://"):
        list(iter_source("gs://bucket/x", FsSpec()))
    with pytest.raises(ArchiveError, match="no such file or folder"):
        list(iter_source(str(tree / "nope"), FsSpec()))
    (tree / "bad.txt").write_text("http://elsewhere/x.png\n")
    with pytest.raises(ArchiveError, match="use a local path or s3://"):
        list(iter_source(str(tree / "bad.txt"), FsSpec()))


def test_reads_check_the_size_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.truncate(1000)
    with pytest.raises(ImageError, match="file too large: 1000 bytes"):
        read_bytes(str(big), -1, FsSpec(), max_bytes=999)
    with pytest.raises(ImageError, match="file too large: 5000 bytes"):  # the listing's size: never opened
        read_bytes(str(tmp_path / "absent.png"), 5000, FsSpec(), max_bytes=999)
    with pytest.raises(ImageError, match="file not found"):
        read_bytes(str(tmp_path / "absent.png"), -1, FsSpec())
    assert read_bytes(str(big), -1, FsSpec()) == b"\0" * 1000


def test_writes_are_atomic_and_done_paths_reads_the_finished_parts(tmp_path: Path) -> None:
    dest = str(tmp_path / "out")
    for paths in (["/x/1.png", "/x/2.png"], ["/x/3.png"]):
        buf = pa.BufferOutputStream()
        pq.write_table(pa.table({"path": paths, "score": [0.5] * len(paths)}), buf)
        write_atomic(dest, part_name(paths), buf.getvalue().to_pybytes(), FsSpec())
    (tmp_path / "out" / ".part-x.parquet.1234.tmp").write_bytes(b"half")  # never read
    assert done_paths(dest, FsSpec()) == {"/x/1.png", "/x/2.png", "/x/3.png"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.endswith(".tmp"))[0].startswith("part-")
    assert part_name(["/x/1.png", "/x/2.png"]) == part_name(["/x/1.png", "/x/2.png"]) != part_name(["/x/1.png"])


def test_endpoint_rules_follow_the_template_store(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert (FsSpec.for_uri("s3://b/p").endpoint_url, FsSpec.for_uri("s3://b/p").region) == (None, "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:9000")
    assert FsSpec.for_uri("s3://b/p").endpoint_url == "http://env:9000"  # boto3's chain
    assert FsSpec.for_uri("s3://b/p?endpoint=http://uri:9000").endpoint_url == "http://uri:9000"
    assert FsSpec.for_uri("s3://b/p?endpoint=http://uri:9000", "http://flag:9000").endpoint_url == "http://flag:9000"
    assert FsSpec.for_uri("/local/folder").endpoint_url is None


def test_the_peak_is_in_source_pixels_and_inside_the_region() -> None:
    amap = np.zeros((4, 8), np.float32)
    amap[1, 6] = 3.0
    amap[3, 0] = 9.0
    assert peak_of(amap, None, 800, 400) == (50, 350, 9.0)
    region = np.zeros((4, 8), bool)
    region[:2] = True
    assert peak_of(amap, region, 800, 400) == (650, 150, 3.0)


def test_actor_threads_cover_the_node_while_one_cpu_stays_reserved_for_the_tasks() -> None:
    # alone on a 2-CPU node (the default pool: (2 - 1) // 1 = 1 actor) it runs 2 threads, reserving 1
    assert actor_threads(2, 1.0) == 2
    assert actor_threads(1, 1.0) == 1
    assert actor_threads(3, 1.0) == 1  # 2 actors on 3 CPUs
    assert actor_threads(16, 1.0) == 1  # 15 actors
    assert actor_threads(16, 4.0) == 5  # 3 actors
    assert actor_threads(8, 0.5) == 1  # 14 actors: never fewer than one thread
    assert actor_threads(4, 3.5) == 4  # never fewer than the reservation


def test_inspect_takes_source_or_a_record_range_not_both(tmp_path: Path, capsys) -> None:
    """``hetmm inspect``: SOURCE and ``--since/--until`` exclude each other, one is required, and a
    bad time is a clear error; all before any store read or Ray start."""
    from hetmm_ray.cli import main

    base = ["inspect", "--product", "p", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "out")]
    for extra, word in (
        ([str(tmp_path), "--since", "0"], "not both"),
        ([], "--since/--until"),
        (["--since", "yesterday"], "ISO 8601"),
    ):
        capsys.readouterr()
        assert main(base + extra) == 2
        assert word in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_ray_datas_console_keeps_its_warnings_and_drops_its_info(capfd: pytest.CaptureFixture[str]) -> None:
    """``hetmm inspect`` draws its own progress bar: Ray Data's INFO lines (a dataset's start, plan and
    end) and its notice that its bars are off stay out of the console; its warnings still print."""
    import logging

    import ray.data  # noqa: F401 - configures Ray Data's loggers and console handler

    from hetmm_ray.archive.job import _QuietDataConsole, quiet_data_console

    executor = logging.getLogger("ray.data._internal.execution.streaming_executor")
    executor.info("Starting execution of Dataset before")
    assert "Starting execution of Dataset before" in capfd.readouterr().err  # the control: it printed
    quiet_data_console()
    quiet_data_console()  # once is enough: no second filter
    executor.info("Starting execution of Dataset after")
    logging.getLogger("ray.data").warning("Progress bars disabled. To enable, set ...")
    executor.warning("a placement warning")
    err = capfd.readouterr().err
    assert "Dataset after" not in err and "Progress bars disabled" not in err
    assert "a placement warning" in err
    consoles = [h for h in logging.getLogger("ray.data").handlers if isinstance(h, logging.StreamHandler)]
    ours = [[f for f in h.filters if isinstance(f, _QuietDataConsole)] for h in consoles]
    assert consoles and all(len(f) == 1 for f in ours), ours
