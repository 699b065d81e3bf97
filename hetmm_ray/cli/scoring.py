"""``hetmm predict``, ``evaluate`` and ``inspect``: images scored against a stored product in this
process (or, ``predict --grpc``, by a service: cli/service.py), an MVTec-layout folder fitted and
measured, and an archive scored by a Ray Data job into Parquet (hetmm_ray/archive/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import DTYPES, GRPC_CLIENT_WAIT_S, STREAM_FRAMES, check_number
from ..config.archive import ACTOR_CPUS, ACTOR_THREADS, BLOCK_IMAGES, SCORE_BATCH
from .common import (
    CLIError,
    Subcommands,
    _add_address_flag,
    _add_config_flags,
    _add_store_flags,
    _config_from,
    _describe_operating_point,
    _image_paths,
    _inspect_source,
    _open,
    _write_json,
)
from .service import _predict_grpc

if TYPE_CHECKING:
    from ..store import Store


# --- predict ---------------------------------------------------------------------------
def add_predict(sub: Subcommands) -> None:
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
    from ..visualize import draw_overlay, save_png

    if args.sigmas is not None:
        check_number("threshold.sigmas", args.sigmas)  # before any work: NaN would pass every image
    from ..detection.detector_choice import load_detector
    from ..detection.interface import frame_grid, stream_chunk, tiles_per_frame
    from ..result import result_records, review_threshold_of

    overrides = {k: v for k, v in (("device", args.device), ("dtype", args.dtype)) if v}
    det = load_detector(_open(args), args.product, args.version, progress=True, **overrides)
    if args.sigmas is not None and args.false_alarm_rate is not None:
        raise CLIError("give --sigmas or --false-alarm-rate, not both")
    try:
        op = det.operating_point(sigmas=args.sigmas, false_alarm_rate=args.false_alarm_rate)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    review = review_threshold_of(det)  # the product's review band, as the service's
    out = Path(args.out) if args.out else None
    records: list[dict[str, Any]] = []
    failed = scored = 0
    seconds = 0.0
    version = None
    # Streamed: STREAM_FRAMES readable frames decoded, scored and written at a time (a
    # multiple of what predict batches: the scores one call on all of them gives); no list of frames
    # or maps is held.
    chunk = stream_chunk(det.config, STREAM_FRAMES)

    def score(good: list[tuple[Path, Path, Any]]) -> None:
        nonlocal seconds, scored, version
        pred = det.predict(
            [det.input_view(img) for _, _, img in good],
            sigmas=args.sigmas,
            false_alarm_rate=args.false_alarm_rate,
        )
        seconds += pred.seconds
        scored += len(good)
        version = pred.version
        results = result_records(pred, review_threshold=review)  # the one result record (hetmm_ray/result.py)
        for i, (path, name, image) in enumerate(good):
            rec: dict[str, Any] = {"image": str(path), **results[i]}
            if out is not None:
                target = out / name.parent / f"{name.name}_heatmap.png"
                region = None if pred.regions is None else pred.regions[i]  # outside: greyed
                overlay = draw_overlay(image, pred.maps[i], threshold=pred.threshold, region=region)
                rec["heatmap"] = str(save_png(overlay, target))
            records.append(rec)
            print(f"{rec['score']:.4f}  {rec['verdict']:<7}  {path}")

    pending: list[tuple[Path, Path, Any]] = []  # decoded frames, scored a full chunk at a time
    for path, name in _image_paths(args.images):
        try:
            pending.append((path, name, decode_image(path)))
        except ImageError as exc:
            print(f"hetmm: skipped: {exc}", file=sys.stderr)
            failed += 1
        if len(pending) == chunk:
            score(pending)
            pending = []
    if pending:
        score(pending)
    if not scored:
        raise CLIError("no readable images to score")
    print(f"{scored} images, {scored / seconds:.2f} images/s, product {args.product} v{version}")
    tiles = tiles_per_frame(det.config)
    if tiles > 1:
        rows, cols = frame_grid(det.config)
        print(f"{rows} x {cols} tiles per frame, {scored * tiles / seconds:.2f} tiles/s")
    print(f"threshold {_describe_operating_point(op)}")
    if args.json:
        _write_json(args.json, records)
    return 1 if failed else 0


# --- evaluate --------------------------------------------------------------------------
def add_evaluate(sub: Subcommands) -> None:
    p = sub.add_parser("evaluate", help="fit on train/good of an MVTec-layout folder and measure on test/")
    p.add_argument("--data", required=True, help="category folder (train/good, test/<type>, ground_truth/<type>)")
    p.add_argument("--json", help="write the results as JSON here, with one row per test image")
    p.add_argument(
        "--report",
        metavar="DIR",
        help="write an HTML report here (DIR/index.html): operating point, score histogram, ROC and PRO "
        "curves, and a gallery of the false alarms, misses and frames nearest the threshold",
    )
    p.add_argument("--product", help="product name when publishing with --store (default: the folder name)")
    _add_store_flags(p, default=None)
    _add_config_flags(p)
    p.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..workflows.evaluation import evaluate

    config = _config_from(args)
    collector = None
    if args.report:
        from ..report.collect import ReportCollector

        try:  # before minutes of fitting: a folder that cannot be made fails now
            Path(args.report).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CLIError(f"--report {args.report}: cannot create the folder ({exc})") from None
        collector = ReportCollector(args.report)
    result, det, _ = evaluate(
        args.data, config, progress=True, report=collector, announce=lambda line: print(line, flush=True)
    )
    print(result.table())
    if collector is not None:
        from ..report.page import write_report

        cal = det.calibration
        index = write_report(args.report, result, collector, train_scores=cal.scores if cal else ())
        print(f"written {index}")
    unstored = None
    if args.store:
        store = _open(args)
        product = args.product or result.category
        version = det.save(store, product)
        print(f"published templates as {product} v{version} in {args.store}")
        if collector is not None:  # the report, as the product's latest (store/reports.py)
            unstored = _store_report(store, product, version, args.report)
    if args.json:
        _write_json(args.json, result.to_json())
        print(f"written {args.json}")
    if unstored is not None:
        raise CLIError(f"published v{version}, but the report was not stored: {unstored}")
    return 0


def _store_report(store: Store, product: str, version: int, directory: str) -> str | None:
    """Store the report in ``directory`` as ``product``'s latest, tagged ``version``; None once stored,
    else why not (a store error: the templates are published either way)."""
    from ..store import StoreError
    from ..store.reports import collect_report

    try:
        files, left_out = collect_report(directory)
        record = store.put_report(product, files, version=version)
    except StoreError as exc:
        return str(exc)
    print(f"stored the report as {product}'s latest (v{version}, {len(files)} files, {record.size} bytes)")
    for ref in left_out:
        print(
            f"hetmm: the stored report leaves out {ref!r} (a report holds only its own .html/.png files)",
            file=sys.stderr,
        )
    return None


# --- inspect ---------------------------------------------------------------------------
def add_inspect(sub: Subcommands) -> None:
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
