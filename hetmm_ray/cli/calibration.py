"""``hetmm calibrate`` and ``hetmm region``: a stored product's templates kept, its threshold set
again (on labelled images, or the far rule at another rate) or its inspection region changed and
recalibrated, published as a new version (live or a candidate)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .common import (
    CLIError,
    Subcommands,
    _add_publish_flags,
    _add_store_flags,
    _announce_candidate,
    _describe_operating_point,
    _describe_region,
    _open,
)


# --- calibrate -------------------------------------------------------------------------
def add_calibrate(sub: Subcommands) -> None:
    p = sub.add_parser(
        "calibrate",
        help="set a stored product's threshold: on labelled images, or the far rule at another rate (a new version)",
    )
    p.add_argument("--product", required=True)
    p.add_argument("--val", metavar="DIR", help="labelled folder: MVTec test layout, or good/ + defect sub-folders")
    p.add_argument(
        "--val-store",
        action="store_true",
        help="instead of --val: the product's labelled set in the store (taught in the console, GET /ui/)",
    )
    p.add_argument(
        "--far",
        type=float,
        metavar="RATE",
        help="instead of labelled images: the far rule at this false-alarm rate (e.g. 0.02) on the stored "
        "out-of-fold scores; a new version of the same templates, nothing recomputed",
    )
    p.add_argument("--objective", choices=("f1", "recall"), default="f1", help="best F1 (default) or best recall")
    p.add_argument(
        "--max-false-alarm-rate",
        type=float,
        default=0.01,
        metavar="RATE",
        help="--objective recall: at most this share of the good images flagged (default 0.01)",
    )
    p.add_argument("--version", type=int, help="version to calibrate (default: head)")
    _add_store_flags(p)
    _add_publish_flags(p)
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..core.calibration import describe_rate_choices
    from ..data.decode import decode_image
    from ..data.labelled import labelled_images
    from ..workflows import operations

    store = _open(args)
    head = store.head(args.product)
    version = head if args.version is None else args.version
    if sum((args.val is not None, bool(args.val_store), args.far is not None)) != 1:
        raise CLIError("give one of --val DIR, --val-store or --far RATE")
    mode = getattr(args, "publish", None)
    if args.far is not None:
        if version != head:
            raise CLIError(f"--far sets the rule of the head, v{head}: drop --version {version}")
        # TemplateError without out-of-fold scores, ConfigError out of range; a tiled product keeps its
        # tile scales: its frame threshold moves, its scores stay (hetmm_ray/detection/tiled.py)
        out = operations.set_far_rule(store, args.product, args.far, mode=mode)
        if out.candidate:
            _announce_candidate(args, store, out.version)
        print(
            f"product {args.product}: version {out.version} (from v{head}) threshold "
            f"{_describe_operating_point(out.operating_point)}"
        )
        return 0
    if args.val_store:  # the labels taught in the console (store/labels.py), beside the product's versions
        from ..store.labels import LabelSet

        stored = LabelSet(store.backend).labelled(args.product)
        labelled: Sequence[tuple[object, int]] = [(name, label) for name, _, label in stored]
        images: list[Any] = [decode_image(data, source=name) for name, data, _ in stored]
    else:
        labelled = labelled_images(args.val)
        images = [p for p, _ in labelled]  # the files: the detector decodes and resizes (or cuts) them
    try:
        out = operations.calibrate_labelled(
            store,
            args.product,
            images,
            [v for _, v in labelled],
            version,
            objective=args.objective,
            max_false_alarm_rate=args.max_false_alarm_rate,
            mode=mode,
            progress=True,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if out.candidate:
        _announce_candidate(args, store, out.version)
    record = out.record
    assert record is not None
    print(
        f"product {args.product}: version {out.version} (from v{version}) threshold {record['threshold']:.4f} "
        f"for {record['objective']} on {record['good']} good + {record['defective']} defective images: "
        f"recall {100 * record['recall']:.1f}%, false alarms {100 * record['false_alarm_rate']:.1f}%, "
        f"F1 {100 * record['f1']:.1f}; estimated false alarms on good parts {_estimate_text(record)}"
    )
    print(describe_rate_choices(record["rates"]))
    return 0


def _estimate_text(record: dict[str, Any]) -> str:
    """The labelled threshold's estimate on the out-of-fold good scores, with its interval."""
    e = record.get("false_alarm_estimate")
    if e is None:
        return f"{100 * record['estimated_false_alarm_rate']:.2f}% (out-of-fold)"
    return (
        f"{100 * e['rate']:.2f}% ({100 * e['confidence']:g}% interval {100 * e['low']:.2f}-{100 * e['high']:.2f}%; "
        f"{e['above']} of {e['n']} out-of-fold good scores above)"
    )


# --- region ----------------------------------------------------------------------------
def add_region(sub: Subcommands) -> None:
    p = sub.add_parser("region", help="give a stored product another inspection region (a new version, recalibrated)")
    p.add_argument("--product", required=True)
    p.add_argument(
        "--region",
        required=True,
        metavar="FILE",
        help="JSON/YAML shapes, a PNG mask (nonzero = include), or 'none' to remove the region",
    )
    p.add_argument("--version", type=int, help="version to start from (default: head)")
    _add_store_flags(p)
    _add_publish_flags(p)
    p.set_defaults(func=cmd_region)


def cmd_region(args: argparse.Namespace) -> int:
    """A new version of a stored product with another inspection region, recalibrated.

    The templates (bank and selection) are kept: a region changes which map pixels count, not
    the features. The out-of-fold calibration is recomputed under the new region, so the
    threshold follows it. A product on the ``validation`` rule is refused: its labelled
    threshold was chosen under the old region (run ``hetmm calibrate`` again afterwards).
    """
    from ..data.region_file import read_region
    from ..workflows import operations

    region = read_region(args.region)  # a bad file fails before any loading
    store = _open(args)
    out = operations.set_region(
        store, args.product, region, args.version, mode=getattr(args, "publish", None), progress=True
    )
    if out.candidate:
        _announce_candidate(args, store, out.version)
    print(
        f"product {args.product}: version {out.version} (from v{out.base}) region {_describe_region(region)}; "
        f"threshold {_describe_operating_point(out.before, warn=False)} -> "
        f"{_describe_operating_point(out.operating_point)}"
    )
    return 0
