"""``hetmm evaluate --report DIR`` and ``--json``'s per-image rows, and the one overlay every picture uses.

On a small synthetic product (a tiny random resnet18 on a 32-px canvas: seconds per evaluate) the
report's parts exist (histogram, ROC, PRO, a gallery entry for every false alarm and every miss),
the per-image rows reproduce the printed image AUROC (recomputed over all pairs), the gallery's
bounded heaps keep what a full sort keeps, and ``hetmm predict --out`` saves exactly
``visualize.draw_overlay``'s picture. With Debian's chromium and Playwright the page is also opened
in a browser and every picture must load (skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from browser import launch, missing_browser
from helpers import tiny_cli_flags
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.config import REPORT_THUMBNAIL_PX
from hetmm_ray.core.metrics import image_auroc
from hetmm_ray.data.synthetic import write_mvtec_layout
from hetmm_ray.report.collect import GALLERY_KINDS, ReportCollector
from hetmm_ray.visualize import MASK_OUTLINE_RGB, draw_overlay, heatmap_overlay, heatmap_range, mask_outline

SIZE = 32
FLAGS = tiny_cli_flags(SIZE)


def slow_auroc(scores: list[float], positive: list[bool]) -> float:
    """Over all (defective, good) pairs: a win counts 1, a tie one half."""
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


class _Page(HTMLParser):
    """The page's images (src) and gallery entries (kind, the entry's text)."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.entries: list[tuple[str, str]] = []
        self._entry: list[str] | None = None
        self._kind = ""
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.images.append(a["src"] or "")
        if tag == "div" and "entry" in (a.get("class") or "").split():
            self._entry, self._kind, self._depth = [], a["data-kind"] or "", 0
        if tag == "div" and self._entry is not None:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self._entry is not None:
            self._depth -= 1
            if self._depth == 0:
                self.entries.append((self._kind, "".join(self._entry)))
                self._entry = None

    def handle_data(self, data: str) -> None:
        if self._entry is not None:
            self._entry.append(data)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str, Path]:
    root = tmp_path_factory.mktemp("report")
    data = write_mvtec_layout(root / "set", n_train=8, n_test_good=6, n_test_per_defect=3, size=SIZE)
    # Both kinds of error, planted: a defective frame filed as good (a false alarm) and good frames
    # filed as holes with a mask (misses); asserted below, so the gallery has both to show.
    shutil.copy(data / "test" / "missing" / "000.png", data / "test" / "good" / "planted.png")
    for i in range(2):
        shutil.copy(data / "test" / "good" / f"00{i}.png", data / "test" / "hole" / f"planted{i}.png")
        shutil.copy(
            data / "ground_truth" / "hole" / "000_mask.png", data / "ground_truth" / "hole" / f"planted{i}_mask.png"
        )
    out, report = root / "e.json", root / "r"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["evaluate", "--data", str(data), "--json", str(out), "--report", str(report), *FLAGS])
    assert rc == 0
    return data, json.loads(out.read_text()), printed.getvalue(), report


def test_the_rows_reproduce_the_printed_auroc(evaluated):
    data, result, printed, _ = evaluated
    rows = result["images"]
    tests = sorted(p for p in (data / "test").rglob("*.png"))
    assert sorted(Path(r["path"]) for r in rows) == tests
    assert {r["defect_type"] for r in rows} == {p.parent.name for p in tests}
    scores = [r["score"] for r in rows]
    positive = [r["defect_type"] != "good" for r in rows]
    slow = 100 * slow_auroc(scores, positive)
    assert result["image_auroc"] == pytest.approx(slow, abs=1e-9)
    assert result["image_auroc"] == 100 * image_auroc(np.asarray(scores, dtype=np.float32), np.asarray(positive))
    printed_auroc = float(re.search(r"^image AUROC\s+([\d.]+)$", printed, flags=re.M).group(1))
    assert printed_auroc == float(f"{slow:.1f}")
    # the verdicts are the threshold's, and the counts are the rows'
    for r in rows:
        assert r["is_anomaly"] == (r["score"] > result["threshold"])
        assert r["verdict"] == ("reject" if r["is_anomaly"] else "ok")  # the record's words; no review band here
    assert result["false_positives"] == sum(r["is_anomaly"] and not p for r, p in zip(rows, positive, strict=True))
    assert result["false_negatives"] == sum(not r["is_anomaly"] and p for r, p in zip(rows, positive, strict=True))


