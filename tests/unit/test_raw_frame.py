"""Raw camera frames: read as the same pixels a lossless encoding gives, refused
clearly and before anything is allocated when they are not what they say."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from hetmm_ray.data.decode import ImageError, decode_image
from hetmm_ray.data.raw_frame import BAYER_CELLS, PIXEL_FORMATS, RawFrame, demosaic, raw_frame_of
from hetmm_ray.errors import Refused
from hetmm_ray.serve.grpc import inspection_pb2 as pb
from hetmm_ray.serve.grpc.messages import image_message, upload_of

RNG = np.random.default_rng(39)
FRAMES = {
    "Mono8": RNG.integers(0, 256, (13, 21), dtype=np.uint8),
    "Mono16": RNG.integers(0, 65536, (13, 21), dtype=np.uint16),
    "RGB8": RNG.integers(0, 256, (13, 21, 3), dtype=np.uint8),
}


def slow_rgb(frame: RawFrame) -> np.ndarray:
    """Pixel by pixel, from the bytes, as the pixel formats define them."""
    size = PIXEL_FORMATS[frame.pixel_format]
    out = np.zeros((frame.height, frame.width, 3), dtype=np.uint8)
    for y in range(frame.height):
        for x in range(frame.width):
            at = (y * frame.width + x) * size
            px = frame.pixels[at : at + size]
            if frame.pixel_format == "Mono8":
                out[y, x] = px[0]
            elif frame.pixel_format == "Mono16":
                out[y, x] = (px[0] | px[1] << 8) >> 8  # little-endian, high byte kept
            else:
                out[y, x] = list(px)
    return out


@pytest.mark.parametrize("fmt", list(FRAMES))
def test_to_rgb_is_the_pixel_formats_definition(fmt: str) -> None:
    frame = raw_frame_of(FRAMES[fmt])
    assert frame.pixel_format == fmt and (frame.height, frame.width) == FRAMES[fmt].shape[:2]
    rgb = frame.to_rgb()
    assert rgb.dtype == np.uint8 and rgb.flags.writeable
    assert np.array_equal(rgb, slow_rgb(frame))


@pytest.mark.parametrize("fmt", list(FRAMES))
def test_the_kept_png_decodes_to_the_scored_pixels(fmt: str) -> None:
    frame = raw_frame_of(FRAMES[fmt])
    png = frame.to_png()
    with Image.open(io.BytesIO(png)) as im:  # lossless, at the frame's own depth
        assert im.format == "PNG" and im.mode == {"Mono8": "L", "Mono16": "I;16", "RGB8": "RGB"}[fmt]
    assert np.array_equal(decode_image(png), frame.to_rgb())


def test_mono16_reads_as_a_16_bit_png_of_the_same_values_reads() -> None:
    values = FRAMES["Mono16"]
    buf = io.BytesIO()
    Image.frombytes("I;16", values.shape[::-1], values.astype("<u2").tobytes()).save(buf, format="PNG")
    assert np.array_equal(raw_frame_of(values).to_rgb(), decode_image(buf.getvalue()))


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (
            RawFrame(21, 13, "YUV422", bytes(21 * 13)),
            "unsupported pixel format 'YUV422' (accepted: Mono8, Mono16, RGB8, BayerRG8",
        ),
        (RawFrame(21, 13, "Mono8", bytes(21 * 13 - 1)), "272 bytes of pixels where a 21x13 Mono8 frame has 273"),
        (RawFrame(21, 13, "Mono16", bytes(21 * 13)), "where a 21x13 Mono16 frame has 546 (rows packed, 2 bytes"),
        (RawFrame(4, 13, "Mono8", bytes(4 * 13)), "frame dimensions 4x13 too small"),
        # refused from the header: no 10^10-pixel array is made from these few bytes
        (RawFrame(100_000, 100_000, "RGB8", bytes(16)), "100000x100000 = 10000000000 pixels exceed the limit"),
    ],
)
def test_a_frame_that_is_not_what_it_says_is_refused_by_name(frame: RawFrame, says: str) -> None:
    with pytest.raises(ImageError, match=r"^cam1\.raw: ") as err:
        frame.to_rgb("cam1.raw")
    assert says in str(err.value)
    with pytest.raises(ImageError):
        frame.to_png("cam1.raw")


def test_an_array_with_no_pixel_format_is_refused() -> None:
    with pytest.raises(ValueError, match="shape \\(4, 4, 4\\) and dtype uint8"):
        raw_frame_of(np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="dtype float32"):
        raw_frame_of(np.zeros((4, 4), np.float32))


def test_an_image_message_carries_either_bytes_or_a_frame() -> None:
    frame = raw_frame_of(FRAMES["Mono16"])
    message = pb.Image.FromString(image_message("cam", frame).SerializeToString())  # over the wire
    assert not message.data and upload_of(message) == frame
    assert upload_of(image_message("a.png", b"\x89PNG")) == b"\x89PNG"
    both = pb.Image(name="both", data=b"\x89PNG", raw=pb.RawFrame(width=1, height=1, pixel_format="Mono8"))
    with pytest.raises(Refused) as err:
        upload_of(both)
    assert (err.value.status, err.value.code) == (400, "bad_image") and "not both" in str(err.value)


def mosaic_of(rgb: np.ndarray, cell: str) -> np.ndarray:
    """What a Bayer sensor with this 2x2 ``cell`` records of ``rgb``: one colour a pixel."""
    h, w, _ = rgb.shape
    out = np.zeros((h, w), np.uint8)
    for y in range(h):
        for x in range(w):
            out[y, x] = rgb[y, x, "RGB".index(cell[(y % 2) * 2 + x % 2])]
    return out


def slow_demosaic(mosaic: np.ndarray, cell: str) -> np.ndarray:
    """Bilinear, pixel by pixel: each colour's weighted mean over the 3x3 neighbours that have it."""
    weights = {"R": [[1, 2, 1], [2, 4, 2], [1, 2, 1]], "G": [[0, 1, 0], [1, 4, 1], [0, 1, 0]]}
    weights["B"] = weights["R"]
    h, w = mosaic.shape
    out = np.zeros((h, w, 3), np.uint8)
    for y in range(h):
        for x in range(w):
            for c, colour in enumerate("RGB"):
                total = norm = 0
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        yy, xx = y + dy, x + dx
                        if 0 <= yy < h and 0 <= xx < w and cell[(yy % 2) * 2 + xx % 2] == colour:
                            total += weights[colour][dy + 1][dx + 1] * int(mosaic[yy, xx])
                            norm += weights[colour][dy + 1][dx + 1]
                out[y, x, c] = int(total / norm + 0.5)
    return out


