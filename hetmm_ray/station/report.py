"""Stations reporting themselves to the service's console, which shows the stations.

Exact semantics: a :class:`ConsoleReporter` (one per ``hetmm station run``, for every station it
runs) sends each station's :func:`station_report` to ``PUT {console.url}/v1/stations/{line}/{station}``
every ``console.every_s`` seconds from a thread of its own, with ``Authorization: Bearer <token>``
when ``console.token_env`` names a set variable, and once more with state ``offline`` when it stops.
A report that fails (the service away, a refusal) is said once on stderr, and once more when reports
get through again; the stations never wait for it. The body is what ``serve/stations.py`` checks.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
from typing import Any

from ..config import ConfigError
from ..config.station import ConsoleTarget

__all__ = ["ConsoleReporter", "station_report"]


def station_report(runner: Any, every_s: float, *, state: str | None = None) -> dict[str, Any]:
    """What ``runner`` (a ``runner.StationRunner``) says of itself: its state (or ``state``), queue
    depth, parts by outcome (a scored part's verdict, another's status), last result, latency p50 / p99
    over its recent scored results."""
    recent = list(runner.recent)
    latencies = [r.latency_ms for r in recent if r.status == "scored"]
    last = recent[-1] if recent else None
    report: dict[str, Any] = {
        "product": runner.station.head.product,
        "state": state or runner.state,
        "queue": len(runner.queue),
        "parts": {outcome: n for outcome, n in runner.counts.copy().items() if n},
        "every_s": every_s,
    }
    if last is not None:
        report["last"] = {
            "part_id": last.part_id,
            "status": last.status,
            "verdict": last.verdict,
            "score": last.score,
            "late": last.late,
        }
        report["version"] = next((r.version for r in reversed(recent) if r.version is not None), None)
    if latencies:
        p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98] if len(latencies) > 1 else latencies[0]
        report["latency_ms"] = {"p50": statistics.median(latencies), "p99": p99}
    return report


class ConsoleReporter:
    """Reports ``runners`` of line ``line`` to ``target`` until :meth:`stop` (see the module docstring)."""

    def __init__(self, target: ConsoleTarget, line: str, runners: list[Any]) -> None:
        import httpx

        headers = {}
        if target.token_env is not None:
            token = os.environ.get(target.token_env)
            if token is None:
                raise ConfigError(f"console: token_env {target.token_env} is not set in the station's environment")
            headers["authorization"] = f"Bearer {token}"
        self.target, self.line, self.runners = target, line, runners
        self.client = httpx.Client(base_url=target.url.rstrip("/"), headers=headers, timeout=10.0)
        self.failing: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="station-console-report", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, *, state: str | None = None) -> bool:
        """Every station's report once; True when all got through."""
        import httpx

        for runner in self.runners:
            name = runner.station.head.name
            try:
                r = self.client.put(
                    f"/v1/stations/{self.line}/{name}", json=station_report(runner, self.target.every_s, state=state)
                )
                problem = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if problem is not None:
                if problem != self.failing:
                    where = f"reporting to the console at {self.target.url}"
                    print(f"hetmm station: {where} failed: {problem}", file=sys.stderr)
                self.failing = problem
                return False
        if self.failing is not None:
            print(f"hetmm station: reporting to the console at {self.target.url} works again", file=sys.stderr)
        self.failing = None
        return True

    def _loop(self) -> None:
        self.send()
        while not self._stop.wait(self.target.every_s):
            self.send()

    def stop(self) -> None:
        """No more periodic reports; one last saying every station is offline."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.send(state="offline")
        self.client.close()
