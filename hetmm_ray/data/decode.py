"""Safe image decoding: every bad input becomes one clear :class:`ImageError`.

Images come from cameras, uploads and dataset folders, so nothing about them is
trusted. :func:`decode_image` enforces, in this order and before any pixel is
decoded:

1. the input exists, is a regular file and is readable (paths only);
2. it is not empty and not larger than ``max_bytes`` (``stat`` for paths, so an
   oversized file is never read);
3. it is PNG, JPEG, BMP or TIFF. Only those four parsers ever see the data; other
   formats are recognised from their signature and refused by name;
4. the width and height declared in the header are sane: ``width * height <=
   max_pixels`` (a tiny file declaring 100000x100000 pixels is refused unread)
   and each side ``>= min_side``.

Only then are the pixels decoded (truncated or corrupt data is an error, never
silently padded) and converted to RGB ``uint8``:

* ``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ``RGBX`` -> RGB with Pillow's conversion;
* modes with alpha (``RGBA``, ``LA``, ``PA``, ``P`` with transparency) are
  composited onto **black**: ``rgb * alpha / 255``. Fully transparent pixels
  become black;
* 16-bit grayscale (``I;16``, ``I;16L``, ``I;16B``, and ``I`` holding values in
  ``0..65535``) keeps the 8 most significant bits (``value >> 8``), so the full
  16-bit range maps onto the full 8-bit range instead of being clipped;
* anything else (``F`` float, ``I`` with 32-bit values, ``LAB``, ``HSV``...) is
  refused as an unsupported pixel mode;
* multi-frame files (TIFF pages, APNG, MPO) yield their first frame.

EXIF orientation is not applied: industrial cameras do not set it and the
detector compares images pixel by pixel as the sensor delivered them.

Pixels of intact 8-bit RGB PNGs (what line cameras and datasets mostly write) are decoded by
libpng through ``imagecodecs`` when it is installed: faster than Pillow's decoder, the
same pixels (a lossless format; tests/unit/core/test_fast_runtime.py compares them), and the GIL released
while it works, so the decode threads of ``predict`` really run beside the scoring (pyspng,
as fast, holds the GIL, so a second thread gains nothing). Anything else, and any PNG
libpng refuses, goes through Pillow, which then accepts or refuses it exactly as before.

Pillow's global decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``) is never
modified; our own limit is checked first, and any ``DecompressionBombError``
Pillow raises later is converted into :class:`ImageError`.
"""

from __future__ import annotations

import io
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, JpegImagePlugin

from hetmm_ray.config import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MIN_IMAGE_SIDE
from hetmm_ray.core.device import image_digest
from hetmm_ray.core.geometry import PAD_VALUE, canvas_box, resized_shape
from hetmm_ray.errors import HetmmError

__all__ = [
    "canvas_digest",
    "ACCEPTED_FORMATS",
    "ImageError",
    "decode_image",
    "image_shape",
    "images_to_tensor",
    "load_image",
    "pillow_only",
    "resize_rgb",
    "resize_to_geometry",
]

ACCEPTED_FORMATS = ("PNG", "JPEG", "BMP", "TIFF")
"""Encoded formats :func:`decode_image` accepts."""

_ACCEPTED_TEXT = ", ".join(ACCEPTED_FORMATS)
_PREFIX_BYTES = 16  # what Pillow's signature checks look at
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_DIRECT_MODES = ("1", "L", "CMYK", "YCbCr", "RGBX")


