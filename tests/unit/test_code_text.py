"""The package's comments and docstrings say what the code does, not when it changed: none names an
issue, a session or the retired BENCHMARKS.md (history is git's, figures are docs/performance.md's).

An upstream bug a workaround answers is cited as ``owner/repo#N``, which names whose issue it is.

Comments are read with ``tokenize`` and docstrings with ``ast`` (module, class and function
docstrings), so string literals the code uses (error messages, data) are not judged here; the
console's JavaScript is read line by line for its ``//`` comments.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "hetmm_ray"
GENERATED = ("_pb2.py", "_pb2_grpc.py")
# "issue 23", "issue #23", "issues 14 and 23", "session 16", "#23" (a bare tracker reference)
HISTORY = re.compile(r"\bissues? ?#?\d+|\bsessions? ?#?\d+|(?<![\w&])#\d{2,}\b|BENCHMARKS\.md", re.IGNORECASE)
JS_COMMENT = re.compile(r"(?:^|\s)//(.*)")


def _python_files() -> list[Path]:
    return [f for f in sorted(PACKAGE.rglob("*.py")) if not f.name.endswith(GENERATED)]


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of one Python file."""
    source = path.read_text()
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def _history(texts: list[tuple[int, str]]) -> list[str]:
    return [f"line {line}: {m.group(0)!r}" for line, text in texts for m in HISTORY.finditer(text)]


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_history_in_python_comments_or_docstrings(path: Path) -> None:
    found = _history(_texts(path))
    assert not found, f"{path.relative_to(REPO)}: comments/docstrings name history: {found}"


def test_no_history_in_console_script_comments() -> None:
    scripts = sorted((PACKAGE / "serve" / "static").rglob("*.js"))
    assert scripts, "the console's scripts moved: update this test"
    found = []
    for script in scripts:
        for n, line in enumerate(script.read_text().splitlines(), 1):
            comment = JS_COMMENT.search(line)  # after a blank or at the start: not the // of https://
            if comment:
                found += [f"{script.name} line {n}: {m.group(0)!r}" for m in HISTORY.finditer(comment.group(1))]
    assert not found, f"console comments name history: {found}"


@pytest.mark.parametrize(
    "text",
    [
        "# the review band (issue 23): a verdict of three",
        "# BENCHMARKS.md, session 16",
        '"""Stations on a line (Issue #39)."""',
        "# see #40 for the numbers",
        "# Ray Serve issues 48741 and #65691",
    ],
)
def test_the_check_finds_history(text: str, tmp_path: Path) -> None:
    """The pattern catches each way history was written, in a comment or a docstring."""
    f = tmp_path / "m.py"
    f.write_text(text + "\nx = 1\n")
    assert _history(_texts(f))


def test_the_check_leaves_contracts_alone(tmp_path: Path) -> None:
    """Error messages and data are not comments; plain numbers and colours are not history."""
    f = tmp_path / "m.py"
    source = '"""Retries every 0.25 s, at most 16 images per request."""\nMSG = "issue 39"'
    f.write_text(source + "  # colour #fff, ray-project/ray#48741\n")
    assert _history(_texts(f)) == []
