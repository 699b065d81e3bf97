"""The stored-product tests under another CPU's kernels.

Another CPU runs the backbone and ATMM in other vector kernels (AVX-512 where this project's CI has
AVX2), which changes float32 results in their last bits. Torch can be told to use its plain
kernels on any machine (``ATEN_CPU_CAPABILITY=default``, oneDNN limited to SSE4.1, MKL to SSE4.2):
the stored-product tests must pass there too, with the same tolerances, as they must on a CPU this
suite has never run on. (Both CPU runtimes, torch and OpenVINO, are parameters of those tests.)
"""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO

PLAIN_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
STORED_PRODUCT_TESTS = [
    "tests/unit/test_pre22_store.py",
    "tests/unit/test_pre38_store.py",
    "tests/unit/test_tile_whole_view.py::test_a_tiled_product_stored_before_the_whole_view_scores_as_it_did",
]


def test_stored_products_score_as_they_did_under_torchs_plain_kernels():
    env = {**os.environ, **PLAIN_KERNELS}
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.stdout.strip() == "DEFAULT", probe  # the setting took: no AVX2 / AVX-512 kernels
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *STORED_PRODUCT_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout.splitlines()[-1] and "failed" not in out.stdout.splitlines()[-1]
