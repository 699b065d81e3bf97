"""Raw camera frames: the pixels as a camera hands them over, with their size and pixel format.

A station that takes frames from a camera has them as pixels already. Encoding them to PNG there
only for the replica to decode them again costs CPU on both sides and bytes on the wire
(docs/performance.md). A :class:`RawFrame` travels as it is (the gRPC ``Image.raw`` message) and
becomes the RGB array every scoring path takes here.

Exact semantics:

- ``pixels`` holds ``height`` rows of ``width`` pixels, top row first, packed (no row padding), in
  one of :data:`PIXEL_FORMATS` (GenICam's names): ``Mono8`` (1 byte a pixel), ``Mono16`` (2 bytes,
  little-endian, as GigE Vision and USB3 Vision deliver them), ``RGB8`` (3 bytes: R, G, B) and the
  Bayer mosaics ``BayerRG8``, ``BayerGR8``, ``BayerGB8``, ``BayerBG8`` (1 byte a pixel; the name
  gives the colours of the top-left 2x2 cell row by row: ``BayerRG8`` is R G over G B). A mosaic
  travels as the camera gives it (a third of RGB's bytes) and is demosaiced where it is read.
- Demosaicing (:func:`demosaic`) is bilinear by normalised convolution: each colour's samples
  weighted by ``[[1, 2, 1], [2, 4, 2], [1, 2, 1]]`` (red, blue) or ``[[0, 1, 0], [1, 4, 1], [0, 1,
  0]]`` (green) around the pixel, divided by the weights of the samples present (so a border
  pixel averages the neighbours it has), rounded half up. A pixel keeps its own sample exactly;
  a flat colour stays that colour everywhere.
- :meth:`RawFrame.to_rgb` checks, before anything is allocated, the format, each side (at least
  ``MIN_IMAGE_SIDE``), the pixel count (at most ``MAX_IMAGE_PIXELS``) and that the bytes are
  exactly ``width * height * bytes per pixel``; any failure is an ``ImageError`` (HTTP 400 /
  gRPC INVALID_ARGUMENT ``bad_image``) naming the frame. Mono is repeated on three channels;
  ``Mono16`` keeps its high byte (``value >> 8``), as ``decode.py`` reads a 16-bit grayscale
  PNG, so a frame gives the same RGB pixels, and so the same score, raw or as a lossless PNG.
- :meth:`RawFrame.to_canvas` is ``decode.resize_to_geometry(frame.to_rgb())``, the same pixels,
  computed cheaper for a Mono frame: its one plane is resized (Pillow's bilinear filter treats each
  band alike) and only then repeated on three channels (a 5 MP Mono8 frame: half the work).
- :meth:`RawFrame.to_png` is the frame as a lossless PNG (8-bit gray, 16-bit gray or RGB), for
  what keeps frames rather than scoring them (the console's recent predictions, the inspection
  record); decoding it with ``decode.decode_image`` gives exactly :meth:`to_rgb`.
- :func:`raw_frame_of` builds a frame from a NumPy array: ``(H, W)`` ``uint8`` is ``Mono8``,
  ``(H, W)`` ``uint16`` is ``Mono16``, ``(H, W, 3)`` ``uint8`` is ``RGB8``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..config import MAX_IMAGE_PIXELS, MIN_IMAGE_SIDE
from ..core.geometry import resized_shape
from .decode import ImageError, resize_to_geometry

__all__ = ["BAYER_CELLS", "PIXEL_FORMATS", "RawFrame", "demosaic", "raw_frame_of"]

BAYER_CELLS = {"BayerRG8": "RGGB", "BayerGR8": "GRBG", "BayerGB8": "GBRG", "BayerBG8": "BGGR"}
"""Bayer pixel format -> the colours of its top-left 2x2 cell, row by row."""
PIXEL_FORMATS = {"Mono8": 1, "Mono16": 2, "RGB8": 3} | dict.fromkeys(BAYER_CELLS, 1)
"""Pixel format name -> bytes a pixel."""
_KERNELS = {
    "R": np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32),
    "G": np.array([[0, 1, 0], [1, 4, 1], [0, 1, 0]], np.float32),
}
_KERNELS["B"] = _KERNELS["R"]

PNG_COMPRESS_LEVEL = 1  # frames kept for looking at: fast to write, still lossless


@dataclass(frozen=True)
class RawFrame:
    """One camera frame as pixels (module doc); ``len(frame)`` is its bytes."""

    width: int
    height: int
    pixel_format: str
    pixels: bytes

    def __len__(self) -> int:
        return len(self.pixels)

    def check(self, source: str, max_pixels: int = MAX_IMAGE_PIXELS, min_side: int = MIN_IMAGE_SIDE) -> None:
        """Refuse a frame that is not what it says (module doc), before anything is allocated."""
        size = PIXEL_FORMATS.get(self.pixel_format)
        if size is None:
            known = ", ".join(PIXEL_FORMATS)
            raise ImageError(source, f"unsupported pixel format {self.pixel_format!r} (accepted: {known})")
        w, h = self.width, self.height
        if w * h > max_pixels:
            raise ImageError(source, f"frame dimensions {w}x{h} = {w * h} pixels exceed the limit of {max_pixels}")
        if min(w, h) < min_side:
            raise ImageError(source, f"frame dimensions {w}x{h} too small: each side must be at least {min_side}")
        if len(self.pixels) != w * h * size:
            raise ImageError(
                source,
                f"{len(self.pixels)} bytes of pixels where a {w}x{h} {self.pixel_format} frame has "
                f"{w * h * size} (rows packed, {size} byte{'s' if size > 1 else ''} a pixel)",
            )

    def _array(self) -> np.ndarray:
        w, h = self.width, self.height
        if self.pixel_format == "Mono16":
            return np.frombuffer(self.pixels, dtype="<u2").reshape(h, w)
        channels = PIXEL_FORMATS[self.pixel_format]
        flat = np.frombuffer(self.pixels, dtype=np.uint8)
        return flat.reshape(h, w) if channels == 1 else flat.reshape(h, w, channels)

    def to_rgb(self, source: str = "<frame>") -> np.ndarray:
        """The frame as an RGB ``uint8`` array ``(H, W, 3)`` (module doc)."""
        self.check(source)
        values = self._array()
        if self.pixel_format == "RGB8":
            return values.copy()  # writable and owned, as a decoded image is
        if self.pixel_format in BAYER_CELLS:
            return demosaic(values, BAYER_CELLS[self.pixel_format])
        return np.repeat(self._gray(values)[:, :, None], 3, axis=2)

    def _gray(self, values: np.ndarray) -> np.ndarray:
        """A Mono frame's 8-bit plane: Mono16 keeps its high byte (module doc)."""
        return (values >> 8).astype(np.uint8) if self.pixel_format == "Mono16" else values

    def to_canvas(self, size: int, geometry: str, source: str = "<frame>") -> np.ndarray:
        """The frame on the backbone's canvas (module doc): ``resize_to_geometry(self.to_rgb())``."""
        if self.pixel_format not in ("Mono8", "Mono16"):
            return resize_to_geometry(self.to_rgb(source), size, geometry)
        self.check(source)
        gray = self._gray(self._array())
        h, w = resized_shape(self.height, self.width, size, geometry)
        if (h, w) != gray.shape:
            gray = np.asarray(Image.fromarray(np.ascontiguousarray(gray)).resize((w, h), Image.Resampling.BILINEAR))
        return np.repeat(gray[:, :, None], 3, axis=2)

    def to_png(self, source: str = "<frame>") -> bytes:
        """The frame as a lossless PNG (module doc; a mosaic as its demosaiced RGB)."""
        self.check(source)
        values = self.to_rgb(source) if self.pixel_format in BAYER_CELLS else self._array()
        if self.pixel_format == "Mono16":
            image = Image.frombytes("I;16", (self.width, self.height), values.astype("<u2").tobytes())
        else:
            image = Image.fromarray(values)
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        return buf.getvalue()


