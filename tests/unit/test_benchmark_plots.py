"""benchmarks/plots.py: each kind draws its PNG from a ``--json`` file of the shape its command writes.

The examples are the JSON files the documentation's figures are drawn from (``docs/figures/*.json``:
``bench_bank.py scale`` and ``bench_memory.py`` rows, and ``hetmm evaluate --json`` results). Each
figure must come out at its stated pixel size, drawn (its lines' colours present, not a blank canvas)
and the same bytes on a second drawing, so a regenerated figure changes only with its data. The
recall curve is checked against the figures ``hetmm evaluate`` printed for the same runs, through an
obvious count over the scores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from PIL import Image

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import plots  # after the repository is on the path

FIGURES = REPO / "docs" / "figures"
EXAMPLES = {
    "bank": [FIGURES / "bank-scale.json"],
    "memory": [FIGURES / "memory-frames.json"],
    "recall": [FIGURES / f"evaluate-{name}.json" for name in ("bottle", "battery_weld", "bsd_pitting")],
}
LINE_RGB = (0x1F, 0x61, 0x8D)  # the first line's colour (plots._LINES[0])


def _pixels(png: Path) -> np.ndarray:
    with Image.open(png) as im:
        return np.asarray(im.convert("RGB")).astype(int)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_each_kind_draws_its_png_from_a_json_example(kind: str, tmp_path: Path) -> None:
    png = plots.draw(kind, EXAMPLES[kind], tmp_path / f"{kind}.png")
    assert png.is_file()
    rgb = _pixels(png)
    width, height = plots.SIZES[kind]
    assert rgb.shape == (round(height * plots.DPI), round(width * plots.DPI), 3)
    ink = (rgb < 240).any(axis=2).mean()  # share of pixels not (near) white: axes, text and lines
    assert 0.01 < ink < 0.5, ink
    line = (np.abs(rgb - LINE_RGB).sum(axis=2) < 30).sum()
    assert line > 100, f"the first line's colour covers {line} pixels"
    again = plots.draw(kind, EXAMPLES[kind], tmp_path / f"{kind}-again.png")
    assert again.read_bytes() == png.read_bytes()


def test_the_command_line_writes_the_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sub" / "memory.png"
    plots.main(["memory", str(EXAMPLES["memory"][0]), "--png", str(png)])
    assert png.is_file() and f"written {png}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="row 0 has no run"):  # memory rows are not bank rows
        plots.main(["bank", str(EXAMPLES["memory"][0]), "--png", str(tmp_path / "bank.png")])
    assert not (tmp_path / "bank.png").exists()


def test_a_row_without_a_key_is_refused(tmp_path: Path) -> None:
    rows = json.loads(EXAMPLES["bank"][0].read_text())
    del rows[2]["fit_s"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"bad\.json: row 2 has no fit_s"):
        plots.draw("bank", [bad], tmp_path / "bad.png")
    with pytest.raises(ValueError, match="kind must be one of"):
        plots.draw("speed", [bad], tmp_path / "bad.png")


def test_the_bank_figure_counts_a_bank_kept_whole_as_all() -> None:
    rows = json.loads(EXAMPLES["bank"][0].read_text())
    lines = plots.bank_lines(rows)
    defaults, every = lines.values()
    assert [r["n_train"] for r in defaults] == [200, 500, 1000]
    assert [(r["n_train"], r["sheets"]) for r in every] == [(200, 200), (500, 500), (1000, 1000)]


def _recall_at(rows: list[dict], false_alarm_rate: float) -> float:
    """The obvious way: every cut at a score, the best recall flagging at most that share of good."""
    good = np.array([r["score"] for r in rows if r["defect_type"] == "good"])
    bad = np.array([r["score"] for r in rows if r["defect_type"] != "good"])
    best = 0.0
    for cut in np.unique(np.r_[good, bad]):
        if np.mean(good >= cut) <= false_alarm_rate:
            best = max(best, float(np.mean(bad >= cut)))
    return best


@pytest.mark.parametrize("name", ["battery_weld", "bsd_pitting"])
def test_the_recall_curve_gives_the_figures_evaluate_printed(name: str) -> None:
    from hetmm_ray.report.plots import roc_points

    result = json.loads((FIGURES / f"evaluate-{name}.json").read_text())
    rows = result["images"]
    fpr, tpr = roc_points([r["score"] for r in rows], [int(r["defect_type"] != "good") for r in rows])
    for rate, printed in ((0.01, "recall_at_1pct_false_alarms"), (0.05, "recall_at_5pct_false_alarms")):
        on_curve = 100 * float(tpr[fpr <= rate + 1e-12].max())
        assert on_curve == pytest.approx(100 * _recall_at(rows, rate), abs=1e-9)
        assert on_curve == pytest.approx(result[printed], abs=1e-9)
