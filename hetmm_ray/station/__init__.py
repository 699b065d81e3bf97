"""Stations on a line (issue 39): a source of frames, a product scored on a service, sinks for the verdicts.

So far: the line file (``config.station``) and its check (``hetmm station check``); the stations'
runner, sources and sinks build on :class:`~hetmm_ray.station.check.Line`.
"""

from __future__ import annotations

from .check import Line, Station, line_problems, load_line

__all__ = ["Line", "Station", "line_problems", "load_line"]
