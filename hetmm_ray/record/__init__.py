"""The inspection record and drift alarms.

- :mod:`.layout`: keys in the store, columns, the image policy (no I/O);
- :mod:`.writer`: :class:`InspectionRecorder`, batches written by a background thread;
- :mod:`.reader`: reads through ``pyarrow.dataset`` (imported on use: it loads pyarrow);
- :mod:`.monitor`: :class:`DriftMonitor`, sliding windows judged by ``core/drift.py``.

The service wires them together in ``serve/inspections.py``.
"""

from __future__ import annotations

from .layout import COLUMNS, keep_image
from .monitor import DriftMonitor, DriftSettings, series
from .writer import InspectionRecorder, RecordSettings

__all__ = [
    "COLUMNS",
    "DriftMonitor",
    "DriftSettings",
    "InspectionRecorder",
    "RecordSettings",
    "keep_image",
    "series",
]