@pytest.mark.parametrize("fmt", list(BAYER_CELLS))
def test_a_bayer_frame_is_demosaiced_as_the_slow_definition(fmt: str) -> None:
    cell = BAYER_CELLS[fmt]
    mosaic = RNG.integers(0, 256, (11, 14), dtype=np.uint8)
    frame = RawFrame(14, 11, fmt, mosaic.tobytes())
    assert np.array_equal(frame.to_rgb(), slow_demosaic(mosaic, cell))
    assert np.array_equal(demosaic(mosaic, cell), slow_demosaic(mosaic, cell))
    assert np.array_equal(decode_image(frame.to_png()), frame.to_rgb())  # kept as its RGB


@pytest.mark.parametrize("fmt", list(BAYER_CELLS))
def test_each_bayer_cell_puts_each_colour_where_it_is(fmt: str) -> None:
    """A flat colour recorded through the format's cell comes back as that colour everywhere: a
    cell read the wrong way round would swap red and blue, or mix green in."""
    flat = np.empty((10, 12, 3), np.uint8)
    flat[...] = (200, 90, 15)
    frame = RawFrame(12, 10, fmt, mosaic_of(flat, BAYER_CELLS[fmt]).tobytes())
    assert np.array_equal(frame.to_rgb(), flat)
    edge = flat.copy()
    edge[:, 6:] = (10, 240, 120)  # a vertical edge: away from it, each side keeps its colour
    rgb = RawFrame(12, 10, fmt, mosaic_of(edge, BAYER_CELLS[fmt]).tobytes()).to_rgb()
    assert np.array_equal(rgb[:, :4], edge[:, :4]) and np.array_equal(rgb[:, 8:], edge[:, 8:])


@pytest.mark.parametrize("fmt", list(PIXEL_FORMATS))
@pytest.mark.parametrize(("size", "geometry"), [(64, "squash"), (64, "letterbox"), (21, "squash"), (224, "squash")])
def test_to_canvas_is_the_rgb_frame_resized(fmt: str, size: int, geometry: str) -> None:
    """The cheaper path for Mono (its one plane resized, then repeated) gives exactly the pixels of
    the obvious one: the whole RGB frame resized by ``resize_to_geometry``."""
    from hetmm_ray.data.decode import resize_to_geometry

    width, height = 97, 61
    nbytes = width * height * PIXEL_FORMATS[fmt]
    frame = RawFrame(width, height, fmt, RNG.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    expected = resize_to_geometry(frame.to_rgb(), size, geometry)
    assert np.array_equal(frame.to_canvas(size, geometry), expected)
