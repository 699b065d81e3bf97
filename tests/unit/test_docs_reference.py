"""The generated reference pages (hetmm_ray/reference.py) against the code they are generated from.

Every setting of every settings class in ``hetmm_ray/config/`` has a description and a row in the
configuration reference, with its default as the class itself holds it; every route the HTTP app
serves is in the HTTP reference; every stable error code the project answers is in the error
reference with its cause and what to do; every gRPC method, message and field of the compiled
descriptor is in the gRPC reference. Each side is read independently of the generator (the app's
routes, not its schema; the descriptor, not the ``.proto``'s text; a scan of the package's source).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
import re

import pytest
from helpers import REPO

import hetmm_ray.config as config_package
from hetmm_ray import reference
from hetmm_ray.config._constraints import ConfigError, Settings, spec_of
from hetmm_ray.errors import ERROR_HELP, ERRORS


def _settings_classes() -> list[type]:
    """Every settings class defined in hetmm_ray/config/, found by walking its modules."""
    found = []
    for info in pkgutil.iter_modules(config_package.__path__, "hetmm_ray.config."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Settings) and cls is not Settings and cls.__module__ == module.__name__:
                found.append(cls)
    return found


CLASSES = _settings_classes()
LISTED = [cls for _, _, _, cls in reference.CONFIG_SECTIONS]


def _leaf_fields(cls: type) -> list[dataclasses.Field]:
    return [
        f
        for f in dataclasses.fields(cls)
        if not (isinstance(f.default_factory, type) and issubclass(f.default_factory, Settings))
    ]


def test_the_walk_finds_the_settings() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"BackboneConfig", "DetectorConfig", "ServiceConfig", "ReplicaSettings", "StationHead", "MqttLogin"} <= names
    assert len(CLASSES) >= 19


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_setting_has_a_description(cls: type) -> None:
    missing = [f.name for f in _leaf_fields(cls) if len(spec_of(f).description.strip()) < 10]
    assert missing == [], f"{cls.__name__}: give these settings a description=: {missing}"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_settings_class_is_in_the_reference(cls: type) -> None:
    """Listed itself, or (a base such as MqttLogin) through every class that inherits its fields."""
    assert cls in LISTED or any(issubclass(listed, cls) for listed in LISTED), cls.__name__


def test_the_reference_has_every_setting_with_its_default() -> None:
    rows = reference.config_rows()
    text = reference.config_reference()
    expected = [(prefix + f.name, cls) for _, _, prefix, cls in reference.CONFIG_SECTIONS for f in _leaf_fields(cls)]
    assert [r.key for r in rows] == [key for key, _ in expected]
    for row, (_, cls) in zip(rows, expected, strict=True):
        name = row.key.rsplit(".", 1)[-1]
        try:
            value = getattr(cls(), name)  # the slow, obvious default: what a default instance holds
        except ConfigError:  # a class whose defaults alone are refused (a line's service: give one target)
            f = next(f for f in dataclasses.fields(cls) if f.name == name)
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert json.loads(row.default) == json.loads(json.dumps(value)), row.key
        assert row.description and reference._cell(row.description) in text, row.key
        assert re.search(rf"^\| `{re.escape(row.key)}` \| `", text, flags=re.M), row.key


def test_the_reference_states_each_range_and_choice() -> None:
    rows = {r.key: r for r in reference.config_rows()}
    assert rows["backbone.image_size"].default == "256"
    assert rows["backbone.image_size"].allowed == "integer in [32, 2048]"
    assert rows["templates.sheets"].allowed == 'integer in [1, 100000] or "auto"'
    assert rows["threshold.rule"].allowed == "one of `far`, `sigmas`, `validation`"
    assert rows["scoring.forward_windows"].allowed.startswith("a list; each odd")
    assert rows["user_config.sigmas"].allowed.endswith("; or null")
    assert rows["device"].run_time and not rows["bank_dtype"].run_time


# --- HTTP ------------------------------------------------------------------------------------------
def _walk(routes: list) -> list:
    """The routes of ``routes``, the routers Serve's ingress included into the app followed."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None) or getattr(r, "app", None)
        out += _walk(inner.routes) if hasattr(inner, "routes") and not hasattr(r, "methods") else [r]
    return out


