"""Labelled validation folders for ``hetmm calibrate --val DIR``.

Accepted layouts (checked in this order):

* an MVTec category folder: ``DIR/test/good/*`` and ``DIR/test/<defect type>/*``;
* an MVTec test folder, or any folder of the same shape: ``DIR/good/*`` and
  ``DIR/<defect type>/*`` (every sub-folder other than ``good`` holds defective images).

Label 0 = good, 1 = defective. Both kinds must be present: a threshold chosen
for an objective on one class alone says nothing about the other.
"""

from __future__ import annotations

import os
from pathlib import Path

from .mvtec import IMAGE_EXTENSIONS, DatasetError, _is_image

__all__ = ["labelled_images"]


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if _is_image(p))


def labelled_images(root: str | os.PathLike) -> list[tuple[Path, int]]:
    """``(path, label)`` of every image under ``root`` (see the module docstring)."""
    base = Path(root)
    if not base.is_dir():
        raise DatasetError(f"{base}: no such folder")
    if (base / "test" / "good").is_dir():
        base = base / "test"
    if not (base / "good").is_dir():
        raise DatasetError(f"{base}: expected a good/ sub-folder (and one or more defect sub-folders), or test/good/")
    out = [(p, 0) for p in _images_in(base / "good")]
    for sub in sorted(q for q in base.iterdir() if q.is_dir() and q.name != "good" and not q.name.startswith(".")):
        out.extend((p, 1) for p in _images_in(sub))
    n_good = sum(1 for _, v in out if v == 0)
    if n_good == 0 or n_good == len(out):
        raise DatasetError(
            f"{base}: labelled validation needs good and defective images, found {n_good} good and "
            f"{len(out) - n_good} defective (extensions: {', '.join(IMAGE_EXTENSIONS)})"
        )
    return out
