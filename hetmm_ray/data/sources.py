"""Good images from a folder or an S3 prefix (``POST /v1/products/{p}`` with a ``source``).

Only names with an image suffix are read, in sorted order, and every object's
size is checked against the upload limit before its bytes are fetched where the
backend can tell (local files); decoding and its checks happen later, where the
features are extracted.
"""

from __future__ import annotations

from pathlib import Path

from .. import config
from ..config import MAX_IMAGE_BYTES
from ..errors import HetmmError
from ..store import StoreError, open_backend

__all__ = ["IMAGE_SUFFIXES", "SourceError", "read_image_source"]

IMAGE_SUFFIXES = config.IMAGE_SUFFIXES  # re-exported: the one list lives in hetmm_ray.config


class SourceError(HetmmError, ValueError):
    """An image source is missing, empty or too big."""


def read_image_source(
    uri: str, *, max_images: int, max_bytes: int = MAX_IMAGE_BYTES, confine_to: str | None = None
) -> list[tuple[str, bytes]]:
    """``(name, encoded bytes)`` of every image under a local folder or ``s3://bucket/prefix``.

    ``confine_to``: a local folder every file read must really lie under (symlinks resolved),
    so a link inside an allowed folder cannot reach outside it.
    """
    try:
        if not uri.startswith("s3://") and not Path(uri.removeprefix("file://")).is_dir():
            raise SourceError(f"{uri}: not a folder")
        backend = open_backend(uri)
        names = [k for k in backend.list("") if k.lower().endswith(IMAGE_SUFFIXES)]
    except StoreError as exc:
        raise SourceError(f"{uri}: {exc}") from None
    except OSError as exc:  # a name too long, a symlink loop, no permission
        raise SourceError(f"{uri}: cannot be listed ({exc.strerror or type(exc).__name__})") from None
    if confine_to is not None:
        root = Path(confine_to).resolve()
        names = [n for n in names if (Path(uri) / n).resolve().is_relative_to(root)]
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
