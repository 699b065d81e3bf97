"""Image decoding, the MVTec AD reader and the synthetic product.

Every bad input is generated here with Pillow or raw bytes.
"""

from __future__ import annotations

import io
import pickle
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

import hetmm_ray.data.decode as decode_module
from hetmm_ray.config import MAX_IMAGE_PIXELS
from hetmm_ray.data import (
    DEFECT_KINDS,
    DatasetError,
    ImageError,
    MVTecCategory,
    Sample,
    SyntheticProduct,
    decode_image,
    images_to_tensor,
    load_image,
    resize_rgb,
    write_mvtec_layout,
)


# --- helpers -------------------------------------------------------------------
def encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def noise_rgb(h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def png_declaring(width: int, height: int) -> bytes:
    """A tiny, valid 16x16 PNG whose IHDR is patched to declare ``width x height`` (CRC fixed)."""
    data = bytearray(encode(Image.new("L", (16, 16)), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def assert_image_error(exc_info, source: str, *words: str) -> None:
    err = exc_info.value
    text = str(err)
    assert "\n" not in text
    assert err.source == source
    assert text == f"{source}: {err.problem}"
    assert text.startswith(source)
    for word in words:
        assert word.lower() in text.lower(), f"{word!r} not in {text!r}"


# --- valid images ----------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF"])
def test_lossless_rgb_roundtrip_from_bytes_and_path(tmp_path, fmt):
    rgb = noise_rgb()
    data = encode(Image.fromarray(rgb), fmt)
    out = decode_image(data)
    assert out.dtype == np.uint8 and out.shape == (48, 64, 3)
    np.testing.assert_array_equal(out, rgb)
    path = tmp_path / f"img.{fmt.lower()}"
    path.write_bytes(data)
    np.testing.assert_array_equal(decode_image(path), rgb)
    np.testing.assert_array_equal(decode_image(str(path)), rgb)
    np.testing.assert_array_equal(load_image(path), rgb)


def test_jpeg_decodes_close_to_original():
    im = Image.new("RGB", (32, 32), (200, 40, 90))
    out = decode_image(encode(im, "JPEG", quality=95))
    assert out.shape == (32, 32, 3)
    assert np.abs(out.astype(int) - [200, 40, 90]).max() <= 4


def test_grayscale_and_bilevel_become_gray_rgb():
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    out = decode_image(encode(Image.fromarray(gray), "PNG"))
    np.testing.assert_array_equal(out, np.repeat(gray[..., None], 3, axis=2))
    bits = Image.new("1", (16, 16), 0)
    bits.putpixel((3, 5), 1)
    out = decode_image(encode(bits, "BMP"))
    assert out[5, 3].tolist() == [255, 255, 255]
    assert out[0, 0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF"])
def test_palette_images_use_their_palette(fmt):
    im = Image.new("P", (16, 16), 0)
    im.putpalette([10, 20, 30, 255, 0, 0, 0, 128, 255])
    im.putpixel((1, 2), 1)
    im.putpixel((3, 4), 2)
    out = decode_image(encode(im, fmt))
    assert out[0, 0].tolist() == [10, 20, 30]
    assert out[2, 1].tolist() == [255, 0, 0]
    assert out[4, 3].tolist() == [0, 128, 255]


def test_palette_transparency_is_composited_onto_black():
    im = Image.new("P", (16, 16), 0)
    im.putpalette([10, 20, 30, 255, 0, 0])
    im.putpixel((1, 1), 1)
    data = encode(im, "PNG", transparency=0)
    assert Image.open(io.BytesIO(data)).mode == "P"
    out = decode_image(data)
    assert out[0, 0].tolist() == [0, 0, 0]  # transparent index
    assert out[1, 1].tolist() == [255, 0, 0]


def test_alpha_is_composited_onto_black():
    rgba = encode(Image.new("RGBA", (16, 16), (200, 100, 50, 128)), "PNG")
    assert decode_image(rgba)[0, 0].tolist() == [100, 50, 25]  # round(v * 128 / 255)
    opaque = encode(Image.new("RGBA", (16, 16), (200, 100, 50, 255)), "PNG")
    assert decode_image(opaque)[0, 0].tolist() == [200, 100, 50]
    la = encode(Image.new("LA", (16, 16), (200, 255)), "PNG")
    assert decode_image(la)[0, 0].tolist() == [200, 200, 200]


def test_cmyk_converts_to_rgb():
    im = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # red
    for x in range(8, 16):
        for y in range(16):
            im.putpixel((x, y), (255, 0, 255, 0))  # green
    tiff = decode_image(encode(im, "TIFF"))
    assert tiff[0, 0].tolist() == [255, 0, 0]
    assert tiff[0, 15].tolist() == [0, 255, 0]
    jpeg_bytes = encode(im, "JPEG", quality=95)
    assert Image.open(io.BytesIO(jpeg_bytes)).mode == "CMYK"
    jpeg = decode_image(jpeg_bytes).astype(int)
    assert np.abs(jpeg[8, 2] - [255, 0, 0]).max() <= 12
    assert np.abs(jpeg[8, 13] - [0, 255, 0]).max() <= 12


SIXTEEN = np.array([0, 255, 256, 400, 1000, 32896, 65280, 65535], dtype=np.uint16)


@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "I;16"), ("TIFF", "I;16"), ("TIFF", "I;16B")])
def test_sixteen_bit_grayscale_keeps_the_high_byte(fmt, mode):
    values = np.tile(SIXTEEN, (8, 1))  # 8x8
    dtype = ">u2" if mode == "I;16B" else "<u2"
    im = Image.frombytes(mode, (8, 8), values.astype(dtype).tobytes())
    data = encode(im, fmt)
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    out = decode_image(data)
    expected = (values >> 8).astype(np.uint8)  # 65535 -> 255, 32896 -> 128, 400 -> 1: scaled, not clipped
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], expected)


