"""A line end to end, all real: Aravis's fake GigE Vision camera (software
trigger) -> ``hetmm station run`` -> ``hetmm serve`` over gRPC -> Mosquitto -> a subscriber, and the
station's OPC UA server read by an asyncua client subscribed to its ``Counter``.

Counts what each end saw (parts published on MQTT: lost, duplicated, out of order; OPC UA counter
changes seen), the latency from the camera's own frame timestamp to the verdict's arrival at the
MQTT subscriber (p50 / p99: trigger to verdict, including the camera's transfer) and the station's
own ``latency_ms`` (frame taken to verdict), and the station process's CPU per part
(``/proc/<pid>/stat``). Needs ``mosquitto``, ``aravis-tools``, ``gir1.2-aravis-0.8`` and
``python3-gi`` (what ``.ci/run`` installs).

    python benchmarks/bench_station.py --parts 2000 --rate-hz 10
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MOBILENET_WEIGHTS, REPO, free_port, repo_env

TOPIC = "line/bench/cam1"
NAMESPACE = "urn:hetmm-ray:bench"


def wait_until(condition: Any, what: str, timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise SystemExit(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def start_broker(folder: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    conf = folder / "mosquitto.conf"
    user = pwd.getpwuid(os.getuid()).pw_name
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest stderr\nuser {user}\n")
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([mosquitto, "-c", str(conf)], stderr=(folder / "mosquitto.log").open("wb"))
    return proc, port


def fit_on_camera(store: Path, frames: int) -> None:
    """A product fitted on the fake camera's own frames (its good parts)."""
    from hetmm_ray.config import DetectorConfig
    from hetmm_ray.config.station import AravisSource
    from hetmm_ray.station.camera import AravisFrames
    from hetmm_ray.store import open_store
    from hetmm_ray.workflows import operations

    source = AravisFrames(AravisSource(camera="127.0.0.1", pixel_format="Mono8"), "fit")
    got: list = []
    wait_until(lambda: bool(got.extend(source.poll()) or len(got) >= frames), "frames to fit on", 60)
    source.close()
    weights = str(MOBILENET_WEIGHTS) if MOBILENET_WEIGHTS.exists() else "random"
    config = {"backbone": {"name": "mobilenet_v2", "weights": weights, "image_size": 224}, "threshold": {"folds": 3}}
    images = [f.data.to_rgb() for f in got[:frames]]
    operations.fit(open_store(store), "cam", DetectorConfig.from_dict(config), images)


