"""Helpers of the archive tests (``hetmm inspect``): a tiny stored product and folders of its images.

The product is fitted here on synthetic gears (resnet18 with random weights at 64 px: small and
fast on a loaded 2-core machine); image folders mix good and defective gears with bad files of
every kind the job must survive (:func:`write_bad_files`).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct

PRODUCT = "gear"
SIZE = 64
BAD_FILES = {  # name -> a word of the error its row must carry
    "truncated.png": "truncated or corrupt",
    "notes.txt": "not a recognised image format",
    "empty.png": "empty file",
    "bomb.png": "exceed the limit",
    "huge.png": "file too large",
}


def tiny_config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=6,
    )


def fit_store(uri: str) -> str:
    """The product fitted on 6 good gears and published to the store at ``uri``."""
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.store import open_store

    gear = SyntheticProduct(seed=0, size=SIZE)
    HETMM(tiny_config()).fit([gear.good(i) for i in range(6)]).save(open_store(uri), PRODUCT)
    return uri


def gear_images(n: int) -> dict[str, np.ndarray]:
    """``n`` images by file name: good and defective gears, alternating (none seen at fit)."""
    gear = SyntheticProduct(seed=0, size=SIZE)
    kinds = ("scratch", "hole", "missing")
    out = {}
    for i in range(n):
        if i % 2:
            out[f"d{i:03d}.png"] = gear.defective(i, kinds[i % 3])[0]
        else:
            out[f"g{i:03d}.png"] = gear.good(100 + i)
    return out


def write_images(folder: Path, n: int) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    images = gear_images(n)
    for name, image in images.items():
        Image.fromarray(image).save(folder / name)
    return images


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png() -> bytes:
    """A tiny PNG whose header declares 100000 x 100000 pixels (refused before decoding)."""
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IEND", b"")


def bad_bytes(name: str, good_png: bytes) -> bytes:
    """The content of one of :data:`BAD_FILES` (``huge.png`` is made sparse by :func:`write_bad_files`)."""
    return {
        "truncated.png": good_png[: len(good_png) // 2],
        "notes.txt": b"not an image\n",
        "empty.png": b"",
        "bomb.png": bomb_png(),
    }[name]


def write_bad_files(folder: Path, *, huge: bool = True) -> list[str]:
    """The bad files in ``folder``; ``huge.png`` is a sparse 40 MiB file (over the byte limit, no disk used)."""
    buf = folder / "g000.png"
    good = buf.read_bytes()
    names = []
    for name in BAD_FILES:
        if name == "huge.png":
            if not huge:
                continue
            with open(folder / name, "wb") as f:
                f.truncate(40 * 2**20)
        else:
            (folder / name).write_bytes(bad_bytes(name, good))
        names.append(name)
    return names


def read_rows(dest: str, filesystem=None) -> list[dict]:
    """Every row of DEST's parts."""
    from hetmm_ray.archive.listing import part_files
    from hetmm_ray.archive.locations import FsSpec

    spec = FsSpec() if filesystem is None else filesystem
    fs, _ = spec.resolve(dest)
    rows = []
    for path in part_files(dest, spec):
        rows.extend(pq.read_table(path, filesystem=fs).to_pylist())
    return rows
