"""A (product, layer) shard: that layer's feature bank and selection, as data.

:class:`LayerShard` is the shard itself, a plain object. Template hosts
(distributed/hosts.py) hold many of them in one long-lived process each, so
processes grow with hosts, not with products. :class:`TemplateShard`
is the same object as an actor of its own (one process per shard), kept for
ad-hoc use and the tests that pin its behaviour.

A product's template set is split by layer so that big banks and many
products spread over the cluster's GPUs and nodes (docs/design.md, "Sharding").
A shard appends new images' features, runs PTS for its layer by fanning pixel
chunks out as Ray tasks, and hands out its tiny set through the object store,
so replicas never pull the full bank.

A shard starts from the store (the truth): its layer's bank and stored
selection at the product's head (or a given version), read with
``VersionedStore.get_layer``, which fetches that layer's objects only. A shard
rebuilt from the store (a restarted actor, or a lost host's shard loaded on
another host) therefore comes back with the published tiny set bit for bit,
without re-running PTS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import ray
import torch
from torch import Tensor

from ..config import PTS_CHUNK_PIXELS, TASK_CPUS
from ..core.pts import select_layer, select_templates
from .pts_fanout import pts_indices_ray

__all__ = ["LayerShard", "ShardPlacement", "TemplateShard", "shard_options"]


@dataclass(frozen=True, kw_only=True)
class ShardPlacement:
    """Where shards go: fractional GPUs when the cluster has them, else CPUs, spread over nodes.

    With template hosts (the registry's way) the resources are per host, not per shard.
    """

    num_gpus: float = 0.25  # per shard (per host) when the cluster has GPUs
    # Shards hold memory; their PTS work runs in tasks that reserve CPUs. A nonzero share here
    # would add up over products x layers and starve those tasks on a small node.
    num_cpus: float = 0.0
    resources: dict[str, float] | None = None  # e.g. {"template_memory": 1} on dedicated nodes
    hosts: int | None = None  # template host processes (None: ServiceConfig().template_hosts)


def shard_options(placement: ShardPlacement, *, product: str, layer: str) -> dict[str, Any]:
    """``TemplateShard.options(...)`` for a product's layer."""
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    return {
        "name": f"hetmm-shard:{product}:{layer}",
        "num_cpus": placement.num_cpus,
        "num_gpus": placement.num_gpus if has_gpus else 0,
        "resources": dict(placement.resources or {}),
        "scheduling_strategy": "SPREAD",
        "max_restarts": -1,  # the store is the truth: a restarted shard is reloaded from it
    }


class LayerShard:
    """One layer of one product: the bank (N, C, H, W) and its current selection."""

    def __init__(self, product: str, layer: str, source: str | np.ndarray, version: int | None = None) -> None:
        """``source``: a store URI (load ``version``'s layer, None = head) or a bank array (tests, ad-hoc use)."""
        self.product = product
        self.layer = layer
        self.indices: Tensor | None = None
        self.centres: Tensor | None = None
        self.version: int | None = None
        if isinstance(source, str):
            self.reload(source, version)
        else:
            self.bank = torch.from_numpy(np.array(source))  # own, writable copy

    def reload(self, source: str, version: int | None = None) -> int:
        """Replace this shard's state by its layer of ``version`` in the store (None = head, e.g.
        another writer moved it); returns the version loaded. Reads this layer's objects only."""
        from ..store import open_store

        got = open_store(source).get_layer(self.product, self.layer, version)
        self.bank, self.indices, self.centres = got.bank, got.indices, got.centres
        self.version = got.version
        return self.version

    def nbytes(self) -> int:
        """Bytes of tensors this shard holds (bank and selection)."""
        parts = (self.bank, self.indices, self.centres)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def info(self) -> dict[str, Any]:
        return {
            "product": self.product,
            "layer": self.layer,
            "images": int(self.bank.shape[0]),
            "shape": list(self.bank.shape[1:]),
            "dtype": str(self.bank.dtype).removeprefix("torch."),
            "sheets": self._tiny().shape[0],
            "version": self.version,
            "pid": os.getpid(),  # tells a restarted incarnation from the old one
            "node": ray.get_runtime_context().get_node_id(),
        }

    def mark_published(self, version: int) -> None:
        """The registry published this shard's state as ``version``: a restart now reloads it."""
        self.version = version

    def append(self, features: np.ndarray) -> int:
        """Add new images' features; the selection is reset until :meth:`select` runs."""
        new = torch.from_numpy(np.array(features)).to(self.bank.dtype)
        if new.shape[1:] != self.bank.shape[1:]:
            raise ValueError(f"{self.layer}: features {tuple(new.shape[1:])} do not fit {tuple(self.bank.shape[1:])}")
        self.bank = torch.cat([self.bank, new])
        self.indices = self.centres = None
        return int(self.bank.shape[0])

    def select(
        self, kind: str, sheets: int, seed: int = 0, chunk_pixels: int = PTS_CHUNK_PIXELS, task_cpus: float = TASK_CPUS
    ) -> int:
        """Re-select the tiny set (``core.pts.select_layer``, the one selection path); PTS runs as
        Ray tasks over pixel chunks."""
        pts = partial(pts_indices_ray, chunk_pixels=chunk_pixels, num_cpus=task_cpus)
        chosen = select_layer(self.bank, kind, sheets, seed, pts=pts)
        self.indices, self.centres = chosen.indices, chosen.centres
        return self._tiny().shape[0]

    def adopt(self, features: np.ndarray, indices: np.ndarray | None, centres: np.ndarray | None) -> int:
        """A hot update selected elsewhere (a tiled product's update task, which re-selects every tile
        position): :meth:`append` the new images' rows, then take the selection made over the grown
        bank; returns the rows held."""
        rows = self.append(features)
        self.indices = None if indices is None else torch.from_numpy(np.array(indices))
        self.centres = None if centres is None else torch.from_numpy(np.array(centres))
        return rows

    def selection(self) -> dict[str, np.ndarray | None]:
        return {
            "indices": None if self.indices is None else self.indices.numpy(),
            "centres": None if self.centres is None else self.centres.numpy(),
        }

    def _tiny(self) -> Tensor:
        if self.centres is not None:
            return self.centres
        if self.indices is not None:
            return select_templates(self.bank, self.indices)
        return self.bank

    def tiny(self) -> np.ndarray:
        """The (K, C, H, W) templates ATMM matches against, for replicas (via the object store)."""
        return self._tiny().numpy()


# The same shard as an actor of its own: one process per (product, layer).
TemplateShard = ray.remote(LayerShard)
