"""Stations on a line: a source of frames, a product scored on a service, sinks for the verdicts.

So far: the line file (``config.station``) and its check (``hetmm station check``, ``check.py``), and
a station's loop with the folder source, the in-process and HTTP services and the CSV log
(``hetmm station run``, ``runner.py``).
"""

from __future__ import annotations

from .check import Line, Station, line_problems, load_line

__all__ = ["Line", "Station", "line_problems", "load_line"]
