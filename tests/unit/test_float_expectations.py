"""No test compares a float that passed through a CPU kernel with a value written on one machine,
bit for bit: a structure test over the tests' source.

What it reads as "bit for bit": an ``==`` / ``!=`` whose side takes ``.hex()`` of a float, or
hashes an array's bytes (``sha256(... .tobytes())``), and a float literal of five or more
significant digits in an assertion or a tolerance check (``approx``, ``allclose``...), which is a
value measured on some machine. A backbone's features (and every score or map computed from them)
differ between CPUs by float32 rounding (tests/stored_products.py says how much and why), so such
a check holds only on the machine that wrote it. Comparisons of two results computed in the same
run (in-process against served, before against after) are not of this kind and are not flagged.

An exact check of something that passes through no CPU kernel (a threshold from a stored
calibration, in float64; stored bytes) is allowed where it is listed in ``EXEMPT`` with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

TESTS = REPO / "tests"
SKIPPED = ("data",)  # tests/data/*: scripts that wrote stored expectations, with the code of their time

EXEMPT = {
    (
        "stored_products.py",
        "check_replayed",
    ): "the threshold: float64 arithmetic on the stored calibration, no backbone",
    ("stored_products.py", "check_through_backbone"): "the same threshold, read back from the stored calibration",
    ("unit/test_pre22_store.py", "test_a_pre_issue_product_reads_back_exactly"): (
        "the threshold of the stored calibration, loaded with no image scored"
    ),
    ("unit/test_pre38_store.py", "test_a_pre_interface_product_reads_back_exactly"): (
        "the threshold of the stored calibration, loaded with no image scored"
    ),
}
"""(file under tests/, function) -> why its exact float check holds on every CPU."""

HASHES = {"sha256", "sha1", "md5", "blake2b"}
TOLERANCE_CALLS = {"approx", "allclose", "assert_allclose", "assert_close", "isclose"}


def _significant_digits(value: float) -> int:
    digits = f"{abs(value):.15e}".split("e")[0].replace(".", "").rstrip("0")
    return len(digits)


def _takes_bits(node: ast.AST) -> bool:
    """Whether ``node`` takes a float's bits: ``.hex()``, or a hash of ``.tobytes()``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr == "hex" and not sub.args:
                return True
            if sub.func.attr in HASHES and any(
                isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == "tobytes"
                for arg in sub.args
                for a in ast.walk(arg)
            ):
                return True
    return False


def _measured_literal(node: ast.AST) -> float | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and type(sub.value) is float and _significant_digits(sub.value) >= 5:
            return sub.value
    return None


def findings(source: str) -> list[tuple[str, int, str]]:
    """(function, line, what) for every exact float check of ``source`` (see the module's docstring)."""
    out: list[tuple[str, int, str]] = []
    tree = ast.parse(source)
    owners: dict[ast.AST, str] = {}

    def own(node: ast.AST, owner: str) -> None:  # each node's innermost function
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else owner
            owners[child] = inner
            own(child, inner)

    own(tree, "<module>")
    for node in ast.walk(tree):
        owner = owners.get(node, "<module>")
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            if any(_takes_bits(side) for side in [node.left, *node.comparators]):
                out.append((owner, node.lineno, "compares a float's bits (.hex() or a hash of its bytes)"))
            literal = _measured_literal(node)
            if literal is not None:
                out.append((owner, node.lineno, f"compares with the measured value {literal!r}"))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in TOLERANCE_CALLS:
                literal = _measured_literal(node)
                if literal is not None:
                    out.append((owner, node.lineno, f"{name} around the measured value {literal!r}"))
    return out


def _test_sources() -> list[Path]:
    return [p for p in sorted(TESTS.rglob("*.py")) if p.relative_to(TESTS).parts[0] not in SKIPPED]


def test_no_test_compares_a_kernels_float_exactly():
    flagged = []
    used = set()
    for path in _test_sources():
        rel = path.relative_to(TESTS).as_posix()
        for owner, line, what in findings(path.read_text()):
            if (rel, owner) in EXEMPT:
                used.add((rel, owner))
                continue
            flagged.append(f"tests/{rel}:{line} ({owner}): {what}")
    assert not flagged, (
        "exact expectations of floats that pass through a CPU kernel hold only on the machine that wrote "
        "them: compare with a stated tolerance (tests/stored_products.py), or list the check in EXEMPT "
        "with why it is exact on every CPU:\n  " + "\n  ".join(flagged)
    )
    assert used == set(EXEMPT), f"exemptions that no longer match a check: {sorted(set(EXEMPT) - used)}"


def test_the_scan_flags_what_the_old_stored_product_tests_did():
    """The lines the stored-product tests once had (they failed on another CPU)."""
    old = """
def test_old(pred, expected):
    assert [float(s).hex() for s in pred.scores] == expected["scores"]
    assert [hashlib.sha256(np.ascontiguousarray(m, dtype=np.float32).tobytes()).hexdigest() for m in pred.maps] == (
        expected["maps_sha256"]
    )
    assert pred.scores[0] == pytest.approx(0.0205871)
    np.testing.assert_allclose(pred.scores, [0.51234567, 0.1], rtol=1e-6)
    assert pred.scores[1] == 0.75  # a value that is exact (two significant digits): not flagged
"""
    lines = {line for owner, line, _ in findings(old) if owner == "test_old"}
    assert lines == {3, 4, 7, 8}  # not line 9


def test_every_exemption_says_why():
    for key, reason in EXEMPT.items():
        assert len(reason) > 20, key
