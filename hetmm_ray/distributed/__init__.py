"""Ray layer: places ``core`` work on a cluster (DESIGN.md). Imports Ray; ``core`` never does."""

from __future__ import annotations

from .pts_fanout import pts_indices_ray
from .registry import ProductRegistry, get_registry
from .shard import ShardPlacement, TemplateShard, shard_options

__all__ = ["ProductRegistry", "ShardPlacement", "TemplateShard", "get_registry", "pts_indices_ray", "shard_options"]
