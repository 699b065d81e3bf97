"""The fit's one geometry rule: how a product's training frames reach the backbone.

Every fit path (``hetmm fit``, ``operations.fit``, ``detector_choice.new_detector``, ``HETMM.fit``, the
service's create and the console's) calls :func:`choose_geometry` on the training frames, which
reads their sizes from the headers only and resolves ``geometry.min_defect_px``, ``geometry.tiles:
"auto"`` and ``geometry.canvas: "aspect"`` into a configuration that resolves to itself: a grid
and a canvas size. :class:`GeometryChoice` says what was chosen and why, in one line, and is
stored with the fitted version (``meta["geometry_choice"]``). Nothing here builds a detector.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..config import ConfigError, DetectorConfig, GeometryConfig
from ..config.product import ASPECT_MAX_SCALE, LARGE_FRAME_SCALE, TILE_GRID_MAX, tap_stride
from ..core.geometry import resized_shape
from ..core.templates import TemplateSet
from ..core.tiles import AUTO_MAX_SCALE, defect_grid, grid_of, tile_grid
from ..data.decode import image_shape
from .scorer import ImageInput, as_rgb

__all__ = [
    "GeometryChoice",
    "auto_tiles",
    "check_resolved",
    "choose_geometry",
    "frame_shape",
    "resolve_tiles",
]


def frame_shape(x: ImageInput) -> tuple[int, int]:
    """(height, width) of an image: arrays directly, files and encoded bytes from their header
    (nothing decoded)."""
    if isinstance(x, np.ndarray):
        return int(x.shape[0]), int(x.shape[1])
    if isinstance(x, str | Path | bytes):
        return image_shape(x)  # decode_image's errors, before any work
    return as_rgb(x).shape[:2]  # type: ignore[return-value]


class GeometryChoice(NamedTuple):
    """What :func:`choose_geometry` chose for a fit: the configuration with the grid and the canvas
    resolved, and why, each in one line (None when that was not chosen: no ``tiles: auto`` nor
    ``min_defect_px``; ``geometry.canvas`` not ``"aspect"``)."""

    config: DetectorConfig
    why: str | None
    canvas_why: str | None = None

    @property
    def tiles(self) -> tuple[int, int]:
        rows, cols = (int(v) for v in self.config.geometry.tiles)  # resolved: never "auto" here
        return rows, cols

    def describe(self) -> str:
        """The fit's one line: ``tiles auto: 6 x 3, <why>`` (``1 x 1``: the frame on one canvas), then
        the canvas's, ``; canvas aspect: ...``, when it was chosen."""
        parts = [] if self.why is None else [f"tiles auto: {self.tiles[0]} x {self.tiles[1]}, {self.why}"]
        return "; ".join([*parts, *([self.canvas_why] if self.canvas_why else [])])

    def to_json(self) -> dict[str, Any] | None:
        """What was chosen, as a create job's record (``tiles_auto``) and the fitted version's manifest
        (``meta["geometry_choice"]``) keep it: ``tiles`` (the grid), ``why`` (None when only the canvas
        was chosen) and ``canvas`` (only when it was chosen); None when nothing was chosen."""
        if self.why is None and self.canvas_why is None:
            return None
        chosen: dict[str, Any] = {"tiles": list(self.tiles), "why": self.why}
        return chosen if self.canvas_why is None else {**chosen, "canvas": self.canvas_why}

    def stored_with(self, ts: TemplateSet) -> TemplateSet:
        """``ts`` with :meth:`to_json` as its ``meta["geometry_choice"]``: how every fit path stores its
        choice with the version it publishes (``ts`` as it is when nothing was chosen)."""
        chosen = self.to_json()
        return ts if chosen is None else replace(ts, meta=ts.meta.with_(geometry_choice=chosen))