class ImageError(HetmmError, ValueError):
    """An image could not be accepted; ``str(err)`` is ``"<source>: <problem>"``."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem

    def __reduce__(self):  # keep both fields across pickling (worker processes)
        return (type(self), (self.source, self.problem))


# --- reading -----------------------------------------------------------------
def _read_path(path: Path, source: str, max_bytes: int) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ImageError(source, "file not found") from None
    except NotADirectoryError:
        raise ImageError(source, "file not found (a parent of the path is not a folder)") from None
    except OSError as exc:
        raise ImageError(source, f"cannot read file ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ImageError(source, "is a directory, not an image file")
    if not stat.S_ISREG(st.st_mode):
        raise ImageError(source, "not a regular file")
    _check_byte_count(st.st_size, source, max_bytes)
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)  # the file may have grown since stat
    except OSError as exc:
        raise ImageError(source, f"cannot read file ({exc.strerror or exc})") from None
    _check_byte_count(len(raw), source, max_bytes)
    return raw


def _check_byte_count(n: int, source: str, max_bytes: int) -> None:
    if n == 0:
        raise ImageError(source, "empty file (0 bytes)")
    if n > max_bytes:
        raise ImageError(source, f"file too large: {n} bytes exceeds the limit of {max_bytes} bytes")


# --- identification (header only) -------------------------------------------
def _plugins() -> dict:
    Image.preinit()
    Image.init()
    return Image.OPEN


def _signature_matches(accept, prefix: bytes) -> bool:
    if accept is None:
        return False
    try:
        result = accept(prefix)
    except Exception:  # noqa: BLE001 - a third-party signature check misbehaving is "no match"
        return False
    return bool(result) and not isinstance(result, str)


def _open_header(raw: bytes, source: str) -> Image.Image:
    """Parse the header with one of the accepted parsers; no pixel is decoded.

    This mirrors ``Image.open`` restricted to :data:`ACCEPTED_FORMATS`, without its
    global decompression-bomb check (our own, configurable check follows).
    """
    opens = _plugins()
    prefix = raw[:_PREFIX_BYTES]
    header_errors: list[str] = []
    for fmt in ACCEPTED_FORMATS:
        factory, accept = opens[fmt]
        if not _signature_matches(accept, prefix):
            continue
        if fmt == "JPEG":
            # The registered factory may turn a JPEG into a multi-picture (MPO)
            # file, whose opening decodes frame offsets; we only want frame 0.
            factory = JpegImagePlugin.JpegImageFile
        try:
            return factory(io.BytesIO(raw), "")
        except Image.DecompressionBombError as exc:
            raise ImageError(source, f"declared image size too large ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - parsers raise many types for bad headers
            header_errors.append(f"{fmt}: {exc}")
    if header_errors:
        raise ImageError(source, f"truncated or corrupt image header ({'; '.join(header_errors)})")
    for fmt in Image.ID:
        if fmt not in ACCEPTED_FORMATS and _signature_matches(opens[fmt][1], prefix):
            raise ImageError(source, f"unsupported format {fmt} (accepted formats: {_ACCEPTED_TEXT})")
    raise ImageError(source, f"not a recognised image format (accepted formats: {_ACCEPTED_TEXT})")


def _check_dimensions(size: tuple[int, int], source: str, max_pixels: int, min_side: int) -> None:
    w, h = size
    if w * h > max_pixels:
        raise ImageError(
            source,
            f"declared image dimensions {w}x{h} = {w * h} pixels exceed the limit of {max_pixels} pixels "
            "(refused before decoding: possible decompression bomb)",
        )
    if min(w, h) < min_side:
        raise ImageError(source, f"image dimensions {w}x{h} too small: each side must be at least {min_side} pixels")


# --- fast path -------------------------------------------------------------------
_png_decode: Callable[..., np.ndarray] | None
try:  # optional: a faster decoder for the commonest input; Pillow decodes everything without it
    from imagecodecs import png_decode as _imagecodecs_png_decode

    _png_decode = _imagecodecs_png_decode
except ImportError:  # pragma: no cover - imagecodecs is a declared dependency
    _png_decode = None

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def pillow_only() -> None:
    """Decode every image of this process with Pillow from now on, libpng's fast path off (the plain
    sequential baseline of ``benchmarks/bench_throughput.py``)."""
    global _png_decode
    _png_decode = None


def _is_plain_intact_rgb8_png(raw: bytes) -> bool:
    """An intact 8-bit truecolour PNG without transparency, in one walk over its chunks: IHDR
    (always the first chunk) declares bit depth 8 and colour type 2; there is no tRNS chunk
    (Pillow keeps such images' transparency apart, libpng's default output would not); every
    chunk's CRC matches and the file ends with IEND, as Pillow checks before it decodes (libpng
    checks the critical chunks only; runs with the GIL released)."""
    if len(raw) < 33 or not raw.startswith(_PNG_SIGNATURE) or raw[12:16] != b"IHDR":
        return False
    if raw[24] != 8 or raw[25] != 2:
        return False
    at, end = len(_PNG_SIGNATURE), len(raw)
    while at + 12 <= end:
        length = int.from_bytes(raw[at : at + 4], "big")
        kind = raw[at + 4 : at + 8]
        stop = at + 12 + length
        if stop > end or kind == b"tRNS":
            return False
        if zlib.crc32(memoryview(raw)[at + 4 : at + 8 + length]) != int.from_bytes(raw[at + 8 + length : stop], "big"):
            return False
        if kind == b"IEND":
            return True
        at = stop
    return False


def _fast_png_rgb(raw: bytes) -> np.ndarray | None:
    """The pixels of a plain, intact 8-bit RGB PNG by libpng, or None (not one, or refused:
    Pillow then decides, with its own messages)."""
    if _png_decode is None or not _is_plain_intact_rgb8_png(raw):
        return None
    try:
        rgb = _png_decode(raw)
    except Exception:  # noqa: BLE001 - libpng's refusals are left to Pillow's decoder
        return None
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        return None
    return rgb


# --- pixel conversion ---------------------------------------------------------
def _drop_alpha(rgba: np.ndarray) -> np.ndarray:
    """Composite an RGBA uint8 array onto black: ``round(rgb * alpha / 255)``."""
    rgb = rgba[..., :3].astype(np.uint16)
    alpha = rgba[..., 3:4].astype(np.uint16)
    return ((rgb * alpha + 127) // 255).astype(np.uint8)


def _to_rgb(im: Image.Image, source: str) -> np.ndarray:
    mode = im.mode
    if mode == "RGB":
        return np.array(im, dtype=np.uint8)
    if mode in _DIRECT_MODES or (mode == "P" and not im.has_transparency_data):
        return np.array(im.convert("RGB"), dtype=np.uint8)
    if mode in _ALPHA_MODES or mode == "P":
        return _drop_alpha(np.array(im.convert("RGBA"), dtype=np.uint8))
    if mode in _SIXTEEN_BIT_MODES:
        values = np.asarray(im)
        if values.ndim != 2:
            raise ImageError(source, f"unsupported pixel mode {mode} (unexpected array shape {values.shape})")
        if mode == "I" and values.size and (values.min() < 0 or values.max() > 0xFFFF):
            raise ImageError(source, "unsupported pixel mode I (values outside the 16-bit range 0..65535)")
        gray = (values.astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    raise ImageError(
        source,
        f"unsupported pixel mode {mode} (accepted: 1, L, P, LA, PA, RGB, RGBA, CMYK, YCbCr, 16-bit grayscale)",
    )


# --- public API ---------------------------------------------------------------
def _read(data: bytes | str | os.PathLike, source: str | None, max_bytes: int, caller: str) -> tuple[bytes, str]:
    """The encoded bytes of ``data`` and the name its errors use."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        src = source if source is not None else "<upload>"
        raw = bytes(data)
        _check_byte_count(len(raw), src, max_bytes)
        return raw, src
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        src = source if source is not None else str(path)
        return _read_path(path, src, max_bytes), src
    raise TypeError(f"{caller}: expected bytes or a path, got {type(data).__name__}")