class Subscriber:
    """Every result on the station's topic (QoS 1), with the time it arrived."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.got: list[tuple[float, dict]] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-subscriber")
        self.client.on_message = lambda _c, _u, msg: self.got.append((time.time(), json.loads(msg.payload)))
        self.client.on_connect = lambda c, *_: c.subscribe(TOPIC, qos=1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class OpcUaWatcher:
    """An asyncua client subscribed to the station's ``Counter`` (every change queued, none merged)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.counters: list[int] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._watch()), daemon=True)
        self.thread.start()

    async def _watch(self) -> None:
        from asyncua import Client

        watcher = self

        class Handler:
            def datachange_notification(self, _node: Any, value: Any, _data: Any) -> None:
                watcher.counters.append(int(value))

        end = time.monotonic() + 120
        while True:
            try:
                async with Client(url=self.url, timeout=30) as client:
                    idx = await client.get_namespace_index(NAMESPACE)
                    station = await client.nodes.objects.get_child([f"{idx}:cam1"])
                    counter = await station.get_child([f"{idx}:Counter"])
                    sub = await client.create_subscription(20, Handler())
                    await sub.subscribe_data_change(counter, queuesize=10_000)
                    while not self.stop_event.is_set():
                        await asyncio.sleep(0.2)
                    return
            except Exception:  # not up yet, or gone at the end
                if self.stop_event.is_set():
                    return
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.5)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=int, default=2000)
    parser.add_argument("--rate-hz", type=float, default=10.0)
    parser.add_argument("--fit-frames", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-station-"))
    env = repo_env()
    procs: list[subprocess.Popen] = []
    try:
        broker, mqtt_port = start_broker(work)
        procs.append(broker)
        fake = shutil.which("arv-fake-gv-camera-0.8") or "arv-fake-gv-camera-0.8"
        procs.append(subprocess.Popen([fake, "-i", "127.0.0.1", "-s", "BENCH"], stderr=subprocess.DEVNULL))
        time.sleep(1.0)
        fit_on_camera(work / "store", args.fit_frames)
        http_port, grpc_port = free_port(), free_port()
        serve = [sys.executable, "-m", "hetmm_ray.cli", "serve", "--store", str(work / "store")]
        serve += ["--port", str(http_port), "--grpc-port", str(grpc_port)]
        procs.append(subprocess.Popen(serve, env=env, stdout=(work / "serve.log").open("wb"), stderr=subprocess.STDOUT))
        import httpx

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, "hetmm serve", 600)
        opc_url = f"opc.tcp://127.0.0.1:{free_port()}/hetmm"
        line = {
            "line": "bench",
            "service": {"grpc": f"127.0.0.1:{grpc_port}", "timeout_ms": 30_000},
            "stations": [
                {
                    "name": "cam1",
                    "product": "cam",
                    "source": {
                        "kind": "aravis",
                        "camera": "127.0.0.1",
                        "pixel_format": "Mono8",
                        "rate_hz": args.rate_hz,
                    },
                    "deadline_ms": 2000,
                    "sinks": [
                        {"kind": "mqtt", "broker": f"127.0.0.1:{mqtt_port}", "topic": TOPIC},
                        {"kind": "opcua", "endpoint": opc_url, "namespace": NAMESPACE},
                        {"kind": "log", "path": "cam1.csv"},
                    ],
                }
            ],
        }
        import yaml

        (work / "line.yaml").write_text(yaml.safe_dump(line))
        subscriber = Subscriber(mqtt_port)
        station = subprocess.Popen(
            [sys.executable, "-m", "hetmm_ray.cli", "station", "run", str(work / "line.yaml")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(work / "station.log").open("wb"),
        )
        procs.append(station)
        watcher = OpcUaWatcher(opc_url)
        started = time.monotonic()
        finals = lambda: [m for _, m in subscriber.got if m.get("verdict") != "timeout"]  # noqa: E731
        warm = max(1, args.parts // 10)  # CPU per part from here on: the start (imports, model load) apart
        budget = args.parts / args.rate_hz * 3 + 300
        wait_until(lambda: len(finals()) >= warm, f"{warm} parts", budget)
        cpu0, parts0 = cpu_s(station.pid), len(finals())
        wait_until(lambda: len(finals()) >= args.parts, f"{args.parts} parts", budget)
        wall = time.monotonic() - started
        cpu, parts1 = cpu_s(station.pid) - cpu0, len(finals()) - parts0
        station.send_signal(signal.SIGTERM)
        station.wait(timeout=60)
        time.sleep(1.0)
        watcher.stop_event.set()
        subscriber.stop()
        got = [(t, m) for t, m in subscriber.got if m.get("verdict") != "timeout"]
        ids = [int(m["part_id"]) for _, m in got]
        first_n = ids[: args.parts]
        timeouts = sum(1 for _, m in subscriber.got if m.get("verdict") == "timeout")
        lost = sorted(set(range(1, max(first_n) + 1)) - set(first_n))
        duplicated = len(first_n) - len(set(first_n))
        in_order = first_n == sorted(first_n)
        trigger_ms = [1000 * (t - int(m["frame"].rsplit("@", 1)[1]) / 1e9) for t, m in got[: args.parts]]
        station_ms = [float(m["latency_ms"]) for _, m in got[: args.parts]]
        frame_ids = [int(m["frame"].split("#")[1].split("@")[0]) for _, m in got[: args.parts]]
        skipped = sum(b - a - 1 for a, b in itertools.pairwise(frame_ids) if b > a)
        counters = watcher.counters
        opc_missing = sorted(set(range(min(counters), max(counters) + 1)) - set(counters)) if counters else []

        def pct(values: list[float], q: int) -> float:
            return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

        verdicts = {v: sum(m["verdict"] == v for _, m in got[: args.parts]) for v in ("anomaly", "good", "error")}
        seen = f"{min(counters)}..{max(counters)}" if counters else "-"
        lines = [
            f"parts: {len(first_n)} on MQTT in {wall:.0f} s at {args.rate_hz:g} Hz; lost {len(lost)}, "
            f"duplicated {duplicated}, in order {in_order}; timeouts published {timeouts}",
            f"verdicts: {verdicts}",
            f"OPC UA: {len(counters)} Counter changes seen ({seen}), missing {len(opc_missing)}",
            f"camera timestamp -> verdict at the subscriber: p50 {statistics.median(trigger_ms):.0f} ms, "
            f"p99 {pct(trigger_ms, 99):.0f} ms",
            f"  after the first {warm} parts (the start's backlog drained): p50 "
            f"{statistics.median(trigger_ms[warm:]):.0f} ms, p99 {pct(trigger_ms[warm:], 99):.0f} ms",
            f"station latency_ms (frame taken -> verdict): p50 {statistics.median(station_ms):.0f} ms, "
            f"p99 {pct(station_ms, 99):.0f} ms",
            f"camera frames between consecutive parts never scored (dropped by the station): {skipped}",
            f"station process CPU after the first {warm} parts: {cpu:.1f} s for {parts1} parts = "
            f"{1000 * cpu / max(1, parts1):.1f} ms a part",
        ]
        print("\n".join(lines))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT if p.args[1:3] == ["-m", "hetmm_ray.cli"] else signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        print(f"work folder: {work}")


if __name__ == "__main__":
    os.chdir(REPO)
    main()
