"""The ingress's shape (issue 10): routes are plain methods under one timing/error decorator,
nothing reads a request's private body or asks Serve's controller through private names, and
the bind the open-bind check uses is the one the application is started with."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from hetmm_ray.config import ConfigError, ServiceConfig
from hetmm_ray.serve import ingress

SOURCE = Path(ingress.__file__).read_text()
# Every route has the same shape now (issue 16's DELETE route included since the merge).
NOT_YET: set[str] = set()


def _routes() -> dict[str, ast.AsyncFunctionDef]:
    cls = next(n for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.ClassDef) and n.name == "Ingress")
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AsyncFunctionDef):
            marks = [ast.unparse(d) for d in node.decorator_list]
            if any(m.startswith("app.") for m in marks):
                out[node.name] = node
    return out


def test_routes_have_no_nested_handlers_and_share_one_decorator() -> None:
    routes = _routes()
    assert {"predict", "create", "normals", "calibrate", "rollback", "job", "products"} <= set(routes)
    nested = {
        name: [
            n.name for n in ast.walk(node) if n is not node and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for name, node in routes.items()
    }
    assert {k: v for k, v in nested.items() if v and k not in NOT_YET} == {}
    timed = {name for name, node in routes.items() if any("timed(" in ast.unparse(d) for d in node.decorator_list)}
    # untimed: liveness, the metrics themselves and the console's static page
    assert timed == set(routes) - NOT_YET - {"healthz", "metrics", "ui_redirect", "ui_index", "ui_file"}
    assert {"recent_items", "versions", "add_label", "calibration"} <= timed  # the console's routes too


def test_timed_routes_keep_the_signature_serve_and_fastapi_read() -> None:
    cls = ingress.Ingress.func_or_class
    assert list(inspect.signature(cls.predict).parameters) == ["self", "product", "request", "map"]
    assert cls.predict.__qualname__ == "Ingress.predict"  # how Serve finds a class's routes
    assert inspect.iscoroutinefunction(cls.create)


def test_no_private_serve_or_starlette_internals() -> None:
    assert "SERVE_CONTROLLER_ACTOR" not in SOURCE and "get_http_config" not in SOURCE
    attrs = {n.attr for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.Attribute)}
    assert "_body" not in attrs and "_private" not in SOURCE


def test_the_bind_comes_from_the_service_config() -> None:
    assert ServiceConfig().http_host is None
    assert ServiceConfig.from_dict({"http_host": "0.0.0.0"}).http_host == "0.0.0.0"
    with pytest.raises(ConfigError, match="http_host"):
        ServiceConfig.from_dict({"http_host": ""})
    run = Path(ingress.__file__).with_name("run.py").read_text()
    assert 'app_args["http_host"] = host' in run  # hetmm serve passes the host it starts Serve on
