"""End-to-end predict speed in process: the current path against a plain baseline, backbones and
template counts, a busy neighbour, and the backbone under three CPU runtimes.

``modes`` (the default command): end-to-end CPU images/s, the current predict path vs a plain
sequential baseline, in one run. For mobilenet_v2 and the default backbone (efficientnet_lite0), at 60
template sheets and ALL (209, bottle's training set), ``HETMM.predict`` on encoded PNGs (bottle test
images, 900x900, or synthetic ones where ../shared is absent), batch 8, in these modes:

- ``baseline``: the plain sequential path: Pillow decode -> resize -> fp32 torch backbone with its
  batch norms as separate ops -> ATMM, one batch after another, one decode thread, the allocator
  untouched;
- ``current``: the defaults (libpng decoding of 8-bit RGB PNGs, BN folded, ``precision: auto``,
  ``backbone_runtime: auto`` = OpenVINO on a CPU, next batch decoded while the current one is
  scored, 2 decode threads, memory kept mapped);
- ``current+torch``: the same with the backbone run by torch (what OpenVINO adds);
- ``current+1worker``: the same with ``score_workers: 1`` (one thread running multi-threaded ops
  with the prefetch pipeline, instead of one single-threaded worker per thread);
- ``current+bf16``: the same with the backbone forced to bfloat16 + channels_last (what
  ``precision: auto`` picks only where the CPU has native bf16).

Each mode runs in its own fresh process (the allocator setting is process-wide; ``hetmm_ray`` imported
before torch, as in the service), the modes interleaved round-robin ``--rounds`` times so that load
from other jobs falls on all alike; a cell is the median over rounds of the median of ``--runs`` timed
calls. Random weights and a random unit-feature bank (speed does not depend on the values).

``e2e``: end-to-end images/s (decode PNG bytes + resize + backbone + ATMM + score) for each backbone
and template count, on a CPU or a GPU: a detector given a bank of random unit features of the right
shapes (random weights) predicts encoded images; median of ``--runs`` timed calls.

``neighbour``: how much a process on the same cores slows scoring, per OpenMP wait policy. Scoring
(``HETMM.predict`` of 16 decoded 256x256 images: backbone + ATMM at 60 sheets, random weights and bank)
runs in a fresh child process with ``--threads`` torch threads, alone and next to a neighbour that
keeps one core busy (a pure-Python spin loop in another process), under ``OMP_WAIT_POLICY=PASSIVE``
(what hetmm_ray sets before torch loads) and ``ACTIVE``, with ``score_workers`` 0 (the default: one
single-threaded worker per thread) and 1 (multi-threaded ops). Each cell is the median of ``--runs``
calls; the slow-down is "with neighbour" / "alone" in the same policy (on 2 cores a neighbour holding
one core can at best halve the speed: 2x).

``runtimes``: the backbone's network under torch, OpenVINO and ONNX Runtime, side by side: for each
backbone (random weights, BN folded, as served) one (B, 3, S, S) batch, ms per image of the network
alone (normalised input -> tap features), median of ``--runs`` calls, the runtimes interleaved call by
call; and each runtime's largest difference from torch's features relative to the largest feature
value (the project adopts a runtime under 1e-5: tests/unit/core/test_fast_runtime.py). ONNX Runtime
needs ``pip install onnx onnxruntime`` (the ``bench`` extra); it is measured only.

    python benchmarks/bench_throughput.py [modes]        # the table (a few minutes, quiet 2-core box)
    python benchmarks/bench_throughput.py --quick        # 1 round, 1 backbone, 60 sheets (smoke test)
    python benchmarks/bench_throughput.py e2e [--device cpu|cuda] [--runs 3] [--images 8]
        [--backbones mobilenet_v2 wide_resnet101_2] [--templates 60 209]
    python benchmarks/bench_throughput.py neighbour [--runs 5]
    python benchmarks/bench_throughput.py runtimes [--backbones resnet18 --batch 1]
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, describe, encoded_images, install_bank, matmul_rate, median_time, table, with_default_command


def child_env(**extra: str) -> dict[str, str]:
    """This environment for a child run of this script: the repository on ``PYTHONPATH``, and ``extra``."""
    return {
        **os.environ,
        **extra,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


# --- modes: the current predict path against the plain baseline --------------------------------------------
MODES = ("baseline", "current", "current+torch", "current+1worker", "current+bf16")


def measure_mode(mode: str, backbones: list[str], sheets: list[int], n_images: int, runs: int, batch: int) -> dict:
    """In this process: ms per image for every (backbone, sheets) in ``mode``."""
    import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
    import torch
    import torch.nn.functional as F

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
    from hetmm_ray.core.backbone import Backbone
    from hetmm_ray.data.decode import pillow_only
    from hetmm_ray.detection.detector import HETMM

    images, source = encoded_images(n_images)
    if mode == "baseline":
        pillow_only()  # Pillow decodes every PNG
    out: dict[str, Any] = {"source": source, "threads": torch.get_num_threads(), "cells": {}, "precision": {}}
    for name in backbones:
        precision = {"baseline": "float32", "current+bf16": "bfloat16"}.get(mode, "auto")
        runtime = "torch" if mode in ("baseline", "current+torch") else "auto"
        plain: dict = {"prefetch": 0, "decode_threads": 1, "malloc_keep_mib": 0} if mode == "baseline" else {}
        if mode in ("baseline", "current+1worker"):
            plain["score_workers"] = 1
        config = DetectorConfig(
            backbone=BackboneConfig(name=name, weights="random", precision=precision),
            templates=TemplateConfig(kind="all"),
            batch_size=batch,
            backbone_runtime=runtime,
            **plain,
        )
        backbone = Backbone(config.backbone, fold_bn=mode != "baseline", runtime=runtime)
        out["precision"][name] = f"{backbone.precision} {backbone.runtime}"
        g = torch.Generator().manual_seed(0)
        shapes = backbone.feature_shapes()
        for k in sheets:
            det = HETMM(config)
            det.scorer.backbone = backbone
            bank = {layer: F.normalize(torch.randn(k, *shape, generator=g), dim=1) for layer, shape in shapes.items()}
            install_bank(det, bank, config)
            det.predict(images[:batch])  # warm-up
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                det.predict(images)
                times.append(time.perf_counter() - t0)
            out["cells"][f"{name}|{k}"] = 1000 * statistics.median(times) / len(images)
    return out


def modes(args: argparse.Namespace) -> None:
    if args.quick:
        args.backbones, args.sheets, args.rounds, args.runs, args.images = ["mobilenet_v2"], [60], 1, 1, 16
    if args._child:
        print(json.dumps(measure_mode(args._child, args.backbones, args.sheets, args.images, args.runs, args.batch)))
        return

    results: dict[str, list[dict]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes:
            cmd = [sys.executable, __file__, "modes", "--_child", mode, "--backbones", *args.backbones, "--sheets"]
            cmd += [*map(str, args.sheets), "--images", str(args.images), "--runs", str(args.runs)]
            cmd += ["--batch", str(args.batch)]
            done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
            results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {mode}: done", file=sys.stderr, flush=True)

    first = results[args.modes[0]][0]
    rows, cells = [], {}
    for name in args.backbones:
        for k in args.sheets:
            key = f"{name}|{k}"
            ms = {m: statistics.median(res["cells"][key] for res in results[m]) for m in args.modes}
            cells[key] = ms
            base = ms.get("baseline")
            row: list[object] = [name, "ALL (209)" if k == 209 else k]
            for m in args.modes:
                row += [f"{1000 / ms[m]:.1f}"]
            for m in args.modes:
                if m != "baseline" and base:
                    row += [f"{base / ms[m]:.2f}x"]
            rows.append(row)
    headers = ["backbone", "sheets", *(f"{m} img/s" for m in args.modes)]
    headers += [f"{m} vs baseline" for m in args.modes if m != "baseline" and "baseline" in args.modes]
    precision = {m: results[m][0]["precision"] for m in args.modes}  # per backbone: precision and runtime
    print(
        f"CPU, {first['threads']} torch threads, {os.cpu_count()} cores; inputs: {first['source']}; "
        f"batch {args.batch}, {args.images} images per call; median of {args.rounds} rounds x {args.runs} runs; "
        f"load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(f"backbone precision and runtime per mode: {precision}")
    print(table(headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"cells_ms_per_image": cells, "precision": precision}, indent=2))


# --- e2e: images/s per backbone and template count -----------------------------------------------------------
def detector_with_random_bank(backbone: str, n_templates: int, device: str, dtype: str, batch: int) -> Any:
    import torch
    import torch.nn.functional as F

    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.detection.detector import HETMM

    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random"), device=device, dtype=dtype, batch_size=batch
    )
    det = HETMM(config)
    g = torch.Generator().manual_seed(0)
    bank = {
        k: F.normalize(torch.randn(n_templates, *shape, generator=g), dim=1)
        for k, shape in det.backbone.feature_shapes().items()
    }
    install_bank(det, bank, config)
    return det


def e2e(args: argparse.Namespace) -> None:
    import torch  # before hetmm_ray, as this benchmark has always run: torch's own OpenMP wait policy

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(args.device)
    images, source = encoded_images(args.images)
    rows = []
    for name in args.backbones:
        for k in args.templates:
            det = detector_with_random_bank(name, k, args.device, args.dtype, args.batch)
            t = median_time(lambda det=det: det.predict(images), runs=args.runs, device=device)
            rows.append([name, k, len(images) / t, 1000 * t / len(images)])
    print(
        f"device: {describe(device)}; dtype {args.dtype}; inputs: {source}; batch {args.batch}; "
        f"median of {args.runs} runs of {len(images)} images"
    )
    print(f"measured matmul rate: {matmul_rate(device) / 1e9:.0f} GFLOP/s (float32)")
    print(table(["backbone", "templates", "images/s", "ms / image"], rows))


# --- neighbour: a busy process on the same cores ----------------------------------------------------------
def measure_neighbour(backbone: str, runs: int, threads: int, workers: int) -> float:
    """ms per image of predict on 16 decoded 256x256 images, in this process."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
    from hetmm_ray.detection.detector import HETMM

    torch.set_num_threads(threads)
    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random"),
        templates=TemplateConfig(kind="all"),
        score_workers=workers,
    )
    det = HETMM(config)
    g = torch.Generator().manual_seed(0)
    bank = {k: F.normalize(torch.randn(60, *s, generator=g), dim=1) for k, s in det.backbone.feature_shapes().items()}
    install_bank(det, bank, config)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(16)]
    det.predict(images[:8])  # warm-up (and the backbone's conversion)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        det.predict(images)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times) / len(images)


