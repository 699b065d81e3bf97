"""What the ``hetmm`` commands share: the one-line error (``CLIError``), the flags several commands
take (configuration, store, Ray address, publish) and the configuration read from them, the images
named on the command line, the store, publishing a version (live or candidate), ``--json`` output,
the lines that describe an operating point or a region, and an archive source (``inspect`` and
``compare --on-ray``).

Each command's own parser and handler are in its group's module (hetmm_ray/cli/__init__.py lists them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ..config import (
    BACKBONES,
    DEFAULT_STORE,
    DTYPES,
    IMAGE_SUFFIXES,
    TEMPLATE_KINDS,
    ConfigError,
    DetectorConfig,
    load_config,
)
from ..errors import HetmmError

if TYPE_CHECKING:
    from ..store.protocol import Store

# what each command module's ``add_<command>(sub)`` adds its parser to (``add_subparsers``' result)
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class CLIError(HetmmError):
    """A user-facing failure with a one-line message."""


# --- flags ---------------------------------------------------------------------------
def _add_store_flags(p: argparse.ArgumentParser, *, default: str | None = DEFAULT_STORE) -> None:
    where = f"(default ./{default})" if default else "(publish the fitted templates there)"
    p.add_argument(
        "--store", default=default, metavar="URI", help=f"template store: a folder or s3://bucket/prefix {where}"
    )
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph); default: boto3's standard chain")


def _add_address_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--address",
        metavar="ADDR",
        help=f"Ray cluster to {what} (auto, host:port or ray://host:port; default: RAY_ADDRESS, else local)",
    )


def _add_publish_flags(p: argparse.ArgumentParser) -> None:
    """``--candidate`` / ``--live``: override the product's ``publish`` setting."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--candidate",
        dest="publish",
        action="store_const",
        const="candidate",
        help="publish as a candidate beside the head (hetmm compare / promote / discard)",
    )
    group.add_argument("--live", dest="publish", action="store_const", const="live", help="publish as the head")


# --- configuration from flags -----------------------------------------------------
def _add_config_flags(p: argparse.ArgumentParser, *, templates: bool = True) -> None:
    g = p.add_argument_group("configuration (a --config file first, then these flags)")
    g.add_argument("--config", metavar="FILE", help="JSON or YAML configuration file")
    g.add_argument("--backbone", choices=BACKBONES, help="feature backbone (default efficientnet_lite0)")
    g.add_argument("--weights", help="DEFAULT (lite: packaged), a torchvision enum, a state-dict file, or 'random'")
    if templates:
        g.add_argument(
            "--templates",
            choices=(*TEMPLATE_KINDS, "pts"),
            help=f"template selection (default {DetectorConfig().templates.kind}; pts = pts_o)",  # one place: config
        )
        g.add_argument(
            "--sheets",
            type=_sheets,
            help=f"template sheets K for compressed selections, or auto (default {DetectorConfig().templates.sheets})",
        )
    g.add_argument(
        "--region",
        metavar="FILE",
        help="inspection region: JSON/YAML shapes or a PNG mask (nonzero = include); pixels outside never count",
    )
    g.add_argument("--device", help="auto (default), cpu, cuda, cuda:N")
    g.add_argument("--dtype", choices=DTYPES, help="ATMM compute dtype")
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting by dotted name, e.g. --set scoring.score_sigma=6.8 (JSON values)",
    )


