"""Ray layer: places ``core`` work on a cluster (DESIGN.md). Imports Ray; ``core`` never does."""

from __future__ import annotations

from .extract import extract_features_ray
from .pts_fanout import pts_indices_ray
from .registry import ProductRegistry, get_registry
from .runtime import ClusterUnavailable, connect
from .shard import ShardPlacement, TemplateShard, shard_options

__all__ = [
    "ClusterUnavailable",
    "ProductRegistry",
    "ShardPlacement",
    "TemplateShard",
    "connect",
    "extract_features_ray",
    "get_registry",
    "pts_indices_ray",
    "shard_options",
]
