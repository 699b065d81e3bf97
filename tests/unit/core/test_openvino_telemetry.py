"""OpenVINO imported by hetmm sends no telemetry (core/openvino_runtime.py ``_openvino``).

``import openvino`` imports OpenVINO's model converter, whose telemetry (Google Analytics) is on
unless an opt-out file exists under ``~/intel`` or ``CI=true``; turning it on writes a client id
file there first. Each check runs in a fresh process with an empty home and no CI variables: a plain
``import openvino`` writes that client id (the control, so the check can fail), hetmm's import does
not, and the converter then holds its no-op stub.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

CI_VARIABLES = ("CI", "TF_BUILD", "JENKINS_URL")  # openvino_telemetry's own "this is CI" signals


def _run(code: str, home: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in CI_VARIABLES}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_plain_openvino_turns_telemetry_on_and_hetmm_does_not(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    control, ours = tmp_path / "control", tmp_path / "ours"
    control.mkdir()
    ours.mkdir()
    _run("import openvino", control)
    if not (control / "intel" / "openvino_ga_cid").is_file():
        pytest.skip("this OpenVINO install has no telemetry to turn off (no openvino_telemetry)")

    stub = _run(
        "from hetmm_ray.core.openvino_runtime import openvino_available\n"
        "assert openvino_available()\n"
        "import openvino, openvino.tools.ovc.telemetry_utils as t\n"
        "print(t.tm.__name__)",
        ours,
    )
    assert stub == "openvino.tools.ovc.telemetry_stub"
    assert not (ours / "intel").exists()