def test_the_report_has_its_parts_and_every_error_in_the_gallery(evaluated):
    _, result, printed, report = evaluated
    index = report / "index.html"
    assert f"written {index}" in printed
    page = _Page()
    page.feed(index.read_text())
    for name in ("histogram.png", "roc.png", "pro.png"):
        assert name in page.images
        with Image.open(report / name) as im:
            assert im.format == "PNG" and im.width > 300 and im.height > 200
    for src in page.images:  # self-contained: every picture is a file in DIR
        assert not re.match(r"[a-z]+:", src) and (report / src).is_file(), src
    assert len(list((report / "gallery").glob("*.png"))) == 2 * len(page.entries)
    rows = result["images"]
    false_alarms = [r for r in rows if r["is_anomaly"] and r["defect_type"] == "good"]
    misses = [r for r in rows if not r["is_anomaly"] and r["defect_type"] != "good"]
    assert false_alarms and misses, "the fixture's threshold must make both kinds of error"
    for kind, expected, worst_first in (("false alarm", false_alarms, True), ("miss", misses, False)):
        shown = [text for k, text in page.entries if k == kind]
        expected = sorted(expected, key=lambda r: r["score"], reverse=worst_first)
        assert len(shown) == len(expected), kind
        for text, row in zip(shown, expected, strict=True):  # worst first
            assert row["path"] in text and f"score {row['score']:.6g}" in text
    # the operating point is stated
    text = index.read_text()
    assert f"{result['threshold']:.6g}" in text and "measured false alarms" in text and "recall" in text


def test_the_report_changes_no_figure(evaluated, tmp_path: Path):
    """The PRO figure with --report (from the curve the report draws) is the one without it."""
    data, with_report, _, _ = evaluated
    out = tmp_path / "plain.json"
    assert main(["evaluate", "--data", str(data), "--json", str(out), *FLAGS]) == 0
    plain = json.loads(out.read_text())
    for key in ("image_auroc", "pixel_auroc", "pro", "threshold", "images"):
        assert plain[key] == with_report[key], key


def test_the_page_opens_in_chromium(evaluated):
    missing = missing_browser()
    if missing is not None:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    report = evaluated[3]
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            page.goto((report / "index.html").as_uri(), wait_until="load")
            sizes = page.evaluate("() => [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth])")
            assert sizes and all(w > 0 for _, w in sizes), sizes
            assert page.locator("#operating-point").inner_text().count("threshold") >= 1
        finally:
            browser.close()


def test_the_gallery_keeps_every_error_and_what_a_full_sort_keeps_near(tmp_path: Path):
    rng = np.random.default_rng(3)
    n = 200
    labels = rng.integers(0, 2, n)
    scores = np.round(rng.random(n), 2)  # ties on purpose: the earlier frame wins them
    threshold = 0.5
    (tmp_path / "gallery").mkdir()
    (tmp_path / "gallery" / "stale.png").write_bytes(b"old")  # an earlier report's picture goes
    collector = ReportCollector(tmp_path, near=3, thumbnail_px=16)
    assert not (tmp_path / "gallery" / "stale.png").exists()
    drawn = []
    amap = np.zeros((4, 4), dtype=np.float32)
    for i in range(n):
        collector.offer(
            path=f"f{i}", defect_type="good" if labels[i] == 0 else "hole", label=int(labels[i]),
            score=float(scores[i]), is_anomaly=bool(scores[i] > threshold), amap=amap, threshold=threshold,
            frame=lambda i=i: drawn.append(i) or np.full((8, 12, 3), i % 256, dtype=np.uint8),
        )  # fmt: skip
    kinds = {
        "false alarm": [i for i in range(n) if labels[i] == 0 and scores[i] > threshold],
        "good near": [i for i in range(n) if labels[i] == 0 and scores[i] <= threshold],
        "miss": [i for i in range(n) if labels[i] == 1 and scores[i] <= threshold],
        "defect near": [i for i in range(n) if labels[i] == 1 and scores[i] > threshold],
    }
    files = set()
    for kind in GALLERY_KINDS:
        good = kind in ("false alarm", "good near")
        # the slow way: all of the kind, worst first, ties in arrival order; every error, 3 near
        expected = sorted(kinds[kind], key=lambda i: (-scores[i] if good else scores[i], i))
        if kind in ("good near", "defect near"):
            expected = expected[:3]
        kept = collector.entries(kind)
        assert [e.path for e in kept] == [f"f{i}" for i in expected], kind
        assert collector.counts[kind] == len(kinds[kind])
        for e in kept:
            for name in (e.frame_file, e.overlay_file):
                with Image.open(tmp_path / "gallery" / name) as im:
                    assert im.size == (20, 13)  # 8 x 12 to about 16 x 16, the aspect kept
                files.add(name)
    # what was pushed out of a near heap left no file behind
    assert {p.name for p in (tmp_path / "gallery").glob("*.png")} == files
    errors = len(kinds["false alarm"]) + len(kinds["miss"])
    assert errors > 20 and len(drawn) < errors + n / 4  # the near kinds draw only what enters a heap


