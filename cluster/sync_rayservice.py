"""Regenerate cluster/rayservice.yaml's ``spec.serveConfigV2`` from deploy.yaml.

    python cluster/sync_rayservice.py           # rewrite the serveConfigV2 block
    python cluster/sync_rayservice.py --check   # exit 1 if it is out of date

The RayService runs the same Serve application(s) as ``deploy.yaml``: its
``applications`` are deploy.yaml's, with the few values that must differ on
Kubernetes (:data:`KUBERNETES_VALUES`) put in. Only the ``applications`` key of
serveConfigV2 is regenerated; its other keys (``http_options``,
``proxy_location``) and the rest of the manifest, comments included, stay.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY_YAML = ROOT / "deploy.yaml"
RAYSERVICE_YAML = ROOT / "cluster" / "rayservice.yaml"

KUBERNETES_VALUES: dict[str, Any] = {
    # Pods have no shared disk: the template store is S3 (credentials from the hetmm-s3 Secret).
    "store": "s3://hetmm-templates/store",
    # Replicas share a worker's GPU in pairs; asking for a GPU also keeps them off the CPU head.
    "detector_num_gpus": 0.5,
    "grpc_host": "0.0.0.0",  # line PCs reach the gRPC endpoint from outside the pod (the token is set)
}

_BLOCK = re.compile(r"^(?P<indent> *)serveConfigV2: \|[-+]?\n(?P<body>(?:(?P=indent)  .*\n|\n)*)", re.MULTILINE)


def for_kubernetes(applications: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """deploy.yaml's applications with :data:`KUBERNETES_VALUES` put in."""
    apps = copy.deepcopy(applications)
    for app in apps:
        if "store" in (app.get("args") or {}):
            app["args"]["store"] = KUBERNETES_VALUES["store"]
        if "grpc_host" in (app.get("args") or {}):
            app["args"]["grpc_host"] = KUBERNETES_VALUES["grpc_host"]
        for dep in app.get("deployments") or []:
            if dep.get("name") == "Detector":
                dep.setdefault("ray_actor_options", {})["num_gpus"] = KUBERNETES_VALUES["detector_num_gpus"]
    return apps


def deploy_applications(path: Path = DEPLOY_YAML) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text())["applications"]


def _block(text: str) -> re.Match[str]:
    match = _BLOCK.search(text)
    if match is None:
        raise SystemExit(f"{RAYSERVICE_YAML}: no 'serveConfigV2: |' block found")
    return match


def serve_config(text: str) -> dict[str, Any]:
    """The parsed serveConfigV2 of a RayService manifest's text."""
    return yaml.safe_load(yaml.safe_load(text)["spec"]["serveConfigV2"])


def synced(text: str, applications: list[dict[str, Any]]) -> str:
    """The manifest ``text`` with serveConfigV2's applications replaced by :func:`for_kubernetes` of them."""
    match = _block(text)
    config = serve_config(text)
    config["applications"] = for_kubernetes(applications)
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=120)
    pad = match["indent"] + "  "
    indented = "".join(pad + line if line.strip() else line for line in body.splitlines(keepends=True))
    return text[: match.start()] + f"{match['indent']}serveConfigV2: |\n{indented}" + text[match.end() :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if rayservice.yaml is out of date")
    args = parser.parse_args(argv)
    text = RAYSERVICE_YAML.read_text()
    new = synced(text, deploy_applications())
    if args.check:
        if serve_config(new) != serve_config(text):
            print(f"{RAYSERVICE_YAML} is out of date: run python cluster/sync_rayservice.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        RAYSERVICE_YAML.write_text(new)
        print(f"updated {RAYSERVICE_YAML}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
