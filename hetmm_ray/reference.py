"""The generated reference pages of the documentation site, each from its one source.

Exact semantics:

- :func:`config_rows` lists every setting of the settings classes in :data:`CONFIG_SECTIONS`
  (``hetmm_ray/config/``), each as a :class:`SettingRow`: its dotted name, its default, what is
  allowed (read from the constraints declared on the field) and its description (declared on the
  field too, ``setting(..., description=...)``). Nested settings sections are followed, so a
  section's settings are listed under its own heading. :func:`config_reference` renders them.
- :func:`http_routes` lists ``(METHOD, path)`` of every route in an OpenAPI schema, by default the
  HTTP service's own (``hetmm_ray.serve.ingress.app.openapi()``: built from the FastAPI app without
  starting Ray). :func:`http_reference` renders each route with its parameters, the notes below
  (:data:`ROUTE_NOTES`, what a user needs beyond the schema) or the route's own description.
- :func:`grpc_reference` renders ``hetmm.v1.Inspection`` from its ``.proto`` (methods and their
  comments, every message's fields) and the status mapping ``errors.GRPC_CODES``.
- :func:`error_reference` renders every stable error code (:func:`error_codes`: the codes of
  ``errors.ERRORS`` and every refusal the package makes) with its HTTP status, gRPC status, cause
  and what to do (``errors.ERROR_HELP``).
- :func:`pages` maps each generated page's path below ``docs/`` to its Markdown; the MkDocs hook
  ``docs/hooks/reference.py`` adds them to the site at build time.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from .config import _constraints as constraints
from .config import limits
from .config.detector import DetectorConfig
from .config.product import BackboneConfig, GeometryConfig, ScoringConfig, TemplateConfig, ThresholdConfig
from .config.replica import ReplicaSettings
from .config.service import ServiceConfig
from .config.station import (
    AravisSource,
    ConsoleTarget,
    FolderSource,
    LogSink,
    MqttSink,
    MqttSource,
    OpcUaSink,
    QueueSettings,
    ServiceTarget,
    StationHead,
    WebhookSink,
)
from .errors import ERROR_HELP, ERRORS, GRPC_CODES

__all__ = [
    "CONFIG_SECTIONS",
    "ROUTE_NOTES",
    "SettingRow",
    "config_reference",
    "config_rows",
    "error_codes",
    "error_reference",
    "grpc_reference",
    "http_reference",
    "http_routes",
    "pages",
]

PACKAGE = Path(__file__).resolve().parent
PROTO = PACKAGE / "serve" / "grpc" / "inspection.proto"

# (heading, where it is written, the prefix of its settings' names, the class). Nested sections of a
# class are listed under their own heading, so DetectorConfig's entry lists its top-level settings only.
CONFIG_SECTIONS: tuple[tuple[str, str, str, type], ...] = (
    ("Backbone", "product config file, `--set backbone.NAME=VALUE`", "backbone.", BackboneConfig),
    ("Scoring (ATMM)", "product config file, `--set scoring.NAME=VALUE`", "scoring.", ScoringConfig),
    ("Templates", "product config file, `--set templates.NAME=VALUE`", "templates.", TemplateConfig),
    ("Threshold", "product config file, `--set threshold.NAME=VALUE`", "threshold.", ThresholdConfig),
    ("Tiles (geometry)", "product config file, `--set geometry.NAME=VALUE`", "geometry.", GeometryConfig),
    ("Product and run (top level)", "product config file, `--set NAME=VALUE`", "", DetectorConfig),
    ("Service", "`deploy.yaml` application `args`, `hetmm serve` flags", "service.", ServiceConfig),
    ("Detector replicas", "`deploy.yaml` Detector `user_config` (live, no restart)", "user_config.", ReplicaSettings),
    ("Station", "line file, each entry of `stations`", "stations[].", StationHead),
    ("Scoring service of a line", "line file `service`, or a station's own `service`", "service.", ServiceTarget),
    ("Console of a line", "line file `console`", "console.", ConsoleTarget),
    ("Part queue", "line file, a station's `queue`", "queue.", QueueSettings),
    ("Source: folder", "line file, a station's `source` with `kind: folder`", "source.", FolderSource),
    ("Source: camera (Aravis)", "line file, a station's `source` with `kind: aravis`", "source.", AravisSource),
    ("Source: MQTT trigger", "line file, a station's `source` with `kind: mqtt`", "source.", MqttSource),
    ("Sink: MQTT", "line file, an entry of a station's `sinks` with `kind: mqtt`", "sinks[].", MqttSink),
    ("Sink: OPC UA", "line file, an entry of a station's `sinks` with `kind: opcua`", "sinks[].", OpcUaSink),
    ("Sink: webhook", "line file, an entry of a station's `sinks` with `kind: webhook`", "sinks[].", WebhookSink),
    ("Sink: log file", "line file, an entry of a station's `sinks` with `kind: log`", "sinks[].", LogSink),
)


@dataclass(frozen=True)
class SettingRow:
    """One setting as the configuration reference shows it."""

    section: str
    key: str  # the dotted name (``backbone.image_size``, ``service.max_body_mib``)
    default: str  # as JSON
    allowed: str
    description: str
    run_time: bool


def _is_section(f: dataclasses.Field[Any]) -> bool:
    return isinstance(f.default_factory, type) and issubclass(f.default_factory, constraints.Settings)


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not MISSING:
        value = f.default
    else:
        assert f.default_factory is not MISSING, f"{f.name}: every setting has a default"
        value = f.default_factory()
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def _allowed(f: dataclasses.Field[Any], hint: Any) -> str:
    spec = constraints.spec_of(f)
    parts: list[str] = []
    for check in spec.checks:
        if isinstance(check, constraints.Range):
            text = f"{'integer' if check.kind is int else 'number'} in [{check.lo:g}, {check.hi:g}]"
            parts.append(text + "".join(f' or "{a}"' for a in check.also))
        elif isinstance(check, constraints.OneOf):
            parts.append("one of " + ", ".join(f"`{c}`" for c in check.choices))
        elif isinstance(check, constraints.Odd):
            parts.append("odd")
        else:
            parts.append(check.text)
    if not parts:
        name = getattr(hint, "__name__", str(hint))
        parts.append({"bool": "true or false", "str": "text", "dict": "a mapping"}.get(name, name))
    text = ", ".join(parts)
    if spec.many:
        text = f"a list; each {text}" if any(c.per_element for c in spec.checks) else f"a list: {text}"
    if spec.nullable:
        text += "; or null"
    return text


def _rows(section: str, prefix: str, cls: type) -> Iterator[SettingRow]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if _is_section(f):
            continue  # listed under its own heading
        spec = constraints.spec_of(f)
        hint = typing.get_origin(hints[f.name]) or hints[f.name]
        yield SettingRow(section, prefix + f.name, _default(f), _allowed(f, hint), spec.description, spec.run_time)


def config_rows() -> list[SettingRow]:
    """Every setting of every class in :data:`CONFIG_SECTIONS`, in declaration order."""
    return [row for title, _, prefix, cls in CONFIG_SECTIONS for row in _rows(title, prefix, cls)]


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: pipes escaped, one line, ``<`` and ``>`` outside code spans
    as entities (``test/<type>`` is text, not an HTML tag)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def config_reference() -> str:
    """The configuration reference page (Markdown)."""
    out = [
        "# Configuration reference",
        "",
        "Generated from `hetmm_ray/config/`: every setting with its default, what it accepts and what it",
        "means, each declared once, on its field. A value outside what is allowed is refused with a",
        "message that names the setting (CLI: exit status 2; HTTP: 400 `bad_config`); unknown names are",
        "refused with the closest known one. Numbers must be finite (no NaN, no Infinity), booleans are",
        "never numbers, and list settings are checked element by element.",
        "",
        "- **A product's settings** go in a JSON or YAML file given with `--config FILE` (partial files",
        "  fill in defaults), or one at a time with `--set dotted.name=VALUE`; over HTTP, in a create",
        "  request's `config`. They are stored with every version of the product, except the *run-time*",
        "  settings (marked below), which change how fast a product is computed, never what it is.",
        "- **The service's settings** are the `args` of the application in `deploy.yaml`, named",
        "  `service.NAME` in messages; the detector replicas' live settings are its `user_config`.",
        "- **A line file's settings** (`hetmm station check line.yaml`) are listed per section.",
        "",
    ]
    rows = config_rows()
    for title, where, _, _ in CONFIG_SECTIONS:
        out += [
            f"## {title}",
            "",
            f"Where: {where}.",
            "",
            "| setting | default | allowed | meaning |",
            "|---|---|---|---|",
        ]
        for row in rows:
            if row.section == title:
                meaning = row.description + (" *(run-time)*" if row.run_time else "")
                out.append(f"| `{row.key}` | `{_cell(row.default)}` | {_cell(row.allowed)} | {_cell(meaning)} |")
        out.append("")
    out += [
        "## Input limits",
        "",
        "Checked before any pixel is decoded (`hetmm_ray/config/limits.py`), on every surface:",
        "",
        "| limit | value |",
        "|---|---|",
        f"| largest encoded image | {limits.MAX_IMAGE_BYTES // 2**20} MiB |",
        f"| largest declared size (width x height) | {limits.MAX_IMAGE_PIXELS:,} pixels |",
        f"| smallest side | {limits.MIN_IMAGE_SIDE} px |",
        f"| image files read from folders | {', '.join(f'`{s}`' for s in limits.IMAGE_SUFFIXES)} |",
        "",
        "Grayscale, palette, 16-bit and CMYK images are converted to RGB; alpha is composited onto black.",
        "",
    ]
    return "\n".join(out)


# --- HTTP ------------------------------------------------------------------------------------------
ADMIN = "**Admin** (needs `Authorization: Bearer <token>` when the service has a token). "
ROUTE_NOTES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "Liveness.",
    ("GET", "/metrics"): (
        "Prometheus text: requests by route and status (gRPC calls as routes `grpc_*`), latency histogram, batch "
        "sizes, template versions, images and anomalies per product, verdicts, drift gauges and the inspection "
        "record's counters."
    ),
    ("GET", "/v1/products"): (
        "Every product with its head version, selection, sheets, backbone, threshold, `threshold_rule`, "
        "`rule_target`, `estimated_false_alarm_rate`, `region` (true when it has one), `tiles` and "
        "`threshold_warning` (null, or why the threshold may flag few defects)."
    ),
    ("GET", "/v1/products/{product}"): (
        'The head\'s stored settings: `{"product", "version", "config", "region", "tiles", "tile_overlap"}`.'
    ),
    ("POST", "/v1/products/{product}/predict"): (
        "Score images: a raw image body (`image/png`, `image/jpeg`, `image/bmp`, `image/tiff`) or "
        "`multipart/form-data` with several. Each result has `score`, `threshold`, `is_anomaly`, `verdict`, "
        "`threshold_rule`, `rule_target`, `estimated_false_alarm_rate`, `version`, `timing` (ms) and "
        "`heatmap_scale`; `?map=png` adds a base64 heat-map overlay, `&map_size=N` bounds its long side."
    ),
    ("POST", "/v1/products/{product}"): ADMIN
    + (
        "Create a product from good images: multipart uploads (optional fields `config`, `region`, `tiles`, "
        '`min_defect_px`) or JSON `{"source": "folder or s3://...", "config": {...}}`. Answers 202 with a job; '
        "`?wait=true` waits for it."
    ),
    ("DELETE", "/v1/products/{product}"): ADMIN + "Delete the product and every version from the store.",
    ("PUT", "/v1/products/{product}/region"): ADMIN
    + (
        'Another inspection region: `{"region": {"size": [h, w], "include": [...], "exclude": [...]}}` '
        '(`{"region": null}`: every pixel counts); a job recalibrating the head under it.'
    ),
    ("POST", "/v1/products/{product}/region/preview"): ADMIN
    + "The same body as the `PUT`: a job computing the head's out-of-fold scores under the region, publishing nothing.",
    ("POST", "/v1/products/{product}/normals"): ADMIN
    + "Hot update with more good images (a job). `?publish=candidate` stores it as a candidate.",
    ("POST", "/v1/products/{product}/calibrate"): ADMIN
    + (
        "Labelled validation (multipart files named `good` / `defective`, or a `source`), or "
        '`{"rule": "far", "false_alarm_rate": r}`: the far rule at another rate. A job storing a new version.'
    ),
    ("POST", "/v1/products/{product}/rollback"): ADMIN
    + '`{"version": n}` makes a kept version head again (recorded as a move).',
    ("GET", "/v1/products/{product}/candidates"): "The product's candidate versions beside its head.",
    ("POST", "/v1/products/{product}/versions/{version}/promote"): ADMIN
    + 'Make candidate `version` head; optional `{"expect_head": n}` (409 unless the head is still `n`).',
    ("POST", "/v1/products/{product}/versions/{version}/discard"): ADMIN
    + "Drop candidate `version`; the head does not move.",
    ("POST", "/v1/products/{product}/versions/{version}/compare"): ADMIN
    + "A job scoring a set with the head (or `base`) and `version` side by side: verdict flips and score shift.",
    ("GET", "/v1/jobs/{job_id}"): ADMIN + "A job's state and progress (`stage`, `done` / `total`).",
    ("GET", "/ui"): "Redirects to the console.",
    ("GET", "/ui/"): "The inspection console (one page, nothing loaded from the network).",
    ("GET", "/ui/{name}"): "The console's static files.",
    ("GET", "/v1/recent"): "Recent predictions counted per product (the console).",
    ("GET", "/v1/products/{product}/recent"): "The product's recent predictions, newest first (`?flagged=true`).",
    ("GET", "/v1/products/{product}/recent/{item_id}/image"): "A recent prediction's image.",
    ("GET", "/v1/products/{product}/recent/{item_id}/heatmap.png"): "A recent prediction's heat-map.",
    ("GET", "/v1/products/{product}/versions"): "Versions, moves (rollbacks) and their merged time line.",
    ("GET", "/v1/products/{product}/labels"): "The product's labelled images (the console's Teach).",
    ("POST", "/v1/products/{product}/labels"): ADMIN + "Label a raw image body `?label=good|defective`.",
    ("GET", "/v1/products/{product}/labels/{label_id}/image"): "A labelled image.",
    ("DELETE", "/v1/products/{product}/labels/{label_id}"): ADMIN + "Delete a label.",
    ("GET", "/v1/products/{product}/calibration"): (
        "The calibration view's data: out-of-fold good scores, labelled scores, the threshold; "
        "`?false_alarm_rate=r` previews the rules at that rate."
    ),
    ("PUT", "/v1/stations/{line}/{station}"): ADMIN
    + "A station's report of itself (`hetmm station run` sends it); a bad field is 400 `bad_station_report`.",
    ("GET", "/v1/stations"): "Every station's last report, by line then name, with `seen_s` and `silent`.",
    ("GET", "/v1/products/{product}/drift"): (
        "The drift chart's data: flagged share over time with the expected band and the live windows "
        "(`?hours=24&buckets=96`)."
    ),
}


def _schema() -> dict[str, Any]:
    from .serve.ingress import app  # FastAPI and Ray Serve imported, no Ray started

    return app.openapi()


def http_routes(schema: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """``(METHOD, path)`` of every operation in ``schema`` (default: the service's own), in its order."""
    schema = _schema() if schema is None else schema
    return [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]


def _rst(text: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))