def choose_geometry(config: DetectorConfig, frames: Sequence[ImageInput]) -> GeometryChoice:
    """The one rule of every fit path (CLI, Python API, HTTP create, console) for how frames reach the
    backbone (:func:`_grid_and_canvas`) and how many map pixels the image score averages:
    ``scoring.score_top_k`` unset (None) becomes ``DetectorConfig.score_pixels`` of ``config`` as given
    (:data:`~hetmm_ray.config.SCORE_TOP_K` at a 256-px canvas, the same share of other sizes), or with
    ``geometry.min_defect_px`` the area a disc of that diameter covers on the chosen map
    (:func:`_defect_area_px`, at least 1), so that the score never averages a defect of the declared
    size away; a value given is kept. Said in the grid's line when ``min_defect_px`` chose it."""
    choice, extent = _grid_and_canvas(config, frames)
    if config.scoring.score_top_k is not None:
        return choice
    g = config.geometry
    if g.min_defect_px is None or extent is None:  # on the canvas as given: an aspect canvas's short side is its size
        return choice._replace(config=choice.config.replace(**{"scoring.score_top_k": config.score_pixels}))
    k = _defect_area_px(choice.config, g.min_defect_px, *extent)
    said = f"the score averages its top {k} map px (a {g.min_defect_px}-px defect's area)"
    why = said if choice.why is None else f"{choice.why}; {said}"
    return choice._replace(config=choice.config.replace(**{"scoring.score_top_k": k}), why=why)


def _defect_area_px(config: DetectorConfig, min_defect_px: int, h: int, w: int) -> int:
    """Map pixels a disc of ``min_defect_px`` frame pixels across covers, in a resolved ``config`` (a
    grid and a canvas size) for ``h x w`` frames: the frame (or its largest tile) reaches the canvas
    at ``image_size / long side`` canvas px per frame px (on a letterbox; the smaller of the two
    axes' scales on a squash, the same number), and the map has ``output_size / image_size`` map px
    per canvas px. At least 1."""
    h, w, _ = _largest_piece(config, h, w)
    size = config.backbone.image_size
    across = min_defect_px * size / max(h, w) * (config.scoring.output_size or size) / size
    return max(1, round(math.pi / 4 * across * across))


def _largest_piece(config: DetectorConfig, h: int, w: int) -> tuple[int, int, str]:
    """What of an ``h x w`` frame one canvas holds under a resolved grid: the frame, or its largest tile
    (height, width, and which it is)."""
    g = config.geometry
    if not g.tiled:
        return h, w, "frame"
    tiles = tile_grid(h, w, [int(v) for v in g.tiles], g.tile_overlap)  # resolved: never "auto" here
    return max(t.height for t in tiles), max(t.width for t in tiles), "tile"