def image_shape(
    data: bytes | str | os.PathLike,
    *,
    source: str | None = None,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
    min_side: int = MIN_IMAGE_SIDE,
) -> tuple[int, int]:
    """``(height, width)`` of an encoded image from its header, no pixel decoded: the checks and the
    :class:`ImageError` of :func:`decode_image` for everything a header can show."""
    raw, src = _read(data, source, max_bytes, "image_shape")
    im = _open_header(raw, src)
    try:
        _check_dimensions(im.size, src, max_pixels, min_side)
        return im.size[1], im.size[0]
    finally:
        im.close()


def decode_image(
    data: bytes | str | os.PathLike,
    *,
    source: str | None = None,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
    min_side: int = MIN_IMAGE_SIDE,
) -> np.ndarray:
    """Decode encoded image bytes or an image file into an RGB ``uint8`` array ``(H, W, 3)``.

    ``source`` names the input in error messages; it defaults to the path, or
    ``"<upload>"`` for bytes. Raises :class:`ImageError` for any input that is
    missing, empty, too large, not PNG/JPEG/BMP/TIFF, of absurd dimensions,
    truncated/corrupt, or in an unsupported pixel mode (see the module docstring).
    """
    raw, src = _read(data, source, max_bytes, "decode_image")
    im = _open_header(raw, src)
    try:
        _check_dimensions(im.size, src, max_pixels, min_side)
        fast = _fast_png_rgb(raw) if im.format == "PNG" else None
        if fast is not None and fast.shape[:2] == (im.size[1], im.size[0]):
            return fast
        try:
            im.seek(0)
            im.load()
            return _to_rgb(im, src)
        except ImageError:
            raise
        except Image.DecompressionBombError as exc:
            raise ImageError(src, f"image dimensions too large to decode ({exc})") from None
        except MemoryError:
            raise ImageError(src, "not enough memory to decode the image") from None
        except Exception as exc:  # noqa: BLE001 - decoders raise OSError, SyntaxError, ValueError, EOFError...
            raise ImageError(src, f"truncated or corrupt image data ({exc})") from None
    finally:
        im.close()


