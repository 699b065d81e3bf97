"""A candidate version on the template hosts: bytes held and the host's RSS, before, with it, after discard.

Issue 23: a candidate is loaded on the template hosts beside HEAD's shards (distributed/hosts.py)
and ``discard`` frees it. This starts a local Ray, a registry over a temporary local store with
``--hosts`` template hosts, and one synthetic product (random, L2-normalised resnet18-shaped
features at ``--image-size``, ``--images`` images, ``templates.kind: all``: no backbone and no
selection run, the bank is what the hosts hold). Its head is loaded, then:

- ``--discards`` times, a candidate with ``--extra`` more images is stored as another writer (the CLI) would, the
  store poll loads it on the hosts, and the registry discards it (``discard``);
- the same with ``promote``: the candidate's loaded shards become HEAD's (host loads unchanged).

After each step it records the bytes the hosts hold per (product, version) shard set
(``TemplateHost.holdings``) and the hosts' resident memory (VmRSS, summed over hosts; noisy: the
allocator keeps some freed pages). Memory only, no timings.

    python benchmarks/bench_candidate_memory.py                         # 400 images at 128 px (~170 MiB)
    python benchmarks/bench_candidate_memory.py --images 8 --extra 4 --image-size 32   # a quick check
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig

RESNET18 = {"layer1": (64, 4), "layer2": (128, 8), "layer3": (256, 16)}  # channels, stride
PRODUCT = "cand-memory"
MIB = 1 << 20


def bank(n: int, seed: int, image_size: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    out = {}
    for layer, (c, s) in RESNET18.items():
        side = max(1, image_size // s)
        x = rng.standard_normal((n, c, side, side), dtype=np.float32)
        out[layer] = torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))
    return out


def template_set(features: dict[str, torch.Tensor], config: DetectorConfig, seed: int) -> Any:
    from hetmm_ray.core.templates import TemplateSet

    n = next(iter(features.values())).shape[0]
    digests = tuple(f"{seed:06x}{i:026x}" for i in range(n))
    return TemplateSet(bank=features, config=config, weights_id="random:seed=0", image_digests=digests)


def snapshot(registry: Any) -> dict[str, Any]:
    import ray

    hosts = ray.get(registry.host_holdings.remote())
    sets: dict[tuple[int, bool], int] = {}
    layers: dict[tuple[int, bool], int] = {}
    for h in hosts:
        for row in h["sets"]:
            key = (row["version"], row["candidate"])
            sets[key] = sets.get(key, 0) + row["bytes"]
            layers[key] = layers.get(key, 0) + len(row["layers"])
    return {
        "sets": sets,
        "layers": layers,
        "bytes": sum(sets.values()),
        "rss": sum(h["rss_bytes"] or 0 for h in hosts),
        "loads": sum(h["loads"] for h in hosts),
    }


def wait_for(registry: Any, check: Any, within: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        snap = snapshot(registry)
        if check(snap) or time.monotonic() > deadline:
            return snap
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--extra", type=int, default=100)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--discards", type=int, default=2, help="candidates loaded and discarded before the promoted one")
    args = ap.parse_args()

    import ray

    from hetmm_ray.distributed import get_registry
    from hetmm_ray.distributed.runtime import connect
    from hetmm_ray.store import open_store

    connect(num_cpus=2)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=args.image_size),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(folds=2),
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        uri = str(Path(tmp) / "store")
        store = open_store(uri)
        head = bank(args.images, 0, args.image_size)
        store.put(PRODUCT, template_set(head, config, 0))
        registry = get_registry(uri, placement={"hosts": args.hosts})
        ray.get(registry.set_poll.remote(0.5))
        ray.get(registry.shard_handles.remote(PRODUCT))
        grown = {k: torch.cat([v, bank(args.extra, 1, args.image_size)[k]]) for k, v in head.items()}

        def step(name: str, snap: dict[str, Any]) -> None:
            sets = ", ".join(f"v{v}{' cand' if c else ''}: {b / MIB:.1f}" for (v, c), b in sorted(snap["sets"].items()))
            rows.append([name, sets, f"{snap['bytes'] / MIB:.1f}", f"{snap['rss'] / MIB:.0f}", snap["loads"]])

        time.sleep(2.0)  # let the host settle after the first load
        step("head loaded", before := snapshot(registry))
        steps = [*((2 + i, "discard") for i in range(args.discards)), (2 + args.discards, "promote")]
        for version, end in steps:
            store.put(PRODUCT, template_set(grown, config, 0), expect_head=store.head(PRODUCT), candidate=True)
            loaded = wait_for(registry, lambda s, v=version: s["layers"].get((v, True)) == len(RESNET18))
            step(f"candidate v{version} (store poll)", loaded)
            if end == "discard":
                ray.get(registry.discard.remote(PRODUCT, version))
                time.sleep(2.0)  # the drop is fire-and-forget: let the host free it
                after = wait_for(registry, lambda s, v=version: (v, True) not in s["sets"])
                step(f"v{version} discarded", after)
            else:
                ray.get(registry.promote.remote(PRODUCT, version))
                step(f"v{version} promoted", wait_for(registry, lambda s, v=version: (v, False) in s["sets"]))
        ray.kill(registry)
    print(f"product: {args.images} images (+{args.extra} in a candidate) at {args.image_size} px, {args.hosts} host(s)")
    print(table(["step", "held per set (MiB)", "held (MiB)", "host RSS (MiB)", "shard loads"], rows))
    change = (after["bytes"] - before["bytes"]) / max(1, before["bytes"])
    rss = (after["rss"] - before["rss"]) / max(1, before["rss"])
    print(f"after the last discard vs before: held {change:+.1%}, host RSS {rss:+.1%}")


if __name__ == "__main__":
    main()