def raw_frame_of(array: np.ndarray) -> RawFrame:
    """A :class:`RawFrame` of ``array`` (module doc: its shape and dtype say the pixel format)."""
    if array.dtype == np.uint8 and array.ndim == 2:
        fmt = "Mono8"
    elif array.dtype == np.uint16 and array.ndim == 2:
        fmt = "Mono16"
    elif array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3:
        fmt = "RGB8"
    else:
        raise ValueError(f"no raw pixel format for an array of shape {array.shape} and dtype {array.dtype}")
    pixels = np.ascontiguousarray(array, dtype="<u2" if fmt == "Mono16" else np.uint8).tobytes()
    return RawFrame(width=int(array.shape[1]), height=int(array.shape[0]), pixel_format=fmt, pixels=pixels)


def _filter3(values: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``values`` (H, W) correlated with a 3x3 ``kernel``, zeros outside."""
    padded = np.pad(values, 1)
    h, w = values.shape
    out = np.zeros((h, w), np.float32)
    for dy in range(3):
        for dx in range(3):
            if kernel[dy, dx]:
                out += kernel[dy, dx] * padded[dy : dy + h, dx : dx + w]
    return out


def demosaic(mosaic: np.ndarray, cell: str) -> np.ndarray:
    """A Bayer ``mosaic`` (H, W) ``uint8`` whose top-left 2x2 ``cell`` is e.g. ``"RGGB"`` as RGB
    ``uint8`` (H, W, 3), bilinear by normalised convolution (module doc)."""
    h, w = mosaic.shape
    samples = mosaic.astype(np.float32)
    out = np.empty((h, w, 3), np.uint8)
    for channel, colour in enumerate("RGB"):
        present = np.zeros((h, w), np.float32)
        for i, at in enumerate(cell):
            if at == colour:
                present[i // 2 :: 2, i % 2 :: 2] = 1
        kernel = _KERNELS[colour]
        value = _filter3(samples * present, kernel) / _filter3(present, kernel)
        out[..., channel] = np.floor(value + 0.5).clip(0, 255)
    return out
