"""Ray layer: places ``core`` work on a cluster (docs/design.md). Imports Ray; ``core`` never does.

Names are imported on first use: Ray workers import this package to reach one
actor or task (a shard needs neither the backbone nor the registry), so
importing it must not pull in every module's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .extract import extract_features_ray
    from .hosts import HostPool, TemplateHost
    from .pts_fanout import pts_indices_ray
    from .registry import ProductRegistry, get_registry
    from .runtime import ClusterUnavailable, connect, shutdown_ray
    from .shard import LayerShard, ShardPlacement, TemplateShard, shard_options

_WHERE = {
    "ClusterUnavailable": "runtime",
    "HostPool": "hosts",
    "LayerShard": "shard",
    "TemplateHost": "hosts",
    "ProductRegistry": "registry",
    "ShardPlacement": "shard",
    "TemplateShard": "shard",
    "connect": "runtime",
    "extract_features_ray": "extract",
    "get_registry": "registry",
    "pts_indices_ray": "pts_fanout",
    "shard_options": "shard",
    "shutdown_ray": "runtime",
}

__all__ = [
    "ClusterUnavailable",
    "HostPool",
    "LayerShard",
    "ProductRegistry",
    "ShardPlacement",
    "TemplateHost",
    "TemplateShard",
    "connect",
    "extract_features_ray",
    "get_registry",
    "pts_indices_ray",
    "shard_options",
    "shutdown_ray",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this hook
    return value