def _grid_and_canvas(
    config: DetectorConfig, frames: Sequence[ImageInput]
) -> tuple[GeometryChoice, tuple[int, int] | None]:
    """How frames reach the backbone, and the largest frame's ``(height, width)`` when it was read (None
    when nothing is chosen from the frames), from the largest of ``frames`` (height and width
    maximised separately, headers only, each read once):

    - ``geometry.min_defect_px`` set and ``tiles`` at its default ``[1, 1]`` or ``"auto"``: the grid
      that keeps such a defect at least one cell of the backbone's finest tap
      (``core.tiles.defect_grid``). So ``min_defect_px`` alone means the same wherever it is set.
    - ``min_defect_px`` with a given grid other than ``[1, 1]``: kept when it is the grid the defect
      size picks for these frames (a configuration this rule resolved before, as a stored product's),
      else refused (ConfigError): the two settings ask for different grids and one would be ignored.
    - ``tiles: "auto"`` alone: at most ``AUTO_MAX_SCALE`` frame px per canvas px (``core.tiles.auto_grid``).
    - ``geometry.tile_large_frames`` (the default) with ``tiles`` at ``[1, 1]`` and no ``min_defect_px``: a
      frame that its one canvas (the ``aspect`` canvas below, when that applies) would give more than
      ``LARGE_FRAME_SCALE`` frame px per canvas px is large, and gets the grid of ``tiles: "auto"``;
      any other frame stays on one canvas. Resolved to false, like the canvas.
    - Then ``geometry.canvas: "aspect"`` (the default): on a letterboxed canvas
      ``backbone.image_size`` ``S`` becomes ``round(S * long / short)`` of the frame (of the largest
      tile, when tiled), at most ``ASPECT_MAX_SCALE * S``, so the frame's short side gets ``S`` canvas
      pixels, as a square frame's does: an elongated frame is scored at the resolution a square
      product gives each square of it, not squeezed into a strip of one; the grid above is chosen
      at ``S``, and with ``min_defect_px`` chosen
      again at the raised size, which stays (the canvas its tiles get; a given grid other than
      ``[1, 1]`` must be that one, else refused as above). A square frame keeps ``S``, and so
      does ``backbone.geometry: squash``, whose content fills the canvas already. Resolved to
      ``"fixed"`` with the size, so a resolved configuration resolves to itself.
    - None of these: ``config`` as it is, nothing chosen.

    A grid of more than ``TILE_GRID_MAX`` tiles per axis is refused (ConfigError)."""
    g = config.geometry
    large_rule = g.tile_large_frames and g.min_defect_px is None and g.tiles == (1, 1)
    config = config.replace(**{"geometry.tile_large_frames": False})  # resolved here, whatever is chosen
    if (
        not large_rule
        and g.min_defect_px is None
        and g.tiles != "auto"
        and (g.canvas == "fixed" or config.backbone.geometry == "squash")
    ):
        return GeometryChoice(config.replace(**{"geometry.canvas": "fixed"}), None), None
    shapes = [frame_shape(x) for x in frames]
    if not shapes:
        raise ConfigError("geometry: tiles, min_defect_px and canvas are chosen from the training frames; none given")
    h, w = max(s[0] for s in shapes), max(s[1] for s in shapes)
    large = None
    if large_rule:
        scale = max(h, w) / _one_canvas_side(config, h, w)
        if scale > LARGE_FRAME_SCALE:
            config = config.replace(**{"geometry.tiles": "auto"})
            large = (
                f"a {w} x {h} frame is large, {scale:.2f} frame px per canvas px on one canvas (over "
                f"{LARGE_FRAME_SCALE:g}: geometry.tile_large_frames; false keeps it on one canvas)"
            )
    config, why = _chosen_grid(config, h, w)
    if large is not None:
        why = f"{large}; {why}"
    if config.geometry.canvas != "aspect":
        return GeometryChoice(config, why), (h, w)
    resolved, canvas_why = _aspect_canvas(config, h, w)
    size = resolved.backbone.image_size
    if g.min_defect_px is not None and size != config.backbone.image_size:
        # the defect's grid again on the canvas its tiles get, so that a resolved configuration resolves to itself
        regrid, why = _chosen_grid(resolved.replace(**{"geometry.tiles": "auto"}), h, w)
        grid = GeometryChoice(regrid, why).tiles
        if grid != config.geometry.tiles:
            if g.tiles not in ("auto", (1, 1)):
                raise _different_grids(g, grid, h, w)
            _, canvas_why = _aspect_canvas(config.replace(**{"geometry.tiles": list(grid)}), h, w, size)
            resolved = regrid
    return GeometryChoice(resolved, why, canvas_why), (h, w)


def _chosen_grid(config: DetectorConfig, h: int, w: int) -> tuple[DetectorConfig, str | None]:
    g, bb = config.geometry, config.backbone
    if g.min_defect_px is None:
        if g.tiles != "auto":
            return config, None
        try:
            rows, cols = grid_of("auto", h, w, bb.image_size, g.tile_overlap)
        except ValueError as exc:  # the settings ask for a grid no frame of this size has
            raise ConfigError(f"geometry: tiles auto for a {w} x {h} frame: {exc}") from exc
        why = f"at most {AUTO_MAX_SCALE:g} frame px per canvas px (no geometry.min_defect_px)"
        return replace(config, geometry=replace(g, tiles=(rows, cols))), why
    stride = min(tap_stride(bb.name, tap) for tap in bb.taps)
    chosen = defect_grid(h, w, bb.image_size, g.tile_overlap, min_defect_px=g.min_defect_px, stride=stride)
    if max(chosen.rows, chosen.cols) > TILE_GRID_MAX:
        raise ConfigError(
            f"geometry.min_defect_px: a {g.min_defect_px}-px defect in a {w} x {h} frame needs {chosen.rows} x "
            f"{chosen.cols} tiles; a grid has at most {TILE_GRID_MAX} per axis (a larger canvas, backbone.image_size, "
            "needs fewer)"
        )
    grid = (chosen.rows, chosen.cols)
    if g.tiles not in ("auto", (1, 1)) and tuple(g.tiles) != grid:
        raise _different_grids(g, grid, h, w)
    return replace(config, geometry=replace(g, tiles=grid)), chosen.why


