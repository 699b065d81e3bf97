"""Input limits: what an image must be before any pixel is decoded, and which files are images.

Exact semantics: an encoded image larger than :data:`MAX_IMAGE_BYTES`, or whose header declares
more than :data:`MAX_IMAGE_PIXELS` (width * height) or a side below :data:`MIN_IMAGE_SIDE`, is
refused (``data/decode.py``); folders are read for files whose lower-cased suffix is in
:data:`IMAGE_SUFFIXES` (the CLI, server-side sources, datasets).
"""

from __future__ import annotations

__all__ = ["IMAGE_SUFFIXES", "MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "MIN_IMAGE_SIDE"]

MAX_IMAGE_BYTES = 32 * 1024 * 1024
"""Largest encoded image accepted (bytes)."""
MAX_IMAGE_PIXELS = 50_000_000
"""Largest declared width*height accepted; larger headers are refused unread."""
MIN_IMAGE_SIDE = 8
"""Smallest width or height accepted."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
"""File suffixes (lower case) read as images from folders: the CLI, server-side sources, datasets."""