def test_32bit_integer_mode_within_16_bits_is_scaled_and_outside_refused():
    values = np.tile(SIXTEEN.astype(np.int32), (8, 1))
    data = encode(Image.fromarray(values), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    np.testing.assert_array_equal(decode_image(data)[..., 0], values >> 8)
    values[0, 0] = 70000
    with pytest.raises(ImageError) as exc:
        decode_image(encode(Image.fromarray(values), "TIFF"), source="wide.tif")
    assert_image_error(exc, "wide.tif", "mode")


def test_float_mode_is_refused():
    data = encode(Image.fromarray(np.ones((16, 16), np.float32)), "TIFF")
    with pytest.raises(ImageError) as exc:
        decode_image(data, source="depth.tif")
    assert_image_error(exc, "depth.tif", "unsupported pixel mode F")


def test_multiframe_tiff_uses_first_frame():
    frames = [Image.new("RGB", (16, 16), (255, 0, 0)), Image.new("RGB", (16, 16), (0, 255, 0))]
    data = encode(frames[0], "TIFF", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(data)).n_frames == 2
    assert decode_image(data)[0, 0].tolist() == [255, 0, 0]


# --- refusals ----------------------------------------------------------------------
def test_image_error_message_and_pickling():
    err = ImageError("a/b.png", "empty file")
    assert str(err) == "a/b.png: empty file"
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.source, copy.problem, str(copy)) == (err.source, err.problem, str(err))


def test_missing_path(tmp_path):
    path = tmp_path / "nope.png"
    with pytest.raises(ImageError) as exc:
        decode_image(path)
    assert_image_error(exc, str(path), "not found")


def test_directory(tmp_path):
    with pytest.raises(ImageError) as exc:
        decode_image(tmp_path)
    assert_image_error(exc, str(tmp_path), "directory")


def test_empty_file_and_empty_bytes(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(ImageError) as exc:
        decode_image(path)
    assert_image_error(exc, str(path), "empty")
    with pytest.raises(ImageError) as exc:
        decode_image(b"")
    assert_image_error(exc, "<upload>", "empty")


def test_too_many_bytes_is_refused_before_reading(tmp_path, monkeypatch):
    data = encode(Image.fromarray(noise_rgb()), "PNG")
    path = tmp_path / "big.png"
    path.write_bytes(data)

    def no_read(*args, **kwargs):
        raise AssertionError("the file must not be opened")

    monkeypatch.setattr(decode_module, "open", no_read, raising=False)
    with pytest.raises(ImageError) as exc:
        decode_image(path, max_bytes=len(data) - 1)
    assert_image_error(exc, str(path), "too large", str(len(data)))
    monkeypatch.undo()
    assert decode_image(path, max_bytes=len(data)).shape == (48, 64, 3)
    with pytest.raises(ImageError) as exc:
        decode_image(data, source="cam-3", max_bytes=100)
    assert_image_error(exc, "cam-3", "too large")


def test_not_an_image():
    with pytest.raises(ImageError) as exc:
        decode_image(b"%PDF-1.4 this is certainly not an image", source="report.png")
    assert_image_error(exc, "report.png", "not a recognised image format", "PNG, JPEG, BMP, TIFF")


def test_unsupported_formats_are_named():
    gif = encode(Image.new("RGB", (16, 16), (1, 2, 3)), "GIF")
    with pytest.raises(ImageError) as exc:
        decode_image(gif, source="anim.gif")
    assert_image_error(exc, "anim.gif", "unsupported format GIF", "PNG, JPEG, BMP, TIFF")
    webp_header = b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(32)  # never parsed: refused by signature
    with pytest.raises(ImageError) as exc:
        decode_image(webp_header, source="x.webp")
    assert_image_error(exc, "x.webp", "unsupported format WEBP")


@pytest.mark.parametrize("side", [60_000, 100_000])
def test_decompression_bomb_refused_from_header(side):
    data = png_declaring(side, side)
    assert len(data) < 200
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImageError) as exc:
            decode_image(data, source="bomb.png")
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    assert_image_error(exc, "bomb.png", f"{side}x{side}", "pixels", str(MAX_IMAGE_PIXELS))
    assert not isinstance(exc.value, Image.DecompressionBombError)


