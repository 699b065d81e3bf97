"""Template store throughput and memory: save and load a ~1 GB bank, local directory and S3.

Each save/load runs in a fresh child process that reports its wall time and its
peak resident memory above what it held before the operation (the bank itself
for a save, nothing for a load). The S3 endpoint is moto's server in its own
process on 127.0.0.1, so its memory is not counted against the store.

    python benchmarks/bench_store.py [--mb 1024] [--runs 3] [--backends local s3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, table

# wide_resnet101_2 layer shapes at 256x256; stored as fp16 like a compact production bank
SHAPES = {"layer1": (256, 64, 64), "layer2": (512, 32, 32), "layer3": (1024, 16, 16)}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _bank(mb: int):
    import torch

    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.core.templates import TemplateSet

    per_image = sum(c * h * w for c, h, w in SHAPES.values()) * 2
    n = max(1, mb * 2**20 // per_image)
    g = torch.Generator().manual_seed(0)
    bank = {}
    for k, shape in SHAPES.items():
        t = torch.empty((n, *shape), dtype=torch.float16)
        for i in range(n):  # in place, image by image: no temporaries raise the peak
            t[i].normal_(generator=g)
        bank[k] = t
    config = DetectorConfig(backbone=BackboneConfig(name="wide_resnet101_2", weights="random"))
    digests = tuple(f"{i:032x}" for i in range(n))
    return TemplateSet(bank=bank, config=config, weights_id="random:seed=0", image_digests=digests), n * per_image


def child(op: str, uri: str, mb: int) -> None:
    from hetmm_ray.store import open_store

    store = open_store(uri)
    if op == "save":
        ts, size = _bank(mb)
        before = _peak_mb()
        t0 = time.perf_counter()
        store.put("bench", ts)
        seconds = time.perf_counter() - t0
    else:
        import torch  # noqa: F401 - imported before the baseline so its memory is not counted

        before = _peak_mb()
        t0 = time.perf_counter()
        ts = store.get("bench")
        seconds = time.perf_counter() - t0
        size = sum(v.numel() * v.element_size() for v in ts.bank.values())
    print(json.dumps({"seconds": seconds, "bytes": size, "extra_mb": _peak_mb() - before}))


def _run_child(op: str, uri: str, mb: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", op, "--uri", uri, "--mb", str(mb)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"child {op} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backends", nargs="+", default=["local", "s3"])
    ap.add_argument("--child", choices=("save", "load"))
    ap.add_argument("--uri")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.uri, args.mb)
        return

    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    rows = []
    for backend in args.backends:
        server = None
        tmp = tempfile.mkdtemp(prefix="hetmm-bench-")
        try:
            if backend == "s3":
                port = free_port()
                server = subprocess.Popen(
                    [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                import boto3

                s3 = boto3.client(
                    "s3",
                    endpoint_url=f"http://127.0.0.1:{port}",
                    region_name="us-east-1",
                    aws_access_key_id="bench",
                    aws_secret_access_key="bench",
                )
                for _ in range(50):
                    try:
                        s3.create_bucket(Bucket="hetmm-bench")
                        break
                    except Exception:  # noqa: BLE001 - server still starting
                        time.sleep(0.2)
            for op in ("save", "load"):
                results = []
                for run in range(args.runs):
                    uri = (
                        f"s3://hetmm-bench/run{run}?endpoint=http://127.0.0.1:{port}"
                        if backend == "s3"
                        else f"{tmp}/run{run}"
                    )
                    results.append(_run_child(op, uri, args.mb, env))
                seconds = statistics.median(r["seconds"] for r in results)
                size_mb = results[0]["bytes"] / 2**20
                extra = statistics.median(r["extra_mb"] for r in results)
                rows.append(
                    [
                        backend,
                        op,
                        f"{size_mb:.0f}",
                        seconds,
                        size_mb / seconds,
                        f"{extra:.0f}",
                        f"{extra / size_mb:.2f}",
                    ]
                )
        finally:
            if server is not None:
                server.terminate()
                server.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"median of {args.runs} runs; each in a fresh process; fp16 wide_resnet101_2-shaped bank")
    print(table(["backend", "op", "MB", "seconds", "MB/s", "peak extra MB", "peak extra / bank"], rows))


if __name__ == "__main__":
    main()
