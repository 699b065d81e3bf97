"""Real slow change through the service's drift alarms: ``bsd_pitting`` in capture-time order (issue 23).

The frames' names carry their capture time (``01_<yymmddhhmmss>_...``; ../shared/data/README.md).
Over the whole range (28 Aug to 7 Sep 2020, every frame of train/ and test/):

1. the good frames captured in the first ``--split`` (60 %) of the time range are the templates: a
   product fitted in process with the product defaults (``DetectorConfig()``: efficientnet_lite0,
   256 canvas, letterbox, sheets ALL, tiles 1 x 1, far rule at 1 %) and saved to a local store;
2. the service is started on that store with the inspection record on, and every later frame (good
   and pitted) is sent in capture order, one ``POST /v1/products/{p}/predict`` at a time;
3. after every ``--every`` frames, ``GET /v1/products/{p}/drift`` is read once the drift monitor
   has seen them all (its longest window's parts equal the frames sent): one chart point per read,
   placed at the capture time of the last frame sent (the service's own clock would squeeze eleven
   days into the minutes the stream takes).

Printed: the state of each window over capture time, and per capture day the frames, the pitted
ones, the flagged share and the good frames' score quantiles against the out-of-fold ones. Saved:
the chart (PNG, drawn with Pillow: flagged share per window with the expected band, and the passed
parts' score quantiles against the out-of-fold quantiles) and the raw points and frames (JSON, ``--json``).

    python benchmarks/drift_bsd.py --png out/drift-bsd.png    # the product defaults (256 canvas)
    python benchmarks/drift_bsd.py --size 128 --oof-images 200 --png docs/figures/drift-bsd-2026-11-27.png
                                                       # the committed chart (a loaded 2-core machine)
    python benchmarks/drift_bsd.py --tiny            # 40 templates, 60 later frames, 128 canvas
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, start_service_retrying, table

from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.drift import QUANTILES, binomial_band
from hetmm_ray.detector import HETMM
from hetmm_ray.store import open_store

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bsd_pitting"
PRODUCT = "bsd"
FOLDERS = (("train/good", "good"), ("test/good", "good"), ("test/pitting", "pitting"))


def capture_time(path: Path) -> datetime:
    """``01_<yymmddhhmmss>_<position>_<angle>_crop_<n>.jpg`` -> the capture time (naive, as named)."""
    return datetime.strptime(path.name.split("_")[1], "%y%m%d%H%M%S")


def frames(root: Path) -> list[tuple[datetime, str, Path]]:
    """Every frame as (capture time, label, path), in capture order (ties by name)."""
    out = [(capture_time(p), label, p) for folder, label in FOLDERS for p in sorted((root / folder).glob("*.jpg"))]
    return sorted(out, key=lambda f: (f[0], f[2].name))


def wait_drift(c: httpx.Client, sent: int, timeout: float = 300.0) -> dict:
    """The drift body once the monitor has seen ``sent`` parts (its longest parts window holds them all)."""
    deadline = time.monotonic() + timeout
    while True:
        body = c.get(f"/v1/products/{PRODUCT}/drift", params={"hours": 24}).json()
        live = body.get("live")
        seen = max((w["parts"] for w in live["windows"].values()), default=0) if live else 0
        if seen >= sent or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


# --- the chart (Pillow: matplotlib is not a dependency) ---------------------------------------------
W, H, LEFT, RIGHT, TOP = 1100, 760, 80, 190, 40
PANEL_H, GAP = 280, 90
COLOURS = {"200": (31, 119, 180), "2000": (214, 39, 40), "3600s": (44, 160, 44)}
STATE_COLOURS = {"ok": (200, 230, 200), "defects": (255, 200, 120), "drift": (230, 110, 110)}


def _axes(d: ImageDraw.ImageDraw, top: int, lo: float, hi: float, t0: float, t1: float, title: str, fmt: str):
    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return top + PANEL_H - (v - lo) / (hi - lo) * PANEL_H

    d.rectangle([LEFT, top, W - RIGHT, top + PANEL_H], outline=(0, 0, 0))
    d.text((LEFT, top - 18), title, fill=(0, 0, 0))
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        d.line([LEFT - 4, y(v), LEFT, y(v)], fill=(0, 0, 0))
        d.line([LEFT, y(v), W - RIGHT, y(v)], fill=(235, 235, 235))
        d.text((8, y(v) - 6), fmt.format(v), fill=(0, 0, 0))
    day = 86400.0
    t = (t0 // day + 1) * day
    while t < t1:
        d.line([x(t), top, x(t), top + PANEL_H], fill=(225, 225, 225))
        d.text((x(t) - 14, top + PANEL_H + 4), datetime.fromtimestamp(t, UTC).strftime("%d %b"), fill=(0, 0, 0))
        t += day
    return x, y


def draw_chart(
    points: list[dict], reference: list[float], expected: float, alpha: float, png: Path, title: str
) -> None:
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    d.text((LEFT, 8), title, fill=(0, 0, 0))
    t0, t1 = points[0]["capture"], points[-1]["capture"]
    t0 -= 0.02 * (t1 - t0)
    names = list(points[0]["windows"])
    top1 = TOP + 20
    shares = [w["flagged_share"] or 0.0 for p in points for w in p["windows"].values()]
    hi = max(0.05, *shares, *(p["pitted_share_200"] for p in points)) * 1.1
    x, y = _axes(d, top1, 0.0, hi, t0, t1, "flagged share per window (band: expected, 200-part window)", "{:.2f}")
    band = [(p["capture"], binomial_band(p["windows"]["200"]["parts"], expected, alpha)) for p in points]
    poly = [(x(t), y(min(b[1], hi))) for t, b in band] + [(x(t), y(b[0])) for t, b in reversed(band)]
    d.polygon(poly, fill=(225, 225, 245))
    d.line([x(t0), y(expected), x(t1), y(expected)], fill=(90, 90, 90), width=1)
    for name in names:
        xy = [(x(p["capture"]), y(p["windows"][name]["flagged_share"] or 0.0)) for p in points]
        d.line(xy, fill=COLOURS.get(name, (0, 0, 0)), width=2)
    pitted = [(x(p["capture"]), y(p["pitted_share_200"])) for p in points]
    for px, py in pitted:
        d.ellipse([px - 2, py - 2, px + 2, py + 2], outline=(120, 120, 120))
    # states: one strip per window under the panel
    for k, name in enumerate(names):
        sy = top1 + PANEL_H + 22 + 12 * k
        for a, b in zip(points, points[1:] + [points[-1]], strict=True):
            d.rectangle(
                [x(a["capture"]), sy, max(x(b["capture"]), x(a["capture"]) + 1), sy + 9],
                fill=STATE_COLOURS[a["windows"][name]["state"]],
            )
        d.text((W - RIGHT + 6, sy - 2), f"state {name}", fill=(0, 0, 0))
    legend = [(f"window {n}", COLOURS.get(n, (0, 0, 0))) for n in names]
    legend += [(f"expected {100 * expected:.1f} %", (90, 90, 90)), ("pitted share (truth), 200", (120, 120, 120))]
    for k, (label, colour) in enumerate(legend):
        d.line([W - RIGHT + 6, top1 + 10 + 16 * k, W - RIGHT + 26, top1 + 10 + 16 * k], fill=colour, width=3)
        d.text((W - RIGHT + 30, top1 + 4 + 16 * k), label, fill=(0, 0, 0))
    for k, (state, colour) in enumerate(STATE_COLOURS.items()):
        d.rectangle([W - RIGHT + 6, top1 + 110 + 14 * k, W - RIGHT + 22, top1 + 119 + 14 * k], fill=colour)
        d.text((W - RIGHT + 28, top1 + 108 + 14 * k), state, fill=(0, 0, 0))
    # passed parts' score quantiles of the 200 window against the out-of-fold ones
    top2 = top1 + PANEL_H + GAP
    qs = [v for p in points for v in p["windows"]["200"]["score_quantiles"] if v is not None] + reference
    lo, hi = min(qs) * 0.97, max(qs) * 1.03
    x, y = _axes(
        d, top2, lo, hi, t0, t1, "passed parts' score quantiles, 200-part window (dashed: out-of-fold)", "{:.3f}"
    )
    shades = [(120, 170, 220), (31, 119, 180), (10, 50, 110)]
    for k, q in enumerate(QUANTILES):
        xy = [
            (x(p["capture"]), y(p["windows"]["200"]["score_quantiles"][k]))
            for p in points
            if p["windows"]["200"]["score_quantiles"][k] is not None
        ]
        if len(xy) > 1:
            d.line(xy, fill=shades[k], width=2)
        for s in range(int(x(t0)), int(x(t1)), 12):
            d.line([s, y(reference[k]), s + 6, y(reference[k])], fill=shades[k], width=1)
        d.line([W - RIGHT + 6, top2 + 10 + 16 * k, W - RIGHT + 26, top2 + 10 + 16 * k], fill=shades[k], width=3)
        d.text((W - RIGHT + 30, top2 + 4 + 16 * k), f"q{q:g}", fill=(0, 0, 0))
    img.save(png, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--split", type=float, default=0.6, help="share of the time range whose good frames are templates"
    )
    parser.add_argument("--every", type=int, default=15, help="frames between drift reads")
    parser.add_argument("--png", type=Path, default=Path("out/drift-bsd.png"))
    parser.add_argument("--json", type=Path, default=Path("out/drift-bsd.json"), help="the raw points and frames")
    parser.add_argument("--store", help="a local store folder; one holding the product already skips the fit")
    parser.add_argument("--size", type=int, help="backbone.image_size (default: the product default, 256)")
    parser.add_argument("--oof-images", type=int, help="threshold.max_images (default: the product default)")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()

    from ray import serve

    from hetmm_ray.serve.run import stop_service

    every = frames(args.data)
    t_first, t_last = every[0][0], every[-1][0]
    cut = t_first + (t_last - t_first) * args.split
    templates = [p for t, label, p in every if t < cut and label == "good"]
    later = [(t, label, p) for t, label, p in every if t >= cut]
    skipped = sum(1 for t, label, _ in every if t < cut and label != "good")
    config = DetectorConfig()  # the product defaults
    if args.size or args.oof_images:  # a cheaper canvas / fewer out-of-fold images on a loaded machine
        config = DetectorConfig(
            backbone=BackboneConfig(image_size=args.size or config.backbone.image_size),
            threshold=ThresholdConfig(max_images=args.oof_images or config.threshold.max_images),
        )
    if args.tiny:
        templates, later, args.every = (
            templates[:: max(1, len(templates) // 40)],
            later[:: max(1, len(later) // 60)],
            10,
        )
        config = DetectorConfig(backbone=BackboneConfig(image_size=128), threshold=ThresholdConfig(folds=5))
    print(
        f"{len(every)} frames {t_first} .. {t_last}; cut at {args.split:.0%}: {cut:%Y-%m-%d %H:%M}; "
        f"{len(templates)} good frames as templates ({skipped} pitted frames before the cut left out); "
        f"{len(later)} later frames ({sum(1 for f in later if f[1] != 'good')} pitted) streamed",
        flush=True,
    )
    store = args.store or f"{tempfile.mkdtemp(prefix='drift-bsd-')}/store"
    start = time.perf_counter()
    if PRODUCT in open_store(store).products():  # a rerun on the store of an earlier one: its fit is kept
        det = HETMM.load(open_store(store), PRODUCT)
        version = det.version
        print(f"store {store}: product {PRODUCT!r} version {version} loaded, not fitted again", flush=True)
    else:
        det = HETMM(config).fit([str(p) for p in templates])
        version = det.save(open_store(store), PRODUCT)
    op = det.operating_point()
    cal = det.calibration
    assert op is not None and cal is not None
    print(
        f"ready in {time.perf_counter() - start:.0f} s: version {version}, tiles {det.config.geometry.tiles}, "
        f"canvas {det.config.backbone.image_size}, {det.config.backbone.name}, sheets {det.config.templates.kind}, "
        f"{len(det.calibration.scores) if det.calibration else 0} out-of-fold scores, "
        f"threshold {op.threshold:.4f} at an estimated {100 * op.false_alarm_rate:.2f} % of good frames flagged",
        flush=True,
    )
    running = start_service_retrying(store=store, port=free_port(), args={"record": True, "record_flush_s": 2.0})
    points: list[dict] = []
    per_frame: list[dict] = []
    body: dict = {}
    try:
        with httpx.Client(base_url=running.url, timeout=300) as c:
            for i, (t, label, path) in enumerate(later):
                r = c.post(
                    f"/v1/products/{PRODUCT}/predict", content=path.read_bytes(), headers={"content-type": "image/jpeg"}
                )
                r.raise_for_status()
                res = r.json()
                res = res["results"][0] if "results" in res else res
                per_frame.append(
                    {
                        "capture": t.replace(tzinfo=UTC).timestamp(),
                        "label": label,
                        "name": path.name,
                        "score": res["score"],
                        "is_anomaly": res["is_anomaly"],
                    }
                )
                if (i + 1) % args.every == 0 or i + 1 == len(later):
                    body = wait_drift(c, i + 1)
                    live = body["live"]
                    recent = per_frame[-200:]
                    points.append(
                        {
                            "capture": per_frame[-1]["capture"],
                            "sent": i + 1,
                            "pitted_share_200": sum(f["label"] != "good" for f in recent) / len(recent),
                            "windows": live["windows"],
                        }
                    )
            time.sleep(5.0)  # the record flushes every 2 s: the last rows are written
            final = c.get(f"/v1/products/{PRODUCT}/drift", params={"hours": 24, "buckets": 24}).json()
    finally:
        stop_service(running)
        serve.shutdown()

    live = body["live"]
    expected = float(live["expected_rate"])
    names = list(live["windows"])
    rows = []
    last = dict.fromkeys(names)
    for p in points:
        states = [p["windows"][n]["state"] for n in names]
        if states != [last[n] for n in names] or p is points[-1]:
            rows.append(
                [datetime.fromtimestamp(p["capture"], UTC).strftime("%d %b %H:%M"), p["sent"]]
                + [
                    f"{p['windows'][n]['state']} ({100 * (p['windows'][n]['flagged_share'] or 0):.1f} %, "
                    f"KS {p['windows'][n]['shift']:.2f})"
                    for n in names
                ]
            )
            last = dict(zip(names, states, strict=True))
    print(f"\nstate over capture time (each change; expected rate {100 * expected:.2f} %, tolerance x2 tested):")
    print(table(["captured (last frame)", "frames sent"] + [f"window {n}" for n in names], rows))

    oof = np.array(cal.scores)
    day_rows = []
    for day in sorted({datetime.fromtimestamp(f["capture"], UTC).date() for f in per_frame}):
        fs = [f for f in per_frame if datetime.fromtimestamp(f["capture"], UTC).date() == day]
        good = np.array([f["score"] for f in fs if f["label"] == "good"])
        gq = "-" if len(good) == 0 else " / ".join(f"{v:.3f}" for v in np.quantile(good, QUANTILES))
        day_rows.append(
            [
                str(day),
                len(fs),
                sum(f["label"] != "good" for f in fs),
                f"{100 * np.mean([f['is_anomaly'] for f in fs]):.1f} %",
                "-"
                if len(good) == 0
                else f"{100 * np.mean([f['is_anomaly'] for f in fs if f['label'] == 'good']):.1f} %",
                gq,
            ]
        )
    print(
        f"\nper capture day (out-of-fold q0.5/0.9/0.99: {' / '.join(f'{v:.3f}' for v in np.quantile(oof, QUANTILES))};"
        f" threshold {op.threshold:.3f}):"
    )
    print(table(["day", "frames", "pitted", "flagged", "good flagged", "good scores q0.5/0.9/0.99"], day_rows))
    print(f"\nGET /drift (record, service clock): {len(final['points'])} points, source {final['source']}")

    args.png.parent.mkdir(parents=True, exist_ok=True)
    reference = [float(v) for v in live["reference_quantiles"]]
    draw_chart(
        points,
        reference,
        expected,
        float(body["alpha"]),
        args.png,
        f"bsd_pitting through the service, capture order from {cut:%d %b %H:%M} "
        f"({len(templates)} template frames before it); alpha {body['alpha']:g}",
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"points": points, "frames": per_frame, "reference_quantiles": reference, "expected": expected})
    )
    print(f"chart: {args.png} ({args.png.stat().st_size // 1024} KiB), points: {args.json}")


if __name__ == "__main__":
    main()
