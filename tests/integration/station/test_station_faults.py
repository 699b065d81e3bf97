"""A line through every fault a station must come through, all real: ``hetmm station run`` (a folder
station scoring over gRPC, results to a real Mosquitto and a log) on ``hetmm serve``. Mid-run the
service is killed (SIGKILL to its whole process group: the CLI, Ray and Serve) and started again,
Mosquitto is restarted, and the station itself is killed (SIGKILL) and started again. Every part
must have exactly one final result on MQTT, in the order the parts came, those that waited for the
service marked late; a ``timeout`` comes first for each of those (the reject gate cannot wait).

Without ``mosquitto`` the module skips, except under ``CI=true`` where it fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import TINY_CONFIG, free_port, png
from mqtt_peers import MOSQUITTO, Broker, Subscriber

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

if MOSQUITTO is None and os.environ.get("CI") != "true":
    pytest.skip("needs Debian's mosquitto (apt-get install mosquitto; .ci/run installs it)", allow_module_level=True)

TOPIC = "line/faults/s1"
START_S = 300.0  # Ray, Serve and the applications, or a station's imports, on a loaded 2-core machine
WAIT_S = 180.0


def _hetmm(*args: str, log: Path) -> subprocess.Popen:
    """The installed ``hetmm`` in a process group of its own (so a SIGKILL to it takes all it started)."""
    script = Path(sys.executable).with_name("hetmm")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hetmm_ray.cli"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray of its own
    out = log.open("ab")
    return subprocess.Popen([*cmd, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (``/proc``'s parent links)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``, its process group and every process under it: Ray's workers (Serve's
    proxies and replicas among them) are the raylet's children, and would answer for a while on
    their own after the rest of their session is gone."""
    under = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in under:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def _wait(ok, what: str, bound_s: float, log: Path | None = None) -> None:
    end = time.monotonic() + bound_s
    while not ok():
        if time.monotonic() > end:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"waited {bound_s:.0f} s for {what}\n{tail}")
        time.sleep(0.2)


