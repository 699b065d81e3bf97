"""Ray layer: places ``core`` work on a cluster (DESIGN.md). Imports Ray; ``core`` never does."""

from __future__ import annotations

from .pts_fanout import pts_indices_ray
from .shard import ShardPlacement, TemplateShard, shard_options

__all__ = ["ShardPlacement", "TemplateShard", "pts_indices_ray", "shard_options"]
