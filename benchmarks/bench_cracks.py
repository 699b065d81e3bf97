"""Thin long faint cracks on elongated frames with a good set that is not clean: what ``hetmm
evaluate --data DIR`` gives on them, at the defaults and at given settings.

Writes ``hetmm_ray/data/cracks.py``'s product (``--height`` x ``--width`` grey frames, round grains
``--grain-px`` across, cracks ``--width-px`` wide and ``--length-px`` long at ``--contrast`` grey
levels darker, ``--mark-rate`` of the good frames with a benign stain; ``--train`` good training
frames, ``--test-good`` good and ``--test-cracked`` cracked test frames, ``--seed``), then runs
``hetmm evaluate --data DIR --json ...`` once per ``--runs`` entry (``defaults``: no setting; else
``KEY=JSON`` pairs separated by ``;``, each passed as ``--set KEY=JSON``), one run at a time, as a
user runs it. Printed per run: the fit's geometry line (what ``geometry_rule.choose_geometry``, the fit's
one rule, chooses for the frames and why, as ``hetmm fit`` prints it), image AUROC, pixel AUROC,
the share of cracked parts flagged at the threshold (the far rule at its configured rate, 1 % by
default) and of good parts, the threshold and the estimated false-alarm rate, and the
evaluation's images/s. ``--json`` keeps all of it.

    python benchmarks/bench_cracks.py                                   # defaults, 60 / 30 / 30 frames
    python benchmarks/bench_cracks.py --contrast 6 10 --runs defaults "geometry.tiles=\\"auto\\""
    python benchmarks/bench_cracks.py --runs defaults "geometry.min_defect_px=4" --json cracks.json
    python benchmarks/bench_cracks.py --runs 'geometry.canvas="aspect"' --keep /tmp/cracks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.cracks import CrackDefects, write_crack_layout
from hetmm_ray.detection.geometry_rule import choose_geometry


def settings_of(run: str) -> dict[str, Any]:
    """The settings of one ``--runs`` entry."""
    if run == "defaults":
        return {}
    out = {}
    for pair in run.split(";"):
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--runs {run!r}: expected KEY=JSON pairs separated by ';' or 'defaults'")
        out[key.strip()] = json.loads(value)  # a mistake here, not after a long fit
    return out


def geometry_line(data: Path, run: str) -> str:
    """What the fit's one rule chooses for this run's frames, as ``hetmm fit`` prints it."""
    config = DetectorConfig().replace(**settings_of(run))
    choice = choose_geometry(config, sorted((data / "train" / "good").glob("*.png")))
    if choice.why is None and choice.canvas_why is None:
        return f"nothing chosen: the frame on one {config.backbone.image_size}-px canvas ({config.backbone.geometry})"
    return choice.describe()


def evaluate(data: Path, run: str, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-cracks-out-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "hetmm_ray.cli", "evaluate", "--data", str(data), "--json", str(out)]
        flags = [f for key, value in settings_of(run).items() for f in ("--set", f"{key}={json.dumps(value)}")]
        done = subprocess.run(argv + flags, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"hetmm evaluate failed ({run}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        result = json.loads(out.read_text())
    result["geometry_line"] = geometry_line(data, run)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--height", type=int, default=1250)
    ap.add_argument("--width", type=int, default=500)
    ap.add_argument("--grain-px", type=int, default=4, help="round grains about this many px across")
    ap.add_argument("--contrast", type=float, nargs=2, default=(10.0, 18.0), metavar=("LOW", "HIGH"))
    ap.add_argument("--width-px", type=float, nargs=2, default=(2.0, 4.0), metavar=("LOW", "HIGH"))
    ap.add_argument("--length-px", type=float, nargs=2, default=(100.0, 400.0), metavar=("LOW", "HIGH"))
    ap.add_argument("--mark-rate", type=float, default=0.02, help="share of good frames with a benign mark")
    ap.add_argument("--train", type=int, default=60)
    ap.add_argument("--test-good", type=int, default=30)
    ap.add_argument("--test-cracked", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", nargs="+", default=["defaults"])
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per evaluate run")
    ap.add_argument("--keep", type=Path, help="write the frames here and keep them (reused when present)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    defects = CrackDefects(
        width_px=tuple(args.width_px), length_px=tuple(args.length_px), contrast=tuple(args.contrast)
    )
    data_settings = {
        "frame": [args.height, args.width], "grain_px": args.grain_px, "contrast": list(args.contrast),
        "width_px": list(args.width_px), "length_px": list(args.length_px), "mark_rate": args.mark_rate,
        "train": args.train, "test_good": args.test_good, "test_cracked": args.test_cracked, "seed": args.seed,
    }  # fmt: skip
    rows, out = [], []
    with tempfile.TemporaryDirectory(prefix="bench-cracks-") as tmp:
        root = args.keep or Path(tmp) / "cracks"
        if not (root / "train").exists():
            write_crack_layout(
                root, height=args.height, width=args.width, n_train=args.train, n_test_good=args.test_good,
                n_test_cracked=args.test_cracked, seed=args.seed, defects=defects, grain_px=args.grain_px,
                mark_rate=args.mark_rate,
            )  # fmt: skip
        for run in args.runs:
            r = evaluate(root, run, args.timeout)
            rec = {
                "run": run, "data": data_settings, "image_auroc": round(r["image_auroc"], 2),
                "pixel_auroc": None if r.get("pixel_auroc") is None else round(r["pixel_auroc"], 2),
                "cracked_flagged_pct": round(r["recall"], 1), "good_flagged_pct": round(r["false_alarm_rate"], 1),
                "threshold": r["threshold"], "rule": r["threshold_rule"], "rule_target": r.get("rule_target"),
                "estimated_false_alarm_pct": r.get("estimated_false_alarm_rate"),
                "images_per_s": round(r["images_per_s"], 3), "tiles": r.get("tiles"),
                "geometry": r["geometry_line"], "score_summary": r.get("score_summary"),
            }  # fmt: skip
            print(json.dumps({k: v for k, v in rec.items() if k not in ("data", "score_summary")}), flush=True)
            out.append(rec)
            rows.append([
                run, rec["image_auroc"], rec["pixel_auroc"], rec["cracked_flagged_pct"], rec["good_flagged_pct"],
                f"{r['threshold']:.4f}", rec["images_per_s"],
            ])  # fmt: skip
    print(
        table(
            ["setting", "image AUROC", "pixel AUROC", "cracked flagged %", "good flagged %", "threshold",
             "images/s"],
            rows,
        )
    )  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
