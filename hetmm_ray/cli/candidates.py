"""``hetmm promote``, ``discard`` and ``compare``: a candidate version, stored beside the
head and not served, made the head or dropped, and compared with the head (or ``--base``) on the
same images: in this process (hetmm_ray/workflows/compare.py) or, ``--on-ray``, as the ``hetmm inspect`` job
(archive/compare_job.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import (
    CLIError,
    Subcommands,
    _add_address_flag,
    _add_store_flags,
    _image_paths,
    _inspect_source,
    _open,
    _write_json,
)


# --- promote and discard ---------------------------------------------------------------
def add_promote(sub: Subcommands) -> None:
    p = sub.add_parser("promote", help="make a candidate version the head (a recorded move)")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, required=True, help="the candidate")
    p.add_argument("--expect-head", type=int, metavar="V", help="refuse unless the head is still V (what you compared)")
    _add_store_flags(p)
    p.set_defaults(func=cmd_promote)


def cmd_promote(args: argparse.Namespace) -> int:
    store = _open(args)
    old = store.head(args.product)
    store.promote(args.product, args.version, expect_head=args.expect_head)
    print(f"product {args.product}: head is now v{args.version} (was v{old}; promoted, recorded)")
    return 0


def add_discard(sub: Subcommands) -> None:
    p = sub.add_parser("discard", help="drop a candidate version (the head does not move)")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, required=True, help="the candidate")
    _add_store_flags(p)
    p.set_defaults(func=cmd_discard)


def cmd_discard(args: argparse.Namespace) -> int:
    store = _open(args)
    store.discard(args.product, args.version)
    print(f"product {args.product}: candidate v{args.version} discarded; head stays v{store.head(args.product)}")
    return 0


# --- compare ---------------------------------------------------------------------------
def add_compare(sub: Subcommands) -> None:
    p = sub.add_parser("compare", help="score images with the head and a candidate side by side; list verdict flips")
    p.add_argument("images", nargs="*", help="images, folders or s3:// prefixes")
    p.add_argument("--product", required=True)
    p.add_argument("--candidate", type=int, required=True, metavar="V", help="the candidate version")
    p.add_argument("--base", type=int, metavar="V", help="the version to compare against (default: head)")
    p.add_argument("--labelled", metavar="DIR", help="labelled folder (good/ + defect sub-folders): recall per version")
    p.add_argument("--since", help="the product's inspection record from this time (unix seconds or ISO 8601, UTC)")
    p.add_argument("--until", help="the product's inspection record up to this time (excluded)")
    p.add_argument("--max-images", type=int, default=10_000, help="at most this many images per s3:// prefix")
    p.add_argument("--out", metavar="DIR", help="write each flip's two heat-maps here")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    p.add_argument(
        "--on-ray",
        action="store_true",
        help="score both versions as the hetmm inspect job (Ray Data; any size of archive or record range): "
        "scores and verdicts only",
    )
    _add_store_flags(p)
    _add_address_flag(p, "run --on-ray on")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    """HEAD (or ``--base``) and a candidate side by side (compare.py); flips' heat-maps to ``--out``."""
    from ..workflows.compare import compare_versions

    if args.on_ray:
        result = _compare_on_ray(args)
    else:
        store = _open(args)
        images, labels = _compare_images(args)
        if not images:
            raise CLIError("no images to compare on")
        result = compare_versions(
            store, args.product, args.candidate, images, labels, base=args.base, maps=args.out is not None
        )
    b, c = result["base"], result["candidate"]
    out = Path(args.out) if args.out else None
    for i, flip in enumerate(result["flips"]):
        fb, fc = flip["base"], flip["candidate"]
        verdict = f"{fb['verdict']} -> {fc['verdict']}"
        print(f"flip  {verdict:<13}  v{b} {fb['score']:.4f}  v{c} {fc['score']:.4f}  {flip['image']}")
        if out is not None:
            for side, png_bytes in flip.pop("heatmaps").items():
                target = out / f"flip{i:04d}_{side}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(png_bytes)
                flip.setdefault("heatmaps", {})[side] = str(target)
    far = result["false_alarm_rate"]
    shift = result["score_shift"]
    print(
        f"{result['images']} images: {len(result['flips'])} verdict flips; flagged v{b} {result['flagged']['base']}, "
        f"v{c} {result['flagged']['candidate']}"
    )
    print(f"threshold v{b} {result['threshold']['base']:.4f}, v{c} {result['threshold']['candidate']:.4f}")
    for side, v in (("base", b), ("candidate", c)):
        est = far[side]["estimated"]
        est_text = "-" if est is None else f"{100 * est:.2f}%"
        share = far[side]["flagged_share"]
        share_text = "-" if share is None else f"{100 * share:.2f}%"
        print(f"v{v}: estimated false alarms {est_text} (out-of-fold), flagged share of the good set {share_text}")
    print("score quantiles " + " ".join(f"q{q:g}" for q in shift["quantiles"]))
    for key in ("base", "candidate", "difference"):
        print(f"  {key:<10} " + " ".join("-" if x is None else f"{x:.4f}" for x in shift[key]))
    if "labelled" in result:
        lab = result["labelled"]
        for side, v in (("base", b), ("candidate", c)):
            r, f = lab[side]["recall"], lab[side]["false_alarm_rate"]
            print(
                f"v{v} on {lab['good']} good + {lab['defective']} defective: recall "
                f"{'-' if r is None else f'{100 * r:.1f}%'}, false alarms {'-' if f is None else f'{100 * f:.1f}%'}"
            )
    if args.json:
        _write_json(args.json, result)
    return 0