def test_pixel_and_side_limits_are_parameters():
    data = encode(Image.fromarray(noise_rgb(40, 40)), "PNG")
    with pytest.raises(ImageError) as exc:
        decode_image(data, max_pixels=1000)
    assert_image_error(exc, "<upload>", "40x40", "pixels")
    with pytest.raises(ImageError) as exc:
        decode_image(encode(Image.new("RGB", (4, 40)), "PNG"), source="thin.png")
    assert_image_error(exc, "thin.png", "4x40", "too small")
    assert decode_image(encode(Image.new("RGB", (4, 40)), "PNG"), min_side=4).shape == (40, 4, 3)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "TIFF"])
def test_truncated_data(tmp_path, fmt):
    data = encode(Image.fromarray(noise_rgb(128, 128)), fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ImageError) as exc:
        decode_image(path)
    assert_image_error(exc, str(path), "truncated")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_truncated_header():
    data = encode(Image.fromarray(noise_rgb()), "PNG")
    with pytest.raises(ImageError) as exc:
        decode_image(data[:20], source="head.png")
    assert_image_error(exc, "head.png", "truncated or corrupt")


def test_corrupt_pixel_data():
    data = bytearray(encode(Image.fromarray(noise_rgb(64, 64)), "PNG"))
    start = data.index(b"IDAT") + 4
    data[start + 10 : start + 60] = bytes(50)  # zlib stream garbage (CRC now wrong too)
    with pytest.raises(ImageError) as exc:
        decode_image(bytes(data), source="bad.png")
    assert_image_error(exc, "bad.png", "corrupt")


def test_wrong_input_type():
    with pytest.raises(TypeError):
        decode_image(123)  # type: ignore[arg-type]


# --- resizing and batching -------------------------------------------------------
def test_resize_rgb():
    out = resize_rgb(noise_rgb(48, 64), 32)
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    flat = np.full((50, 70, 3), (12, 34, 56), np.uint8)
    assert (resize_rgb(flat, 20) == (12, 34, 56)).all()
    with pytest.raises(ValueError):
        resize_rgb(np.zeros((8, 8), np.uint8), 4)
    with pytest.raises(ValueError):
        resize_rgb(np.zeros((8, 8, 3), np.float32), 4)


def test_images_to_tensor():
    white = np.full((40, 30, 3), 255, np.uint8)
    black = np.zeros((16, 16, 3), np.uint8)
    mixed = noise_rgb(16, 16)
    t = images_to_tensor([white, black, mixed], 16)
    assert t.shape == (3, 3, 16, 16) and t.dtype == torch.float32
    assert float(t.min()) >= 0.0 and float(t.max()) <= 1.0
    assert torch.all(t[0] == 1.0) and torch.all(t[1] == 0.0)
    expected = torch.from_numpy(mixed).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(t[2], expected)  # already the right size: not resampled
    with pytest.raises(ValueError):
        images_to_tensor([], 16)


# --- MVTec AD reader ----------------------------------------------------------------
@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mvtec") / "gear"
    assert write_mvtec_layout(root, n_train=5, n_test_good=3, n_test_per_defect=2, size=64) == root
    return root


def test_layout_files(layout):
    assert sorted(p.name for p in (layout / "train" / "good").iterdir()) == [f"{i:03d}.png" for i in range(5)]
    for kind in DEFECT_KINDS:
        assert sorted(p.name for p in (layout / "ground_truth" / kind).iterdir()) == ["000_mask.png", "001_mask.png"]
        mask = np.asarray(Image.open(layout / "ground_truth" / kind / "000_mask.png"))
        assert set(np.unique(mask).tolist()) == {0, 255}
    train = [load_image(p) for p in sorted((layout / "train" / "good").iterdir())]
    tests = [load_image(p) for p in sorted((layout / "test").rglob("*.png"))]
    assert all(t.shape == (64, 64, 3) for t in train + tests)
    assert not any(np.array_equal(a, b) for a in train for b in tests)


