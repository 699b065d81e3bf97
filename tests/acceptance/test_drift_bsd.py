"""Real slow change through the service's drift alarms: ``bsd_pitting`` in capture-time order.

The frames' names carry their capture time (``01_<yymmddhhmmss>_...``; ../shared/data/README.md).
Over the whole range (28 Aug to 7 Sep 2020, every frame of train/ and test/):

1. the good frames captured in the first 60 % of the time range are the templates: a product fitted
   in process (the product defaults, at the committed chart's cheaper canvas: 128 px, 200 out-of-fold
   images) and saved to a local store;
2. the service is started on that store with the inspection record on, and every later frame (good
   and pitted) is sent in capture order, one ``POST /v1/products/{p}/predict`` at a time;
3. after every 15 frames, ``GET /v1/products/{p}/drift`` is read once the drift monitor has seen them
   all (its longest window's parts equal the frames sent): one chart point per read, placed at the
   capture time of the last frame sent.

Asserted: every frame scored, every read saw every frame sent, the record answers ``GET /drift``, and
(full size) every window ends in ``drift``: the line's slow change and the pitting
(docs/performance.md). Printed: the state of each window over capture time and, per capture day, the
frames, the pitted ones, the flagged share and the good frames' score quantiles against the
out-of-fold ones. Saved to ``HETMM_ACCEPTANCE_OUT`` (else the test's temporary folder):
``drift-bsd.png`` (the chart, ``drift_chart.py``) and ``drift-bsd.json`` (the raw points and frames).
Quick (``HETMM_ACCEPTANCE_QUICK=1``): 40 templates, 60 later frames, 128 canvas, 5 folds.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
from drift_chart import draw_chart

from benchmarks.common import BSD, free_port, served, table
from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.drift import QUANTILES
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.store import open_store

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.shared,
    pytest.mark.skipif(not BSD.is_dir(), reason=f"needs {BSD} (../shared)"),
]

PRODUCT = "bsd"
FOLDERS = (("train/good", "good"), ("test/good", "good"), ("test/pitting", "pitting"))
SPLIT = 0.6  # share of the time range whose good frames are templates
CANVAS, OOF_IMAGES = 128, 200  # the committed chart's (docs/figures/drift-bsd-2026-11-27.png); defaults 256, 1000


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
        if seen >= sent:
            return body
        assert time.monotonic() < deadline, f"the drift monitor saw {seen} of {sent} frames after {timeout:.0f} s"
        time.sleep(0.2)


def test_bsd_pitting_in_capture_order_turns_every_window_to_drift(
    tmp_path: Path, out_dir: Path, quick: bool, own_ray: None
) -> None:
    every_frame = frames(BSD)
    t_first, t_last = every_frame[0][0], every_frame[-1][0]
    cut = t_first + (t_last - t_first) * SPLIT
    templates = [p for t, label, p in every_frame if t < cut and label == "good"]
    later = [(t, label, p) for t, label, p in every_frame if t >= cut]
    skipped = sum(1 for t, label, _ in every_frame if t < cut and label != "good")
    every = 15
    config = DetectorConfig(
        backbone=BackboneConfig(image_size=CANVAS), threshold=ThresholdConfig(max_images=OOF_IMAGES)
    )
    if quick:
        templates, later, every = templates[:: max(1, len(templates) // 40)], later[:: max(1, len(later) // 60)], 10
        config = DetectorConfig(backbone=BackboneConfig(image_size=128), threshold=ThresholdConfig(folds=5))
    print(
        f"{len(every_frame)} frames {t_first} .. {t_last}; cut at {SPLIT:.0%}: {cut:%Y-%m-%d %H:%M}; "
        f"{len(templates)} good frames as templates ({skipped} pitted frames before the cut left out); "
        f"{len(later)} later frames ({sum(1 for f in later if f[1] != 'good')} pitted) streamed",
        flush=True,
    )
    store = str(tmp_path / "store")
    start = time.perf_counter()
    det = HETMM(config).fit([str(p) for p in templates])
    version = det.save(open_store(store), PRODUCT)
    op = det.operating_point()
    cal = det.calibration
    assert op is not None and cal is not None
    print(
        f"ready in {time.perf_counter() - start:.0f} s: version {version}, tiles {det.config.geometry.tiles}, "
        f"canvas {det.config.backbone.image_size}, {det.config.backbone.name}, sheets {det.config.templates.kind}, "
        f"{len(cal.scores)} out-of-fold scores, "
        f"threshold {op.threshold:.4f} at an estimated {100 * op.false_alarm_rate:.2f} % of good frames flagged",
        flush=True,
    )
    points: list[dict] = []
    per_frame: list[dict] = []
    body: dict = {}
    args = {"record": True, "record_flush_s": 2.0}
    with served(store=store, port=free_port(), args=args) as running:
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
                if (i + 1) % every == 0 or i + 1 == len(later):
                    body = wait_drift(c, i + 1)
                    recent = per_frame[-200:]
                    points.append(
                        {
                            "capture": per_frame[-1]["capture"],
                            "sent": i + 1,
                            "pitted_share_200": sum(f["label"] != "good" for f in recent) / len(recent),
                            "windows": body["live"]["windows"],
                        }
                    )
            time.sleep(5.0)  # the record flushes every 2 s: the last rows are written
            final = c.get(f"/v1/products/{PRODUCT}/drift", params={"hours": 24, "buckets": 24}).json()

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
        good_flagged = [f["is_anomaly"] for f in fs if f["label"] == "good"]
        day_rows.append(
            [
                str(day),
                len(fs),
                sum(f["label"] != "good" for f in fs),
                f"{100 * np.mean([f['is_anomaly'] for f in fs]):.1f} %",
                "-" if len(good) == 0 else f"{100 * np.mean(good_flagged):.1f} %",
                gq,
            ]
        )
    print(
        f"\nper capture day (out-of-fold q0.5/0.9/0.99: {' / '.join(f'{v:.3f}' for v in np.quantile(oof, QUANTILES))};"
        f" threshold {op.threshold:.3f}):"
    )
    print(table(["day", "frames", "pitted", "flagged", "good flagged", "good scores q0.5/0.9/0.99"], day_rows))
    print(f"\nGET /drift (record, service clock): {len(final['points'])} points, source {final['source']}")

    png, raw = out_dir / "drift-bsd.png", out_dir / "drift-bsd.json"
    reference = [float(v) for v in live["reference_quantiles"]]
    draw_chart(
        points,
        reference,
        expected,
        float(body["alpha"]),
        png,
        f"bsd_pitting through the service, capture order from {cut:%d %b %H:%M} "
        f"({len(templates)} template frames before it); alpha {body['alpha']:g}",
    )
    raw.write_text(
        json.dumps({"points": points, "frames": per_frame, "reference_quantiles": reference, "expected": expected})
    )
    print(f"chart: {png} ({png.stat().st_size // 1024} KiB), points: {raw}")
    assert len(per_frame) == len(later)
    assert final["points"], "GET /drift found nothing in the record"
    if not quick:
        assert {n: w["state"] for n, w in live["windows"].items()} == dict.fromkeys(names, "drift")
