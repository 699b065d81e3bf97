"""The chart of ``test_drift_bsd.py`` (Pillow: matplotlib is not a dependency): the flagged share per
window with the expected band, and the passed parts' score quantiles against the out-of-fold ones."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from PIL import Image, ImageDraw

from hetmm_ray.core.drift import QUANTILES, binomial_band

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
