"""``hetmm fit``, ``update`` and ``compress``: a product's templates built from good images, grown
with more, or compressed to a small selection (PTS), each published as a new version; tiled or
not, one path (``detector_choice.new_detector`` / ``load_detector``: the ``interface.Detector`` calls).
Where the features and PTS run (here or as Ray tasks, ``--address``) is :func:`_steps`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..config import RATE_CHOICES, TEMPLATE_KINDS
from .common import (
    CLIError,
    Subcommands,
    _add_address_flag,
    _add_config_flags,
    _add_publish_flags,
    _add_store_flags,
    _announce_candidate,
    _config_from,
    _describe_operating_point,
    _describe_region,
    _image_paths,
    _open,
    _sheets,
    _template_kind,
)


# --- fit -----------------------------------------------------------------------------
def add_fit(sub: Subcommands) -> None:
    p = sub.add_parser("fit", help="build a product's templates from good images and store them")
    p.add_argument("images", nargs="+", help="good images or folders of them")
    p.add_argument("--product", required=True, help="product name")
    _add_store_flags(p)
    _add_config_flags(p)
    _add_address_flag(p, "extract features and run PTS on")
    p.set_defaults(func=cmd_fit)


def cmd_fit(args: argparse.Namespace) -> int:
    from ..detection.detector_choice import ms_per_frame_of
    from ..detection.geometry_rule import choose_geometry, frame_shape
    from ..workflows import operations

    config = _config_from(args)
    paths = [p for p, _ in _image_paths(args.images)]
    if len(paths) < 2:
        raise CLIError(f"fit needs at least 2 good images, got {len(paths)}")
    layout = None

    choice = choose_geometry(config, paths)  # the fit's one rule; what it chose and why, before the long work
    if choice.why is not None or choice.canvas_why is not None:
        print(choice.describe(), flush=True)

    def announce(det: Any) -> None:  # the cost line, before the long work
        nonlocal layout
        layout = det.layout(*frame_shape(paths[0]))
        sheets = _sheets_text(det.config.templates, len(paths)).replace(" (", f"{layout.per_tile} (", 1)
        ms = ms_per_frame_of(det, paths[0], len(paths))
        print(
            f"{layout.describe(det.config.backbone.image_size)}, sheets {sheets}, estimated {ms:.0f} ms per frame",
            flush=True,
        )

    # The files themselves, not canvases resized here: the detector decodes them a batch at a time,
    # and an image's digest is its decoded frame's, as on every other path. --address:
    # PTS as Ray tasks; "auto" tiles resolved from the frames' headers.
    out = operations.fit(_open(args), args.product, config, paths, on_start=announce, progress=True, steps=_steps(args))
    assert layout is not None and out.detector is not None
    fitted = out.detector.template_set()
    print(
        f"product {args.product}: version {out.version} from {len(paths)} good images "
        f"({fitted.weights_id}); {layout.fitted_note()}threshold "
        f"{_describe_operating_point(out.operating_point)}; store {args.store}"
    )
    if config.region is not None:
        print(f"region {_describe_region(config.region)}{layout.region_note()}")
    # a fit's bank holds the frames in the order given (repeats too), so bank frame i is file i
    frame_names = list(map(str, paths)) if len(paths) == fitted.n_images else None
    _print_calibration_facts(out.detector, args.product, frame_names)
    return 0


def _print_calibration_facts(det: Any, product: str, frame_names: list[str] | None = None) -> None:
    """After a fit, an update or a drop: the far rule at ``RATE_CHOICES`` (threshold, good frames
    above, estimate with its interval), the good frames standing apart and the frames held more than
    once (``core/good_outliers.py``), by file name (``frame_names``, bank order) where known."""
    from ..core.calibration import describe_rate_choices, rate_choices
    from ..workflows import operations

    cal = det.calibration
    if cal is None:
        return
    print(describe_rate_choices([c.to_json() for c in rate_choices(cal.scores, RATE_CHOICES)]))
    report = operations.good_outliers(det)
    if report is not None:
        print(report.describe(frame_names=frame_names, product=product))


def _sheets_text(tc: Any, n_images: int) -> str:
    """``5 (all)``, ``200 (cover)``, ``40 (pts_o)``, ``at most 120 (pts_o, sheets auto)``: what a fit will hold."""
    k = tc.sheets_of(n_images)
    if tc.kind != "all" and tc.sheets == "auto":
        return f"at most {k} ({tc.kind}, sheets auto)"
    if tc.kind == "cover" and n_images <= tc.sheets:
        return f"{k} (cover: every image while the bank holds at most {tc.sheets})"
    return f"{k} ({tc.kind})"


# --- update ----------------------------------------------------------------------------
def add_update(sub: Subcommands) -> None:
    p = sub.add_parser("update", help="hot update: add good images to a stored product (new version)")
    p.add_argument("images", nargs="+", help="good images or folders of them")
    p.add_argument("--product", required=True)
    _add_store_flags(p)
    _add_address_flag(p, "extract features and run PTS on")
    _add_publish_flags(p)
    p.set_defaults(func=cmd_update)


def cmd_update(args: argparse.Namespace) -> int:
    from ..detection.interface import tiles_per_frame
    from ..workflows import operations

    store = _open(args)
    paths = [p for p, _ in _image_paths(args.images)]
    mode = getattr(args, "publish", None)
    # expect_head inside: a concurrent update in between makes this one fail cleanly instead of losing images
    out = operations.update(store, args.product, paths, mode=mode, progress=True, steps=_steps(args))
    det = out.detector
    assert det is not None
    if out.skipped:
        print(f"hetmm: skipped: {out.skipped} image(s) already in v{out.base} (same content)", file=sys.stderr)
    if not out.changed:
        print(f"product {args.product}: no new images; head stays v{out.base}")
        return 0
    if out.candidate:
        _announce_candidate(args, store, out.version)
    count = tiles_per_frame(det.config)
    tiles = f"; {count} tiles" if count > 1 else ""
    print(
        f"product {args.product}: version {out.version} (from v{out.base}) with {out.added} more good images, "
        f"{det.template_set().n_images} in all{tiles}; threshold {_describe_operating_point(out.operating_point)}"
    )
    _print_calibration_facts(det, args.product)
    return 0


# --- drop ------------------------------------------------------------------------------
def add_drop(sub: Subcommands) -> None:
    p = sub.add_parser(
        "drop",
        help="remove good frames from a stored product's bank and calibration (a new version, recalibrated)",
    )
    p.add_argument(
        "frames",
        nargs="*",
        metavar="NAME",
        help="an image file (its decoded frame's content digest) or a digest, or its first 8+ hex digits, "
        "as hetmm fit / update print for the frames standing apart: every copy of it is dropped",
    )
    p.add_argument(
        "--repeats",
        action="store_true",
        help="also drop the later copies of every frame the bank holds more than once (the first copy kept), "
        "as hetmm fit / update print them",
    )
    p.add_argument("--product", required=True)
    _add_store_flags(p)
    _add_publish_flags(p)
    p.set_defaults(func=cmd_drop)


def cmd_drop(args: argparse.Namespace) -> int:
    from ..workflows import operations

    if not args.frames and not args.repeats:
        raise CLIError("drop: name at least one frame (NAME...), or give --repeats")
    store = _open(args)
    names: dict[str, str] = {}

    def resolve(held: tuple[str, ...]) -> list[str]:
        digests, given = _resolve_frames(args.frames, held)
        names.update(given)
        return digests

    try:
        out = operations.drop(
            store, args.product, resolve, repeats=args.repeats, mode=getattr(args, "publish", None), progress=True
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    det = out.detector
    assert det is not None
    if out.candidate:
        _announce_candidate(args, store, out.version)
    assert out.record is not None and out.base is not None
    parts = [names[d] for d in out.record["dropped"]]
    parts += [_later_copies(g["digest"], g["indices"], out.base) for g in out.record["repeats"]]
    count = len(out.record["dropped"]) + sum(len(g["indices"]) - 1 for g in out.record["repeats"])
    print(
        f"product {args.product}: version {out.version} (from v{out.base}) without {count} good frame(s) "
        f"({', '.join(parts)}), {det.template_set().n_images} in all; "
        f"threshold {_describe_operating_point(out.before, warn=False)} -> "
        f"{_describe_operating_point(out.operating_point)}"
    )
    _print_calibration_facts(det, args.product)
    return 0


def _later_copies(digest: str, indices: list[int], base: int) -> str:
    """``the later copy of 3f2a9c01b2d4 (v1's bank frame 24; frame 20 kept)``: a repeat group's dropped copies."""
    later = indices[1:]
    copies = "copy" if len(later) == 1 else "copies"
    frames = "frame" if len(later) == 1 else "frames"
    return (
        f"the later {copies} of {digest[:12]} (v{base}'s bank {frames} {', '.join(map(str, later))}; "
        f"frame {indices[0]} kept)"
    )


def _resolve_frames(frames: list[str], held: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """Each NAME as a digest of the bank (an image file's decoded frame, or a digest prefix of 8+ hex
    digits matching exactly one held frame), and the name each was given by; CLIError otherwise."""
    import os

    from ..core.device import image_digest
    from ..detection.scorer import as_rgb

    out: list[str] = []
    names: dict[str, str] = {}
    for name in frames:
        if os.path.isfile(name):
            digest = image_digest(as_rgb(name))
            if digest not in held:
                raise CLIError(f"{name}: the product's bank holds no frame with this content (digest {digest[:12]})")
        else:
            prefix = name.lower()
            if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
                raise CLIError(f"{name}: neither an image file nor a digest of 8 or more hex digits")
            matches = sorted({d for d in held if d.startswith(prefix)})
            if len(matches) != 1:
                raise CLIError(f"{name}: {'no' if not matches else len(matches)} frames of the bank have this digest")
            digest = matches[0]
        if digest not in names:
            out.append(digest)
            names[digest] = name
    return out, names


# --- compress --------------------------------------------------------------------------
def add_compress(sub: Subcommands) -> None:
    p = sub.add_parser("compress", help="select a stored product's tiny template set (PTS) and publish it")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, help="version to compress (default: head)")
    p.add_argument("--templates", default="pts_o", choices=(*TEMPLATE_KINDS, "pts"), help="selection (default pts_o)")
    p.add_argument(
        "--sheets",
        type=_sheets,
        default=None,
        help="sheets K, or auto: the smallest K whose verdicts match ALL's (default: the product's configuration)",
    )
    p.add_argument("--seed", type=int, help="seed of the random and k-means selections")
    p.add_argument("--device")
    _add_store_flags(p)
    _add_address_flag(p, "run PTS on")
    _add_publish_flags(p)
    p.set_defaults(func=cmd_compress)


def cmd_compress(args: argparse.Namespace) -> int:
    from ..detection.interface import tiles_per_frame
    from ..detection.tiled import position_sets
    from ..workflows import operations

    store = _open(args)
    overrides = {k: v for k, v in (("device", args.device),) if v}
    out = operations.compress(
        store,
        args.product,
        args.version,
        kind=_template_kind(args.templates),
        sheets=args.sheets,
        seed=args.seed,
        mode=getattr(args, "publish", None),
        progress=True,
        steps=_steps(args),
        **overrides,
    )
    det = out.detector
    assert det is not None
    if out.candidate:
        _announce_candidate(args, store, out.version)
    compressed = det.template_set()
    sets = position_sets(compressed)
    for p, ts in enumerate(sets):
        auto = ts.meta.get("sheets_auto")  # present only when this selection measured its K
        if auto and len(sets) == 1:
            print(_ladder_table(auto))
        elif auto:
            print(f"tile {p}: sheets auto chose K = {auto['chosen']} ({auto['why']})")
    counts = sorted({ts.sheets for ts in sets})
    held = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    count = tiles_per_frame(det.config)
    per_tile = f" per tile ({count} tiles)" if count > 1 else ""
    print(
        f"product {args.product}: version {out.version} = {det.config.templates.kind} with {held} sheets{per_tile} "
        f"of {compressed.n_images} images ({out.seconds:.1f}s); "
        f"threshold {_describe_operating_point(out.operating_point)}"
    )
    return 0


def _ladder_table(auto: dict[str, Any]) -> str:
    """The ``sheets: auto`` ladder as printed by ``hetmm compress`` (each side at its own threshold)."""
    tol = auto["tolerance"]
    budget = tol.get("max_ms_per_image")
    lines = [
        f"sheets: auto (agreement with ALL on out-of-fold scores, each at its own threshold: rank corr >= "
        f"{tol['min_rank_corr']}, norm diff <= {tol['max_norm_diff']}, verdicts >= "
        f"{100 * tol['min_verdict_agreement']:.0f}%"
        + ("" if budget is None else f"; budget {budget:g} ms/frame, backbone + ATMM")
        + ")",
        f"{'K':>6}  {'rank corr':>9}  {'norm diff':>9}  {'verdicts':>8}  {'ms/img':>7}  agrees"
        + ("" if budget is None else "  est. ms/frame"),
    ]
    for r in auto["ladder"]:
        agrees = "yes" if r["agrees"] else "no"
        if r.get("ms_per_frame") is not None:  # a budget was set: the frame estimate it was judged by
            agrees = f"{agrees:<6}  {r['ms_per_frame']:>13.1f}"
        lines.append(
            f"{r['sheets']:>6}  {r['rank_corr']:>9.4f}  {r['norm_diff']:>9.4f}  "
            f"{100 * r['verdict_agreement']:>7.1f}%  {r['ms_per_image']:>7.1f}  {agrees}"
        )
    lines.append(f"{'ALL':>6}  {'':>9}  {'':>9}  {'':>8}  {auto['all_ms_per_image']:>7.1f}")
    lines.append(f"chosen K = {auto['chosen']} ({auto['why']})")
    return "\n".join(lines)


def _steps(args: argparse.Namespace) -> Any:
    """Where fit/update/compress extract features and run PTS: as tasks on the Ray cluster at
    ``--address`` (joined here), else in this process (None). A tiled product's tiles go through the
    backbone in this process either way; its positions' PTS runs as those tasks."""
    if not getattr(args, "address", None):
        return None
    from ..distributed.ray_steps import ray_steps
    from ..distributed.runtime import connect

    connect(args.address)
    return ray_steps()
