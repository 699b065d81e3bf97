"""The backbone's network under three CPU runtimes, side by side: torch, OpenVINO, ONNX Runtime.

For each backbone (random weights: speed does not depend on the values; BN folded, as served),
one (B, 3, S, S) batch: ms per image of the network alone (normalised input -> tap features),
median of ``--runs`` calls, the runtimes interleaved call by call so that load from other jobs
falls on all alike; and each runtime's largest difference from torch's features, relative to
the largest feature value. The tolerance the project adopts a runtime under: 1e-5
(tests/unit/core/test_fast_runtime.py).

    python benchmarks/bench_backbone_runtimes.py                     # mobilenet_v2, efficientnet_lite0
    python benchmarks/bench_backbone_runtimes.py --backbones resnet18 --batch 1

ONNX Runtime needs ``pip install onnx onnxruntime`` (the ``bench`` extra); it is measured only
(the service uses OpenVINO: ``backbone_runtime: auto``).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from hetmm_ray.config import BackboneConfig  # noqa: E402
from hetmm_ray.core.backbone import Backbone  # noqa: E402
from hetmm_ray.core.openvino_runtime import OpenVinoTaps, _TapsAsTuple  # noqa: E402


def onnxruntime_taps(backbone: Backbone, size: int, threads: int) -> Callable[[torch.Tensor], dict] | str:
    """An ONNX Runtime session of the backbone's network, or why there is none."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime not installed"
    buf = io.BytesIO()
    net = _TapsAsTuple(backbone.extractor, backbone.layers).eval()
    try:
        torch.onnx.export(
            net,
            (torch.zeros(1, 3, size, size),),
            buf,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
        )
    except Exception as exc:  # noqa: BLE001 - the exporter needs the onnx package
        return f"ONNX export failed: {exc}"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])

    def run(x: torch.Tensor) -> dict:
        outs = session.run(None, {"x": x.numpy()})
        return {tap: torch.from_numpy(o) for tap, o in zip(backbone.layers, outs, strict=True)}

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "efficientnet_lite0"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from common import table

    rows = []
    for name in args.backbones:
        backbone = Backbone(BackboneConfig(name=name, weights="random", image_size=args.size), runtime="torch")
        x = torch.rand(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
        x = ((x - backbone.mean) / backbone.std).contiguous()
        identity = ("bench", name, args.size)
        runtimes: dict[str, Callable[[torch.Tensor], dict] | str] = {
            "torch": lambda t, e=backbone.extractor: e(t),
            "openvino": OpenVinoTaps(backbone.extractor, backbone.layers, identity),
            "onnxruntime": onnxruntime_taps(backbone, args.size, args.threads),
        }
        usable = {k: f for k, f in runtimes.items() if callable(f)}
        with torch.inference_mode():
            reference = usable["torch"](x)
            diffs = {}
            for k, f in usable.items():
                out = f(x)  # also the warm-up
                diffs[k] = max(
                    float((out[t] - reference[t]).abs().max() / reference[t].abs().max()) for t in backbone.layers
                )
            times: dict[str, list[float]] = {k: [] for k in usable}
            for _ in range(args.runs):
                for k, f in usable.items():
                    t0 = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - t0)
        base = statistics.median(times["torch"])
        for k, f in runtimes.items():
            if not callable(f):
                rows.append([name, k, "-", "-", f])
                continue
            med = statistics.median(times[k])
            rows.append([name, k, f"{1000 * med / args.batch:.2f}", f"{base / med:.2f}x", f"{diffs[k]:.1e}"])
    print(
        f"CPU, {args.threads} threads, {os.cpu_count()} cores; batch {args.batch} at {args.size} px; "
        f"median of {args.runs} interleaved calls; load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(table(["backbone", "runtime", "ms/image", "vs torch", "max rel. diff to torch"], rows))


if __name__ == "__main__":
    main()
