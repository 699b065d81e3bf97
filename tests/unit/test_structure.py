"""The layers of docs/design.md point down only: no import cycle, and the pure layers
never reach Ray, boto3 or the web stack.

The import graph is read from the source (every ``import``, also inside functions: a deferred
import is still a dependency), so the test sees what a run might not exercise.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "hetmm_ray"
FORBIDDEN = ("ray", "boto3", "botocore", "fastapi", "starlette")


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> tuple[set[str], set[str]]:
    """(project modules, outside top-level packages) that ``name`` imports anywhere in its source."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]) if node.level else node.module
            base = (base or "").rstrip(".")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] == "hetmm_ray":
                while t not in MODULES:  # hetmm_ray.x.name -> hetmm_ray.x
                    t = t.rsplit(".", 1)[0]
                if t != name:
                    inside.add(t)
            else:
                outside.add(t.split(".")[0])
    return inside, outside


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(GRAPH[v][0]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    # an honest walk: the edges the test relies on are there
    assert "hetmm_ray.core.atmm" in GRAPH["hetmm_ray.detection.scorer"][0]
    assert "hetmm_ray.core.device" in GRAPH["hetmm_ray.distributed.extract"][0]
    assert "ray" in GRAPH["hetmm_ray.distributed.extract"][1]


def test_no_import_cycle() -> None:
    assert _cycles() == []


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(GRAPH[m][0])
    return seen


# the single-process API: the detector and the modules it is made of
DETECTOR = sorted(m for m in MODULES if m.startswith("hetmm_ray.detection"))
PURE = sorted(m for m in MODULES if m.startswith("hetmm_ray.core")) + DETECTOR


@pytest.mark.parametrize("module", PURE)
def test_pure_layers_never_reach_ray_boto3_or_the_web(module: str) -> None:
    """Every module ``module`` can import, directly or not, also in a function: none imports Ray,
    boto3 or FastAPI/starlette."""
    bad = {m: sorted(GRAPH[m][1] & set(FORBIDDEN)) for m in _reachable(module)}
    assert {m: b for m, b in bad.items() if b} == {}


def test_importing_detector_and_core_loads_no_ray() -> None:
    code = (
        "import sys, pkgutil, importlib, hetmm_ray.core as c, hetmm_ray.detection.detector\n"
        "[importlib.import_module(i.name) for i in pkgutil.walk_packages(c.__path__, 'hetmm_ray.core.')]\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_docstrings_cite_the_shipped_spec() -> None:
    """The method's spec ships in docs/ and every citation in the code points at a real section
    (21 docstrings cited ALGORITHM.md / DESIGN.md, files not in the repository)."""
    import re

    docs = PACKAGE.parent / "docs"
    sections = set(re.findall(r"^## (\d+)\.", (docs / "algorithm.md").read_text(), flags=re.M))
    assert {"1", "2", "3", "4"} <= sections and (docs / "design.md").is_file()
    cited = 0
    for path in MODULES.values():
        text = path.read_text()
        assert not re.search(r"(?<!docs/)(ALGORITHM|DESIGN)\.md", text), path
        for group in re.findall(r"docs/algorithm\.md ((?:§\d+(?:, )?)+)", text):
            for n in re.findall(r"§(\d+)", group):
                assert n in sections, (path, n)
                cited += 1
    assert cited >= 10


def test_only_the_store_reads_raw_manifests() -> None:
    """A stored version is read outside ``store/`` through its typed record (``store.record``:
    store/manifest.py), never as the manifest dict (``store.manifest(...)``), so one parser
    decides what a manifest means (cli, registry and console indexed it by hand)."""
    raw = {
        name: sorted(
            node.lineno
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr == "manifest" and not name.startswith("hetmm_ray.store")
        )
        for name, path in MODULES.items()
    }
    assert {m: lines for m, lines in raw.items() if lines} == {}


ROOT = PACKAGE.parent
RAY_COMPAT = PACKAGE / "compat" / "ray.py"


def _private_uses(path: Path) -> list[str]:
    """``_private`` module paths in ``path``'s imports and ``_private`` attributes (``ray._private.x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        else:
            continue
        found += [f"{n} (line {node.lineno})" for n in names if "_private" in n.split(".")]
    return found


def test_private_ray_apis_only_through_compat() -> None:
    """Ray's private modules (``ray._private``, ``ray.serve._private``) are reached only in
    ``hetmm_ray/compat/ray.py``, which checks them against the supported Ray versions."""
    files = [*MODULES.values(), *sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    offenders = {str(f.relative_to(ROOT)): uses for f in files if f != RAY_COMPAT and (uses := _private_uses(f))}
    assert offenders == {}
    assert _private_uses(RAY_COMPAT) == []  # even there only by name, through importlib (the version check)


def test_ray_compat_names_the_supported_versions_when_a_symbol_moved() -> None:
    pytest.importorskip("ray")
    from hetmm_ray.compat import ray as compat

    with pytest.raises(ImportError, match=r"ray\._private\.nowhere\.thing.*supported: Ray 2\.60"):
        compat._symbol("ray._private.nowhere", "thing")
    with pytest.raises(ImportError, match="add_port_to_grpc_server_moved"):
        compat._symbol("ray.serve._private.replica", "add_port_to_grpc_server_moved")
    assert hasattr(compat.serve_replica_module(), "add_port_to_grpc_server")  # the installed Ray is supported


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default import mode keys a test module by its file name: two ``test_x.py`` in
    different folders stop the whole run at collection, but only when both are collected together."""
    seen: dict[str, list[str]] = {}
    for f in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(f.name, []).append(str(f.relative_to(REPO)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert len(seen) > 50
    assert not clashes, f"rename one of each: {clashes}"
