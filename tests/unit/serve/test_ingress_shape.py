"""The ingress's shape: routes are plain methods under one timing/error decorator,
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
# Every route has the same shape now (the DELETE route included).
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
    assert timed == set(routes) - NOT_YET - {"healthz", "metrics_page", "ui_redirect", "ui_index", "ui_file"}
    assert {"recent_items", "versions", "add_label", "calibration"} <= timed  # the console's routes too


def test_timed_routes_keep_the_signature_serve_and_fastapi_read() -> None:
    cls = ingress.Ingress.func_or_class
    assert list(inspect.signature(cls.predict).parameters) == ["self", "product", "request", "map", "map_size"]
    assert cls.predict.__qualname__ == "Ingress.predict"  # how Serve finds a class's routes
    assert inspect.iscoroutinefunction(cls.create)


def _names_used(tree: ast.AST) -> set[str]:
    """Every identifier the code uses: names, attributes and what its imports bring in."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            out.update(part for a in n.names for part in a.name.split("."))
    return out


def test_no_private_serve_or_starlette_internals() -> None:
    # Ray's private modules are fenced by tests/unit/test_structure.py (only hetmm_ray/compat/ray.py)
    used = _names_used(ast.parse(SOURCE))
    assert not used & {"SERVE_CONTROLLER_ACTOR", "get_http_config", "_body"}


def test_the_bind_comes_from_the_service_config() -> None:
    assert ServiceConfig().http_host is None
    assert ServiceConfig.from_dict({"http_host": "0.0.0.0"}).http_host == "0.0.0.0"
    with pytest.raises(ConfigError, match="http_host"):
        ServiceConfig.from_dict({"http_host": ""})
    # hetmm serve passes the host it starts Serve on: start_service sets app_args["http_host"] = host
    run = ast.parse(Path(ingress.__file__).with_name("run.py").read_text())
    start = next(n for n in ast.walk(run) if isinstance(n, ast.FunctionDef) and n.name == "start_service")
    assigned = {
        (ast.unparse(t), ast.unparse(n.value)) for n in ast.walk(start) if isinstance(n, ast.Assign) for t in n.targets
    }
    assert ("app_args['http_host']", "host") in assigned
