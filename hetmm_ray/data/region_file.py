"""Reading an inspection region from a file (``hetmm fit --region FILE`` and friends).

Exact semantics:

- ``.json``, ``.yaml`` / ``.yml``: the stored form of ``config/region.py``
  (``{"size": [h, w], "include": [...], "exclude": [...]}``), checked there; the region must
  count at least one pixel (``core.region.check_region_covers``).
- An image (``.png``, ``.bmp``, ``.tif``, ``.jpg``: decoded safely by ``data.decode``): a mask
  whose size is the reference frame; a pixel is included iff some RGB channel of its decoded
  value is nonzero (alpha composited onto black; 16-bit masks keep their 8 high bits, so use
  0 / 65535 there). Converted exactly to include rectangles (``core.region.region_from_mask``).
- ``none`` (the word): no region (every pixel counts; ``hetmm region`` removes one).

Every problem is a :class:`~hetmm_ray.config.ConfigError` naming the file: one line, exit 2
on the CLI, 400 over HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import IMAGE_SUFFIXES, ConfigError
from ..core.region import check_region_covers, region_from_mask
from .decode import ImageError, decode_image

__all__ = ["read_region", "region_from_json"]


def region_from_json(data: Any) -> dict[str, Any]:
    """A region given as data (a JSON body, a create form's field): canonical and covering a pixel."""
    return check_region_covers(data)


def read_region(path: str | Path) -> dict[str, Any] | None:
    """The canonical region in ``path`` (see the module docstring); None for ``none``."""
    if str(path).lower() == "none":
        return None
    p = Path(path)
    suffix = p.suffix.lower()
    try:
        if suffix in IMAGE_SUFFIXES:
            try:
                rgb = decode_image(p)
            except ImageError as exc:
                raise ConfigError(f"region mask: {exc}") from None
            return region_from_mask(rgb.max(axis=2))
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the region file ({exc.strerror or type(exc).__name__})") from None
        if suffix in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"not valid YAML: {str(exc).splitlines()[0]}") from None
        elif suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not valid JSON: {exc}") from None
        else:
            raise ConfigError(f"unknown region file type {suffix or '(none)'!r}: use .json, .yaml or a PNG mask")
        return region_from_json(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
