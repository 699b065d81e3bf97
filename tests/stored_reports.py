"""A small evaluation report for the report store's tests (store/reports.py): real PNG bytes, a page
that refers to them, and a two-image template set so that the store holds a version to tag it with."""

from __future__ import annotations

import struct
import zlib

import torch
import torch.nn.functional as F

from hetmm_ray.config import BackboneConfig, DetectorConfig, ScoringConfig
from hetmm_ray.core.scoring import Calibration
from hetmm_ray.core.templates import TemplateSet

__all__ = ["page", "png_bytes", "report", "tiny_set"]


def tiny_set(seed: int = 0) -> TemplateSet:
    """A two-image, one-layer template set: enough for the store to hold a version."""
    g = torch.Generator().manual_seed(seed)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64, layers=("layer1",)),
        scoring=ScoringConfig(forward_windows=(3,), backward_windows=(3,), alphas=(0.5,), layer_weights=(1,)),
        device="cpu",
    )
    return TemplateSet(
        bank={"layer1": F.normalize(torch.randn(2, 4, 3, 3, generator=g), dim=1)},
        config=config,
        weights_id="random:seed=0",
        image_digests=(f"{seed:032x}", f"{seed + 1:032x}"),
        calibration=Calibration((0.1, 0.2)),
    )


def png_bytes(value: int, side: int = 4) -> bytes:
    """A real grey PNG of ``side`` x ``side`` pixels of ``value`` (written by hand: zlib and CRCs)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([value]) * side for _ in range(side))
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def page(*images: str) -> bytes:
    """A page showing ``images`` (relative names), with an inline style as the real report has."""
    tags = "".join(f'<img src="{name}" alt="">' for name in images)
    return f"<!DOCTYPE html><html><head><style>body{{}}</style></head><body>{tags}</body></html>".encode()


def report(value: int) -> dict[str, bytes]:
    """A report's files (name -> bytes): the page, a figure and a gallery picture, told apart by ``value``."""
    return {
        "index.html": page("histogram.png", "gallery/000-frame.png"),
        "histogram.png": png_bytes(value),
        "gallery/000-frame.png": png_bytes(value + 1),
    }
