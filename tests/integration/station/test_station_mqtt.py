"""The MQTT sink against a real Mosquitto broker the test starts (Debian's ``mosquitto``; ``.ci/run``
installs it): every result as the documented JSON at QoS 1, the retained station state, and every
result delivered after a broker restart.

Without ``mosquitto`` the module skips, except under ``CI=true`` where it fails."""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import TINY_CONFIG, folder_station, png
from mqtt_peers import MOSQUITTO, WAIT_S, Broker, Subscriber

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.station import load_line
from hetmm_ray.station.runner import FIELDS, build_station
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

if MOSQUITTO is None and os.environ.get("CI") != "true":
    pytest.skip("needs Debian's mosquitto (apt-get install mosquitto; .ci/run installs it)", allow_module_level=True)

TOPIC = "line/press-3/s1"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()
    b.log.close()


def test_results_reach_a_subscriber_at_qos1_and_survive_a_broker_restart(tmp_path: Path, broker: Broker) -> None:
    part = SyntheticProduct(seed=3, size=64)
    store = open_store(tmp_path / "store")
    operations.fit(store, "p", DetectorConfig.from_dict(TINY_CONFIG), [part.good(i) for i in range(4)])
    (tmp_path / "in").mkdir()
    line = {
        "line": "press-3",
        "service": {"in_process": "store"},
        "stations": [
            {
                "name": "s1",
                "product": "p",
                "source": {"kind": "folder", "path": "in", "after": "delete", "settle_ms": 0},
                "deadline_ms": 600_000,
                "sinks": [
                    {"kind": "log", "path": "s1.csv"},
                    {"kind": "mqtt", "broker": f"127.0.0.1:{broker.port}", "topic": TOPIC},
                ],
            }
        ],
    }
    (tmp_path / "line.yaml").write_text(yaml.safe_dump(line))
    sub = Subscriber(broker.port, [TOPIC])
    sub.wait(lambda: sub.client.is_connected(), "the subscriber to connect")
    runner = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path, line="press-3")

    def score(names: list[str], total: int) -> None:
        for n in names:
            (tmp_path / "in" / f"{n}.png").write_bytes(png(part.good(40 + len(n))))
        end = time.monotonic() + WAIT_S
        while sum(runner.counts.values()) < total:
            runner.step()
            assert time.monotonic() < end, "the station did not score its parts"
            time.sleep(0.02)

    try:
        score(["a1", "a2", "a3"], 3)
        sub.wait(lambda: len(sub.results()) == 3, "three results")
        with (tmp_path / "s1.csv").open(newline="") as f:
            logged = list(csv.DictReader(f))
        for got, row in zip(sub.results(), logged, strict=True):
            assert tuple(got) == FIELDS  # the documented keys, in order
            assert got["part_id"] == row["part_id"] and got["verdict"] == row["verdict"] in ("ok", "review", "reject")
            assert got["score"] == float(row["score"]) and got["version"] == 1 and got["product"] == "p"

        watcher = Subscriber(broker.port, [f"{TOPIC}/state"], client_id="state-watch", clean=True)
        watcher.wait(lambda: watcher.messages, "the retained state")
        _, payload, retained = watcher.messages[0]
        assert retained and json.loads(payload) == {"station": "s1", "state": "ok"}
        watcher.close()

        broker.stop()  # the broker goes away; the station goes on scoring
        score(["b1", "b2"], 5)
        broker.start()  # the same port and persistence: both sessions come back
        sub.wait(lambda: len(sub.results()) == 5, "every result after the restart")
        assert [r["part_id"] for r in sub.results()] == ["a1", "a2", "a3", "b1", "b2"]  # in order, none twice
    finally:
        runner.close()
    sub.close()
    last = Subscriber(broker.port, [f"{TOPIC}/state"], client_id="state-after", clean=True)
    last.wait(lambda: last.messages, "the retained state after close")
    assert json.loads(last.messages[0][1]) == {"station": "s1", "state": "offline"}
    last.close()


