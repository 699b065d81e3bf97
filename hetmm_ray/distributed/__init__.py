"""Ray layer: places ``core`` work on a cluster (DESIGN.md). Imports Ray; ``core`` never does."""

from __future__ import annotations

from .pts_fanout import pts_indices_ray

__all__ = ["pts_indices_ray"]