def _app_routes() -> tuple[set[tuple[str, str]], set[str]]:
    """(METHOD, path) of every route the FastAPI app serves, read from the app, not its schema; and the
    paths of the framework's own documentation routes (``/openapi.json``, ``/docs``...)."""
    from fastapi.routing import APIRoute

    from hetmm_ray.serve.ingress import app

    routes = _walk(app.routes)
    api = {(m, r.path) for r in routes if isinstance(r, APIRoute) for m in r.methods if m != "HEAD"}
    return api, {r.path for r in routes if not isinstance(r, APIRoute)}


def test_the_http_reference_lists_every_route_the_app_serves() -> None:
    routes, framework = _app_routes()
    assert ("POST", "/v1/products/{product}/predict") in routes and len(routes) >= 30
    assert "/openapi.json" in framework
    text = reference.http_reference()
    listed = set(re.findall(r"^## `([A-Z]+) (\S+)`$", text, flags=re.M))
    assert listed == routes
    for path in framework:
        assert f"`{path}`" in text, path
    assert set(reference.ROUTE_NOTES) <= routes, "notes for routes the app does not serve"
    for method, path in routes:  # every route says something
        section = text.split(f"## `{method} {path}`\n", 1)[1].split("\n## ", 1)[0]
        assert len(section.strip()) > 5, (method, path)


def test_the_http_reference_shows_parameters() -> None:
    text = reference.http_reference()
    predict = text.split("## `POST /v1/products/{product}/predict`\n", 1)[1].split("\n## ", 1)[0]
    assert "| `map_size` | query |" in predict and "| `product` | path | string | yes |" in predict


# --- errors ----------------------------------------------------------------------------------------
def _answered_codes() -> set[str]:
    """Every stable code in ERRORS and in the package's refusals (``Refused(<status>, "<code>"`` and
    ``"code": "<code>"`` literals), scanned from the source."""
    codes = {code for _, code in ERRORS.values()}
    for path in (REPO / "hetmm_ray").rglob("*.py"):
        text = path.read_text()
        codes |= set(re.findall(r"Refused\(\s*\d{3}\s*,\s*\"([a-z_]+)\"", text))
        codes |= set(re.findall(r"\"code\": \"([a-z_]+)\"", text))
    return codes


def test_every_error_code_is_in_the_error_reference_with_its_cause_and_remedy() -> None:
    codes = _answered_codes()
    assert {"bad_config", "too_large", "cross_origin", "body_timeout", "unknown_product"} <= codes
    text = reference.error_reference()
    for code in codes:
        assert code in ERROR_HELP, f"add {code!r} to errors.ERROR_HELP (cause, what to do)"
        cause, todo = ERROR_HELP[code]
        assert cause.strip() and todo.strip(), code
        assert re.search(rf"^\| `{code}` \| [\d, x]+ \|", text, flags=re.M), code
    assert set(ERROR_HELP) <= codes | {"method_not_allowed", "http_error"}, "help for codes nothing answers"


# --- gRPC ------------------------------------------------------------------------------------------
def test_the_grpc_reference_has_every_method_message_and_field() -> None:
    from hetmm_ray.serve.grpc import inspection_pb2 as pb

    text = reference.grpc_reference()
    service = pb.DESCRIPTOR.services_by_name["Inspection"]
    for method in service.methods:
        row = f"| `{method.name}` | `{method.input_type.name}` | `{method.output_type.name}` |"
        assert row in text, method.name
    for name, message in pb.DESCRIPTOR.message_types_by_name.items():
        assert f"### `{name}`" in text, name
        section = text.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        for field in message.fields:
            assert f"| {field.number} | `{field.name}` |" in section, (name, field.name)
