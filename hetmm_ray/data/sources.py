"""Good images from a folder or an S3 prefix (``POST /v1/products/{p}`` with a ``source``).

Only names with an image suffix are read, in sorted order, and every object's
size is checked against the upload limit before its bytes are fetched where the
backend can tell (local files); decoding and its checks happen later, where the
features are extracted.
"""

from __future__ import annotations

from pathlib import Path

from ..config import MAX_IMAGE_BYTES
from ..store import StoreError, open_backend

__all__ = ["IMAGE_SUFFIXES", "SourceError", "read_image_source"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


class SourceError(ValueError):
    """An image source is missing, empty or too big."""


def read_image_source(uri: str, *, max_images: int, max_bytes: int = MAX_IMAGE_BYTES) -> list[tuple[str, bytes]]:
    """``(name, encoded bytes)`` of every image under a local folder or ``s3://bucket/prefix``."""
    if not uri.startswith("s3://") and not Path(uri.removeprefix("file://")).is_dir():
        raise SourceError(f"{uri}: not a folder")
    try:
        backend = open_backend(uri)
        names = [k for k in backend.list("") if k.lower().endswith(IMAGE_SUFFIXES)]
    except StoreError as exc:
        raise SourceError(f"{uri}: {exc}") from None
    if not names:
        raise SourceError(f"{uri}: no images ({', '.join(IMAGE_SUFFIXES)}) found")
    if len(names) > max_images:
        raise SourceError(f"{uri}: {len(names)} images, more than the limit of {max_images}")
    out = []
    for name in names:
        local = getattr(backend, "root", None)
        if local is not None and (Path(local) / name).stat().st_size > max_bytes:
            raise SourceError(f"{uri}/{name}: larger than {max_bytes} bytes")
        data, _ = backend.read(name)
        if len(data) > max_bytes:
            raise SourceError(f"{uri}/{name}: larger than {max_bytes} bytes")
        out.append((name, data))
    return out
