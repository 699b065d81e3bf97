"""The printed false-alarm estimate against held-out good parts, on the shared products; runs
``benchmarks/bench_estimate.py`` (its docstring states the check) and asserts on its ``--json``.

Each product is fitted at the defaults on ``train/good``; for each far rate the threshold's printed
estimate and its stated interval (``m`` of ``n`` out-of-fold scores above) are compared with the
``k`` of ``N`` held-out ``test/good`` frames above it, at the rates the fit shows (1, 2, 5 %): ``k``
must lie in the 95 % predictive range of ``BetaBinomial(N, m + 1, n - m)``. Also asserted: the
estimate is inside its own interval, and every good frame standing apart is named with its score.
Quick (``HETMM_ACCEPTANCE_QUICK=1``): battery_weld only (37 frames, a fit of seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.common import BATTERY, BOTTLE, BSD, REPO

pytestmark = [pytest.mark.acceptance, pytest.mark.shared]


def test_printed_estimate_matches_held_out_good_parts(quick, tmp_path) -> None:
    present = [
        name for name, root in (("battery_weld", BATTERY), ("bottle", BOTTLE), ("bsd_pitting", BSD)) if root.is_dir()
    ]
    if quick:
        present = [n for n in present if n == "battery_weld"]
    if not present:
        pytest.skip("needs ../shared/data (battery_weld, bottle, bsd_pitting)")
    out = tmp_path / "estimate.json"
    cmd = [
        sys.executable,
        "benchmarks/bench_estimate.py",
        "--data",
        *present,
        "--rates",
        "0.01",
        "0.02",
        "0.05",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    print(done.stdout)
    results = json.loads(out.read_text())
    assert [r["data"] for r in results] == present
    for r in results:
        for row in r["rates"]:
            e = row["estimate"]
            assert e["low"] <= e["rate"] <= e["high"], (r["data"], row)
            assert row["within"], (r["data"], row)
        names = r["outlier_names"]
        assert len(names) == len(r["outliers"]["frames"])
        for name, frame in zip(names, r["outliers"]["frames"], strict=True):
            assert f"{name}  {frame['score']:.4f}" in r["outlier_text"]
    assert done.returncode == 0, done.stderr[-2000:]