def _slow_outline(inside: np.ndarray) -> np.ndarray:
    h, w = inside.shape
    out = np.zeros_like(inside)
    for y in range(h):
        for x in range(w):
            if inside[y, x]:
                nbrs = [(y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)]
                out[y, x] = any(not (0 <= a < h and 0 <= b < w) or not inside[a, b] for a, b in nbrs)
    return out


def test_the_overlay_outlines_the_mask_and_leaves_the_rest():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    amap = rng.random((20, 30)).astype(np.float32)
    mask = np.zeros((40, 60), dtype=bool)
    mask[10:25, 5:20] = True
    mask[0:6, 50:60] = True  # touching the border: the border counts as outside
    outline = mask_outline(mask, 40, 60)
    assert np.array_equal(outline, _slow_outline(mask))
    vmin, vmax = heatmap_range(amap, 0.4)
    plain = heatmap_overlay(image, amap, vmin=vmin, vmax=vmax)
    drawn = draw_overlay(image, amap, threshold=0.4, mask=mask)
    assert np.array_equal(drawn[~outline], plain[~outline])
    assert (drawn[outline] == MASK_OUTLINE_RGB).all()
    assert np.array_equal(draw_overlay(image, amap, threshold=0.4), plain)
    # a defect one pixel wide in a large mask still shows in a small picture
    thin = np.zeros((400, 600), dtype=bool)
    thin[200, 100:500] = True
    assert mask_outline(thin, 40, 60).sum() >= 30


def test_predict_saves_the_one_overlay(tmp_path: Path):
    """``hetmm predict --out`` writes ``draw_overlay`` of the frame as the detector saw it."""
    from hetmm_ray.data.decode import decode_image
    from hetmm_ray.detection.detector_choice import load_detector
    from hetmm_ray.store import open_store

    data = write_mvtec_layout(tmp_path / "set", n_train=6, n_test_good=2, n_test_per_defect=1, size=SIZE)
    store = tmp_path / "store"
    assert main(["evaluate", "--data", str(data), "--store", str(store), "--product", "p", *FLAGS]) == 0
    frame = next((data / "test").rglob("*.png"))
    heat = tmp_path / "heat"
    assert main(["predict", str(frame), "--product", "p", "--store", str(store), "--out", str(heat)]) == 0
    saved = np.asarray(Image.open(next(heat.rglob("*_heatmap.png"))).convert("RGB"))
    det = load_detector(open_store(str(store)), "p")
    view = det.input_view(decode_image(frame))
    pred = det.predict([view])
    assert np.array_equal(saved, draw_overlay(view, pred.maps[0], threshold=pred.threshold))


def test_a_tiled_set_without_masks_has_no_pro_curve(tmp_path: Path):
    """Image labels only: no PRO figure (the page says why); a tiled product's gallery shows whole frames."""
    data = write_mvtec_layout(tmp_path / "set", n_train=6, n_test_good=3, n_test_per_defect=2, size=64, masks=False)
    report = tmp_path / "r"
    tiled = [*FLAGS, "--set", "geometry.tiles=[2,2]"]
    assert main(["evaluate", "--data", str(data), "--report", str(report), *tiled]) == 0
    text = (report / "index.html").read_text()
    assert not (report / "pro.png").exists() and "no ground-truth masks" in text
    assert (report / "histogram.png").is_file() and (report / "roc.png").is_file()
    frames = sorted((report / "gallery").glob("*-frame.png"))
    assert frames
    for f in frames:  # the whole 64 x 64 frame, at the thumbnail's size
        with Image.open(f) as im:
            assert im.size == (REPORT_THUMBNAIL_PX, REPORT_THUMBNAIL_PX)