@pytest.mark.parametrize("payload", ["path", "image"])
def test_an_mqtt_trigger_names_the_part_and_brings_its_frame(tmp_path: Path, broker: Broker, payload: str) -> None:
    import paho.mqtt.client as mqtt

    part = SyntheticProduct(seed=3, size=64)
    store = open_store(tmp_path / "store")
    operations.fit(store, "p", DetectorConfig.from_dict(TINY_CONFIG), [part.good(i) for i in range(4)])
    (tmp_path / "frames").mkdir()
    topic = "line/press-3/s1/parts" + ("/+" if payload == "image" else "")
    line = {
        "service": {"in_process": "store"},
        "stations": [
            {
                "name": "s1",
                "product": "p",
                "source": {"kind": "mqtt", "broker": f"127.0.0.1:{broker.port}", "topic": topic, "payload": payload},
                "deadline_ms": 600_000,
                "sinks": [{"kind": "log", "path": "s1.csv"}],
            }
        ],
    }
    (tmp_path / "line.yaml").write_text(yaml.safe_dump(line))
    runner = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path, line="press-3")
    source = runner.source
    end = time.monotonic() + WAIT_S
    assert source.subscribed.wait(WAIT_S), "the trigger source did not subscribe"
    sender = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="plc")
    sender.connect("127.0.0.1", broker.port)
    sender.loop_start()
    frames = {"P-100": png(part.good(80)), "P-101": png(part.good(81))}
    for part_id, data in frames.items():
        if payload == "path":
            (tmp_path / "frames" / f"{part_id}.png").write_bytes(data)
            body = json.dumps({"part_id": part_id, "path": f"frames/{part_id}.png"})
            sender.publish("line/press-3/s1/parts", body, qos=1).wait_for_publish(30)
        else:
            sender.publish(f"line/press-3/s1/parts/{part_id}", data, qos=1).wait_for_publish(30)
    sender.disconnect()
    sender.loop_stop()
    try:
        while sum(runner.counts.values()) < 2:
            runner.step()
            assert time.monotonic() < end, f"the station scored {sum(runner.counts.values())} of 2 triggered parts"
            time.sleep(0.02)
        with (tmp_path / "s1.csv").open(newline="") as f:
            logged = list(csv.DictReader(f))
        assert [r["part_id"] for r in logged] == ["P-100", "P-101"]  # the trigger's part ids, in order
        assert all(r["verdict"] in ("ok", "review", "reject") for r in logged)
    finally:
        runner.close()


def test_a_broker_refusing_the_login_is_said_and_the_other_station_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad login: one station logs in with a wrong password, the other with the right
    one. The refusal is one line on stderr naming the broker and its reason and the station shows
    degraded (its results wait); the other station's results reach the broker."""
    broker = Broker(tmp_path, users={"line": "right-password"})
    broker.start()
    monkeypatch.setenv("HETMM_TEST_MQTT_WRONG", "wrong-password")
    monkeypatch.setenv("HETMM_TEST_MQTT_RIGHT", "right-password")
    part = SyntheticProduct(seed=3, size=64)
    operations.fit(
        open_store(tmp_path / "store"), "p", DetectorConfig.from_dict(TINY_CONFIG), [part.good(i) for i in range(4)]
    )
    login = {"kind": "mqtt", "broker": f"127.0.0.1:{broker.port}", "username": "line"}
    stations = [
        folder_station(tmp_path, name, {**login, "topic": f"line/{name}", "password_env": env})
        for name, env in (("s1", "HETMM_TEST_MQTT_WRONG"), ("s2", "HETMM_TEST_MQTT_RIGHT"))
    ]
    (tmp_path / "line.yaml").write_text(yaml.safe_dump({"service": {"in_process": "store"}, "stations": stations}))
    import paho.mqtt.client as mqtt

    received: list[str] = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="checker")
    sub.username_pw_set("line", "right-password")
    sub.on_connect = lambda c, *_: c.subscribe("line/+", qos=1)
    sub.on_message = lambda _c, _u, msg: received.append(msg.topic)
    sub.connect("127.0.0.1", broker.port)
    sub.loop_start()
    runners = [build_station(st, tmp_path) for st in load_line(tmp_path / "line.yaml").stations]
    try:
        for runner in runners:
            (tmp_path / runner.station.head.name / "part.png").write_bytes(png(part.good(50)))
        end = time.monotonic() + WAIT_S
        while not (sum(runners[0].counts.values()) and sum(runners[1].counts.values()) and "line/s2" in received):
            for runner in runners:
                runner.step()
            assert time.monotonic() < end, f"both stations scoring; received {received}"
            time.sleep(0.05)
        while runners[0].state != "degraded":  # the refusal comes back from the broker on its own time
            runners[0].step()
            assert time.monotonic() < end, "station s1 shows degraded"
            time.sleep(0.05)
        assert runners[1].state == "ok" and "line/s1" not in received
        refused = [line for line in capsys.readouterr().err.splitlines() if "refused" in line]
        assert len(refused) == 1, refused  # said once, not on every reconnect
        assert f"127.0.0.1:{broker.port} refused station s1's results" in refused[0]
        assert "authori" in refused[0].lower() or "password" in refused[0].lower(), refused[0]
    finally:
        for runner in runners:
            runner.close()
        sub.loop_stop()
        sub.disconnect()
        broker.stop()
