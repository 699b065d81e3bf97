"""A procedural "product" for tests and the demo: a machined gear on a plain background.

The part is a brushed-metal gear with fixed features (a central bore, a raised
ring, four blind bolt holes, a printed blue label). Every image is rendered
analytically in the part's own coordinate frame, so per-image variation (a
shift of up to 3 px, a rotation of up to 2 degrees, a brightness change of up
to 4 %, Gaussian sensor noise) keeps good images similar but never identical.
Everything is deterministic in ``(seed, index)`` and uses numpy and Pillow
only; a 256x256 image takes a few milliseconds.

``printed_code=True`` adds what changes on every good part: a light plate below the bore
with a lot/date code of six random 7-segment digits, printed with a random offset along the
plate (deterministic in ``(seed, index)``, from a stream of its own, so every other pixel is
the image ``printed_code=False`` gives); defects then keep clear of the plate.
:meth:`SyntheticProduct.code_region` is the image rectangle the plate stays in, whatever the
pose.

Defects (:data:`DEFECT_KINDS`) are rendered into the same clean image as the
good one with the same index, so the returned mask is exactly the set of
pixels that differ materially (by more than :data:`MASK_THRESHOLD` grey
levels in some channel, before noise) from the good image.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = [
    "ASPECTS",
    "DEFECT_KINDS",
    "POSES",
    "MASK_THRESHOLD",
    "SyntheticProduct",
    "band_crop",
    "save_layout",
    "write_mvtec_layout",
]

ASPECTS = ("square", "varied")
POSES = ("fixed", "varied")
"""``fixed``: a shift of up to 3 px and a turn of up to 2 degrees (a part in a fixture);
``varied``: any turn and a shift of up to 12 px (a part dropped on a belt)."""

DEFECT_KINDS = ("scratch", "hole", "missing")
MASK_THRESHOLD = 24.0
"""A pixel belongs to a defect mask when some channel differs by more than this."""

_BACKGROUND = np.array([48.0, 56.0, 66.0], dtype=np.float32)
_METAL_TINT = np.array([1.0, 0.97, 0.90], dtype=np.float32)
_HOLE_COLOUR = np.array([34.0, 32.0, 30.0], dtype=np.float32)
_LABEL_COLOUR = np.array([35.0, 75.0, 165.0], dtype=np.float32)
_PRINT_COLOUR = np.array([236.0, 236.0, 232.0], dtype=np.float32)

# Geometry as fractions of the image side.
_R_ROOT = 0.36  # gear root radius
_TOOTH = 0.04  # tooth height
_N_TEETH = 14
_R_BORE = 0.085  # central through-hole
_R_HUB = 0.14  # raised hub
_R_RING = 0.20  # machined groove
_R_BOLTS = 0.265  # bolt-hole circle
_BOLT = 0.028  # bolt-hole radius
_BOLT_ANGLES = tuple(math.radians(45 + 90 * k) for k in range(4))
_LABEL_CENTRE = (0.0, -0.29)  # (u, v): above the bore
_LABEL_HALF = (0.065, 0.026)
_BARS = ((-0.045, 0.016), (-0.02, 0.010), (0.005, 0.016), (0.03, 0.013))  # (u centre, half height)
_BAR_HALF_WIDTH = 0.006
# The printed code (printed_code=True): a plate mirrored below the bore, six 7-segment digits.
_CODE_CENTRE = (0.0, 0.29)
_CODE_HALF = (0.12, 0.045)
_CODE_PLATE = np.array([222.0, 222.0, 212.0], dtype=np.float32)
_CODE_INK = np.array([28.0, 28.0, 34.0], dtype=np.float32)
_DIGIT_PITCH = 0.03  # between digit centres
_DIGIT_HALF = (0.009, 0.018)  # half width, half height of a digit
_SEGMENT_HALF = 0.0032  # half thickness of a segment
_CODE_SHIFT = (0.025, 0.008)  # the printer's offset on the plate (along, across), at most
_CODE_MARGIN = 0.035  # code_region's margin for the pose (shift, rotation), as a fraction of the side
# Segments a-g of the digits 0-9 (a top, b top right, c bottom right, d bottom, e bottom left, f top left, g middle).
_SEGMENTS = ("abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg")


def _cover(sdf: np.ndarray) -> np.ndarray:
    """Antialiased coverage from a signed distance in pixels (negative inside)."""
    return np.clip(0.5 - sdf, 0.0, 1.0)


def _box_sdf(u: np.ndarray, v: np.ndarray, cu: float, cv: float, hu: float, hv: float) -> np.ndarray:
    return np.maximum(np.abs(u - cu) - hu, np.abs(v - cv) - hv)


def _lerp(base: np.ndarray, colour: np.ndarray, amount: np.ndarray) -> np.ndarray:
    return base + (colour - base) * amount[..., None]


@dataclass
class _Scene:
    """One posed part, rendered inside its bounding box ``box`` of the image."""

    box: tuple[slice, slice]
    origin: tuple[float, float]  # image coordinates of the part centre
    ca: float
    sa: float
    gain: float
    u: np.ndarray  # part-frame coordinates of the box pixels
    v: np.ndarray
    r: np.ndarray
    theta: np.ndarray
    rgb: np.ndarray  # (h, w, 3) part colour
    part: np.ndarray  # (h, w) part coverage in [0, 1]
    noise: np.ndarray  # (H, W, 3) int8 sensor noise


class SyntheticProduct:
    """Deterministic generator of good and defective images of one synthetic part."""

    def __init__(self, *, seed: int = 0, size: int = 256, printed_code: bool = False, pose: str = "fixed") -> None:
        if not isinstance(size, int) or size < 32:
            raise ValueError(f"size must be an integer >= 32, got {size!r}")
        if pose not in POSES:
            raise ValueError(f"pose must be one of {', '.join(POSES)}, got {pose!r}")
        if pose != "fixed" and printed_code:
            raise ValueError("printed_code needs pose='fixed' (its region is drawn for a part in a fixture)")
        self.pose = pose
        self.seed = int(seed)
        self.size = size
        self.printed_code = bool(printed_code)
        s = float(size)
        rng = np.random.default_rng([self.seed, 7919])
        # Surface texture fixed to the part (so it moves and turns with it): blotches
        # + grain, padded so that part-frame lookups never leave the array.
        self._pad = math.ceil(0.06 * s) + 4
        n = size + 2 * self._pad
        n_low = n // 8 + 2
        coarse = Image.fromarray(rng.standard_normal((n_low, n_low)).astype(np.float32))
        low = np.asarray(coarse.resize((n, n), Image.Resampling.BILINEAR))
        self._texture = (5.0 * low + 2.5 * rng.standard_normal((n, n))).astype(np.float32)
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
        self._xx, self._yy = xx, yy
        self._centre = (size - 1) / 2.0
        # Plain background with a faint vertical gradient (image frame: it does not move).
        self._background = (_BACKGROUND + (8.0 * (yy / s - 0.5))[..., None]).astype(np.float32)
        # Light from the top-left, in the image frame.
        c = self._centre
        self._light = (-18.0 * ((xx - c) + (yy - c)) / (_R_ROOT * s * 1.414)).astype(np.float32)

    # --- public API -------------------------------------------------------
    def good(self, index: int) -> np.ndarray:
        """A good image (RGB ``uint8``), deterministic in ``(seed, index)``."""
        scene = self._scene(index)
        return self._finish(self._compose(scene, scene.rgb, scene.part), scene.noise)

    def defective(self, index: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """The good image ``index`` with one defect; returns ``(image, mask)``.

        ``mask`` is a bool ``(H, W)`` array of exactly the pixels the defect
        changed materially.
        """
        if kind not in DEFECT_KINDS:
            raise ValueError(f"unknown defect kind {kind!r}; choose one of {', '.join(DEFECT_KINDS)}")
        scene = self._scene(index)
        good = self._compose(scene, scene.rgb, scene.part)
        rng = np.random.default_rng([self.seed, int(index), 1 + DEFECT_KINDS.index(kind)])
        rgb, part = scene.rgb.copy(), scene.part
        if kind == "scratch":
            self._scratch(rng, scene, rgb)
        elif kind == "hole":
            self._hole(rng, scene, rgb)
        else:
            part = part * (1.0 - self._missing(rng, scene))
        bad = self._compose(scene, rgb, part)
        mask = np.zeros((self.size, self.size), dtype=bool)
        mask[scene.box] = np.abs(bad[scene.box] - good[scene.box]).max(axis=2) > MASK_THRESHOLD
        return self._finish(bad, scene.noise), mask

    def code_region(self) -> list[float]:
        """``[x0, y0, x1, y1]`` in image pixels: where the printed code's plate lies in every pose
        (``core/region.py``'s rect; a region excluding it leaves the code out)."""
        s = float(self.size)
        c = self._centre + 0.5  # pixel centres are at index + 0.5 in region coordinates
        hu, hv = (_CODE_HALF[0] + _CODE_MARGIN) * s, (_CODE_HALF[1] + _CODE_MARGIN) * s
        cx, cy = c + _CODE_CENTRE[0] * s, c + _CODE_CENTRE[1] * s
        return [max(0.0, cx - hu), max(0.0, cy - hv), min(s, cx + hu), min(s, cy + hv)]

    def _print_code(self, index: int, scene: _Scene) -> None:
        """The plate and its six random digits (their own random stream: nothing else changes)."""
        s = float(self.size)
        rng = np.random.default_rng([self.seed, int(index), 7777])
        digits = rng.integers(0, 10, size=6)
        offset = float(rng.uniform(-_CODE_SHIFT[0], _CODE_SHIFT[0])) * s
        drop = float(rng.uniform(-_CODE_SHIFT[1], _CODE_SHIFT[1])) * s
        cu, cv = _CODE_CENTRE[0] * s, _CODE_CENTRE[1] * s
        w = self._window(scene, cu, cv, math.hypot(*_CODE_HALF) * s + 1.0)
        uw, vw = scene.u[w], scene.v[w]
        rgb = scene.rgb
        plate = _lerp(rgb[w], _CODE_PLATE, _cover(_box_sdf(uw, vw, cu, cv, _CODE_HALF[0] * s, _CODE_HALF[1] * s)))
        hx, hy, t = _DIGIT_HALF[0] * s, _DIGIT_HALF[1] * s, _SEGMENT_HALF * s
        boxes = {  # segment -> (u offset, v offset, half u, half v) from the digit's centre
            "a": (0.0, -hy, hx, t),
            "g": (0.0, 0.0, hx, t),
            "d": (0.0, hy, hx, t),
            "f": (-hx, -hy / 2, t, hy / 2),
            "b": (hx, -hy / 2, t, hy / 2),
            "e": (-hx, hy / 2, t, hy / 2),
            "c": (hx, hy / 2, t, hy / 2),
        }
        for k, digit in enumerate(digits):
            du = cu + offset + (k - 2.5) * _DIGIT_PITCH * s
            for seg in _SEGMENTS[int(digit)]:
                ou, ov, su, sv = boxes[seg]
                plate = _lerp(plate, _CODE_INK, _cover(_box_sdf(uw, vw, du + ou, cv + drop + ov, su, sv)))
        rgb[w] = plate

    def _clear_of_code(self, cu: float, cv: float, reach: float) -> bool:
        """Whether a defect at part-frame ``(cu, cv)`` reaching ``reach`` pixels keeps off the code plate."""
        if not self.printed_code:
            return True
        s = float(self.size)
        du = abs(cu - _CODE_CENTRE[0] * s) - _CODE_HALF[0] * s
        dv = abs(cv - _CODE_CENTRE[1] * s) - _CODE_HALF[1] * s
        return max(du, dv) > reach

    # --- rendering --------------------------------------------------------
    def _window(self, scene: _Scene, cu: float, cv: float, extent: float) -> tuple[slice, slice]:
        """Slices of the scene box covering the part-frame disc ``(cu, cv), extent``."""
        x = scene.origin[0] + scene.ca * cu - scene.sa * cv
        y = scene.origin[1] + scene.sa * cu + scene.ca * cv
        e = extent + 2.0
        rows, cols = scene.box
        h, w = scene.part.shape
        y0 = min(max(0, math.floor(y - e) - rows.start), h)
        x0 = min(max(0, math.floor(x - e) - cols.start), w)
        y1 = min(max(0, math.ceil(y + e) + 1 - rows.start), h)
        x1 = min(max(0, math.ceil(x + e) + 1 - cols.start), w)
        return slice(y0, max(y0, y1)), slice(x0, max(x0, x1))

    def _scene(self, index: int) -> _Scene:
        size, s = self.size, float(self.size)
        px = s / 256.0  # one "design pixel"
        rng = np.random.default_rng([self.seed, int(index)])
        # Python floats: numpy float64 scalars would promote the float32 grids.
        shift, turn = (3.0, 2.0) if self.pose == "fixed" else (12.0, 180.0)
        dx, dy = (float(t) * px for t in rng.uniform(-shift, shift, size=2))
        angle = math.radians(float(rng.uniform(-turn, turn)))
        gain = float(rng.uniform(0.96, 1.04))
        noise = rng.integers(-3, 4, size=(size, size, 3), dtype=np.int8)  # uniform, std 2 grey levels
        ox, oy = self._centre + dx, self._centre + dy

        # Everything below lives in the part's bounding box.
        reach = (_R_ROOT + _TOOTH) * s + 3.0
        box = (
            slice(max(0, math.floor(oy - reach)), min(size, math.ceil(oy + reach) + 1)),
            slice(max(0, math.floor(ox - reach)), min(size, math.ceil(ox + reach) + 1)),
        )
        x = self._xx[box] - ox
        y = self._yy[box] - oy
        ca, sa = math.cos(angle), math.sin(angle)
        u = ca * x + sa * y
        v = ca * y - sa * x
        r = np.hypot(u, v)
        theta = np.arctan2(v, u)

        # Outline: gear teeth (trapezoidal profile), distance scaled by the flank slope.
        wave = 2.2 * np.cos(_N_TEETH * theta) + 0.4
        profile = np.clip(wave, -1.0, 1.0)
        on_flank = np.where(profile == wave, np.float32(1.1 * _N_TEETH * _TOOTH * s), np.float32(0.0))
        slope = on_flank * np.sin(_N_TEETH * theta) / (r + 1.0)
        outer_sdf = (r - (_R_ROOT + _TOOTH / 2) * s - (_TOOTH * s / 2) * profile) / np.sqrt(1.0 + slope * slope)
        part = _cover(outer_sdf)

        # Metal: texture + turning marks + lighting + groove + edge bevel.
        pad = self._centre + self._pad + 0.5
        # Clipped: only the background beyond the part reaches past the texture (a turned part's box corners).
        top = self._texture.shape[0] - 1
        lum = self._texture[np.clip((v + pad).astype(np.intp), 0, top), np.clip((u + pad).astype(np.intp), 0, top)]
        lum += 168.0 + 5.0 * np.sin(r * (2 * math.pi / (5.5 * px))) + self._light[box]
        groove = (r - _R_RING * s) / (1.2 * px)
        lum += 25.0 * np.exp(-((groove - 1.8) ** 2)) - 50.0 * np.exp(-(groove * groove))
        lum -= 30.0 * np.exp(-(((outer_sdf + 1.5 * px) / (1.5 * px)) ** 2))

        scene = _Scene(box, (ox, oy), ca, sa, gain, u, v, r, theta, np.empty((*r.shape, 3), np.float32), part, noise)

        # Raised hub, central through-bore with a dark bevel.
        w = self._window(scene, 0.0, 0.0, _R_HUB * s + 2.0)
        rw = r[w]
        lum[w] += 14.0 * _cover(rw - _R_HUB * s) - 30.0 * np.exp(-(((rw - _R_BORE * s - 1.5 * px) / (1.5 * px)) ** 2))
        part[w] *= 1.0 - _cover(rw - _R_BORE * s)
        rgb = scene.rgb
        np.multiply(lum[..., None], _METAL_TINT, out=rgb)

        # Blind bolt holes with a bright chamfer.
        for a in _BOLT_ANGLES:
            cu, cv = _R_BOLTS * s * math.cos(a), _R_BOLTS * s * math.sin(a)
            w = self._window(scene, cu, cv, _BOLT * s + 4.0 * px)
            d = np.hypot(u[w] - cu, v[w] - cv) - _BOLT * s
            chamfer = rgb[w] + (40.0 * np.exp(-(((d - 1.0 * px) / (1.2 * px)) ** 2)))[..., None]
            rgb[w] = _lerp(chamfer, _HOLE_COLOUR, _cover(d))

        # Printed label: a blue plate with white bars.
        lu, lv = _LABEL_CENTRE[0] * s, _LABEL_CENTRE[1] * s
        w = self._window(scene, lu, lv, math.hypot(*_LABEL_HALF) * s + 1.0)
        uw, vw = u[w], v[w]
        plate = _lerp(rgb[w], _LABEL_COLOUR, _cover(_box_sdf(uw, vw, lu, lv, _LABEL_HALF[0] * s, _LABEL_HALF[1] * s)))
        for bu, bh in _BARS:
            plate = _lerp(plate, _PRINT_COLOUR, _cover(_box_sdf(uw, vw, lu + bu * s, lv, _BAR_HALF_WIDTH * s, bh * s)))
        rgb[w] = plate
        if self.printed_code:
            self._print_code(index, scene)
        return scene

    def _compose(self, scene: _Scene, rgb: np.ndarray, part: np.ndarray) -> np.ndarray:
        image = self._background * scene.gain
        image[scene.box] = _lerp(self._background[scene.box], rgb, part) * scene.gain
        return image

    def _finish(self, clean: np.ndarray, noise: np.ndarray) -> np.ndarray:
        clean += noise
        return np.clip(np.rint(clean, out=clean), 0, 255, out=clean).astype(np.uint8)

    # --- defects (in the part frame) ---------------------------------------
    def _scratch(self, rng: np.random.Generator, scene: _Scene, rgb: np.ndarray) -> None:
        s, px = float(self.size), self.size / 256.0
        for _ in range(1000):
            rho, phi, psi = rng.uniform(0.17, 0.30) * s, rng.uniform(0, 2 * math.pi), rng.uniform(0, math.pi)
            half = rng.uniform(0.125, 0.19) * s
            cu, cv = rho * math.cos(phi), rho * math.sin(phi)
            hu, hv = half * math.cos(psi), half * math.sin(psi)
            # Keep it on the metal: away from the bore, inside the tooth roots.
            t0 = min(max(-((cu - hu) * hu + (cv - hv) * hv) / (2 * half * half), 0.0), 1.0)
            nearest = math.hypot(cu - hu + 2 * t0 * hu, cv - hv + 2 * t0 * hv)
            ends_in = max(math.hypot(cu - hu, cv - hv), math.hypot(cu + hu, cv + hv)) <= 0.34 * s
            clear = all(self._clear_of_code(cu + f * hu, cv + f * hv, 6.0 * px) for f in np.linspace(-1, 1, 9))
            if nearest >= 0.11 * s and ends_in and clear:
                break
        width = max(1.2, float(rng.uniform(1.5, 2.1)) * px)
        colour = np.array([250.0, 248.0, 240.0] if rng.random() < 0.5 else [40.0, 36.0, 34.0], dtype=np.float32)
        w = self._window(scene, cu, cv, half + width + 1.0)
        ax, ay, bx, by = cu - hu, cv - hv, 2 * hu, 2 * hv  # start point and direction
        u, v = scene.u[w], scene.v[w]
        t = np.clip(((u - ax) * bx + (v - ay) * by) / (bx * bx + by * by), 0.0, 1.0)
        dist = np.hypot(u - ax - t * bx, v - ay - t * by) - width
        rgb[w] = _lerp(rgb[w], colour, _cover(dist))

    def _hole(self, rng: np.random.Generator, scene: _Scene, rgb: np.ndarray) -> None:
        s, px = float(self.size), self.size / 256.0
        bolts = [(_R_BOLTS * s * math.cos(a), _R_BOLTS * s * math.sin(a)) for a in _BOLT_ANGLES]
        lu, lv = _LABEL_CENTRE[0] * s, _LABEL_CENTRE[1] * s
        for _ in range(1000):
            radius = rng.uniform(0.035, 0.05) * s
            rho, phi = rng.uniform(0.13, 0.32) * s, rng.uniform(0, 2 * math.pi)
            cu, cv = rho * math.cos(phi), rho * math.sin(phi)
            clear = 3.0 * px + radius
            ok = (
                rho - radius >= 0.11 * s
                and rho + radius <= 0.34 * s
                and all(math.hypot(cu - bu, cv - bv) >= clear + _BOLT * s for bu, bv in bolts)
                and not (abs(cu - lu) < _LABEL_HALF[0] * s + clear and abs(cv - lv) < _LABEL_HALF[1] * s + clear)
                and self._clear_of_code(cu, cv, clear)
            )
            if ok:
                break
        w = self._window(scene, cu, cv, radius + 4.0 * px)
        d = np.hypot(scene.u[w] - cu, scene.v[w] - cv) - radius
        burr = rgb[w] + (45.0 * np.exp(-(((d - 1.0 * px) / (1.0 * px)) ** 2)))[..., None]
        depth = np.clip(-d / radius, 0.0, 1.0)[..., None]  # darker towards the centre
        colour = np.array([30.0, 27.0, 26.0], dtype=np.float32) * (1.0 - 0.6 * depth)
        rgb[w] = burr + (colour - burr) * _cover(d)[..., None]

    def _missing(self, rng: np.random.Generator, scene: _Scene) -> np.ndarray:
        """Coverage of a chunk broken off the rim (replaced by background)."""
        s = float(self.size)
        label_angle = -math.pi / 2
        for _ in range(1000):
            phi = rng.uniform(-math.pi, math.pi)
            half = math.radians(rng.uniform(9.0, 16.0))
            gap = abs((phi - label_angle + math.pi) % (2 * math.pi) - math.pi)
            code_gap = abs((phi - math.pi / 2 + math.pi) % (2 * math.pi) - math.pi)  # the code plate, below
            if gap > half + math.radians(20.0) and (not self.printed_code or code_gap > half + math.radians(25.0)):
                break
        phase = rng.uniform(0, 2 * math.pi)
        delta = np.abs((scene.theta - phi + math.pi) % (2 * math.pi) - math.pi)
        r_cut = (0.305 + 0.012 * np.sin(delta * (5.0 / half) + phase)) * s
        return _cover(np.maximum((delta - half) * scene.r, r_cut - scene.r))


def band_crop(
    image: np.ndarray, index: int, seed: int, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """A horizontal band through the image centre, of height ``40..100 %`` of the side
    (uniform, deterministic in ``(seed, index)``; widened where needed so that a defect
    mask stays whole): tiles of varied aspect, like crops of a weld seam.
    """
    size = image.shape[0]
    fraction = float(np.random.default_rng([seed, int(index), 4243]).uniform(0.4, 1.0))
    height = round(size * fraction)
    if mask is not None and mask.any():
        rows = np.flatnonzero(mask.any(axis=1))
        half = max(abs(rows[0] - (size - 1) / 2), abs(rows[-1] - (size - 1) / 2))
        height = max(height, min(size, 2 * math.ceil(half) + 2))
    top = (size - height) // 2
    band = slice(top, top + height)
    return np.ascontiguousarray(image[band]), None if mask is None else np.ascontiguousarray(mask[band])


def write_mvtec_layout(
    root: str | os.PathLike,
    *,
    n_train: int = 40,
    n_test_good: int = 8,
    n_test_per_defect: int = 4,
    seed: int = 0,
    size: int = 256,
    aspect: str = "square",
    masks: bool = True,
    pose: str = "fixed",
) -> Path:
    """Write a synthetic category in the MVTec AD layout and return ``root``.

    ``train/good/000.png...``, ``test/good``, ``test/<kind>`` and
    ``ground_truth/<kind>/<stem>_mask.png`` (0/255). Every image uses its own
    index, so train and test never share an image. ``aspect="varied"``: every image
    (and its mask) is cut to a centred band of varied height (:func:`band_crop`).
    ``masks=False``: no ``ground_truth/`` (an image-labels-only set). ``pose`` (:data:`POSES`):
    how far each part is shifted and turned.
    """
    if aspect not in ASPECTS:
        raise ValueError(f"aspect must be one of {', '.join(ASPECTS)}, got {aspect!r}")
    root = Path(root)

    def shaped(i: int, image: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        return band_crop(image, i, seed, mask) if aspect == "varied" else (image, mask)

    product = SyntheticProduct(seed=seed, size=size, pose=pose)

    def defective(i: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        image, mask = shaped(i, *product.defective(i, kind))
        assert mask is not None
        return image, mask

    return save_layout(
        root,
        good=lambda i: shaped(i, product.good(i))[0],
        defective=defective,
        kinds=DEFECT_KINDS,
        n_train=n_train,
        n_test_good=n_test_good,
        n_test_per_defect=n_test_per_defect,
        masks=masks,
    )


def save_layout(
    root: str | os.PathLike,
    *,
    good: Callable[[int], np.ndarray],
    defective: Callable[[int, str], tuple[np.ndarray, np.ndarray]],
    kinds: Sequence[str],
    n_train: int,
    n_test_good: int,
    n_test_per_defect: int,
    masks: bool = True,
) -> Path:
    """Write a generated product in the MVTec AD layout and return ``root``: ``good(index)`` for
    ``train/good`` then ``test/good``, ``defective(index, kind)`` (image, bool mask) for each of
    ``kinds`` in turn, ``index`` counting through all of them (so no two files share a part), files
    numbered ``000.png``... per folder, masks as ``ground_truth/<kind>/<stem>_mask.png`` (0/255)
    unless ``masks`` is False."""
    root = Path(root)

    def save(array: np.ndarray, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(path, compress_level=1)

    index = 0
    for folder, count in (("train/good", n_train), ("test/good", n_test_good)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            save(good(index), root / folder / f"{i:03d}.png")
            index += 1
    for kind in kinds:
        for i in range(n_test_per_defect):
            image, mask = defective(index, kind)
            save(image, root / "test" / kind / f"{i:03d}.png")
            if masks:
                save(mask.astype(np.uint8) * 255, root / "ground_truth" / kind / f"{i:03d}_mask.png")
            index += 1
    return root