def test_mvtec_reader(layout):
    cat = MVTecCategory(layout)
    assert cat.name == "gear"
    assert [p.name for p in cat.train_paths()] == [f"{i:03d}.png" for i in range(5)]
    samples = cat.test_samples()
    assert len(samples) == 3 + 2 * len(DEFECT_KINDS)
    assert [s.defect_type for s in samples] == sorted(s.defect_type for s in samples)
    goods = [s for s in samples if s.defect_type == "good"]
    assert len(goods) == 3 and all(s.label == 0 and s.mask_path is None for s in goods)
    for s in samples:
        assert isinstance(s, Sample)
        mask = cat.load_mask(s, 32)
        assert mask.shape == (32, 32) and mask.dtype == bool
        if s.label == 0:
            assert not mask.any()
        else:
            assert s.defect_type in DEFECT_KINDS
            assert s.mask_path == layout / "ground_truth" / s.defect_type / f"{s.path.stem}_mask.png"
            assert mask.any()


def test_mvtec_extensions_and_hidden_files(tmp_path):
    (tmp_path / "train" / "good").mkdir(parents=True)
    (tmp_path / "test" / "good").mkdir(parents=True)
    img = Image.fromarray(noise_rgb(16, 16))
    for name in ("b.PNG", "a.jpg", "c.TIFF", "d.bmp"):
        img.save(tmp_path / "train" / "good" / name)
    (tmp_path / "train" / "good" / ".DS_Store").write_bytes(b"junk")
    (tmp_path / "train" / "good" / "notes.txt").write_text("x")
    assert [p.name for p in MVTecCategory(tmp_path).train_paths()] == ["a.jpg", "b.PNG", "c.TIFF", "d.bmp"]


def test_mvtec_missing_folder(tmp_path):
    with pytest.raises(DatasetError) as exc:
        MVTecCategory(tmp_path / "absent")
    assert "absent" in str(exc.value)
    (tmp_path / "test").mkdir()
    with pytest.raises(DatasetError) as exc:
        MVTecCategory(tmp_path)
    assert "train/good" in str(exc.value).replace("\\", "/")
    assert "not found" in str(exc.value)


def test_mvtec_missing_mask(tmp_path):
    root = write_mvtec_layout(tmp_path / "cat", n_train=2, n_test_good=1, n_test_per_defect=1, size=32)
    missing = root / "ground_truth" / "hole" / "000_mask.png"
    missing.unlink()
    cat = MVTecCategory(root)
    with pytest.raises(DatasetError) as exc:
        cat.test_samples()
    assert str(missing) in str(exc.value)


# --- synthetic product ------------------------------------------------------------------
def test_synthetic_is_deterministic():
    a, b = SyntheticProduct(seed=1), SyntheticProduct(seed=1)
    g = a.good(3)
    assert g.shape == (256, 256, 3) and g.dtype == np.uint8
    np.testing.assert_array_equal(g, b.good(3))
    np.testing.assert_array_equal(g, a.good(3))
    assert not np.array_equal(g, a.good(4))
    assert not np.array_equal(g, SyntheticProduct(seed=2).good(3))
    # similar but not identical: different poses and noise, same part
    assert 1.0 < np.abs(g.astype(int) - a.good(4).astype(int)).mean() < 30.0
    img1, mask1 = a.defective(7, "hole")
    img2, mask2 = b.defective(7, "hole")
    np.testing.assert_array_equal(img1, img2)
    np.testing.assert_array_equal(mask1, mask2)
    with pytest.raises(ValueError):
        a.defective(0, "dent")


@pytest.mark.parametrize("kind", DEFECT_KINDS)
def test_synthetic_defects(kind):
    size = 256
    product = SyntheticProduct(seed=0, size=size)
    yy, xx = np.mgrid[0:size, 0:size]
    radius = np.hypot(yy - (size - 1) / 2, xx - (size - 1) / 2)
    for index in range(100, 106):
        good = product.good(index).astype(int)
        image, mask = product.defective(index, kind)
        assert mask.shape == (size, size) and mask.dtype == bool
        assert 0.003 <= mask.mean() <= 0.05, (kind, index, mask.mean())
        diff = np.abs(image.astype(int) - good).max(axis=2)
        assert diff[mask].mean() > 40  # clearly visible inside the mask
        assert diff[~mask].max() <= 30  # and nothing material outside it
        # on the part: between the bore (0.085 * size) and the tooth tips (0.40 * size)
        assert radius[mask].min() > 0.085 * size - 4 and radius[mask].max() < 0.40 * size + 4
