"""``hetmm demo``: the service end to end on a generated product (hetmm_ray/demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import Subcommands, _add_address_flag, _add_config_flags, _config_from


def add_demo(sub: Subcommands) -> None:
    p = sub.add_parser("demo", help="the service end to end on a generated product: create, predict, hot update")
    p.add_argument("--out", default="out/demo", help="output folder (default out/demo)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000, another free one if taken)")
    _add_address_flag(p, "run on")
    p.add_argument("--train-images", type=int, default=30, help="generated good images to fit on")
    _add_config_flags(p, templates=False)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(Path(args.out), config=_config_from(args), n_train=args.train_images, port=args.port, address=args.address)
    return 0
