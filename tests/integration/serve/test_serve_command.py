"""`hetmm serve` as a user runs it: it comes up, answers over HTTP and gRPC, and Ctrl-C stops it cleanly.

A fresh process (the installed entry point) on its own local Ray, an empty store, HTTP and gRPC on
free loopback ports. After SIGINT it must exit 0 having said ``hetmm: stopped``, with nothing of
Ray's on its output that reads as a failure: ``serve.shutdown()`` before a local Ray's shutdown made
Ray print "Task ServeController.graceful_shutdown failed ... will be retried" on every clean stop
(``serve/run.stop_service``). Its ports are free again afterwards. A SIGTERM to its whole process
group (systemd's default) stops Ray's GCS as well: the command must then say so and exit at once.
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


def _start_serve(
    tmp_path: Path, *extra: str, wait_for_banner: bool = True
) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    """`hetmm serve` (the installed entry point) in a session of its own, its output collected in lines."""
    script = Path(sys.executable).with_name("hetmm")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hetmm_ray.cli"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray of its own
    args = ["serve", "--store", str(tmp_path / "store"), *extra]
    proc = subprocess.Popen(
        [*cmd, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        text=True,
        start_new_session=True,  # its own process group, as a terminal or systemd gives it
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300  # Ray, Serve and the applications on a loaded 2-core machine
    while wait_for_banner and not any(line.startswith("hetmm: serving") for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("".join(lines))
        time.sleep(0.5)
    return proc, lines, reader


def _finish(proc: subprocess.Popen, lines: list[str], reader: threading.Thread) -> str:
    """The command's whole output, once it is gone: killed if still running, and whatever of its session
    is left killed too (Ray's workers exit on their own once their raylet is gone, within seconds; not
    left to linger into the next tests)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
    ps = subprocess.run(["ps", "-o", "pid=", "-s", str(proc.pid)], capture_output=True, text=True, check=False)
    for pid in ps.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    reader.join(timeout=30)
    return "".join(lines)


def _session_processes(pid: int) -> list[str]:
    ps = subprocess.run(["ps", "-o", "pid=,comm=", "-s", str(pid)], capture_output=True, text=True, check=False)
    return [line.split(None, 1)[1] for line in ps.stdout.splitlines() if line.strip() and int(line.split()[0]) != pid]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_comes_up_answers_and_stops_on_ctrl_c(own_ray, tmp_path: Path) -> None:
    from hetmm_ray.core.device import usable_cores
    from hetmm_ray.serve.grpc.client import InspectionClient

    port, grpc_port = free_port(), free_port()
    proc, lines, reader = _start_serve(tmp_path, "--port", str(port), "--grpc-port", str(grpc_port))
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/v1/products", timeout=60).json() == {"products": []}
        with InspectionClient(f"127.0.0.1:{grpc_port}", timeout=60) as client:
            assert client.health().status == "ok"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=180)
    finally:
        output = _finish(proc, lines, reader)
    assert code == 0, output[-2000:]
    assert "hetmm: stopping (in-flight requests finish first)" in output
    assert output.rstrip().endswith("hetmm: stopped"), output[-2000:]
    assert "failed" not in output.lower() and "Traceback" not in output, output[-2000:]
    assert "RAY_AUTH_MODE" not in output, output[:2000]  # Ray's token auth asked for, not warned about
    assert _port_is_free(port) and _port_is_free(grpc_port)
    # its own Ray on this machine: one detector replica per application using every core (serve/run.py)
    assert f"hetmm: detector per application: 1 replica, {usable_cores()} torch threads" in output, output[:2000]


def test_a_stop_signal_to_the_whole_group_exits_at_once(own_ray, tmp_path: Path) -> None:
    """SIGTERM to the process group (systemd's default KillMode, `timeout`) stops Ray's GCS too. Before,
    the drain then waited about 60 s for the GCS ("Failed to connect to GCS within 60 seconds") before
    the process died; now it says what happened and exits 1 within seconds."""
    proc, lines, reader = _start_serve(tmp_path, "--port", str(free_port()))
    try:
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.monotonic() - started
    finally:
        output = _finish(proc, lines, reader)
    if output.rstrip().endswith("hetmm: stopped"):  # the drain beat the GCS's exit: a clean stop, also right
        assert code == 0, output[-2000:]
        return
    assert code == 1, output[-2000:]
    assert "hetmm: Ray's own processes were stopped by the same signal" in output, output[-2000:]
    assert "Failed to connect to GCS" not in output and took < 45, (took, output[-2000:])


def test_ctrl_c_while_starting_stops_cleanly_once_up(own_ray, tmp_path: Path) -> None:
    """Ctrl-C while Ray is starting: before, it broke off the start wherever it fell (a KeyboardInterrupt
    inside ray.init or serve.run: exit 130); now the command says so, finishes starting, and stops as
    it does when up (exit 0, ``hetmm: stopped``, nothing of its session left)."""
    port = free_port()
    proc, lines, reader = _start_serve(tmp_path, "--port", str(port), wait_for_banner=False)
    try:
        deadline = time.monotonic() + 300
        while not any("raylet" in p for p in _session_processes(proc.pid)):  # Ray is starting
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
        left = time.monotonic() + 120  # Ray's workers exit on their own once their raylet is gone
        while _session_processes(proc.pid) and time.monotonic() < left:
            time.sleep(1)
        leftover = _session_processes(proc.pid)
    finally:
        output = _finish(proc, lines, reader)
    assert code == 0, output[-2000:]
    assert "hetmm: stop asked while starting" in output, output[-2000:]
    assert output.rstrip().endswith("hetmm: stopped"), output[-2000:]
    assert not leftover, leftover
    assert _port_is_free(port)
