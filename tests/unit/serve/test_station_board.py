"""The console's board of stations (serve/stations.py): reports checked field by field, listed by line
then name, silent after three of a station's own periods, bounded."""

from __future__ import annotations

import pytest

from hetmm_ray.errors import Refused
from hetmm_ray.serve.stations import SILENT_AFTER, StationBoard, parse_report


def report(**extra: object) -> dict:
    return {"product": "bottle", "state": "ok", "queue": 0, "parts": {"ok": 3}, "every_s": 2.0, **extra}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_report_is_listed_with_every_verdict_and_how_long_ago() -> None:
    clock = Clock()
    board = StationBoard(clock=clock)
    board.report("press-3", "s2", report(state="degraded", queue=4))
    last = {"part_id": "P-7", "status": "scored", "verdict": "reject", "score": 0.5, "late": True}
    board.report("press-3", "s1", report(last=last, latency_ms={"p50": 40, "p99": 90.5}, version=3))
    board.report("assembly", "cam", report(state="offline"))
    clock.now += 1.5
    listed = board.listing()
    assert [(s["line"], s["station"]) for s in listed] == [("assembly", "cam"), ("press-3", "s1"), ("press-3", "s2")]
    s1 = listed[1]
    assert s1["parts"] == {"ok": 3, "review": 0, "reject": 0, "timeout": 0, "error": 0}
    assert s1["last"] == last and s1["latency_ms"] == {"p50": 40.0, "p99": 90.5} and s1["version"] == 3
    assert s1["seen_s"] == 1.5 and not s1["silent"]
    assert listed[2]["state"] == "degraded" and listed[2]["queue"] == 4


def test_a_station_that_stops_reporting_is_silent_and_keeps_what_it_said() -> None:
    clock = Clock()
    board = StationBoard(clock=clock)
    board.report("l", "s", report(every_s=2.0, state="degraded"))
    clock.now += SILENT_AFTER * 2.0
    assert not board.listing()[0]["silent"]  # exactly three periods: not yet
    clock.now += 0.01
    (s,) = board.listing()
    assert s["silent"] and s["state"] == "degraded"
    board.report("l", "s", report(every_s=2.0))
    assert not board.listing()[0]["silent"]


def test_the_board_is_bounded_and_forgets_the_longest_silent_first() -> None:
    clock = Clock()
    board = StationBoard(clock=clock, max_stations=3)
    for name in ("a", "b", "c"):
        board.report("l", name, report())
        clock.now += 1
    board.report("l", "a", report())  # a speaks again: b is now the longest silent
    board.report("l", "d", report())
    assert [s["station"] for s in board.listing()] == ["a", "c", "d"]


def test_a_report_of_a_station_running_older_code_is_read_in_the_one_vocabulary() -> None:
    """An older station says good / anomaly / timeout / error: read as the verdicts ok / reject and the
    statuses timeout / error (hetmm_ray/result.py)."""
    old = report(parts={"good": 2, "anomaly": 1, "timeout": 1}, last={"part_id": "P-1", "verdict": "anomaly"})
    got = parse_report(old)
    assert got["parts"] == {"ok": 2, "review": 0, "reject": 1, "timeout": 1, "error": 0}
    assert (got["last"]["status"], got["last"]["verdict"]) == ("scored", "reject")
    late = parse_report(report(last={"part_id": "P-2", "verdict": "timeout", "score": None}))["last"]
    assert (late["status"], late["verdict"]) == ("timeout", None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (report(state="sleeping"), "state"),
        (report(queue=-1), "queue"),
        (report(queue=True), "queue"),
        (report(parts={"bad": 1}), "parts"),
        (report(parts={"ok": 1.5}), "parts.ok"),
        (report(every_s=0.1), "every_s"),
        (report(every_s="2"), "every_s"),
        (report(product=""), "product"),
        (report(product="x" * 300), "product"),
        (report(last={"part_id": "a", "verdict": "maybe"}), "last.verdict"),
        (report(last={"part_id": "a", "status": "timeout", "verdict": "ok"}), "last.verdict"),
        (report(last={"part_id": "a", "status": "scored"}), "last.verdict"),
        (report(last={"part_id": "a", "status": "late"}), "last.status"),
        (report(last={"part_id": "a", "verdict": "ok", "extra": 1}), "last"),
        (report(latency_ms={"p50": "fast"}), "latency_ms.p50"),
        (report(colour="red"), "colour"),
    ],
)
def test_a_bad_report_is_a_400_naming_its_field(body: dict, field: str) -> None:
    with pytest.raises(Refused) as refused:
        parse_report(body)
    assert refused.value.status == 400 and refused.value.code == "bad_station_report"
    assert refused.value.message.startswith(f"{field}:"), refused.value.message


@pytest.mark.parametrize(("line", "station"), [("", "s"), ("l", "a/b"), ("l", "-x"), ("l" * 65, "s")])
def test_line_and_station_names_are_checked(line: str, station: str) -> None:
    with pytest.raises(Refused) as refused:
        StationBoard().report(line, station, report())
    assert refused.value.status == 400
