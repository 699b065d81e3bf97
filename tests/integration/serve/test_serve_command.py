"""`hetmm serve` as a user runs it: it comes up, answers over HTTP and gRPC, and Ctrl-C stops it cleanly.

A fresh process (the installed entry point) on its own local Ray, an empty store, HTTP and gRPC on
free loopback ports. After SIGINT it must exit 0 having said ``hetmm: stopped``, with nothing of
Ray's on its output that reads as a failure: ``serve.shutdown()`` before a local Ray's shutdown made
Ray print "Task ServeController.graceful_shutdown failed ... will be retried" on every clean stop
(``serve/run.stop_service``). Its ports are free again afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from helpers import free_port


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_comes_up_answers_and_stops_on_ctrl_c(own_ray, tmp_path: Path) -> None:
    from hetmm_ray.serve.grpc.client import InspectionClient

    script = Path(sys.executable).with_name("hetmm")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hetmm_ray.cli"]
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray of its own
    args = ["serve", "--store", str(tmp_path / "store"), "--port", str(port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(
        [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300  # Ray, Serve and both applications on a loaded 2-core machine
        while not any(line.startswith("hetmm: serving") for line in lines):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/products", timeout=60).json() == {"products": []}
        with InspectionClient(f"127.0.0.1:{grpc_port}", timeout=60) as client:
            assert client.health().status == "ok"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    reader.join(timeout=30)
    output = "".join(lines)
    assert "hetmm: stopping (in-flight requests finish first)" in output
    assert output.rstrip().endswith("hetmm: stopped"), output[-2000:]
    assert "failed" not in output.lower() and "Traceback" not in output, output[-2000:]
    assert _port_is_free(port) and _port_is_free(grpc_port)
