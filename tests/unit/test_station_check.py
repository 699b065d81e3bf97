"""``hetmm station check``: a line file's problems, one line each, found without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hetmm_ray.cli import main
from hetmm_ray.config import ConfigError
from hetmm_ray.config.station import SINK_KINDS, SOURCE_KINDS, FolderSource, LogSink, MqttSink
from hetmm_ray.station import line_problems, load_line

GOOD = {
    "line": "press-3",
    "service": {"grpc": "127.0.0.1:50051"},
    "stations": [
        {
            "name": "station-1",
            "product": "bottle",
            "source": {"kind": "folder", "path": "in", "after": "move", "move_to": "done"},
            "deadline_ms": 800,
            "sinks": [
                {"kind": "mqtt", "broker": "127.0.0.1:1883", "topic": "line/press-3/station-1"},
                {"kind": "log", "path": "station-1.csv"},
            ],
        },
        {
            "name": "station-2",
            "product": "cap",
            "version": 4,
            "source": {"kind": "aravis", "camera": "Aravis-Fake-GV01", "pixel_format": "BayerRG8"},
            "service": {"in_process": "./store"},
            "sinks": [{"kind": "opcua"}, {"kind": "webhook", "url": "http://127.0.0.1:9000/parts"}],
        },
    ],
}


def write(tmp_path: Path, data: object, name: str = "line.yaml") -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "done").mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_valid_line_loads_with_every_section_built(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, GOOD)
    assert line_problems(path) == []
    line = load_line(path)
    assert line.name == "press-3" and [s.head.name for s in line.stations] == ["station-1", "station-2"]
    one, two = line.stations
    assert isinstance(one.source, FolderSource) and one.source.after == "move" and one.head.deadline_ms == 800
    assert [type(s) for s in one.sinks] == [MqttSink, LogSink] and one.sinks[0].qos == 1  # QoS 1 by default
    assert one.service.grpc == "127.0.0.1:50051"  # the line's service
    assert two.service.in_process == "./store" and two.head.version == 4  # its own, and a pinned version
    assert main(["station", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 station(s), no problem found" in out and "station-2: aravis -> cap v4" in out


def test_every_problem_is_one_line_naming_where_it_is(tmp_path: Path, capsys) -> None:
    bad = yaml.safe_load(yaml.safe_dump(GOOD))
    bad["colour"] = "red"  # unknown at the top
    one, two = bad["stations"]
    one["source"]["move_to"] = "nowhere"  # a folder that does not exist
    one["sinks"][1] = {"kind": "webhok", "url": "http://x"}  # a misspelt kind
    two["version"] = 0
    two["product"] = "bad name!"
    two["source"]["pixel_format"] = "Mono12"
    two["service"] = {"grpc": "a:1", "http": "http://b"}
    two["queue"] = {"max_parts": 0}
    two["sinks"].append({"kind": "opcua", "endpoint": "tcp://x"})
    bad["stations"].append({"name": "station-1", "product": "p", "source": {"kind": "mqtt", "topic": "t"}, "sinks": []})
    path = write(tmp_path, bad)
    problems = line_problems(path)
    expected = [
        ("colour", "unknown setting"),
        ("stations[0] 'station-1' sinks[1]", "did you mean 'webhook'"),
        ("stations[1] 'station-2'", "version: must be an integer"),
        ("stations[1] 'station-2'", "invalid product name 'bad name!'"),
        ("stations[1] 'station-2' source", "did you mean 'Mono16'"),
        ("stations[1] 'station-2' sinks[2]", "endpoint: must be opc.tcp://"),
        ("stations[1] 'station-2' service", "exactly one of grpc, http or in_process (got grpc, http)"),
        ("stations[1] 'station-2' queue", "max_parts: must be an integer in [1"),
        ("stations[2] 'station-1'", "sinks: give a list of at least one sink"),
        ("station 'station-1'", "name: 2 stations of this line have it"),
    ]
    for where, text in expected:
        assert sum(p.startswith(where + ":") and text in p for p in problems) == 1, (where, text, problems)
    assert len(problems) == len(expected), problems
    assert all("\n" not in p for p in problems)
    assert main(["station", "check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(expected) + 1 and err[-1].endswith(f"{len(expected)} problem(s)")
    with pytest.raises(ConfigError, match=r"10 problem\(s\)"):
        load_line(path)


def test_folders_queues_and_topics_are_checked_across_stations(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["stations"][0]["source"]["path"] = "missing"
    twin = {**data["stations"][0], "name": "station-3", "source": {"kind": "folder", "path": "in"}}
    data["stations"].append(twin)  # the same MQTT topic on the same broker
    data["stations"][1]["queue"] = {"path": ".hetmm-queue/station-1"}  # station-1's default queue folder
    problems = line_problems(write(tmp_path, data))
    assert any("station 'station-1' source: path: no such folder" in p and "missing" in p for p in problems), problems
    assert any("is also station 'station-1''s queue" in p for p in problems), problems
    assert any("topic 'line/press-3/station-1' on 127.0.0.1:1883 is station 'station-1''s too" in p for p in problems)
    assert len(problems) == 3, problems


def test_a_station_without_any_service_is_named(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    del data["service"]
    problems = line_problems(write(tmp_path, data))
    assert problems == ["stations[0] 'station-1': service: none here and none for the line (grpc, http or in_process)"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stations: [\n  {name: a\n", "line 3, column 1: not valid YAML"),
        ("- a\n- b\n", "file: expected a mapping with line, service, console, stations, got list"),
    ],
)
def test_a_file_that_is_not_a_line_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    problems = line_problems(write(tmp_path, text))
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    assert line_problems(tmp_path / "absent.yaml") == ["file: No such file or directory"]


def test_every_kind_builds_from_its_defaults_and_its_required_fields() -> None:
    required = {
        "folder": {"path": "in"},
        "mqtt": {"topic": "a/b"},
        "webhook": {"url": "http://h/p"},
        "log": {"path": "x.csv"},
    }
    for kinds in (SOURCE_KINDS, SINK_KINDS):
        for kind, cls in kinds.items():
            built = cls.from_dict({"kind": kind, **required.get(kind, {})})
            assert built.kind == kind
            with pytest.raises(ConfigError, match="unknown setting"):
                cls.from_dict({"kind": kind, **required.get(kind, {}), "colour": 1})


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ({"trigger": "mqtt"}, "topic: needed exactly when trigger is 'mqtt'"),
        ({"topic": "line/t"}, "topic: needed exactly when trigger is 'mqtt'"),
        ({"trigger": "hardware", "rate_hz": 5}, "rate_hz: only with trigger 'software', not 'hardware'"),
    ],
)
def test_a_cameras_trigger_settings_go_together(tmp_path: Path, source: dict, says: str) -> None:
    bad = yaml.safe_load(yaml.safe_dump(GOOD))
    bad["stations"][1]["source"] = {"kind": "aravis", **source}
    problems = line_problems(write(tmp_path, bad))
    assert len(problems) == 1 and problems[0].startswith("stations[1] 'station-2' source:") and says in problems[0]
    ok = yaml.safe_load(yaml.safe_dump(GOOD))
    ok["stations"][1]["source"] = {"kind": "aravis", "trigger": "mqtt", "topic": "line/t/#", "broker": "10.0.0.5:1883"}
    assert line_problems(write(tmp_path, ok)) == []


def test_the_console_is_the_lines_http_service_unless_given(tmp_path: Path) -> None:
    assert load_line(write(tmp_path, GOOD)).console is None  # a gRPC line reports nowhere unless told
    http = {**GOOD, "service": {"http": "http://10.0.0.5:8000"}}
    console = load_line(write(tmp_path, http)).console
    assert console is not None and console.url == "http://10.0.0.5:8000" and console.every_s == 2.0
    given = {**GOOD, "console": {"url": "http://10.0.0.5:8000", "every_s": 5, "token_env": "HETMM_TOKEN"}}
    console = load_line(write(tmp_path, given)).console
    assert console is not None and console.every_s == 5 and console.token_env == "HETMM_TOKEN"
    bad = {**GOOD, "console": {"url": "ftp://x", "every_s": 0.1, "colour": 1}}
    problems = line_problems(write(tmp_path, bad))
    assert [p for p in problems if p.startswith("console")], problems
    assert any("url" in p for p in problems) and any("every_s" in p for p in problems), problems
    assert any("colour" in p for p in problems), problems