class Service:
    """``hetmm serve`` on fixed ports (the station's line file names them), killed and started again."""

    def __init__(self, store: Path, log: Path) -> None:
        self.store, self.log = store, log
        self.http, self.grpc = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = ["serve", "--store", str(self.store), "--port", str(self.http), "--grpc-port", str(self.grpc)]
        self.proc = _hetmm(*args, log=self.log)
        _wait(self.up, "hetmm serve to answer", START_S, self.log)

    def up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
        try:
            return httpx.get(f"http://127.0.0.1:{self.http}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc)


def test_every_part_has_one_final_result_in_order_through_every_fault(tmp_path: Path) -> None:
    part = SyntheticProduct(seed=3, size=64)
    store = tmp_path / "store"
    operations.fit(open_store(store), "p", DetectorConfig.from_dict(TINY_CONFIG), [part.good(i) for i in range(4)])
    broker = Broker(tmp_path)
    broker.start()
    service = Service(store, tmp_path / "serve.log")
    try:
        service.start()
    except BaseException:  # nothing of it left running for the next tests
        service.kill()
        broker.stop()
        raise
    (tmp_path / "in").mkdir()
    (tmp_path / "done").mkdir()
    line = {
        "line": "faults",
        "service": {"grpc": f"127.0.0.1:{service.grpc}", "timeout_ms": 10_000},
        "stations": [
            {
                "name": "s1",
                "product": "p",
                "source": {"kind": "folder", "path": "in", "after": "move", "move_to": "done", "settle_ms": 0},
                "deadline_ms": 5_000,
                "sinks": [
                    {"kind": "mqtt", "broker": f"127.0.0.1:{broker.port}", "topic": TOPIC},
                    {"kind": "log", "path": "s1.csv"},
                ],
            }
        ],
    }
    (tmp_path / "line.yaml").write_text(yaml.safe_dump(line))
    sub = Subscriber(broker.port, [TOPIC], client_id="plc")
    sub.wait(lambda: sub.client.is_connected(), "the subscriber to connect")
    station_log = tmp_path / "station.log"
    station = _hetmm("station", "run", str(tmp_path / "line.yaml"), log=station_log)
    names: list[str] = []

    def finals() -> list[dict]:
        return [r for r in sub.results() if r["status"] != "timeout"]

    def put(n: int, *, wait: bool = True, every_s: float = 0.05) -> None:
        """``n`` more parts, one at a time (a part every ``every_s``); with ``wait``, until each has its
        final result."""
        for _ in range(n):
            name = f"p{len(names) + 1:03d}"
            names.append(name)
            tmp = tmp_path / f"{name}.tmp"
            tmp.write_bytes(png(part.good(100 + len(names))))
            tmp.replace(tmp_path / "in" / f"{name}.png")  # whole files only, as a camera PC writes them
            time.sleep(every_s)
        if wait:
            everyone = lambda: {r["part_id"] for r in finals()} >= set(names)  # noqa: E731
            _wait(everyone, f"final results of {names}", WAIT_S, station_log)

    try:
        put(4)  # all up
        service.kill()  # the service goes away mid-run: parts wait in the station's queue
        put(3, wait=False)
        _wait(lambda: sum(r["status"] == "timeout" for r in sub.results()) >= 3, "3 timeouts", WAIT_S, station_log)
        service.start()  # back on the same ports: the queued parts are scored, late
        put(2)
        broker.stop()  # the broker restarts mid-run: results wait in the station's outbox
        put(3, wait=False)
        broker.start()
        put(1)
        put(30, wait=False, every_s=0)  # the station is killed while it works through these
        end = time.monotonic() + WAIT_S
        while len(finals()) < len(names) - 25:
            assert time.monotonic() < end, "the station did not take up the last parts"
            time.sleep(0.005)
        _kill_group(station)
        assert list((tmp_path / "in").iterdir()), "the kill came after the last part: not mid-run"
        station = _hetmm("station", "run", str(tmp_path / "line.yaml"), log=station_log)
        put(2)
    finally:
        if station.poll() is None:
            station.send_signal(signal.SIGTERM)
            try:
                station.wait(timeout=60)
            except subprocess.TimeoutExpired:
                _kill_group(station)
        service.kill()
        sub.close()
        broker.stop()
        broker.log.close()

    # One final result per part, in the order the parts came. MQTT QoS 1 is "at least once": a result
    # the broker took just before the station was killed, its acknowledgement unread, is sent again
    # from the outbox at the next start: the same bytes, a copy of that one result, never a second
    # scoring (a part scored twice would differ at least in its latency_ms).
    copies: dict[str, set[str]] = {}
    for r in finals():
        copies.setdefault(r["part_id"], set()).add(json.dumps(r, sort_keys=True))
    assert list(copies) == names, f"{list(copies)}\n{station_log.read_text(errors='replace')[-3000:]}"
    assert all(len(c) == 1 for c in copies.values()), {p: c for p, c in copies.items() if len(c) > 1}
    resent = len(finals()) - len(names)
    assert resent <= 100, resent  # at most what was in flight at the kill (the sink's 100 unacknowledged)
    got = [json.loads(next(iter(c))) for c in copies.values()]
    assert all(r["verdict"] in ("ok", "review", "reject") and r["version"] == 1 for r in got), got
    late = [r["part_id"] for r in got if r["late"]]
    assert set(names[4:7]) <= set(late), late  # waited for the service: marked late
    timeouts = [r["part_id"] for r in sub.results() if r["status"] == "timeout"]
    assert set(names[4:7]) <= set(timeouts)  # each said at once: the service was away
    for name in names[4:7]:  # the timeout before the late result
        ids = [(r["part_id"], r["status"]) for r in sub.results()]
        assert ids.index((name, "timeout")) < next(i for i, (n, st) in enumerate(ids) if n == name and st == "scored")
    assert sorted(p.stem for p in (tmp_path / "done").iterdir()) == names  # every frame let go once
    assert not list((tmp_path / "in").iterdir())
