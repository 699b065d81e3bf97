"""``hetmm versions``, ``delete``, ``rollback``, ``repair`` and ``migrate``: the template store's
administration (listing and retention, deleting a product, moving its head back, rebuilding a
broken head, republishing old-layout heads). Candidates are cli/candidates.py's."""

from __future__ import annotations

import argparse
import time

from .common import CLIError, Subcommands, _add_store_flags, _open, _short_operating_point


# --- versions --------------------------------------------------------------------------
def add_versions(sub: Subcommands) -> None:
    p = sub.add_parser("versions", help="list products, or the kept versions of one product (* = head)")
    p.add_argument("--product", help="product name (default: list all products)")
    p.add_argument(
        "--keep", type=int, metavar="N", help="retention: delete all but the newest N versions (never the head)"
    )
    _add_store_flags(p)
    p.set_defaults(func=cmd_versions)


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
    if cands:  # stored beside the head, not served until promoted
        described = ", ".join(f"v{v} (over v{store.record(args.product, v).parent})" for v in cands)
        print(f"candidates: {described}")
    return 0


# --- delete and rollback -----------------------------------------------------------------
def add_delete(sub: Subcommands) -> None:
    p = sub.add_parser("delete", help="delete a product and all its versions from the store")
    p.add_argument("--product", required=True)
    p.add_argument("--yes", action="store_true", help="confirm")
    _add_store_flags(p)
    p.set_defaults(func=cmd_delete)


def cmd_delete(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CLIError(f"deleting {args.product!r} removes every version from {args.store}: add --yes to confirm")
    _open(args).delete_product(args.product)
    print(f"product {args.product} deleted from {args.store}")
    return 0


def add_rollback(sub: Subcommands) -> None:
    p = sub.add_parser("rollback", help="make a kept older version the head")
    p.add_argument("--product", required=True)
    p.add_argument("--version", type=int, required=True)
    _add_store_flags(p)
    p.set_defaults(func=cmd_rollback)


def cmd_rollback(args: argparse.Namespace) -> int:
    store = _open(args)
    store.rollback(args.product, args.version)
    print(f"product {args.product}: head is now v{args.version}")
    return 0


# --- repair and migrate ------------------------------------------------------------------
def add_repair(sub: Subcommands) -> None:
    p = sub.add_parser("repair", help="rebuild a garbage or missing HEAD from the newest version that loads")
    p.add_argument("--product", required=True)
    _add_store_flags(p)
    p.set_defaults(func=cmd_repair)


def cmd_repair(args: argparse.Namespace) -> int:
    done = _open(args).repair(args.product)
    swept = f"; removed {len(done['swept'])} stale temporary file(s)" if done["swept"] else ""
    if done["rebuilt"]:
        print(f"product {args.product}: HEAD rebuilt at v{done['version']} (versions {done['history']}){swept}")
    else:
        print(f"product {args.product}: HEAD is sound (v{done['version']}), left alone{swept}")
    return 0


def add_migrate(sub: Subcommands) -> None:
    p = sub.add_parser("migrate", help="republish old-layout heads so one layer reads without the others")
    p.add_argument("--product", help="one product (default: every product in the store)")
    _add_store_flags(p)
    p.set_defaults(func=cmd_migrate)


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