def _compare_images(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], list[int] | None]:
    """The images ``hetmm compare`` scores: files / folders / ``s3://`` prefixes, or ``--labelled``."""
    from ..data.decode import decode_image
    from ..data.labelled import labelled_images
    from ..data.sources import read_image_source

    if args.since is not None or args.until is not None:  # the product's inspection record
        from ..workflows.compare import parse_time, record_images

        if args.images or args.labelled:
            raise CLIError("give --since/--until, images or --labelled DIR, one of them")
        try:
            since, until = parse_time(args.since), parse_time(args.until)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        found, labels = record_images(_open(args), args.product, since, until)
        if not found:
            raise CLIError(f"the inspection record of {args.product!r} kept no images in that time range")
        return [(name, decode_image(data, source=name)) for name, data in found], labels
    if bool(args.images) == bool(args.labelled):
        raise CLIError("give images (files, folders or an s3:// prefix) or --labelled DIR, not both")
    if args.labelled:
        files = labelled_images(args.labelled)
        return [(str(p), decode_image(p)) for p, _ in files], [int(v) for _, v in files]
    out: list[tuple[str, Any]] = []
    local = [item for item in args.images if not item.startswith("s3://")]
    for item in args.images:
        if item.startswith("s3://"):
            for name, data in read_image_source(item, max_images=args.max_images):
                out.append((f"{item.rstrip('/')}/{name}", decode_image(data, source=name)))
    out.extend((str(path), decode_image(path)) for path, _ in (_image_paths(local) if local else []))
    return out, None


def _compare_on_ray(args: argparse.Namespace) -> dict[str, Any]:
    """``hetmm compare --on-ray``: both versions over one SOURCE (or the record's range) as the Ray
    Data job of ``hetmm inspect`` (archive/compare_job.py): no heat-maps, no labels."""
    from ..archive import JobOptions, compare_archive

    if args.labelled or args.out:
        raise CLIError("--on-ray compares scores and verdicts only: --labelled and --out need the one-process compare")
    if len(args.images) > 1:
        raise CLIError("--on-ray takes one SOURCE (a folder, a glob, an s3:// prefix or a list of URIs)")
    source = _inspect_source(args.images[0] if args.images else None, args)
    opts = JobOptions(store=args.store, endpoint_url=args.endpoint_url, address=args.address)
    result = compare_archive(source, args.product, args.candidate, opts, base=args.base)
    if result["unreadable"]:
        print(f"{result['unreadable']} files could not be read or scored: left out of the comparison")
    if not result["images"]:
        raise CLIError("no images to compare on")
    return result
