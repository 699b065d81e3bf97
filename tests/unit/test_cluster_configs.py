"""cluster/: the AWS launcher config is valid for Ray's launcher; the RayService runs deploy.yaml's application."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from helpers import REPO

ROOT = REPO
CLUSTER = ROOT / "cluster"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def sync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_rayservice", CLUSTER / "sync_rayservice.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- AWS cluster launcher -----------------------------------------------------------------
def test_aws_config_passes_the_launchers_schema() -> None:
    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = load_yaml(CLUSTER / "aws.yaml")
    jsonschema.validate(config, schema)  # what `ray up` checks first
    for key in ("cluster_name", "max_workers", "provider", "auth", "available_node_types", "head_node_type"):
        assert key in config, key
    assert config["provider"]["type"] == "aws" and config["provider"]["region"]
    assert config["head_node_type"] in config["available_node_types"]
    for key in ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        assert config[key], key


def test_aws_head_is_cpu_only_and_gpu_workers_autoscale() -> None:
    config = load_yaml(CLUSTER / "aws.yaml")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert "--num-gpus=0" in " ".join(config["head_start_ray_commands"])
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    assert len(workers) >= 2
    for name, t in workers.items():
        assert t["resources"]["GPU"] >= 1, name
        assert t["node_config"]["InstanceType"].startswith(("g", "p")), name  # AWS GPU instance families
        assert t.get("min_workers", 0) == 0 and t["max_workers"] > t.get("min_workers", 0), name
    assert sum(t["max_workers"] for t in workers.values()) <= config["max_workers"]
    start = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert start.count("--object-store-memory") == 2  # head and workers size their object stores
    assert any("[gpu]" in c for c in config["setup_commands"])


# --- KubeRay RayService -----------------------------------------------------------------
def test_rayservice_runs_deploy_yamls_applications(sync: ModuleType) -> None:
    manifest = load_yaml(CLUSTER / "rayservice.yaml")
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    expected = sync.for_kubernetes(load_yaml(ROOT / "deploy.yaml")["applications"])
    assert served["applications"] == expected, (
        "cluster/rayservice.yaml's serveConfigV2 differs from deploy.yaml: run python cluster/sync_rayservice.py"
    )


def test_rayservice_cluster_shape() -> None:
    manifest = load_yaml(CLUSTER / "rayservice.yaml")
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for c in head["template"]["spec"]["containers"]:
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    groups = cluster["workerGroupSpecs"]
    assert groups
    for g in groups:
        assert g["rayStartParams"] is not None
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] and g["maxReplicas"] > g["minReplicas"]
        (container,) = g["template"]["spec"]["containers"]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    detector = [d for a in served["applications"] for d in a["deployments"] if d["name"] == "Detector"]
    assert detector and all(d["ray_actor_options"]["num_gpus"] > 0 for d in detector)  # replicas on GPU workers


def test_every_ray_node_runs_the_serve_environment() -> None:
    from hetmm_ray.config import SERVE_ENVIRONMENT

    cluster = load_yaml(CLUSTER / "rayservice.yaml")["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:
        for container in pod["template"]["spec"]["containers"]:
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            assert {k: env.get(k) for k in SERVE_ENVIRONMENT} == SERVE_ENVIRONMENT, container["name"]
    aws = load_yaml(CLUSTER / "aws.yaml")
    starts = [c for c in aws["head_start_ray_commands"] + aws["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2
    for command in starts:
        for name, value in SERVE_ENVIRONMENT.items():
            assert f"{name}={value} ray start" in command or f"{name}={value} " in command, command


def test_no_cluster_sends_rays_usage_statistics() -> None:
    """Every way this repository starts a Ray cluster turns Ray's usage statistics off: the image
    every pod of the Kubernetes manifests runs, and the `ray start` commands of aws.yaml and
    local_cluster.sh."""
    assert "\nENV RAY_USAGE_STATS_ENABLED=0\n" in (CLUSTER / "Dockerfile").read_text()
    images = re.compile(r"^\s*image: (\S+)", re.MULTILINE)
    for manifest in ("rayservice.yaml", "rayjob.yaml"):
        text = (CLUSTER / manifest).read_text()
        assert "# built from cluster/Dockerfile" in text
        assert len(set(images.findall(text))) == 1, manifest  # every pod runs that one image
    aws = load_yaml(CLUSTER / "aws.yaml")
    starts = [c for c in aws["head_start_ray_commands"] + aws["worker_start_ray_commands"] if "ray start" in c]
    script = (CLUSTER / "local_cluster.sh").read_text().replace("\\\n", " ")  # continued lines joined
    starts += [line for line in script.splitlines() if '"$RAY" start' in line]
    assert len(starts) == 4 and all("--disable-usage-stats" in c for c in starts), starts


def test_sync_rewrites_only_the_applications(sync: ModuleType) -> None:
    text = (CLUSTER / "rayservice.yaml").read_text()
    apps = load_yaml(ROOT / "deploy.yaml")["applications"]
    changed = [dict(apps[0], route_prefix="/elsewhere"), *apps[1:]]
    new = sync.synced(text, changed)
    assert sync.serve_config(new)["applications"] == sync.for_kubernetes(changed)
    before, after = yaml.safe_load(text), yaml.safe_load(new)
    assert after["spec"]["rayClusterConfig"] == before["spec"]["rayClusterConfig"]
    assert {k: v for k, v in sync.serve_config(new).items() if k != "applications"} == {
        k: v for k, v in sync.serve_config(text).items() if k != "applications"
    }
    assert new.splitlines()[:5] == text.splitlines()[:5]  # comments kept
    assert sync.synced(new, changed) == new  # idempotent


# --- KubeRay RayJob: hetmm inspect ---------------------------------------------------------
def test_rayjob_runs_hetmm_inspect_with_the_real_parser() -> None:
    import shlex

    from hetmm_ray.cli import build_parser
    from hetmm_ray.cli.scoring import cmd_inspect

    manifest = load_yaml(CLUSTER / "rayjob.yaml")
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayJob"
    spec = manifest["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["hetmm", "inspect"]
    args = build_parser().parse_args(argv[1:])  # the entrypoint's flags are the CLI's (exit 2 otherwise)
    assert args.func is cmd_inspect and args.source.startswith("s3://") and args.out.startswith("s3://")
    assert args.store.startswith("s3://") and args.address is None  # RAY_ADDRESS: the job's own cluster
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] >= 1


def test_rayjob_cluster_shape_matches_the_rayservice() -> None:
    job = load_yaml(CLUSTER / "rayjob.yaml")["spec"]["rayClusterSpec"]
    service = load_yaml(CLUSTER / "rayservice.yaml")["spec"]["rayClusterConfig"]
    assert job["rayVersion"] == service["rayVersion"]
    assert job["enableInTreeAutoscaling"] is True
    assert job["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    images = {c["image"] for c in job["headGroupSpec"]["template"]["spec"]["containers"]}
    for g in job["workerGroupSpecs"]:
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] and g["maxReplicas"] > g["minReplicas"]
        (container,) = g["template"]["spec"]["containers"]
        images.add(container["image"])
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        assert {"secretRef": {"name": "hetmm-s3", "optional": True}} in container["envFrom"]
    service_images = {c["image"] for c in service["headGroupSpec"]["template"]["spec"]["containers"]}
    assert images == service_images  # one image for the service and the jobs