def _config_from(args: argparse.Namespace, base: DetectorConfig | None = None) -> DetectorConfig:
    config = load_config(args.config) if getattr(args, "config", None) else (base or DetectorConfig())
    changes: dict[str, Any] = {}
    if getattr(args, "backbone", None):
        changes["backbone.name"] = args.backbone
    if getattr(args, "templates", None):
        args.templates = _template_kind(args.templates)
    for flag, key in (
        ("weights", "backbone.weights"),
        ("templates", "templates.kind"),
        ("sheets", "templates.sheets"),
        ("device", "device"),
        ("dtype", "dtype"),
    ):
        if getattr(args, flag, None) is not None:
            changes[key] = getattr(args, flag)
    if getattr(args, "region", None):
        from ..data.region_file import read_region

        changes["region"] = read_region(args.region)
    for item in getattr(args, "set", []):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            changes[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            changes[key.strip()] = raw
    return config.replace(**changes) if changes else config


def _sheets(value: str) -> int | str:
    """``--sheets``: a positive integer or ``auto``."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {value!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {value!r}")
    return k


def _template_kind(kind: str | None) -> str | None:
    return "pts_o" if kind == "pts" else kind


# --- inputs and outputs --------------------------------------------------------------
def _image_paths(items: list[str]) -> list[tuple[Path, Path]]:
    """Image files named or found under folders, each with the name to report it by.

    The name keeps the sub-folders below a given folder (``test/broken/000.png`` ->
    ``broken/000``), so outputs of same-named files in different folders never collide.
    """
    found: list[tuple[Path, Path]] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            inside, skipped = _folder_images(p)
            for q, why in skipped:
                print(f"hetmm: skipped: {q}: {why}", file=sys.stderr)
            if not inside:
                raise CLIError(f"{p}: no images (png, jpg, bmp, tif) in this folder")
            found.extend((q, q.relative_to(p).with_suffix("")) for q in inside)
        elif p.exists():
            found.append((p, Path(p.stem)))
        else:
            raise CLIError(f"{p}: no such file or folder")
    seen: dict[Path, int] = {}
    unique = []
    for path, name in found:
        seen[name] = seen.get(name, 0) + 1
        unique.append((path, name if seen[name] == 1 else name.with_name(f"{name.name}-{seen[name]}")))
    return unique


def _folder_images(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Regular image files under ``folder`` (sorted), and every other entry with why it was skipped.

    Hidden entries (``.name``) are skipped without a word; directories are walked, not
    reported; a symlink loop or an unreadable entry is reported, never followed.
    """
    images: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for q in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in q.relative_to(folder).parts):
            continue
        try:
            if q.is_dir():
                if q.suffix.lower() in IMAGE_SUFFIXES:
                    skipped.append((q, "a directory, not an image file"))
                continue
            mode = q.stat().st_mode
        except OSError as exc:  # a symlink loop, a dangling link, no permission
            skipped.append((q, f"cannot be read ({exc.strerror or type(exc).__name__})"))
            continue
        import stat

        if not stat.S_ISREG(mode):
            skipped.append((q, "not a regular file (a FIFO, socket or device)"))
        elif q.suffix.lower() not in IMAGE_SUFFIXES:
            skipped.append((q, f"not an image suffix ({', '.join(sorted(IMAGE_SUFFIXES))})"))
        else:
            images.append(q)
    return images, skipped


def _inspect_source(source: str | None, args: argparse.Namespace) -> Any:
    """SOURCE, or the product's inspection record over ``--since``/``--until`` (archive.RecordSource)."""
    from ..archive import RecordSource

    ranged = args.since is not None or args.until is not None
    if ranged == (source is not None):
        raise CLIError("give SOURCE, or --since/--until for the product's inspection record (not both)")
    if not ranged:
        return source
    from ..workflows.compare import parse_time

    try:
        since, until = (None if t is None else parse_time(t) for t in (args.since, args.until))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return RecordSource(args.store, args.product, since, until)


def _open(args: argparse.Namespace) -> Any:
    from ..store import open_store

    return open_store(args.store, endpoint_url=getattr(args, "endpoint_url", None))


def _write_json(path: str, value: Any) -> None:
    """``--json``: ``value`` written to ``path`` (its folder made), indented."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(value, indent=1))


# --- publishing a version (live or a candidate) ------------------------------------------------
def _announce_candidate(args: argparse.Namespace, store: Store, version: int) -> None:
    """On stderr: ``version`` is a candidate, and how to compare and promote it."""
    head = store.head(args.product)
    if head != version:  # a product's first version is always head
        print(
            f"hetmm: v{version} is a candidate; HEAD stays v{head} (hetmm compare / promote / discard "
            f"{args.product} {version})",
            file=sys.stderr,
        )


# --- what the commands print -----------------------------------------------------------
def _rule_text(op: Any) -> str:
    """``far 1%``, ``validation``, ``sigmas 3``."""
    if op.target is None:
        return op.rule
    return f"{op.rule} {100 * op.target:g}%" if op.rule == "far" else f"{op.rule} {op.target:g}"


def _short_operating_point(op: Any) -> str:
    """``0.4321 far 1%`` (``hetmm versions``); ``none`` before calibration."""
    return "none" if op is None else f"{op.threshold:.4f} {_rule_text(op)}"


def _describe_operating_point(op: Any, *, warn: bool = True) -> str:
    """``0.4321 (rule far 1%, estimated false alarms 1.08% (95% interval 0.09-2.57%; 2 of 278 out-of-fold
    good scores above))``; ``none`` before calibration. ``warn``: the point's warning (a threshold far
    above every good score) on a line of its own after it; False for a point that is no longer the
    product's (a ``before -> after`` line warns about the after only)."""
    if op is None:
        return "none (not calibrated)"
    est = f"{100 * op.false_alarm_rate:.2f}%" if op.estimate is None else op.estimate.describe()
    text = f"{op.threshold:.4f} (rule {_rule_text(op)}, estimated false alarms {est})"
    warning = op.warning() if warn else None
    return text if warning is None else f"{text}\nwarning: {warning}"


def _describe_region(region: dict[str, Any] | None) -> str:
    """``1 include / 2 exclude shapes in a 460 x 1130 frame, 83.2% of it counts``; ``none``."""
    if region is None:
        return "none (every pixel counts)"
    from ..core.region import covered_share, raster

    h, w = region["size"]
    share = 100 * covered_share(raster(region))
    return (
        f"{len(region['include'])} include / {len(region['exclude'])} exclude shapes in a {w} x {h} frame, "
        f"{share:.1f}% of it counts"
    )
