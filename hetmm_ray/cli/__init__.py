"""The ``hetmm`` command: fit, predict, update, compress, region, evaluate, serve, demo.

Every expected failure (bad image, bad config, missing weights, unknown
product, unreadable store) ends with a one-line ``hetmm: error: ...`` and exit
status 2; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import (
    BACKBONES,
    DEFAULT_STORE,
    DTYPES,
    GRPC_CLIENT_WAIT_S,
    IMAGE_SUFFIXES,
    TEMPLATE_KINDS,
    ConfigError,
    DetectorConfig,
    check_number,
    load_config,
)
from ..config.archive import ACTOR_CPUS, ACTOR_THREADS, BLOCK_IMAGES, SCORE_BATCH
from ..errors import HetmmError, describe

__all__ = ["main"]


class CLIError(HetmmError):
    """A user-facing failure with a one-line message."""


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
        g.add_argument("--sheets", type=_sheets, help="template sheets K for compressed selections, or auto (default)")
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


# --- commands ------------------------------------------------------------------------
def cmd_fit(args: argparse.Namespace) -> int:
    from ..detector import HETMM
    from ..evaluation import load_images

    config = _config_from(args)
    paths = [p for p, _ in _image_paths(args.images)]
    if len(paths) < 2:
        raise CLIError(f"fit needs at least 2 good images, got {len(paths)}")
    if config.geometry.tiles != (1, 1):
        from ..tiled import resolve_tiles

        config = resolve_tiles(config, paths)  # "auto": from the frames' headers; 1 x 1 is the plain fit
        if config.geometry.tiled:
            return _fit_tiled(args, config, paths)
    det = HETMM(config, progress=True, steps=_steps(args))
    bb = config.backbone
    _print_untiled_cost(det, paths)
    det.fit(load_images(paths, bb.image_size, progress=True, desc="decode", geometry=bb.geometry))
    version = det.save(_open(args), args.product)
    print(
        f"product {args.product}: version {version} from {len(paths)} good images "
        f"({det.backbone.weights_id}); threshold {_describe_operating_point(det.operating_point())}; store {args.store}"
    )
    if config.region is not None:
        print(f"region {_describe_region(config.region)}")
    return 0


def _sheets_text(tc: Any, n_images: int) -> str:
    """``5 (all)``, ``40 (pts_o)``, ``at most 120 (pts_o, sheets auto)``: what a fit will hold."""
    k = tc.sheets_of(n_images)
    if tc.kind != "all" and tc.sheets == "auto":
        return f"at most {k} ({tc.kind}, sheets auto)"
    return f"{k} ({tc.kind})"


def _print_untiled_cost(det: Any, paths: list[Path]) -> None:
    """``hetmm fit`` of an untiled product: the cost line before the long work (as a tiled fit's)."""
    from ..evaluation import load_images
    from ..fitting import estimate_ms_per_frame
    from ..tiled import frame_shape

    bb = det.config.backbone
    h, w = frame_shape(paths[0])
    first = load_images(paths[:1], bb.image_size, geometry=bb.geometry)  # as the fit will get it
    ms = estimate_ms_per_frame(det.scorer, first, det.config.templates.sheets_of(len(paths)))
    print(
        f"tiles 1 x 1 (1 per frame, a {h} x {w} frame, {max(h, w) / bb.image_size:.2f} frame px per canvas px), "
        f"sheets {_sheets_text(det.config.templates, len(paths))}, estimated {ms:.0f} ms per frame",
        flush=True,
    )


def _fit_tiled(args: argparse.Namespace, config: Any, paths: list[Path]) -> int:
    """``hetmm fit`` of a tiled product (hetmm_ray/tiled.py): the cost first, then the fit."""
    from ..tiled import TiledHETMM, frame_shape

    det = TiledHETMM(config, progress=True, steps=_steps(args))  # --address: each position's PTS as Ray tasks
    h, w = frame_shape(paths[0])
    tile = det.tiles_of(h, w)[0]
    size = config.backbone.image_size
    sheets = _sheets_text(config.templates, len(paths)).replace(" (", " per tile (", 1)
    ms = det.estimate_ms_per_frame(paths[0], len(paths))
    print(
        f"tiles {det.rows} x {det.cols} ({det.n_tiles} per frame, {tile.height} x {tile.width} px of a "
        f"{h} x {w} frame, {max(tile.height, tile.width) / size:.2f} frame px per canvas px), "
        f"sheets {sheets}, estimated {ms:.0f} ms per frame",
        flush=True,
    )
    det.fit(paths)
    version = det.save(_open(args), args.product)
    print(
        f"product {args.product}: version {version} from {len(paths)} good images "
        f"({det.backbone.weights_id}); {det.n_tiles} tiles{' + the whole view' if det.whole_view else ''}; threshold "
        f"{_describe_operating_point(det.operating_point())}; store {args.store}"
    )
    if config.region is not None:
        dead = det.n_tiles - sum(det.live[: det.n_tiles])  # tiles only (the whole view is not one)
        print(f"region {_describe_region(config.region)}; {dead} of {det.n_tiles} tiles wholly outside it")
    return 0


def _write_json(path: str, value: Any) -> None:
    """``--json``: ``value`` written to ``path`` (its folder made), indented."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(value, indent=1))


def _predict_grpc(args: argparse.Namespace) -> int:
    """``hetmm predict --grpc HOST:PORT``: the images scored by a service's hetmm.v1.Inspection
    (serve/grpc/) through ``InspectionClient.predict_all`` (files read as they are sent, requests within
    the service's limits, two in flight); the same lines as in process."""
    import os
    import threading

    import grpc

    from ..serve.grpc.client import ImageRefused, InspectionClient
    from ..serve.grpc.messages import RULE_FIELDS

    found = _image_paths(args.images)  # (path, the name its outputs are written by), as in process
    if not found:
        raise CLIError("no images to score")
    token = os.environ.get("HETMM_ADMIN_TOKEN") or None
    records, out, failed = [], Path(args.out) if args.out else None, 0
    uploads = ((str(path), path.read_bytes()) for path, _ in found)
    wait_s = GRPC_CLIENT_WAIT_S if args.wait_s is None else args.wait_s
    if not 0 <= wait_s <= 3600:  # NaN too
        raise CLIError(f"--wait-s must be between 0 and 3600 seconds, not {wait_s}")
    told = threading.Event()

    def waiting(refusal: grpc.RpcError) -> None:  # said once: the service may be starting
        if not told.is_set():
            told.set()
            why = (refusal.details() or "").splitlines()[0][:200]  # type: ignore[attr-defined]
            print(f"hetmm: {args.grpc}: UNAVAILABLE ({why}); trying again for up to {wait_s:g} s", file=sys.stderr)

    with InspectionClient(args.grpc, token=token, wait_s=wait_s, on_wait=waiting) as client:
        results = client.predict_all(
            args.product,
            uploads,
            heatmap=out is not None,
            version=args.version,
            threshold=args.threshold,
            skip_bad_images=True,
        )
        try:
            # in the order sent: each result is its file's, and written by that file's unique name
            for (path, name), r in zip(found, results, strict=True):
                if isinstance(r, ImageRefused):
                    print(f"hetmm: skipped: {r.details.split(': ', 1)[-1]}", file=sys.stderr)
                    failed += 1
                    continue
                rec: dict[str, Any] = {"image": str(path), "score": round(r.score, 6)}
                rec.update(threshold=round(r.threshold, 6), is_anomaly=r.is_anomaly)
                for field in RULE_FIELDS:  # as in process
                    if r.HasField(field):
                        rec[field] = getattr(r, field)
                rec["version"] = r.version
                if out is not None and r.heatmap_png:
                    target = out / name.parent / f"{name.name}_heatmap.png"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(r.heatmap_png)
                    rec["heatmap"] = str(target)
                records.append(rec)
                print(f"{rec['score']:.4f}  {'ANOMALY' if r.is_anomaly else 'ok':<7}  {path}")
        except grpc.RpcError as exc:
            raise CLIError(f"{args.grpc}: {exc.code().name}: {exc.details()}") from None
    if not records:
        raise CLIError("no readable images to score")
    print(f"{len(records)} images, product {args.product} v{records[-1]['version']} (gRPC {args.grpc})")
    if args.json:
        _write_json(args.json, records)
    return 1 if failed else 0


def cmd_predict(args: argparse.Namespace) -> int:
    if args.grpc:
        for option, value in (("--sigmas", args.sigmas), ("--false-alarm-rate", args.false_alarm_rate)):
            if value is not None:
                raise CLIError(
                    f"{option} sets the rule in process; a service judges by the product's rule: "
                    "give --threshold with --grpc to override its verdict"
                )
        for option, value in (("--device", args.device), ("--dtype", args.dtype)):
            if value is not None:
                raise CLIError(f"{option} applies in process; the service's replicas score on their own device")
        return _predict_grpc(args)
    if args.threshold is not None:
        raise CLIError("--threshold overrides the verdict of a service: give it with --grpc")
    if args.wait_s is not None:
        raise CLIError("--wait-s is how long to wait for a service: give it with --grpc")
    from ..data.decode import ImageError, decode_image
    from ..visualize import heatmap_overlay, heatmap_range, save_png

    if args.sigmas is not None:
        check_number("threshold.sigmas", args.sigmas)  # before any work: NaN would pass every image
    from ..tiled import TiledHETMM, load_detector

    overrides = {k: v for k, v in (("device", args.device), ("dtype", args.dtype)) if v}
    det = load_detector(_open(args), args.product, args.version, progress=True, **overrides)
    tiled = isinstance(det, TiledHETMM)
    good: list[tuple[Path, Path, Any]] = []
    failed = 0
    for path, name in _image_paths(args.images):
        try:
            good.append((path, name, decode_image(path)))
        except ImageError as exc:
            print(f"hetmm: skipped: {exc}", file=sys.stderr)
            failed += 1
    if not good:
        raise CLIError("no readable images to score")
    if args.sigmas is not None and args.false_alarm_rate is not None:
        raise CLIError("give --sigmas or --false-alarm-rate, not both")
    try:
        op = det.operating_point(sigmas=args.sigmas, false_alarm_rate=args.false_alarm_rate)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    pred = det.predict(
        [det.input_view(img) for _, _, img in good],
        sigmas=args.sigmas,
        false_alarm_rate=args.false_alarm_rate,
    )
    rule = {} if op is None else {k: v for k, v in op.to_json().items() if k != "threshold"}
    out = Path(args.out) if args.out else None
    records = []
    for i, (path, name, image) in enumerate(good):
        rec = {
            "image": str(path),
            "score": round(float(pred.scores[i]), 6),
            "threshold": round(pred.threshold, 6),
            "is_anomaly": bool(pred.is_anomaly[i]),
            **rule,  # threshold_rule, rule_target, estimated_false_alarm_rate
            "version": pred.version,
        }
        if out is not None:
            target = out / name.parent / f"{name.name}_heatmap.png"
            vmin, vmax = heatmap_range(pred.maps[i], pred.threshold)
            region = None if pred.regions is None else pred.regions[i]  # outside: greyed
            overlay = heatmap_overlay(image, pred.maps[i], vmin=vmin, vmax=vmax, region=region)
            rec["heatmap"] = str(save_png(overlay, target))
        records.append(rec)
        flag = "ANOMALY" if rec["is_anomaly"] else "ok"
        print(f"{rec['score']:.4f}  {flag:<7}  {path}")
    print(f"{len(good)} images, {len(good) / pred.seconds:.2f} images/s, product {args.product} v{pred.version}")
    if tiled:
        print(f"{det.rows} x {det.cols} tiles per frame, {len(good) * det.n_tiles / pred.seconds:.2f} tiles/s")
    print(f"threshold {_describe_operating_point(op)}")
    if args.json:
        _write_json(args.json, records)
    return 1 if failed else 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..evaluation import evaluate

    config = _config_from(args)
    result, det, _ = evaluate(args.data, config, progress=True)
    print(result.table())
    if args.store:
        version = det.save(_open(args), args.product or result.category)
        print(f"published templates as {args.product or result.category} v{version} in {args.store}")
    if args.json:
        _write_json(args.json, result.to_json())
        print(f"written {args.json}")
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    from ..detector import HETMM
    from ..evaluation import load_images

    store = _open(args)
    head = store.head(args.product)
    if store.record(args.product, head).config.geometry.tiled:
        return _update_tiled(args, store, head)
    det = HETMM.load(store, args.product, head, progress=True, steps=_steps(args))
    paths = [p for p, _ in _image_paths(args.images)]
    bb = det.config.backbone
    det.update(load_images(paths, bb.image_size, progress=True, desc="decode", geometry=bb.geometry))
    if det.skipped_duplicates:
        print(f"hetmm: skipped: {det.skipped_duplicates} image(s) already in v{head} (same content)", file=sys.stderr)
    if det.skipped_duplicates == len(paths):
        print(f"product {args.product}: no new images; head stays v{head}")
        return 0
    # expect_head: a concurrent update in between makes this one fail cleanly instead of losing images.
    version = _publish(args, store, det.templates, expect_head=head)
    print(
        f"product {args.product}: version {version} (from v{head}) with "
        f"{len(paths) - det.skipped_duplicates} more good images, "
        f"{det.templates.n_images} in all; threshold {_describe_operating_point(det.operating_point())}"
    )
    return 0


def _update_tiled(args: argparse.Namespace, store: Any, head: int) -> int:
    """``hetmm update`` of a tiled product (``TiledHETMM.update``): frames at their own resolution."""
    from ..tiled import TiledHETMM

    det = TiledHETMM.load(store, args.product, head, progress=True, steps=_steps(args))
    paths = [p for p, _ in _image_paths(args.images)]
    det.update(paths)
    if det.skipped_duplicates:
        print(f"hetmm: skipped: {det.skipped_duplicates} image(s) already in v{head} (same content)", file=sys.stderr)
    if det.skipped_duplicates == len(paths):
        print(f"product {args.product}: no new images; head stays v{head}")
        return 0
    version = _publish(args, store, det.template_set(), expect_head=head)
    print(
        f"product {args.product}: version {version} (from v{head}) with "
        f"{len(paths) - det.skipped_duplicates} more good images, "
        f"{len(det.frame_digests)} in all; {det.n_tiles} tiles; threshold "
        f"{_describe_operating_point(det.operating_point())}"
    )
    return 0


def cmd_compress(args: argparse.Namespace) -> int:
    from ..detector import HETMM

    store = _open(args)
    overrides = {k: v for k, v in (("device", args.device),) if v}
    version = store.head(args.product) if args.version is None else args.version
    if store.record(args.product, version).config.geometry.tiled:
        return _compress_tiled(args, store, version, overrides)
    det = HETMM.load(store, args.product, args.version, progress=True, steps=_steps(args), **overrides)
    start = time.perf_counter()
    det.compress(_template_kind(args.templates), args.sheets, seed=args.seed)
    seconds = time.perf_counter() - start
    version = _publish(args, store, det.templates) if _candidate(args, det.config) else det.save(store, args.product)
    ts = det.templates
    assert ts is not None
    auto = ts.meta.get("sheets_auto")  # present only when this selection measured its K
    if auto:
        print(_ladder_table(auto))
    print(
        f"product {args.product}: version {version} = {ts.config.templates.kind} with {ts.sheets} sheets "
        f"of {ts.n_images} images ({seconds:.1f}s); threshold {_describe_operating_point(det.operating_point())}"
    )
    return 0


def _compress_tiled(args: argparse.Namespace, store: Any, version: int, overrides: dict[str, Any]) -> int:
    """``hetmm compress`` of a tiled product (``TiledHETMM.compress``): a selection per tile position."""
    from ..tiled import TiledHETMM

    det = TiledHETMM.load(store, args.product, version, progress=True, steps=_steps(args), **overrides)
    start = time.perf_counter()
    det.compress(_template_kind(args.templates), args.sheets, seed=args.seed)
    seconds = time.perf_counter() - start
    new = _publish(args, store, det.template_set()) if _candidate(args, det.config) else det.save(store, args.product)
    sets = [d.templates for d in det.dets]
    for p, ts in enumerate(sets):
        auto = ts.meta.get("sheets_auto")  # present only when this position measured its K
        if auto:
            print(f"tile {p}: sheets auto chose K = {auto['chosen']} ({auto['why']})")
    sheets = sorted({ts.sheets for ts in sets})
    held = str(sheets[0]) if len(sheets) == 1 else f"{sheets[0]}-{sheets[-1]}"
    print(
        f"product {args.product}: version {new} = {det.config.templates.kind} with {held} sheets per tile "
        f"({det.n_tiles} tiles) of {len(det.frame_digests)} images ({seconds:.1f}s); threshold "
        f"{_describe_operating_point(det.operating_point())}"
    )
    return 0


def _rule_text(op: Any) -> str:
    """``far 1%``, ``validation``, ``sigmas 3``."""
    if op.target is None:
        return op.rule
    return f"{op.rule} {100 * op.target:g}%" if op.rule == "far" else f"{op.rule} {op.target:g}"


def _short_operating_point(op: Any) -> str:
    """``0.4321 far 1%`` (``hetmm versions``); ``none`` before calibration."""
    return "none" if op is None else f"{op.threshold:.4f} {_rule_text(op)}"


def _describe_operating_point(op: Any) -> str:
    """``0.4321 (rule far 1%, estimated false alarms 1.00%)``; ``none`` before calibration."""
    if op is None:
        return "none (not calibrated)"
    text = f"{op.threshold:.4f} (rule {_rule_text(op)}, estimated false alarms {100 * op.false_alarm_rate:.2f}%)"
    warning = op.warning()  # a threshold far above every good score: say so where it is shown
    return text if warning is None else f"{text}\nwarning: {warning}"


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..data.decode import decode_image
    from ..data.labelled import labelled_images
    from ..evaluation import load_images
    from ..validation import calibrate_with_labels

    store = _open(args)
    head = store.head(args.product)
    version = head if args.version is None else args.version
    if sum((args.val is not None, bool(args.val_store), args.far is not None)) != 1:
        raise CLIError("give one of --val DIR, --val-store or --far RATE")
    if args.far is not None:
        return _calibrate_far(args, store, head, version)
    from ..tiled import TiledHETMM, load_detector

    det = load_detector(store, args.product, version, progress=True)
    tiled = isinstance(det, TiledHETMM)
    if args.val_store:  # the labels taught in the console (store/labels.py), beside the product's versions
        from ..store.labels import LabelSet

        stored = LabelSet(store.backend).labelled(args.product)
        labelled = [(name, label) for name, _, label in stored]
        images = [decode_image(data, source=name) for name, data, _ in stored]
    else:
        labelled = labelled_images(args.val)
        bb = det.config.backbone
        if tiled:  # frames at their own resolution: the tiles are cut from them
            images = [decode_image(p) for p, _ in labelled]
        else:
            images = load_images(
                [p for p, _ in labelled], bb.image_size, progress=True, desc="decode", geometry=bb.geometry
            )
    try:
        ts, record = calibrate_with_labels(
            det,
            images,
            [v for _, v in labelled],
            objective=args.objective,
            max_false_alarm_rate=args.max_false_alarm_rate,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    new = _publish(args, store, ts, expect_head=head)
    print(
        f"product {args.product}: version {new} (from v{version}) threshold {record['threshold']:.4f} "
        f"for {record['objective']} on {record['good']} good + {record['defective']} defective images: "
        f"recall {100 * record['recall']:.1f}%, false alarms {100 * record['false_alarm_rate']:.1f}%, "
        f"F1 {100 * record['f1']:.1f}; estimated false alarms on good parts "
        f"{100 * record['estimated_false_alarm_rate']:.2f}% (out-of-fold)"
    )
    return 0


def _calibrate_far(args: argparse.Namespace, store: Any, head: int, version: int) -> int:
    """``hetmm calibrate --far RATE``: the far rule at ``RATE`` as a new version of the head's templates
    and out-of-fold scores, nothing recomputed (``VersionedStore.republish``, as the service's
    ``POST .../calibrate {"rule": "far"}``). A tiled product keeps its tile scales: its frame threshold
    moves, its scores stay (hetmm_ray/tiled.py)."""
    if version != head:
        raise CLIError(f"--far sets the rule of the head, v{head}: drop --version {version}")
    rec = store.record(args.product, head)
    config = rec.under_far_rule(args.far)  # TemplateError without out-of-fold scores, ConfigError out of range
    candidate = _candidate(args, rec.config)
    new = int(store.republish(args.product, config=config, expect_head=head, candidate=candidate))
    if candidate:
        _announce_candidate(args, store, new)
    op = store.record(args.product, new).operating_point()
    print(f"product {args.product}: version {new} (from v{head}) threshold {_describe_operating_point(op)}")
    return 0


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


def cmd_region(args: argparse.Namespace) -> int:
    """A new version of a stored product with another inspection region, recalibrated.

    The templates (bank and selection) are kept: a region changes which map pixels count, not
    the features. The out-of-fold calibration is recomputed under the new region, so the
    threshold follows it. A product on the ``validation`` rule is refused: its labelled
    threshold was chosen under the old region (run ``hetmm calibrate`` again afterwards).
    """
    from dataclasses import replace

    from ..data.region_file import read_region
    from ..detector import HETMM
    from ..fitting import check_visible

    region = read_region(args.region)  # a bad file fails before any loading
    store = _open(args)
    head = store.head(args.product)
    version = head if args.version is None else args.version
    if store.record(args.product, version).config.geometry.tiled:
        return _region_tiled(args, store, head, version, region)
    det = HETMM.load(store, args.product, version, progress=True)
    ts = det.templates
    assert ts is not None
    if ts.config.threshold.rule == "validation":
        raise CLIError(
            f"product {args.product!r} uses the validation threshold rule, chosen on labelled images under its "
            "old region: refit or change its rule first"
        )
    before = det.operating_point()
    config = replace(ts.config, region=region)
    check_visible(config)
    new_ts = det.calibrated(replace(ts, config=config))
    new = _publish(args, store, new_ts, expect_head=head)
    after = HETMM.load(store, args.product, new).operating_point()
    print(
        f"product {args.product}: version {new} (from v{version}) region {_describe_region(region)}; threshold "
        f"{_describe_operating_point(before)} -> {_describe_operating_point(after)}"
    )
    return 0


def _region_tiled(args: argparse.Namespace, store: Any, head: int, version: int, region: Any) -> int:
    """``hetmm region`` of a tiled product (``TiledHETMM.with_region``): every position recalibrated."""
    from ..tiled import TiledHETMM

    det = TiledHETMM.load(store, args.product, version, progress=True)
    if det.config.threshold.rule == "validation":
        raise CLIError(
            f"product {args.product!r} uses the validation threshold rule, chosen on labelled images under its "
            "old region: refit or change its rule first"
        )
    before = det.operating_point()
    new_det = det.with_region(region)
    new = _publish(args, store, new_det.template_set(), expect_head=head)
    print(
        f"product {args.product}: version {new} (from v{version}) region {_describe_region(region)}; threshold "
        f"{_describe_operating_point(before)} -> {_describe_operating_point(new_det.operating_point())}"
    )
    return 0


def _candidate(args: argparse.Namespace, config: Any) -> bool:
    """Whether this command publishes a candidate (issue 23): ``--candidate`` / ``--live`` if given,
    else the product's ``publish`` setting, else ``live`` (the default of ``hetmm`` on one machine)."""
    chosen = getattr(args, "publish", None) or config.publish or "live"
    return chosen == "candidate"


def _publish(args: argparse.Namespace, store: Any, ts: Any, *, expect_head: int | None = None) -> int:
    """Store ``ts`` as the product's next version: HEAD (``live``) or a candidate beside it
    (:func:`_candidate`); a candidate is announced on stderr with how to compare and promote it."""
    if not _candidate(args, ts.config):
        return int(store.put(args.product, ts, expect_head=expect_head))
    version = int(store.put(args.product, ts, expect_head=expect_head, candidate=True))
    _announce_candidate(args, store, version)
    return version


def _announce_candidate(args: argparse.Namespace, store: Any, version: int) -> None:
    """On stderr: ``version`` is a candidate, and how to compare and promote it."""
    head = store.head(args.product)
    if head != version:  # a product's first version is always head
        print(
            f"hetmm: v{version} is a candidate; HEAD stays v{head} (hetmm compare / promote / discard "
            f"{args.product} {version})",
            file=sys.stderr,
        )


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
    from ..distributed.runtime import connect
    from ..distributed.steps import ray_steps

    connect(args.address)
    return ray_steps()


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from ..distributed.runtime import ray_reachable
    from ..serve.app import DEPLOY_YAML
    from ..serve.run import leave_ray, start_service, stop_service

    # Stop signals are taken from the start: a Ctrl-C while Ray and Serve start is acted on once they are
    # up, with the same clean stop (before, it broke off the start wherever it fell); a second one while
    # starting gives up at once. ray.init sets a SIGTERM handler of Ray's own (it stops Ray's processes
    # and exits 1), so SIGTERM is ours again once the service is up.
    stop, started = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if not started.is_set():
            if stop.is_set():
                raise KeyboardInterrupt  # main(): "hetmm: interrupted", exit 130
            print("hetmm: stop asked while starting: stopping once the service is up (again: at once)", flush=True)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        running = start_service(
            config_path=args.serve_config or DEPLOY_YAML,
            store=args.store,
            host=args.host,
            port=args.port,
            address=args.address,
            grpc_port=args.grpc_port,
        )
    except BaseException:  # refused or interrupted: the caller's handlers back (tests call main())
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    started.set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    print(f"hetmm: detector per application: {running.detector}", flush=True)
    if running.grpc_target:
        print(f"hetmm: gRPC hetmm.v1.Inspection on {running.grpc_target}", flush=True)
    print(f"hetmm: serving {running.url} (store {running.store}), console {running.url}/ui/; Ctrl-C stops", flush=True)
    stop.wait()
    print("hetmm: stopping (in-flight requests finish first)", flush=True)
    # Drained in a thread while this one watches Ray: a stop signal sent to the whole process group
    # (systemd's default KillMode, `timeout`, `kill -- -PGID`) stops Ray's own processes too, and every
    # call into a Ray whose GCS is gone waits about 60 s before it fails.
    drained, failed = threading.Event(), []

    def drain() -> None:
        try:
            stop_service(running)
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the command's thread
            failed.append(exc)
        finally:
            drained.set()

    threading.Thread(target=drain, name="hetmm-drain", daemon=True).start()
    while not drained.wait(0.5):
        if not ray_reachable():
            print(
                "hetmm: Ray's own processes were stopped by the same signal, so in-flight requests were not "
                "drained (send it to this process only: systemd KillMode=mixed); exiting",
                flush=True,
            )
            os._exit(1)  # no atexit: Ray's would wait for the GCS that is gone
    if failed:
        raise failed[0]
    leave_ray()
    print("hetmm: stopped", flush=True)
    return 0


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


def cmd_versions(args: argparse.Namespace) -> int:
    store = _open(args)
    if args.product is None:
        products = store.products()
        for name in products:
            cands = store.candidates(name)
            print(
                f"{name}  head v{store.head(name)}  versions {store.versions(name)}"
                + (f"  candidates {cands}" if cands else "")
            )
        if not products:
            print(f"no products in {args.store}")
        return 0
    if args.keep is not None:
        dropped = store.retain(args.product, args.keep)
        print(f"retention: deleted versions {dropped or 'none'} (kept the newest {args.keep} and the head)")
    head = store.head(args.product)
    rows, auto_seen = [], False
    for v in store.versions(args.product):
        rec = store.record(args.product, v)
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.created))
        sheets: int | str = rec.sheets  # held, not configured
        if rec.sheets_auto:
            sheets, auto_seen = f"{sheets}a", True  # chosen by sheets: auto
        mark = "*" if v == head else " "
        threshold = _short_operating_point(rec.operating_point())
        rows.append(
            f"{mark}{v:>6}  {rec.parent or '-':>6}  {rec.images:>6}  {sheets:>6}  {threshold:<18}  {created}  "
            f"{rec.weights_id}"
        )
    if auto_seen:
        print("(sheets 'Ka': K chosen by sheets: auto, the smallest K whose verdicts match ALL's)")
    header = f"{'version':>7}  {'parent':>6}  {'images':>6}  {'sheets':>6}  {'threshold (rule)':<18}"
    print(f"{header}  created              weights")
    print("\n".join(rows))
    cands = store.candidates(args.product)
    if cands:  # issue 23: stored beside the head, not served until promoted
        described = ", ".join(f"v{v} (over v{store.record(args.product, v).parent})" for v in cands)
        print(f"candidates: {described}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CLIError(f"deleting {args.product!r} removes every version from {args.store}: add --yes to confirm")
    _open(args).delete_product(args.product)
    print(f"product {args.product} deleted from {args.store}")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    done = _open(args).repair(args.product)
    swept = f"; removed {len(done['swept'])} stale temporary file(s)" if done["swept"] else ""
    if done["rebuilt"]:
        print(f"product {args.product}: HEAD rebuilt at v{done['version']} (versions {done['history']}){swept}")
    else:
        print(f"product {args.product}: HEAD is sound (v{done['version']}), left alone{swept}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Republish format-1 heads in the per-layer layout (store/layout.py) as new versions."""
    store = _open(args)
    for product in [args.product] if args.product else store.products():
        done = store.migrate(product)
        if done["migrated"]:
            print(f"product {product}: v{done['from_version']} republished as v{done['version']} (per-layer layout)")
        else:
            print(f"product {product}: v{done['version']} already has the per-layer layout, left alone")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    store = _open(args)
    store.rollback(args.product, args.version)
    print(f"product {args.product}: head is now v{args.version}")
    return 0


# --- candidates and compare (issue 23) ----------------------------------------------------------
def cmd_promote(args: argparse.Namespace) -> int:
    store = _open(args)
    old = store.head(args.product)
    store.promote(args.product, args.version, expect_head=args.expect_head)
    print(f"product {args.product}: head is now v{args.version} (was v{old}; promoted, recorded)")
    return 0


def cmd_discard(args: argparse.Namespace) -> int:
    store = _open(args)
    store.discard(args.product, args.version)
    print(f"product {args.product}: candidate v{args.version} discarded; head stays v{store.head(args.product)}")
    return 0


def _compare_images(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], list[int] | None]:
    """The images ``hetmm compare`` scores: files / folders / ``s3://`` prefixes, or ``--labelled``."""
    from ..data.decode import decode_image
    from ..data.labelled import labelled_images
    from ..data.sources import read_image_source

    if args.since is not None or args.until is not None:  # the product's inspection record
        from ..compare import parse_time, record_images

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
        found = labelled_images(args.labelled)
        return [(str(p), decode_image(p)) for p, _ in found], [int(v) for _, v in found]
    out: list[tuple[str, Any]] = []
    local = [item for item in args.images if not item.startswith("s3://")]
    for item in args.images:
        if item.startswith("s3://"):
            for name, data in read_image_source(item, max_images=args.max_images):
                out.append((f"{item.rstrip('/')}/{name}", decode_image(data, source=name)))
    out.extend((str(path), decode_image(path)) for path, _ in (_image_paths(local) if local else []))
    return out, None


def cmd_compare(args: argparse.Namespace) -> int:
    """HEAD (or ``--base``) and a candidate side by side (compare.py); flips' heat-maps to ``--out``."""
    from ..compare import compare_versions

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
        verdict = "ok -> ANOMALY" if fc["is_anomaly"] else "ANOMALY -> ok"
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


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(Path(args.out), config=_config_from(args), n_train=args.train_images, port=args.port, address=args.address)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """``hetmm inspect``: an archive scored by a Ray Data job into Parquet (hetmm_ray/archive/)."""
    from ..archive import JobOptions, inspect_archive

    concurrency = None
    if args.concurrency:
        lo, _, hi = args.concurrency.partition(",")
        try:
            concurrency = (int(lo), int(hi or lo))
        except ValueError:
            raise CLIError(f"--concurrency {args.concurrency!r}: expected MIN,MAX or N") from None
    if args.sigmas is not None and args.false_alarm_rate is not None:
        raise CLIError("give --sigmas or --false-alarm-rate, not both")
    source = _inspect_source(args.source, args)
    opts = JobOptions(
        store=args.store,
        endpoint_url=args.endpoint_url,
        address=args.address,
        concurrency=concurrency,
        actor_cpus=args.actor_cpus,
        actor_threads=args.actor_threads,
        actor_gpus=args.actor_gpus,
        batch_size=args.batch_size,
        block_size=args.block_size,
        device=args.device,
        dtype=args.dtype,
        sigmas=args.sigmas,
        false_alarm_rate=args.false_alarm_rate,
    )
    report = inspect_archive(source, args.product, args.out, opts, version=args.version, heatmaps=args.heatmaps)
    print(report.summary())
    return 0


def _inspect_source(source: str | None, args: argparse.Namespace) -> Any:
    """SOURCE, or the product's inspection record over ``--since``/``--until`` (archive.RecordSource)."""
    from ..archive import RecordSource

    ranged = args.since is not None or args.until is not None
    if ranged == (source is not None):
        raise CLIError("give SOURCE, or --since/--until for the product's inspection record (not both)")
    if not ranged:
        return source
    from ..compare import parse_time

    try:
        since, until = (None if t is None else parse_time(t) for t in (args.since, args.until))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return RecordSource(args.store, args.product, since, until)


def _open(args: argparse.Namespace) -> Any:
    from ..store import open_store

    return open_store(args.store, endpoint_url=getattr(args, "endpoint_url", None))


def _add_address_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--address",
        metavar="ADDR",
        help=f"Ray cluster to {what} (auto, host:port or ray://host:port; default: RAY_ADDRESS, else local)",
    )


def _add_publish_flags(p: argparse.ArgumentParser) -> None:
    """``--candidate`` / ``--live`` (issue 23): override the product's ``publish`` setting."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--candidate",
        dest="publish",
        action="store_const",
        const="candidate",
        help="publish as a candidate beside the head (hetmm compare / promote / discard)",
    )
    group.add_argument("--live", dest="publish", action="store_const", const="live", help="publish as the head")


def _add_store_flags(p: argparse.ArgumentParser, *, default: str | None = DEFAULT_STORE) -> None:
    where = f"(default ./{default})" if default else "(publish the fitted templates there)"
    p.add_argument(
        "--store", default=default, metavar="URI", help=f"template store: a folder or s3://bucket/prefix {where}"
    )
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph); default: boto3's standard chain")


# --- entry point -----------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetmm", description="Training-free industrial anomaly detection (HETMM).")
    parser.add_argument("--version", action="version", version=f"hetmm-ray {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("fit", help="build a product's templates from good images and store them")
    p.add_argument("images", nargs="+", help="good images or folders of them")
    p.add_argument("--product", required=True, help="product name")
    _add_store_flags(p)
    _add_config_flags(p)
    _add_address_flag(p, "extract features and run PTS on")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("predict", help="score images against a stored product; write heat-maps")
    p.add_argument("images", nargs="+", help="images or folders of them")
    p.add_argument("--product", required=True)
    _add_store_flags(p)
    p.add_argument(
        "--version",
        type=int,
        help="template version (default: head); with --grpc the version the service's head must be (a service "
        "scores with its head: another is refused, version_moved)",
    )
    p.add_argument("--out", help="folder for heat-map overlay PNGs")
    p.add_argument("--json", help="write results as JSON here")
    p.add_argument("--sigmas", type=float, help="threshold = mean + SIGMAS * std of good scores (default from config)")
    p.add_argument(
        "--false-alarm-rate",
        type=float,
        metavar="RATE",
        help="threshold at this estimated share of good parts flagged, e.g. 0.01 (default: the product's rule)",
    )
    p.add_argument("--device")
    p.add_argument("--dtype", choices=DTYPES)
    p.add_argument(
        "--grpc", metavar="HOST:PORT", help="score on a service's gRPC endpoint (hetmm.v1.Inspection), not in process"
    )
    p.add_argument("--threshold", type=float, help="with --grpc: the verdict at this threshold (admin token)")
    p.add_argument(
        "--wait-s",
        type=float,
        metavar="S",
        help=f"with --grpc: send a call refused UNAVAILABLE (service starting) again for up to S seconds "
        f"(default {GRPC_CLIENT_WAIT_S:g}; 0: once)",
    )
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "inspect", help="score an archive (folder, glob, s3:// prefix, URI list) into Parquet with Ray Data"
    )
    p.add_argument(
        "source",
        nargs="?",
        help="a folder, a glob, an s3:// prefix, or a .txt/.parquet list of URIs (or --since/--until)",
    )
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, help="template version (default: head at the start)")
    p.add_argument("--since", help="instead of SOURCE: the images the product's inspection record kept from this time")
    p.add_argument("--until", help="instead of SOURCE: ... up to this time (excluded; unix seconds or ISO 8601, UTC)")
    p.add_argument("--out", required=True, metavar="DEST", help="folder or s3:// prefix for the Parquet parts")
    p.add_argument("--heatmaps", action="store_true", help="also write heat-map PNGs to DEST/heatmaps/")
    p.add_argument("--concurrency", metavar="MIN,MAX", help="detector actors (default 1 to what the cluster holds)")
    p.add_argument(
        "--actor-cpus", type=float, default=ACTOR_CPUS, help=f"CPUs per detector actor (default {ACTOR_CPUS:g})"
    )
    p.add_argument(
        "--actor-threads",
        type=int,
        default=ACTOR_THREADS,
        help="torch threads per detector actor (default: its node's CPUs shared by the actors placed there)",
    )
    p.add_argument("--actor-gpus", type=float, help="GPUs per detector actor (default 1 where the cluster has GPUs)")
    p.add_argument("--batch-size", type=int, default=SCORE_BATCH, help=f"images per actor call (default {SCORE_BATCH})")
    p.add_argument(
        "--block-size", type=int, default=BLOCK_IMAGES, help=f"images per Parquet part (default {BLOCK_IMAGES})"
    )
    p.add_argument("--sigmas", type=float, help="threshold = mean + SIGMAS * std of good scores")
    p.add_argument("--false-alarm-rate", type=float, metavar="RATE", help="threshold at this estimated share")
    p.add_argument("--device")
    p.add_argument("--dtype", choices=DTYPES)
    _add_store_flags(p)
    _add_address_flag(p, "run on")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("evaluate", help="fit on train/good of an MVTec-layout folder and measure on test/")
    p.add_argument("--data", required=True, help="category folder (train/good, test/<type>, ground_truth/<type>)")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--product", help="product name when publishing with --store (default: the folder name)")
    _add_store_flags(p, default=None)
    _add_config_flags(p)
    p.set_defaults(func=cmd_evaluate)

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

    p = sub.add_parser("update", help="hot update: add good images to a stored product (new version)")
    p.add_argument("images", nargs="+", help="good images or folders of them")
    p.add_argument("--product", required=True)
    _add_store_flags(p)
    _add_address_flag(p, "extract features and run PTS on")
    _add_publish_flags(p)
    p.set_defaults(func=cmd_update)

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

    p = sub.add_parser("versions", help="list products, or the kept versions of one product (* = head)")
    p.add_argument("--product", help="product name (default: list all products)")
    p.add_argument(
        "--keep", type=int, metavar="N", help="retention: delete all but the newest N versions (never the head)"
    )
    _add_store_flags(p)
    p.set_defaults(func=cmd_versions)

    p = sub.add_parser("delete", help="delete a product and all its versions from the store")
    p.add_argument("--product", required=True)
    p.add_argument("--yes", action="store_true", help="confirm")
    _add_store_flags(p)
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser("rollback", help="make a kept older version the head")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, required=True)
    _add_store_flags(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("promote", help="make a candidate version the head (a recorded move)")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, required=True, help="the candidate")
    p.add_argument("--expect-head", type=int, metavar="V", help="refuse unless the head is still V (what you compared)")
    _add_store_flags(p)
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("discard", help="drop a candidate version (the head does not move)")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, required=True, help="the candidate")
    _add_store_flags(p)
    p.set_defaults(func=cmd_discard)

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

    p = sub.add_parser("repair", help="rebuild a garbage or missing HEAD from the newest version that loads")
    p.add_argument("--product", required=True)
    _add_store_flags(p)
    p.set_defaults(func=cmd_repair)

    p = sub.add_parser("migrate", help="republish old-layout heads so one layer reads without the others")
    p.add_argument("--product", help="one product (default: every product in the store)")
    _add_store_flags(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("serve", help="run the HTTP service (deploy.yaml's application) until Ctrl-C")
    p.add_argument("--serve-config", metavar="FILE", help="Serve config file (default: the repository's deploy.yaml)")
    p.add_argument("--store", metavar="URI", help="template store (default: deploy.yaml's args.store)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need an admin token)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, help="also serve hetmm.v1.Inspection over gRPC on this port (e.g. 9000)")
    _add_address_flag(p, "run on")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="the service end to end on a generated product: create, predict, hot update")
    p.add_argument("--out", default="out/demo", help="output folder (default out/demo)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000, another free one if taken)")
    _add_address_flag(p, "run on")
    p.add_argument("--train-images", type=int, default=30, help="generated good images to fit on")
    _add_config_flags(p, templates=False)
    p.set_defaults(func=cmd_demo)
    return parser


def error_line(exc: BaseException) -> str:
    """The one line ``hetmm: error: ...`` says for ``exc``: a project error (``hetmm_ray/errors.py``,
    the table HTTP maps too) or an OS error says its own message; anything else is unexpected."""
    known = describe(exc)
    if known is not None:
        return known[2]
    if isinstance(exc, OSError):  # a local file the user named: their message is the useful one
        msg = str(exc)
        return msg.splitlines()[0] if msg else type(exc).__name__
    return f"unexpected {type(exc).__name__}: {exc} (run with --debug for a traceback)".splitlines()[0]


EXIT_READER_GONE = 141  # 128 + SIGPIPE: what a Unix tool's exit status is when its reader goes


def _reader_gone() -> bool:
    """Whether standard output's reader has gone (``hetmm versions | head``). If so, standard output
    is pointed at /dev/null, so that Python's own flush at exit does not report the pipe again."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return gone


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is seen below
    except KeyboardInterrupt:
        print("hetmm: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _reader_gone():
            return EXIT_READER_GONE  # quietly, as Unix tools stop when their reader does
        if args.debug:
            raise
        print(f"hetmm: error: {error_line(exc)}", file=sys.stderr)
        return 2
    if args.debug:
        print(f"hetmm: {args.command} took {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return code
