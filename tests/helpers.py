"""Small helpers shared by the test modules (tests/ is on sys.path under pytest's default import mode:
tests/conftest.py's folder), and the paths every module uses."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

REPO = Path(__file__).resolve().parents[1]
"""The repository's root."""
SHARED = REPO.parent / "shared"
"""``../shared`` beside the repository: real data and weights (tests that need it skip without it)."""


LOCAL_RAY_ARGS = {  # the tests' local Ray: tests/conftest.py's local_ray, and modules that start their own
    "address": "local",  # always a fresh local Ray, never a cluster some other process started
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "configure_logging": False,
}


def small_pts_config(*, max_images: int, folds: int, size: int = 64) -> Any:
    """A PTS product that fits in seconds: resnet18 with random weights on a ``size``-px canvas,
    3 sheets, an out-of-fold calibration of ``max_images`` images in ``folds`` folds."""
    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig

    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=size),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=max_images, folds=folds),
        batch_size=4,
    )


def png(array: np.ndarray) -> bytes:
    """``array`` (H, W[, 3]) uint8 encoded as PNG bytes."""
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bound then closed: nothing listens there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def randomise_bn(model: nn.Module, seed: int = 0) -> None:
    """Non-trivial BN statistics (a fresh model's are mean 0, var 1: folding them is a no-op)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=g) * 2 + 0.1)
                m.weight.copy_(torch.randn(n, generator=g))
                m.bias.copy_(torch.randn(n, generator=g) * 0.3)


def until(condition: Callable[[], Any], what: str, timeout: float = 180.0, every_s: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); AssertionError naming ``what``
    after ``timeout`` seconds (generous by default: a condition on a loaded 2-core machine)."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(every_s)


def finished_job(client: Any, started: Any, headers: dict[str, str], timeout: float = 300.0) -> dict[str, Any]:
    """The job an admin request's ``started`` response answered (an ``httpx`` response), once it
    succeeded: ``?wait=true`` answers 202 while the job still runs, so poll ``GET /v1/jobs/{id}``."""
    assert started.status_code in (200, 202), started.text
    job = started.json()["job"]
    deadline = time.monotonic() + timeout
    while job["state"] == "running":
        assert time.monotonic() < deadline, f"job still running after {timeout:.0f} s: {job}"
        time.sleep(0.5)
        job = client.get(f"/v1/jobs/{job['id']}", headers=headers).json()["job"]
    assert job["state"] == "succeeded", job
    return job


def tiled_served(ts: Any, backbone: Any, version: int, config: Any = None) -> Any:
    """A replica's ``TiledHETMM.serving`` over a stored tiled set's (position, layer) shards, each handing
    out its tiny set (``ts.templates(key)``) as the template hosts do; ``config`` instead of the set's own."""
    from hetmm_ray.detection.tiled import TiledHETMM

    return TiledHETMM.serving(
        ts.config if config is None else config,
        {key: ts.templates(key) for key in ts.bank},
        tiles=ts.meta["tiles"],
        weights_id=ts.weights_id,
        calibration=ts.calibration,
        version=version,
        backbone=backbone,
    )


# A tiny product for tests of what surrounds scoring (stations): fits and scores in seconds on a CPU.
def folder_station(base: Path, name: str, *sinks: dict, product: str = "p") -> dict:
    """A line file's station that scores the files put in ``base / name`` (made here; each deleted
    once done) and logs them to ``<name>.csv``, with ``sinks`` besides."""
    (base / name).mkdir()
    return {
        "name": name,
        "product": product,
        "source": {"kind": "folder", "path": name, "after": "delete", "settle_ms": 0},
        "deadline_ms": 600_000,  # a loaded machine's first part loads its model: no timeout row
        "sinks": [{"kind": "log", "path": f"{name}.csv"}, *sinks],
    }


TINY_CONFIG = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": 32, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "threshold": {"folds": 2},
    "device": "cpu",
}


def tiny_cli_flags(size: int = 32) -> list[str]:
    """``hetmm`` flags for a tiny random resnet18 on a ``size``-px canvas: seconds per fit or evaluate
    (for tests of what a command does, not of its figures)."""
    return [
        "--backbone", "resnet18", "--weights", "random", "--device", "cpu",
        "--set", f"backbone.image_size={size}", "--set", 'backbone.layers=["layer2","layer3"]',
        "--set", "scoring.forward_windows=[3,3]", "--set", "scoring.backward_windows=[3,3]",
        "--set", "scoring.alphas=[0.5,0.5]", "--set", "scoring.layer_weights=[1,1]",
    ]  # fmt: skip
