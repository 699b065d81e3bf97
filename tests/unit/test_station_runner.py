"""A station in one process: a watched folder, the product scored in process,
results to a CSV log; complete files only, the deadline, a hot update seen by the next part."""

from __future__ import annotations

import csv
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from helpers import TINY_CONFIG, png

from hetmm_ray.config import ConfigError, DetectorConfig
from hetmm_ray.config.station import FolderSource
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.station import load_line
from hetmm_ray.station.runner import InProcessService, Scored, ServiceUnavailable, build_station
from hetmm_ray.station.sources import FolderFrames
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations


@pytest.fixture(scope="module")
def part() -> SyntheticProduct:
    return SyntheticProduct(seed=3, size=64)


def line_file(tmp_path: Path, **station: object) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "done").mkdir(exist_ok=True)
    data = {
        "service": {"in_process": "store"},
        "stations": [
            {
                "name": "s1",
                "product": "p",
                "source": {"kind": "folder", "path": "in", "after": "move", "move_to": "done", "settle_ms": 0},
                "sinks": [{"kind": "log", "path": "s1.csv"}],
                "deadline_ms": 600_000,  # a loaded machine's first part loads its model: no timeout row
                **station,
            }
        ],
    }
    path = tmp_path / "line.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fit(tmp_path: Path, part: SyntheticProduct) -> Any:
    store = open_store(tmp_path / "store")
    operations.fit(store, "p", DetectorConfig.from_dict(TINY_CONFIG), [part.good(i) for i in range(4)])
    return store


def wait_for(runner, n: int, bound_s: float = 120) -> None:
    end = time.monotonic() + bound_s
    while sum(runner.counts.values()) < n:
        runner.step()
        assert time.monotonic() < end, f"{sum(runner.counts.values())} of {n} results in {bound_s} s"
        time.sleep(0.02)


def rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_folder_station_scores_each_new_file_once_as_the_detector_does(tmp_path: Path, part) -> None:
    store = fit(tmp_path, part)
    line = load_line(line_file(tmp_path))
    runner = build_station(line.stations[0], tmp_path)
    frames = [part.good(10), part.defective(11, "scratch")[0], part.good(12)]
    for i, frame in enumerate(frames):
        (tmp_path / "in" / f"part-{i}.png").write_bytes(png(frame))
    wait_for(runner, 3)
    logged = rows(tmp_path / "s1.csv")
    assert [r["part_id"] for r in logged] == ["part-0", "part-1", "part-2"]  # name order, once each
    detector = load_detector(store, "p")
    expected = [detector.predict([png(f)]) for f in frames]  # one frame per call, as the station scores
    for r, p in zip(logged, expected, strict=True):
        score, flagged = float(p.scores[0]), bool(p.is_anomaly[0])
        # The same process and batch size: equal but for the CSV's float text (a batch of three
        # would differ by ~1e-6: the backbone's kernels depend on the batch).
        assert float(r["score"]) == pytest.approx(score, rel=1e-9)
        assert r["verdict"] == ("reject" if flagged else "ok") and r["version"] == "1" and r["late"] == "False"
        assert (r["status"], r["is_anomaly"], r["record_version"]) == ("scored", str(flagged), "1"), r
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == ["part-0.png", "part-1.png", "part-2.png"]
    assert not list((tmp_path / "in").iterdir())

    # A hot update: the next part is scored on the new version, with no restart.
    operations.update(store, "p", [part.good(i) for i in range(4, 7)])
    (tmp_path / "in" / "part-0.png").write_bytes(png(frames[0]))  # the same name again: moved aside, not lost
    wait_for(runner, 4)
    assert rows(tmp_path / "s1.csv")[-1]["version"] == "2"
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == [
        "part-0.1.png",
        "part-0.png",
        "part-1.png",
        "part-2.png",
    ]
    runner.close()