def _spin(stop: Any) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def neighbour(args: argparse.Namespace) -> None:
    if args._child:
        print(json.dumps(measure_neighbour(args.backbone, args.runs, args.threads, args.workers)))
        return
    rows = []
    setups = [("PASSIVE", 0), ("PASSIVE", 1), ("ACTIVE", 1)]  # score_workers 0: one single-threaded worker per thread
    for policy, workers in setups:
        env = child_env(OMP_WAIT_POLICY=policy)
        cells = {}
        for busy in (False, True):
            stop = mp.Event()
            spinner = mp.Process(target=_spin, args=(stop,), daemon=True) if busy else None
            if spinner:
                spinner.start()
            try:
                cmd = [sys.executable, __file__, "neighbour", "--_child", "--backbone", args.backbone]
                cmd += ["--runs", str(args.runs), "--threads", str(args.threads), "--workers", str(workers)]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                cells[busy] = float(done.stdout.strip().splitlines()[-1])
            finally:
                if spinner:
                    stop.set()
                    spinner.join()
        how = f"{args.threads} single-threaded workers" if workers == 0 else f"{args.threads}-thread ops"
        rows.append([policy, how, f"{cells[False]:.1f}", f"{cells[True]:.1f}", f"{cells[True] / cells[False]:.2f}x"])
    print(
        f"{args.backbone}, 60 sheets, {args.threads} torch threads, {os.cpu_count()} cores; predict of 16 decoded "
        f"256x256 images; median of {args.runs} calls; neighbour: one busy process"
    )
    print(table(["OMP_WAIT_POLICY", "score_workers", "alone ms/img", "with neighbour ms/img", "slow-down"], rows))


