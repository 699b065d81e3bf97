"""Ship what the replica needs: uploads decoded and resized to the product's canvas in the ingress.

The replica only ever uses an image at the size its backbone sees (``backbone.image_size`` and
``geometry``: ``data.decode.resize_to_geometry``), for scoring and for the heat-map alike. So the
ingress, which decodes the upload anyway, resizes it there: a 900x900 PNG crosses the object
store as 256x256x3 bytes (12x less) and the replica, whose CPU is the bottleneck, skips the
resize (``resize_to_geometry`` returns an image already at its shape unchanged, and the
letterbox box of a fitted image is the box of the original). Scores are the same as when the
replica resizes: the same Pillow resize of the same pixels, run in another process.

A tiled product (``geometry.tiles``) has no canvas here: its frames go to the replica at their
own resolution, where each tile is cut and reaches the canvas (hetmm_ray/detection/tiled.py).

The canvas of a product comes from its published version's configuration (the registry's
snapshot), cached for ``ttl_s`` seconds like the ingress's other product facts. A version
published with another canvas inside that window is still scored correctly in geometry, from
an image already resized to the old canvas (resized again by the replica).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from ..core.device import usable_cores
from ..data.decode import decode_image, resize_to_geometry
from ..data.raw_frame import RawFrame
from ..detection.pipeline import load_batch
from ..messages import ProductSnapshot

__all__ = ["CanvasCache", "decode_threads", "decode_to_canvas"]


class CanvasCache:
    """product -> (image_size, geometry) of its published version, refreshed after ``ttl_s``."""

    def __init__(self, snapshot: Callable[[str], Awaitable[ProductSnapshot]], ttl_s: float) -> None:
        self._snapshot = snapshot
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, tuple[int, str] | None]] = {}

    async def canvas(self, product: str) -> tuple[int, str] | None:
        """The product's canvas, or None when it cannot be had (then the replica resizes) or the
        product is tiled (frames travel whole)."""
        now = time.monotonic()
        hit = self._cache.get(product)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            snap = await self._snapshot(product)
        except Exception:  # noqa: BLE001 - an optimisation only: the replica reports real errors
            return None
        value = snap.config.decode_canvas
        self._cache[product] = (now + self._ttl_s, value)
        return value

    def forget(self, product: str) -> None:
        self._cache.pop(product, None)


DECODE_THREADS_MAX = 8


def decode_threads(busy: bool) -> int:
    """Threads to decode one request's uploads with: one per core (at most ``DECODE_THREADS_MAX``) when
    nothing else of the service is at work here, one when it is (``busy``: the caller knows: the ingress,
    other requests queued or scoring at the detector; the gRPC replica, images queued or scoring there
    or other requests decoding).

    Why: under load the cores are already taken by scoring, so a request decoded in parallel only
    takes them from the batch being scored, and the decode threads, the torch threads and the request
    path then contend (one decode thread serves more images/s there; docs/performance.md). A lone
    request still gets every core: its decode is all there is to do."""
    return 1 if busy else min(DECODE_THREADS_MAX, usable_cores())


def decode_to_canvas(
    uploads: Sequence[tuple[str, bytes | RawFrame]], canvas: tuple[int, str] | None, busy: bool = False
) -> list[np.ndarray]:
    """Decode every upload (encoded bytes, or a camera's :class:`RawFrame` read as it is; ``ImageError``
    names the first bad one, in upload order) and resize it to ``canvas``; several uploads in
    :func:`decode_threads` threads (``busy``: the service is at work).

    Why threads: Pillow's decode and resize release the GIL, and a request decoded one image after
    another holds one core while the others could idle once the replica has scored the previous
    batch. The pixels are the same whichever thread decodes them."""

    def one(upload: tuple[str, bytes | RawFrame]) -> np.ndarray:
        name, data = upload
        if isinstance(data, RawFrame):
            return data.to_rgb(name) if canvas is None else data.to_canvas(canvas[0], canvas[1], name)
        image = decode_image(data, source=name)
        return image if canvas is None else resize_to_geometry(image, canvas[0], canvas[1])

    return load_batch(uploads, one, decode_threads(busy))