def _param_type(param: dict[str, Any]) -> str:
    schema = param.get("schema", {})
    kinds = [s.get("type", "") for s in schema.get("anyOf", [schema])]
    return " or ".join(k for k in kinds if k) or "any"


def http_reference(schema: dict[str, Any] | None = None) -> str:
    """The HTTP API reference page (Markdown), from the OpenAPI schema."""
    schema = _schema() if schema is None else schema
    out = [
        "# HTTP API reference",
        "",
        f"Generated from the service's own OpenAPI schema ({schema['info']['title']}, "
        f"{len(http_routes(schema))} operations). The guide to the service (starting it, tokens, limits,",
        "examples) is [The HTTP service](../service.md); every error code is in [Error codes](errors.md).",
        "",
        'Every client mistake is a 4xx with `{"error": {"code": "...", "message": "..."}}`. Responses never',
        "contain NaN or Infinity (a non-finite number is written as `null`). The service also serves this",
        "schema itself, at `/openapi.json`, with the web framework's viewers at `/docs` (and",
        "`/docs/oauth2-redirect`) and `/redoc`.",
        "",
    ]
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            key = (method.upper(), path)
            out += [f"## `{key[0]} {path}`", ""]
            note = ROUTE_NOTES.get(key) or _rst(op.get("description") or op.get("summary") or "")
            out += [note, ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | default |", "|---|---|---|---|---|"]
                for p in params:
                    default = p.get("schema", {}).get("default", "")
                    shown = f"`{json.dumps(default)}`" if default != "" else ""
                    required = "yes" if p.get("required") else "no"
                    out.append(f"| `{p['name']}` | {p['in']} | {_param_type(p)} | {required} | {shown} |")
                out.append("")
    return "\n".join(out)


# --- gRPC ------------------------------------------------------------------------------------------
_RPC = re.compile(r"^\s*rpc (\w+)\((\w+)\) returns \((\w+)\);")
_FIELD = re.compile(r"^\s*(optional |repeated )?([\w.]+) (\w+) = (\d+);\s*(?://\s*(.*))?$")


def grpc_reference() -> str:
    """The gRPC reference page (Markdown), from ``inspection.proto`` and ``errors.GRPC_CODES``."""
    lines = PROTO.read_text().splitlines()
    package = next(m[1] for line in lines if (m := re.match(r"package ([\w.]+);", line)))
    service = next(m[1] for line in lines if (m := re.match(r"service (\w+) \{", line)))
    out = [
        "# gRPC reference",
        "",
        f"Generated from `hetmm_ray/serve/grpc/inspection.proto`: the service `{package}.{service}`. Send the",
        "metadata `application: hetmm-grpc` and, for `Predict`, `multiplexed_model_id: <product>` (Ray Serve",
        "routes by them); a threshold override needs `authorization: Bearer <token>` when a token is set.",
        "The limits and checks are the HTTP service's; admin operations stay on HTTP.",
        "",
        "## Methods",
        "",
        "| method | request | reply | what |",
        "|---|---|---|---|",
    ]
    comment: list[str] = []
    messages: list[tuple[str, str, list[str]]] = []
    current: tuple[str, str, list[str]] | None = None
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("//"):
            comment.append(stripped[2:].strip())  # the comment above the next declaration
            continue
        if m := _RPC.match(line):
            out.append(f"| `{m[1]}` | `{m[2]}` | `{m[3]}` | {_cell(' '.join(comment))} |")
        elif m := re.match(r"message (\w+) \{", stripped):
            current = (m[1], " ".join(comment), [])
            messages.append(current)
        elif current is not None and (m := _FIELD.match(line)):
            kind = f"{(m[1] or '').strip()} {m[2]}".strip()
            current[2].append(f"| {m[4]} | `{m[3]}` | `{kind}` | {_cell(m[5] or '')} |")
        elif stripped == "}":
            current = None
        comment = []
    out.append("")
    out += ["## Messages", ""]
    for name, about, fields in messages:
        out += [f"### `{name}`", ""]
        if about:
            out += [about, ""]
        if fields:
            out += ["| # | field | type | meaning |", "|---|---|---|---|", *fields, ""]
    out += [
        "## Status codes",
        "",
        "Every error maps from its HTTP status (`errors.GRPC_CODES`); the details are `<code>: <message>`",
        "with the stable code of [Error codes](errors.md).",
        "",
        "| HTTP | gRPC status | e.g. |",
        "|---|---|---|",
    ]
    by_status: dict[int, list[str]] = {}
    for code, statuses in error_codes().items():
        for status in statuses:
            by_status.setdefault(status, []).append(code)
    for status, name in GRPC_CODES.items():
        examples = ", ".join(f"`{c}`" for c in sorted(by_status.get(status, ())))
        out.append(f"| {status} | {name} | {examples} |")
    out.append("")
    return "\n".join(out)


# --- errors ----------------------------------------------------------------------------------------
_REFUSAL = re.compile(r"Refused\(\s*(\d{3})\s*,\s*\"([a-z_]+)\"", re.S)
# Refusals made without a literal ``Refused(status, "code"``: the web framework's own answers
# (serve/answers.py) and the cross-origin guard's response (serve/security.py).
_OTHER_REFUSALS: dict[str, set[int]] = {
    "not_found": {404},
    "method_not_allowed": {405},
    "http_error": set(),
    "cross_origin": {403},
}


def error_codes() -> dict[str, set[int]]:
    """Every stable code the project answers -> its HTTP statuses: ``errors.ERRORS``' codes and the
    refusals written in the package (``Refused(<status>, "<code>", ...)``)."""
    codes: dict[str, set[int]] = {}
    for status, code in ERRORS.values():
        codes.setdefault(code, set()).add(status)
    for path in sorted(PACKAGE.rglob("*.py")):
        for status, code in _REFUSAL.findall(path.read_text()):
            codes.setdefault(code, set()).add(int(status))
    for code, statuses in _OTHER_REFUSALS.items():
        codes.setdefault(code, set()).update(statuses)
    return codes


def error_reference() -> str:
    """The error code reference page (Markdown), from ``hetmm_ray/errors.py``."""
    out = [
        "# Error codes",
        "",
        "Generated from the one error taxonomy, `hetmm_ray/errors.py`. Every expected failure has a stable",
        "code and an HTTP status. The CLI prints `hetmm: error: <one line>` and exits with status 2; HTTP",
        'answers the status with `{"error": {"code": "...", "message": "..."}}`; gRPC answers the status',
        "code below with the details `<code>: <message>`. An admin request that waited for its job",
        "(`?wait=true`) answers a failed job the same way, with the job beside the error",
        '(`{"error": ..., "job": ...}`).',
        "",
        "| code | HTTP | gRPC | cause | what to do |",
        "|---|---|---|---|---|",
    ]
    for code, statuses in sorted(error_codes().items()):
        cause, todo = ERROR_HELP.get(code, ("", ""))
        http = ", ".join(str(s) for s in sorted(statuses)) or "4xx"
        grpc = ", ".join(sorted({GRPC_CODES.get(s, "INTERNAL") for s in statuses})) or ""
        out.append(f"| `{code}` | {http} | {grpc} | {_cell(cause)} | {_cell(todo)} |")
    out += [
        "",
        "A malformed HTTP head (e.g. `Content-Length: abc`) is answered by Ray Serve's HTTP server before the",
        "application sees it: a plain-text 400. A client that disconnects mid-body is counted as 499.",
        "",
    ]
    return "\n".join(out)


def pages() -> dict[str, str]:
    """Generated page path (below ``docs/``) -> Markdown."""
    return {
        "reference/configuration.md": config_reference(),
        "reference/http.md": http_reference(),
        "reference/grpc.md": grpc_reference(),
        "reference/errors.md": error_reference(),
    }