# --- runtimes: the backbone under torch, OpenVINO and ONNX Runtime -----------------------------------------
def onnxruntime_taps(backbone: Any, size: int, threads: int) -> Callable[[Any], dict] | str:
    """An ONNX Runtime session of the backbone's network, or why there is none."""
    import torch

    from hetmm_ray.core.openvino_runtime import TapsAsTuple

    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime not installed"
    buf = io.BytesIO()
    net = TapsAsTuple(backbone.extractor, backbone.layers).eval()
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


def runtimes(args: argparse.Namespace) -> None:
    import torch  # before hetmm_ray, as this benchmark has always run: torch's own OpenMP wait policy

    from hetmm_ray.config import BackboneConfig
    from hetmm_ray.core.backbone import Backbone
    from hetmm_ray.core.openvino_runtime import OpenVinoTaps

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.backbones:
        backbone = Backbone(BackboneConfig(name=name, weights="random", image_size=args.size), runtime="torch")
        x = torch.rand(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
        x = ((x - backbone.mean) / backbone.std).contiguous()
        identity = ("bench", name, args.size)
        nets: dict[str, Callable[[torch.Tensor], dict] | str] = {
            "torch": lambda t, e=backbone.extractor: e(t),
            "openvino": OpenVinoTaps(backbone.extractor, backbone.layers, identity),
            "onnxruntime": onnxruntime_taps(backbone, args.size, args.threads),
        }
        usable = {k: f for k, f in nets.items() if callable(f)}
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
        for k, f in nets.items():
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


COMMANDS = {"modes": modes, "e2e": e2e, "neighbour": neighbour, "runtimes": runtimes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("modes", help="the current predict path vs the plain sequential baseline (the default)")
    p.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "efficientnet_lite0"])
    p.add_argument("--sheets", nargs="+", type=int, default=[60, 209], help="209 = ALL of bottle's training set")
    p.add_argument("--images", type=int, default=24, help="images per timed predict call (3 batches of 8)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--runs", type=int, default=3, help="timed calls per cell and round")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per mode, interleaved")
    p.add_argument("--modes", nargs="+", default=[m for m in MODES if m != "current+bf16"], choices=MODES)
    p.add_argument("--quick", action="store_true", help="1 round, 1 run, mobilenet_v2 at 60 sheets")
    p.add_argument("--json", help="write the cells here")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p = sub.add_parser("e2e", help="images/s per backbone and template count, CPU or GPU")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda where there is one)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--images", type=int, default=8, help="images per timed call")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "wide_resnet101_2"])
    p.add_argument("--templates", nargs="+", type=int, default=[60, 209])
    p = sub.add_parser("neighbour", help="the slow-down next to a busy process, per OpenMP wait policy")
    p.add_argument("--backbone", default="mobilenet_v2")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    p = sub.add_parser("runtimes", help="the backbone under torch, OpenVINO and ONNX Runtime")
    p.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "efficientnet_lite0"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(with_default_command(sys.argv[1:], list(COMMANDS), "modes"))
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()
