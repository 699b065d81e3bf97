"""A station's report of itself for the console (station/report.py): what it says, and a console that
is away said once, then once more when reports get through again."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from helpers import free_port

from hetmm_ray.config.station import ConsoleTarget
from hetmm_ray.serve.stations import parse_report
from hetmm_ray.station.report import ConsoleReporter, station_report
from hetmm_ray.station.runner import PartResult


def fake_runner(results: list[PartResult], queue: int = 0) -> SimpleNamespace:
    from collections import Counter

    return SimpleNamespace(
        station=SimpleNamespace(head=SimpleNamespace(name="s1", product="p")),
        state="degraded" if queue else "ok",
        queue=[None] * queue,
        counts=Counter(r.outcome for r in results),
        recent=results,
    )


def result(part: str, outcome: str, latency: float, version: int | None = 2) -> PartResult:
    """A part of ``outcome``: a verdict (scored, score 0.1 against 0.2), or the status timeout / error."""
    common = {"station": "s1", "part_id": part, "product": "p", "latency_ms": latency, "frame": f"/in/{part}.png"}
    if outcome in ("timeout", "error"):
        return PartResult(**common, status=outcome)
    scored = {"score": 0.1, "threshold": 0.2, "is_anomaly": outcome == "reject", "version": version}
    return PartResult(**common, status="scored", verdict=outcome, **scored)


def test_the_report_says_state_queue_parts_last_and_latency_of_final_results() -> None:
    results = [result(f"a{i}", "ok", 10.0 * (i + 1)) for i in range(9)] + [result("a9", "timeout", 5000, None)]
    body = station_report(fake_runner(results, queue=2), 2.0)
    assert body["state"] == "degraded" and body["queue"] == 2 and body["parts"] == {"ok": 9, "timeout": 1}
    assert body["last"] == {"part_id": "a9", "status": "timeout", "verdict": None, "score": None, "late": False}
    assert body["version"] == 2  # the last result that has one
    assert body["latency_ms"]["p50"] == 50.0  # over final results only: the timeout's 5 s is not a latency
    assert body["latency_ms"]["p99"] <= 90.0
    assert parse_report(body)["state"] == "degraded"  # what the service accepts
    assert station_report(fake_runner([]), 2.0, state="offline") == {
        "product": "p",
        "state": "offline",
        "queue": 0,
        "parts": {},
        "every_s": 2.0,
    }


def test_a_console_away_is_said_once_then_once_when_back(capsys) -> None:
    port = free_port()
    reporter = ConsoleReporter(ConsoleTarget(url=f"http://127.0.0.1:{port}"), "l", [fake_runner([])])
    assert not reporter.send() and not reporter.send()
    err = capsys.readouterr().err
    assert err.count("failed") == 1 and f"127.0.0.1:{port}" in err

    got: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            got.append((self.path, json.loads(self.rfile.read(int(self.headers["content-length"])))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert reporter.send()
        assert "works again" in capsys.readouterr().err
        reporter.stop()  # the last report: offline
        assert [(path, body["state"]) for path, body in got] == [
            ("/v1/stations/l/s1", "ok"),
            ("/v1/stations/l/s1", "offline"),
        ]
    finally:
        server.shutdown()
