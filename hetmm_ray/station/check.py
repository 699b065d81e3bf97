"""Reading and checking a line file (``hetmm station check line.yaml``) without starting anything.

Exact semantics:

- :func:`line_problems` returns every problem of the file it can find, one line each, in file
  order, each naming where it is (``stations[1] 'press-2' sinks[0]: topic: ...``); an empty list
  means the file is valid. The settings are ``hetmm_ray.config.station``'s.
- Each section (the line's ``service``, a station's own settings, its ``source``, each sink, its
  ``service`` and ``queue``) is built on its own, so one section's problem never hides another's;
  inside one section the first problem is reported (the settings' own validator stops there).
- Across sections: station names are unique; every station has a service (its own or the
  line's); a folder source's folder (and ``move_to``) exist; no two stations share a queue
  folder or publish to the same MQTT topic on the same broker; product names follow the
  store's rule.
- :func:`load_line` returns the :class:`Line` or raises ``ConfigError`` whose message holds
  every problem, one per line.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError
from ..config._constraints import did_you_mean
from ..config.station import (
    SINK_KINDS,
    SOURCE_KINDS,
    STATION_SECTIONS,
    ConsoleTarget,
    FolderSource,
    MqttSink,
    QueueSettings,
    ServiceTarget,
    StationHead,
)
from ..store.base import StoreError, check_product_name

__all__ = ["Line", "Station", "line_problems", "load_line"]

LINE_KEYS = ("line", "service", "console", "stations")
HEAD_KEYS = tuple(f.name for f in fields(StationHead))


@dataclass(frozen=True)
class Station:
    """One station, every section built and checked."""

    head: StationHead
    source: Any  # one of config.station.SOURCE_KINDS' classes
    sinks: tuple[Any, ...]  # config.station.SINK_KINDS' classes
    service: ServiceTarget
    queue: QueueSettings


@dataclass(frozen=True)
class Line:
    name: str
    stations: tuple[Station, ...]
    console: ConsoleTarget | None = None  # where the stations report themselves (None: nowhere)


class _Problems:
    """Collects one line per problem; :meth:`build` builds a section or records why it cannot."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, text: str) -> None:
        self.lines.append(f"{where}: {text}")

    def build(self, where: str, cls: type[Any], data: Any) -> Any:
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            self.add(where, str(exc))
            return None


def _kind_of(problems: _Problems, where: str, data: Any, kinds: dict[str, type]) -> type | None:
    if not isinstance(data, dict):
        problems.add(where, f"expected a mapping with a kind ({', '.join(kinds)}), got {type(data).__name__}")
        return None
    kind = data.get("kind")
    if kind not in kinds:
        problems.add(where, f"kind: choose one of {', '.join(kinds)}, got {kind!r}{did_you_mean(kind, tuple(kinds))}")
        return None
    return kinds[kind]


def _station(problems: _Problems, i: int, data: Any, line_service: ServiceTarget | None) -> Station | None:
    label = f"stations[{i}]"
    if not isinstance(data, dict):
        problems.add(label, f"expected a mapping, got {type(data).__name__}")
        return None
    if isinstance(data.get("name"), str):
        label = f"{label} {data['name']!r}"
    known = (*HEAD_KEYS, *STATION_SECTIONS)
    for key in data:
        if key not in known:
            problems.add(label, f"unknown setting {key!r}{did_you_mean(key, known)}; known: {', '.join(known)}")
    head = problems.build(label, StationHead, {k: v for k, v in data.items() if k in HEAD_KEYS})
    if isinstance(data.get("product"), str) and data["product"]:
        try:
            check_product_name(data["product"])
        except StoreError as exc:
            problems.add(label, f"product: {exc}")

    source = None
    if "source" not in data:
        problems.add(label, "source: missing (folder, aravis or mqtt)")
    else:
        cls = _kind_of(problems, f"{label} source", data["source"], SOURCE_KINDS)
        source = None if cls is None else problems.build(f"{label} source", cls, data["source"])

    sinks_data = data.get("sinks")
    sinks: list[Any] | None = []
    if not isinstance(sinks_data, list) or not sinks_data:
        problems.add(label, "sinks: give a list of at least one sink (mqtt, opcua, webhook or log)")
        sinks = None
    else:
        for j, sink_data in enumerate(sinks_data):
            cls = _kind_of(problems, f"{label} sinks[{j}]", sink_data, SINK_KINDS)
            sink = None if cls is None else problems.build(f"{label} sinks[{j}]", cls, sink_data)
            if sink is None:
                sinks = None
            elif sinks is not None:
                sinks.append(sink)

    service = line_service
    if "service" in data:
        service = problems.build(f"{label} service", ServiceTarget, data["service"])
    elif line_service is None:
        problems.add(label, "service: none here and none for the line (grpc, http or in_process)")
    queue = problems.build(f"{label} queue", QueueSettings, data.get("queue") or {})

    if head is None or source is None or sinks is None or service is None or queue is None:
        return None
    return Station(head=head, source=source, sinks=tuple(sinks), service=service, queue=queue)