def test_a_file_still_being_written_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    now = [0.0]
    frames = FolderFrames(FolderSource(path="in", settle_ms=500), tmp_path, clock=lambda: now[0])
    (tmp_path / "in" / "old.png").write_bytes(b"x")
    frames = FolderFrames(
        FolderSource(path="in", settle_ms=500), tmp_path, clock=lambda: now[0]
    )  # keep: old is history
    path = tmp_path / "in" / "a.png"
    path.write_bytes(b"half")
    assert frames.poll() == []  # first seen
    now[0] = 0.4
    assert frames.poll() == []  # not settled yet
    with path.open("ab") as f:  # still being written
        f.write(b" more")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    now[0] = 0.8
    assert frames.poll() == []  # changed: its clock starts again
    now[0] = 1.4
    (ready,) = frames.poll()
    assert ready.token == path and ready.name == "a" and frames.read(ready) == b"half more"
    now[0] = 5.0
    assert frames.poll() == []  # once only
    frames.done(ready)
    assert path.exists()  # after: keep


class SlowService:
    """The in-process service with a delay before each part (a service that answers after the deadline)."""

    def __init__(self, inner: InProcessService, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def score(self, frame: bytes) -> Scored:
        time.sleep(self.delay_s)
        return self.inner.score(frame)


def test_a_part_past_its_deadline_is_published_as_timeout_then_its_result_follows(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    line = load_line(line_file(tmp_path, deadline_ms=50))
    runner = build_station(line.stations[0], tmp_path)
    runner.service = SlowService(runner.service, delay_s=0.5)
    (tmp_path / "in" / "late.png").write_bytes(png(part.good(20)))
    wait_for(runner, 2)
    first, second = rows(tmp_path / "s1.csv")
    assert (first["part_id"], first["status"], first["verdict"], first["score"]) == ("late", "timeout", "", "")
    assert 50 <= float(first["latency_ms"]) < float(second["latency_ms"])
    assert (
        second["verdict"] in ("ok", "review", "reject")
        and second["late"] == "True"
        and float(second["latency_ms"]) >= 500
    )
    runner.close()


def test_a_frame_the_service_cannot_score_is_an_error_result_and_the_station_goes_on(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    runner = build_station(load_line(line_file(tmp_path)).stations[0], tmp_path)
    (tmp_path / "in" / "a-broken.png").write_bytes(b"not an image")
    (tmp_path / "in" / "b-good.png").write_bytes(png(part.good(21)))
    wait_for(runner, 2)
    broken, good = rows(tmp_path / "s1.csv")
    assert broken["status"] == "error" and broken["error"] and good["verdict"] in ("ok", "review", "reject")
    runner.close()


@pytest.mark.parametrize(
    ("station", "message"),
    [
        ({"source": {"kind": "mqtt", "topic": "t", "payload": "none"}}, "payload none needs a camera"),
        ({"sinks": [{"kind": "log", "path": "x.parquet"}]}, "parquet logs are not built yet"),
    ],
)
def test_kinds_not_built_yet_are_refused_before_anything_starts(tmp_path: Path, station: dict, message: str) -> None:
    line = load_line(line_file(tmp_path, **station))
    with pytest.raises(ConfigError, match=message):
        build_station(line.stations[0], tmp_path)


def test_station_run_stops_on_sigterm_and_counts_its_parts(tmp_path: Path, part) -> None:
    """``hetmm station run`` as a line PC runs it: its own process, stopped by SIGTERM."""
    import signal
    import subprocess
    import sys

    fit(tmp_path, part)
    path = line_file(tmp_path)
    (tmp_path / "in" / "one.png").write_bytes(png(part.good(30)))
    log = tmp_path / "s1.csv"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "hetmm_ray.cli", "station", "run", str(path)]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        end = time.monotonic() + 300
        while time.monotonic() < end and proc.poll() is None and not (log.exists() and rows(log)):
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "s1 one: " in out and any(f"s1: 1 {v}" in out for v in ("ok", "review", "reject")), out
    assert np.isfinite(float(rows(log)[0]["score"]))


class OutageService:
    """The in-process service behind a switch: while ``down`` is set it is away (a stopped service)."""

    def __init__(self, inner: InProcessService) -> None:
        self.inner, self.down = inner, threading.Event()

    def score(self, frame: bytes) -> Scored:
        if self.down.is_set():
            raise ServiceUnavailable("connection refused")
        return self.inner.score(frame)


def test_parts_wait_on_disk_while_the_service_is_away_and_are_scored_late_in_order(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    line = load_line(line_file(tmp_path, queue={"max_parts": 3}))
    runner = build_station(line.stations[0], tmp_path)
    runner.service = service = OutageService(runner.service)
    service.down.set()
    for name in ("q1", "q2", "q3", "q4"):
        (tmp_path / "in" / f"{name}.png").write_bytes(png(part.good(50 + int(name[1]))))
    wait_for(runner, 4)
    logged = rows(tmp_path / "s1.csv")
    assert [(r["part_id"], r["status"]) for r in logged[:3]] == [
        ("q1", "timeout"),
        ("q2", "timeout"),
        ("q3", "timeout"),
    ]
    assert logged[3]["part_id"] == "q4" and logged[3]["status"] == "error" and "queue.max_parts" in logged[3]["error"]
    assert len(runner.queue) == 3 and len(list(runner.queue.folder.glob("*.json"))) == 3
    assert (tmp_path / "in" / "q4.png").exists()  # refused: its file stays
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == ["q1.png", "q2.png", "q3.png"]  # safe on disk

    # A restart (a new runner on the same folder and queue: what a killed station finds), then the service is back.
    runner.close()
    again = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path)
    assert len(again.queue) == 3
    end = time.monotonic() + 120
    while len(again.queue) or sum(again.counts.values()) < 4:
        again.step()
        assert time.monotonic() < end, "the queue did not drain"
        time.sleep(0.02)
    late = rows(tmp_path / "s1.csv")[4:]
    assert [(r["part_id"], r["verdict"] in ("ok", "review", "reject"), r["late"]) for r in late] == [
        ("q1", True, "True"),
        ("q2", True, "True"),
        ("q3", True, "True"),
        ("q4", True, "False"),  # the refused part's file stayed: the new start scores it, on time
    ]
    assert not list(again.queue.folder.iterdir())
    again.close()


def test_a_part_cut_off_mid_write_is_not_in_the_queue(tmp_path: Path) -> None:
    from hetmm_ray.station.part_queue import PartQueue

    q = PartQueue(tmp_path / "q", max_parts=10)
    q.put("a", b"frame-a", "/in/a.png", 1.0)
    (tmp_path / "q" / "000000000002.frame").write_bytes(b"half")  # killed before its .json
    (tmp_path / "q" / "000000000003.json.tmp").write_bytes(b"{")
    again = PartQueue(tmp_path / "q", max_parts=10)
    assert len(again) == 1 and again.head().frame == b"frame-a" and again.head().part_id == "a"
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["000000000001.frame", "000000000001.json"]
    assert again.put("b", b"frame-b", "/in/b.png", 2.0) == 2  # after the last whole part
    again.pop()
    assert again.head().part_id == "b"


def test_metrics_say_parts_queue_latency_and_state_over_http(tmp_path: Path, part) -> None:
    import httpx
    from helpers import free_port
    from prometheus_client.parser import text_string_to_metric_families

    from hetmm_ray.station.metrics import StationMetrics

    fit(tmp_path, part)
    runner = build_station(load_line(line_file(tmp_path)).stations[0], tmp_path)
    runner.service = service = OutageService(runner.service)
    metrics = StationMetrics()
    port = free_port()
    server = metrics.serve(port)
    runner.metrics = metrics

    def scrape() -> dict[tuple[str, tuple], float]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    try:
        service.down.set()
        (tmp_path / "in" / "m1.png").write_bytes(png(part.good(70)))
        wait_for(runner, 1)
        seen = scrape()
        timeouts = ("hetmm_station_parts_total", (("station", "s1"), ("status", "timeout"), ("verdict", "")))
        assert seen[timeouts] == 1
        assert seen[("hetmm_station_queue_depth", (("station", "s1"),))] == 1
        assert seen[("hetmm_station_state", (("state", "degraded"), ("station", "s1")))] == 1
        assert seen[("hetmm_station_state", (("state", "ok"), ("station", "s1")))] == 0
        service.down.clear()
        runner._retry_at = 0.0  # the service is back: ask now, not after RETRY_S
        wait_for(runner, 2)
        seen = scrape()
        scored = sum(
            seen.get(("hetmm_station_parts_total", (("station", "s1"), ("status", "scored"), ("verdict", v))), 0)
            for v in ("ok", "review", "reject")
        )
        assert scored == 1 and seen[("hetmm_station_queue_depth", (("station", "s1"),))] == 0
        assert seen[("hetmm_station_state", (("state", "ok"), ("station", "s1")))] == 1
        assert seen[("hetmm_station_latency_seconds_count", (("station", "s1"),))] == 1
        runner.close()
        assert scrape()[("hetmm_station_state", (("state", "offline"), ("station", "s1")))] == 1
    finally:
        server.shutdown()


def test_a_raw_frame_waits_in_the_queue_as_pixels_and_comes_back_the_same(tmp_path: Path) -> None:
    from hetmm_ray.data.raw_frame import raw_frame_of
    from hetmm_ray.station.part_queue import PartQueue

    frame = raw_frame_of(np.arange(16 * 24, dtype=np.uint16).reshape(16, 24) * 97)
    q = PartQueue(tmp_path / "q", max_parts=10)
    q.put("cam-1", frame, "camera:cam0#17", 5.0)
    q.put("file-2", b"\x89PNG...", "/in/2.png", 6.0)
    again = PartQueue(tmp_path / "q", max_parts=10)  # as a restarted station finds it
    assert again.head().frame == frame and again.head().frame_ref == "camera:cam0#17"
    assert (tmp_path / "q" / "000000000001.frame").read_bytes() == frame.pixels  # pixels, not encoded
    again.pop()
    assert again.head().frame == b"\x89PNG..."


def test_a_grpc_service_that_is_not_there_is_away_so_the_part_waits(tmp_path: Path, part) -> None:
    from helpers import free_port

    from hetmm_ray.data.raw_frame import raw_frame_of
    from hetmm_ray.station.runner import GrpcService

    service = GrpcService(f"127.0.0.1:{free_port()}", "p", timeout_s=30)
    for frame in (png(part.good(1)), raw_frame_of(part.good(1))):
        with pytest.raises(ServiceUnavailable, match="gRPC UNAVAILABLE"):
            service.score(frame)
    line = load_line(line_file(tmp_path, service={"grpc": "127.0.0.1:1"}, version=1))
    with pytest.raises(ConfigError, match="the gRPC service scores the product's live version"):
        build_station(line.stations[0], tmp_path)


class StateSink:
    """A sink that shows the station's state (as the MQTT and OPC UA sinks do), recording each."""

    def __init__(self) -> None:
        self.states: list[str] = []

    def publish(self, result: Any) -> None:
        pass

    def show_state(self, state: str) -> None:
        self.states.append(state)

    def close(self) -> None:
        pass


def test_the_sinks_show_degraded_while_parts_wait_then_ok_then_offline(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    runner = build_station(load_line(line_file(tmp_path)).stations[0], tmp_path)
    runner.service = service = OutageService(runner.service)
    runner.sinks.append(sink := StateSink())
    service.down.set()
    (tmp_path / "in" / "w1.png").write_bytes(png(part.good(61)))
    wait_for(runner, 1)  # its timeout is out, the part waits on disk
    assert len(runner.queue) == 1 and sink.states == ["degraded"]
    service.down.clear()
    end = time.monotonic() + 120
    while len(runner.queue):
        runner.step()
        assert time.monotonic() < end, "the queue did not drain"
        time.sleep(0.02)
    assert sink.states == ["degraded", "ok"]  # said once each, when it changed
    runner.close()
    assert sink.states == ["degraded", "ok", "offline"]


# --- a station killed between its steps (nothing lost, nothing twice) ---------------------
def mqtt_line(tmp_path: Path) -> Path:
    """A folder station whose MQTT sink names a broker that is not there: its results wait in the
    sink's on-disk outbox (what a killed station finds at its next start)."""
    from helpers import free_port

    return line_file(
        tmp_path,
        sinks=[{"kind": "log", "path": "s1.csv"}, {"kind": "mqtt", "broker": f"127.0.0.1:{free_port()}", "topic": "t"}],
    )


def outbox_of(runner) -> Any:
    (mqtt,) = [s for s in runner.sinks if hasattr(s, "outbox")]
    return mqtt.outbox


def test_a_station_killed_after_publishing_lets_the_frame_go_at_restart_without_scoring_it_again(
    tmp_path: Path, part, capsys
) -> None:
    fit(tmp_path, part)
    runner = build_station(load_line(mqtt_line(tmp_path)).stations[0], tmp_path)
    runner.source.done = lambda frame: None  # killed after the result went out, before the file was moved
    for name in ("k1", "k2"):
        (tmp_path / "in" / f"{name}.png").write_bytes(png(part.good(60 + int(name[1]))))
    wait_for(runner, 2)
    first = rows(tmp_path / "s1.csv")
    assert [(r["part_id"], r["verdict"] in ("ok", "review", "reject")) for r in first] == [("k1", True), ("k2", True)]
    unsent = outbox_of(runner).unsent()
    assert [json.loads(p.payload)["part_id"] for p in unsent] == ["k1", "k2"]  # on disk until the broker has them
    runner.close()

    again = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path)
    assert [p.seq for p in outbox_of(again).unsent()] == [p.seq for p in unsent]  # sent first at the new start
    (tmp_path / "in" / "k3.png").write_bytes(png(part.good(63)))
    wait_for(again, 1)
    end = time.monotonic() + 60
    while (tmp_path / "in" / "k1.png").exists() or (tmp_path / "in" / "k2.png").exists():
        again.step()
        assert time.monotonic() < end, "the frames handled before the restart were not let go"
        time.sleep(0.02)
    assert [r["part_id"] for r in rows(tmp_path / "s1.csv")] == ["k1", "k2", "k3"]  # none scored twice
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == ["k1.png", "k2.png", "k3.png"]
    assert "handled before the restart" in capsys.readouterr().err
    again.close()


def test_a_station_killed_before_publishing_scores_the_frame_at_restart(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    runner = build_station(load_line(mqtt_line(tmp_path)).stations[0], tmp_path)
    (tmp_path / "in" / "k1.png").write_bytes(png(part.good(61)))
    assert runner.source.poll()  # taken, then killed before it was scored
    runner.close()
    again = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path)
    wait_for(again, 1)
    assert [r["part_id"] for r in rows(tmp_path / "s1.csv")] == ["k1"]
    assert [json.loads(p.payload)["part_id"] for p in outbox_of(again).unsent()] == ["k1"]
    again.close()


def test_a_queued_part_whose_result_was_out_before_a_kill_leaves_the_queue_unscored(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    runner = build_station(load_line(mqtt_line(tmp_path)).stations[0], tmp_path)
    runner.service = service = OutageService(runner.service)
    service.down.set()
    (tmp_path / "in" / "q1.png").write_bytes(png(part.good(51)))
    wait_for(runner, 1)  # its timeout: the part waits in the queue
    assert len(runner.queue) == 1
    service.down.clear()

    class Killed(Exception):
        pass

    def killed() -> None:
        raise Killed

    runner.queue.pop = killed  # killed after its late result went out, before it left the queue
    runner._retry_at = 0.0
    with pytest.raises(Killed):
        runner.drain()
    assert [
        (r["part_id"], r["verdict"] in ("ok", "review", "reject"), r["late"]) for r in rows(tmp_path / "s1.csv")
    ] == [
        ("q1", False, "False"),
        ("q1", True, "True"),
    ]
    runner.close()
    again = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path)
    assert len(again.queue) == 1
    again.step()
    assert len(again.queue) == 0 and len(rows(tmp_path / "s1.csv")) == 2  # dropped, not scored again
    again.close()


def test_the_counter_goes_on_after_a_restart(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    path = line_file(tmp_path, part_id="counter")
    for names in (("a", "b"), ("c",)):
        runner = build_station(load_line(path).stations[0], tmp_path)
        for name in names:
            (tmp_path / "in" / f"{name}.png").write_bytes(png(part.good(70 + ord(name))))
        wait_for(runner, len(names))
        runner.close()
    assert [r["part_id"] for r in rows(tmp_path / "s1.csv")] == ["1", "2", "3"]


def test_files_written_slowly_or_renamed_into_place_are_each_scored_once_whole(tmp_path: Path, part) -> None:
    """A camera PC writing files slowly (in pieces, straight into the folder)
    and others written beside it then renamed into place, while the station runs: every file is
    scored once, and from its whole bytes (its score is the detector's score of the whole image)."""
    store = fit(tmp_path, part)
    runner = build_station(
        load_line(
            line_file(
                tmp_path,
                source={
                    "kind": "folder",
                    "path": "in",
                    "after": "move",
                    "move_to": "done",
                    "settle_ms": 300,
                },
            )
        ).stations[0],
        tmp_path,
    )
    images = {f"w{i}": png(part.good(90 + i)) for i in range(6)}

    def write_slowly() -> None:
        for i, (name, data) in enumerate(images.items()):
            if i % 2:  # beside the folder, then renamed into place: whole at once
                tmp = tmp_path / f"{name}.partial"
                tmp.write_bytes(data)
                tmp.replace(tmp_path / "in" / f"{name}.png")
                continue
            with (tmp_path / "in" / f"{name}.png").open("wb") as f:  # in three pieces, 100 ms apart
                for piece in (
                    data[: len(data) // 3],
                    data[len(data) // 3 : 2 * len(data) // 3],
                    data[2 * len(data) // 3 :],
                ):
                    f.write(piece)
                    f.flush()
                    time.sleep(0.1)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    wait_for(runner, len(images), bound_s=180)
    writer.join()
    logged = rows(tmp_path / "s1.csv")
    assert sorted(r["part_id"] for r in logged) == sorted(images)  # each once
    detector = load_detector(store, "p", 1, progress=False)
    for r in logged:  # one image at a time, as the station scores them (the same batch of one)
        expected = float(detector.predict([images[r["part_id"]]]).scores[0])
        assert r["verdict"] in ("ok", "review", "reject") and float(r["score"]) == pytest.approx(expected, rel=1e-6), r
    runner.close()


def test_an_unknown_product_is_an_error_result_and_the_other_station_goes_on(tmp_path: Path, part) -> None:
    fit(tmp_path, part)
    from helpers import folder_station

    stations = [folder_station(tmp_path, "s-known"), folder_station(tmp_path, "s-unknown", product="no-such-product")]
    (tmp_path / "line.yaml").write_text(yaml.safe_dump({"service": {"in_process": "store"}, "stations": stations}))
    runners = [build_station(st, tmp_path) for st in load_line(tmp_path / "line.yaml").stations]
    for runner in runners:
        (tmp_path / runner.station.head.name / "a.png").write_bytes(png(part.good(30)))
    for runner in runners:
        wait_for(runner, 1)
        runner.close()
    (known,) = rows(tmp_path / "s-known.csv")
    (unknown,) = rows(tmp_path / "s-unknown.csv")
    assert known["verdict"] in ("ok", "review", "reject")
    assert unknown["status"] == "error" and "no-such-product" in unknown["error"], unknown