def load_image(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as RGB ``uint8`` ``(H, W, 3)``; see :func:`decode_image`."""
    return decode_image(path)


def _check_rgb(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        dtype = getattr(image, "dtype", type(image).__name__)
        raise ValueError(f"expected an RGB uint8 array of shape (H, W, 3), got shape {shape} dtype {dtype}")


def resize_rgb(image: np.ndarray, size: int) -> np.ndarray:
    """Resize an RGB ``uint8`` array to ``size x size`` with Pillow's bilinear filter.

    Pillow's bilinear filter widens its support when downscaling, i.e. it
    antialiases. Returns a new ``uint8`` array ``(size, size, 3)``.
    """
    _check_rgb(image)
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    pil = Image.fromarray(np.ascontiguousarray(image))
    return np.asarray(pil.resize((size, size), Image.Resampling.BILINEAR), dtype=np.uint8).copy()


def resize_to_geometry(image: np.ndarray, size: int, geometry: str = "squash") -> np.ndarray:
    """The image as it goes onto the backbone's ``size x size`` canvas (``core.geometry``):
    ``size x size`` for squash, long side ``size`` with the aspect kept for letterbox (not padded).

    Resizing an image already at that shape returns it unchanged, so decoding code may resize
    early (smaller arrays to hold) without changing what the backbone sees.
    """
    _check_rgb(image)
    h, w = resized_shape(image.shape[0], image.shape[1], size, geometry)
    if image.shape[:2] == (h, w):
        return image
    pil = Image.fromarray(np.ascontiguousarray(image))
    return np.asarray(pil.resize((w, h), Image.Resampling.BILINEAR), dtype=np.uint8).copy()


def canvas_digest(image: np.ndarray, size: int, geometry: str = "squash") -> str:
    """The digest ``hetmm fit``, ``update`` and ``evaluate`` stored for an image before digests were
    of decoded frames: its :func:`~hetmm_ray.core.device.image_digest` after :func:`resize_to_geometry`
    (they resized first).

    Every path now stores the digest of the decoded frame (what the service always stored); a hot
    update also compares this one with the bank's, so an image of a product stored with canvas
    digests is still recognised as held (no duplicate, the same folds).
    """
    return image_digest(resize_to_geometry(image, size, geometry))


def images_to_tensor(images: list[np.ndarray], size: int, geometry: str = "squash") -> torch.Tensor:
    """Stack RGB ``uint8`` arrays into a float32 tensor ``(B, 3, size, size)`` in ``[0, 1]``.

    Images are brought to the canvas with :func:`resize_to_geometry`; for letterbox the rest
    of the canvas holds the ImageNet mean (``core.geometry.PAD_VALUE``), and
    :func:`hetmm_ray.core.geometry.canvas_box` says where each image's content is.
    """
    if len(images) == 0:
        raise ValueError("images_to_tensor: no images given")
    if geometry == "squash":
        batch = np.empty((len(images), size, size, 3), dtype=np.uint8)
        for i, image in enumerate(images):
            _check_rgb(image)
            batch[i] = image if image.shape[:2] == (size, size) else resize_rgb(image, size)
        return torch.from_numpy(batch).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
    out = torch.tensor(PAD_VALUE, dtype=torch.float32).view(1, 3, 1, 1).repeat(len(images), 1, size, size)
    for i, image in enumerate(images):
        fitted = resize_to_geometry(image, size, geometry)
        t, left, h, w = canvas_box(image.shape[0], image.shape[1], size, geometry)
        out[i, :, t : t + h, left : left + w] = torch.from_numpy(fitted).permute(2, 0, 1).float().div_(255.0)
    return out