def _different_grids(g: GeometryConfig, grid: Sequence[int], h: int, w: int) -> ConfigError:
    return ConfigError(
        f"geometry: tiles {g.tiles[0]} x {g.tiles[1]} and min_defect_px {g.min_defect_px} ask for different "
        f"grids (a {g.min_defect_px}-px defect in a {w} x {h} frame picks {grid[0]} x {grid[1]}); give one of them"
    )


def _aspect_canvas(
    config: DetectorConfig, h: int, w: int, size: int | None = None
) -> tuple[DetectorConfig, str | None]:
    """``config`` on the canvas ``geometry.canvas: "aspect"`` gives its frame or largest tile, and the
    line saying so; ``size``: that canvas side as already chosen, for the line only."""
    bb = config.backbone
    if bb.geometry != "letterbox":  # squash: the content fills the canvas, there is nothing to raise
        return config.replace(**{"geometry.canvas": "fixed"}), None
    h, w, what = _largest_piece(config, h, w)
    if size is None:
        size = _aspect_side(bb.image_size, h, w)
    if size == bb.image_size:  # square enough: the canvas as it is, nothing chosen
        return config.replace(**{"geometry.canvas": "fixed"}), None
    resolved = config.replace(**{"backbone.image_size": size, "geometry.canvas": "fixed"})
    before, after = resized_shape(h, w, bb.image_size, "letterbox"), resized_shape(h, w, size, "letterbox")
    why = (
        f"canvas aspect: image_size {size}, a {w} x {h} {what} gets {after[1]} x {after[0]} canvas px "
        f"({after[0] / h:.2f} per frame px; {before[1]} x {before[0]} at {bb.image_size})"
    )
    return resolved, why


def _aspect_side(image_size: int, h: int, w: int) -> int:
    """The canvas side ``geometry.canvas: "aspect"`` gives an ``h x w`` frame (or tile) at ``image_size``."""
    return min(round(image_size * max(h, w) / min(h, w)), ASPECT_MAX_SCALE * image_size)


def _one_canvas_side(config: DetectorConfig, h: int, w: int) -> int:
    """The canvas side an untiled ``h x w`` frame would get: raised by ``canvas: "aspect"`` on a letterbox
    (the frame's long side spans it), ``image_size`` otherwise (squash: the long side spans it too)."""
    size = config.backbone.image_size
    aspect = config.geometry.canvas == "aspect" and config.backbone.geometry == "letterbox"
    return _aspect_side(size, h, w) if aspect else size


def check_resolved(config: DetectorConfig, frames: Sequence[ImageInput]) -> None:
    """ConfigError when ``config`` asks :func:`choose_geometry` for a grid (``geometry.min_defect_px``
    or ``tiles: "auto"``) and its grid or canvas size is not what the rule resolves for ``frames``. A
    tiled detector built directly (``TiledHETMM(config)``) fits its configuration as given, so such a
    setting would be ignored there: :meth:`TiledHETMM.fit` refuses it instead (``detector_choice.new_detector``
    and ``operations.fit`` resolve it first; a configuration they resolved passes)."""
    g = config.geometry
    if g.min_defect_px is None and g.tiles != "auto":
        return
    chosen = choose_geometry(config, frames)
    size = config.backbone.image_size
    if g.tiles == "auto" or chosen.tiles != tuple(g.tiles) or chosen.config.backbone.image_size != size:
        asked = "tiles auto" if g.min_defect_px is None else f"geometry.min_defect_px {g.min_defect_px}"
        given = "auto" if g.tiles == "auto" else f"{g.tiles[0]} x {g.tiles[1]}"
        raise ConfigError(
            f"{asked}: for these frames the fit's rule chooses {chosen.describe()}, and this detector fits its "
            f"configuration as given (tiles {given}, image_size {size}); fit with detector_choice.new_detector(config, "
            "frames) or operations.fit, which resolve it"
        )


def resolve_tiles(config: DetectorConfig, frames: Sequence[ImageInput]) -> DetectorConfig:
    """``config`` with its grid chosen for ``frames`` (:func:`choose_geometry`); a grid of 1 x 1 is the
    untiled default."""
    return choose_geometry(config, frames).config


def auto_tiles(config: DetectorConfig, frames: Sequence[ImageInput]) -> tuple[int, int, str]:
    """The grid :func:`choose_geometry` picks for ``frames`` and why, in one line."""
    choice = choose_geometry(config, frames)
    return *choice.tiles, choice.why or "the grid as given"