def _across(problems: _Problems, stations: list[Station], base: Path) -> None:
    """The rules between sections and stations, and the folders a source reads."""
    queues: dict[Path, str] = {}
    topics: dict[tuple[str, str], str] = {}
    for st in stations:
        name = st.head.name
        label = f"station {name!r}"
        if isinstance(st.source, FolderSource):
            for key in ("path", "move_to"):
                value = getattr(st.source, key)
                if value is not None and not (base / value).is_dir():
                    problems.add(f"{label} source", f"{key}: no such folder {str(base / value)!r}")
        queue = (base / (st.queue.path or f".hetmm-queue/{name}")).resolve()
        if queue in queues:
            problems.add(f"{label} queue", f"path: {str(queue)!r} is also station {queues[queue]!r}'s queue")
        queues[queue] = name
        for sink in st.sinks:
            if isinstance(sink, MqttSink):
                topic = (sink.broker, sink.topic)
                if topic in topics and topics[topic] != name:
                    owner = topics[topic]
                    problems.add(label, f"sinks: topic {sink.topic!r} on {sink.broker} is station {owner!r}'s too")
                topics.setdefault(topic, name)


def _read(path: Path, problems: _Problems) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        problems.add("file", exc.strerror or type(exc).__name__)
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "file"
        problems.add(where, f"not valid YAML ({getattr(exc, 'problem', None) or exc})")
        return None


def _line(path: str | Path) -> tuple[Line | None, list[str]]:
    path = Path(path)
    problems = _Problems()
    data = _read(path, problems)
    if problems.lines:
        return None, problems.lines
    if not isinstance(data, dict):
        return None, [f"file: expected a mapping with {', '.join(LINE_KEYS)}, got {type(data).__name__}"]
    for key in data:
        if key not in LINE_KEYS:
            problems.add(str(key), f"unknown setting{did_you_mean(key, LINE_KEYS)}; known: {', '.join(LINE_KEYS)}")
    line_service = None
    if data.get("service") is not None:
        line_service = problems.build("service", ServiceTarget, data["service"])
    console = None
    if data.get("console") is not None:
        console = problems.build("console", ConsoleTarget, data["console"])
    elif line_service is not None and line_service.http is not None:
        console = ConsoleTarget(url=line_service.http)
    raw = data.get("stations")
    if not isinstance(raw, list) or not raw:
        problems.add("stations", "give a list of at least one station")
        raw = []
    stations = [st for i, item in enumerate(raw) if (st := _station(problems, i, item, line_service)) is not None]
    names: list[str] = [item["name"] for item in raw if isinstance(item, dict) and isinstance(item.get("name"), str)]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.add(f"station {name!r}", f"name: {names.count(name)} stations of this line have it")
    _across(problems, stations, path.parent)
    line = data.get("line")
    if line is not None and not isinstance(line, str):
        problems.add("line", f"must be a name, got {line!r}")
    if problems.lines:
        return None, problems.lines
    return Line(name=line or path.stem, stations=tuple(stations), console=console), []


def line_problems(path: str | Path) -> list[str]:
    """Every problem of the line file at ``path``, one line each (empty: valid)."""
    return _line(path)[1]


def load_line(path: str | Path) -> Line:
    """The line file at ``path``, checked; ``ConfigError`` with every problem, one per line."""
    line, problems = _line(path)
    if line is None:
        raise ConfigError(f"{path}: {len(problems)} problem(s)\n" + "\n".join(problems))
    return line
