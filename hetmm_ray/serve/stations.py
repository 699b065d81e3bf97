"""The console's view of a line's stations: what each station last said of itself, held in
the ingress's memory (one replica, deploy.yaml; as the recent-predictions ring).

Exact semantics:

- A station process reports each of its stations every ``every_s`` seconds (``station/report.py``)
  with ``PUT /v1/stations/{line}/{station}`` and a JSON object, checked here by
  :func:`parse_report`: ``product`` (a text), ``state`` (``ok``, ``degraded`` or ``offline``, as on
  its sinks), ``queue`` (parts waiting for the service, >= 0), ``parts`` (outcome -> count, each
  outcome a verdict ``ok``, ``review``, ``reject`` or a status ``timeout``, ``error``:
  hetmm_ray/result.py ``PART_OUTCOMES``), ``every_s`` (its report period, 0.5-600), and optionally
  ``last`` (the last result: ``part_id``, ``status``, ``verdict`` (null unless scored), ``score``,
  ``late``), ``latency_ms`` (``p50`` and ``p99`` over its recent parts) and ``version``. Anything
  else, or a value of the wrong kind, is a 400 naming the field. Line and station names are 1-64
  letters, digits, ``_`` or ``-`` (a line file's station names). A report of a station running older
  code (``parts`` and ``last.verdict`` in ``good``, ``anomaly``, ``timeout``, ``error``) is read in
  these words (``good`` -> ``ok``, ``anomaly`` -> ``reject``; ``timeout``, ``error`` a status).
- :meth:`StationBoard.listing` gives every station, ordered by line then name, with ``seen_s``
  (seconds since its last report) and ``silent`` (true once it has not reported for
  ``SILENT_AFTER`` of its own periods: the station process is gone or cut off from the service;
  its last report is kept as it was).
- At most ``MAX_STATIONS`` are held; a report of one more evicts the station silent the longest.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ..errors import Refused
from ..result import LEGACY_VERDICTS, PART_OUTCOMES, PART_STATUSES, VERDICTS, verdict_word

__all__ = ["MAX_STATIONS", "SILENT_AFTER", "StationBoard", "parse_report"]

MAX_STATIONS = 1000
SILENT_AFTER = 3  # report periods without a report before a station shows silent
STATES = ("ok", "degraded", "offline")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_TEXT_MAX = 256


def _bad(field: str, why: str) -> Refused:
    return Refused(400, "bad_station_report", f"{field}: {why}")


def _count(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(field, f"must be a whole number >= 0, got {value!r}")
    return value


def _number(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        raise _bad(field, f"must be a number, got {value!r}")
    return float(value)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _TEXT_MAX:
        raise _bad(field, f"must be a text of 1-{_TEXT_MAX} characters")
    return value


def check_name(value: str, field: str) -> str:
    if not _NAME.fullmatch(value):
        raise _bad(field, "must be 1-64 letters, digits, '_' or '-'")
    return value


def _last(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"part_id", "status", "verdict", "score", "late"}:
        raise _bad("last", "must be an object of part_id, status, verdict, score and late")
    status, verdict = value.get("status"), value.get("verdict")
    if status is None and verdict in ("timeout", "error"):  # an older station's words
        status, verdict = verdict, None
    elif status is None:
        status = "scored"
    if status not in PART_STATUSES:
        raise _bad("last.status", f"must be one of {', '.join(PART_STATUSES)}")
    try:
        verdict = verdict_word(verdict)
    except ValueError:
        verdict = ""  # refused below
    if (status == "scored") != (verdict in VERDICTS):
        raise _bad("last.verdict", f"must be one of {', '.join(VERDICTS)} when scored, else null")
    return {
        "part_id": _text(value.get("part_id"), "last.part_id"),
        "status": status,
        "verdict": verdict,
        "score": _number(value.get("score"), "last.score"),
        "late": bool(value.get("late", False)),
    }


def parse_report(body: dict[str, Any]) -> dict[str, Any]:
    """A station's report, checked (see the module docstring); ``Refused`` 400 naming the field."""
    known = {"product", "state", "queue", "parts", "every_s", "last", "latency_ms", "version"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise _bad(unknown[0], f"unknown field; known: {', '.join(sorted(known))}")
    if body.get("state") not in STATES:
        raise _bad("state", f"must be one of {', '.join(STATES)}")
    parts = body.get("parts", {})
    if isinstance(parts, dict):  # an older station's words: good -> ok, anomaly -> reject
        parts = {LEGACY_VERDICTS.get(k, k): v for k, v in parts.items()}
    if not isinstance(parts, dict) or set(parts) - set(PART_OUTCOMES):
        raise _bad("parts", f"must map outcomes ({', '.join(PART_OUTCOMES)}) to counts")
    every = _number(body.get("every_s"), "every_s")
    if every is None or not 0.5 <= every <= 600:
        raise _bad("every_s", "must be a number of seconds from 0.5 to 600")
    latency = body.get("latency_ms")
    if latency is not None and (not isinstance(latency, dict) or set(latency) - {"p50", "p99"}):
        raise _bad("latency_ms", "must be an object of p50 and p99")
    version = body.get("version")
    if version is not None:
        _count(version, "version")
    return {
        "product": _text(body.get("product"), "product"),
        "state": body["state"],
        "queue": _count(body.get("queue", 0), "queue"),
        "parts": {v: _count(parts.get(v, 0), f"parts.{v}") for v in PART_OUTCOMES},
        "every_s": every,
        "last": _last(body.get("last")),
        "latency_ms": None
        if latency is None
        else {k: _number(latency.get(k), f"latency_ms.{k}") for k in ("p50", "p99")},
        "version": version,
    }


class StationBoard:
    """Every station's last report (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_stations: int = MAX_STATIONS) -> None:
        self.clock = clock
        self.max_stations = max_stations
        self._reports: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}

    def report(self, line: str, station: str, body: dict[str, Any]) -> dict[str, Any]:
        key = (check_name(line, "line"), check_name(station, "station"))
        report = parse_report(body)
        if key not in self._reports and len(self._reports) >= self.max_stations:
            del self._reports[min(self._reports, key=lambda k: self._reports[k][0])]
        self._reports[key] = (self.clock(), report)
        return {"line": line, "station": station, **report}

    def listing(self) -> list[dict[str, Any]]:
        now = self.clock()
        out = []
        for (line, station), (seen, report) in sorted(self._reports.items()):
            seen_s = round(now - seen, 3)
            silent = seen_s > SILENT_AFTER * report["every_s"]
            out.append({"line": line, "station": station, **report, "seen_s": seen_s, "silent": silent})
        return out
