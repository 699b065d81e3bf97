"""Hardening, the parts without a running service: the CLI, the store and the configuration.

What a careless operator can do: non-finite or absurd settings, a product name with
a trailing newline, a garbage or deleted HEAD, a writer killed mid-object, folders
holding things that are not images, retried updates, and an embedded Ray that
listened on every interface. Each test failed before the fix. Store tests run on a
local folder and on the moto S3 server (tests/integration/store/test_store.py's fixtures).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from PIL import Image
from s3_server import new_bucket

from hetmm_ray.cli import main
from hetmm_ray.config import (
    NUMERIC_RANGES,
    ConfigError,
    DetectorConfig,
    ReplicaSettings,
    ScoringConfig,
    ServiceConfig,
    load_config,
)
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.store import StoreCorrupt, StoreError, check_product_name, open_store

ROOT = REPO
SIZE = 64
FLAGS = ["--backbone", "resnet18", "--weights", "random", "--set", f"backbone.image_size={SIZE}"]
FLAGS += ["--set", "threshold.max_images=4", "--set", "threshold.folds=2"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *words: str) -> str:
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.strip() and "%|" not in x]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("hetmm: error: "), lines
    assert "unexpected" not in lines[0] and "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def save_png(array: np.ndarray, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


@pytest.fixture(scope="module")
def gear() -> SyntheticProduct:
    return SyntheticProduct(seed=11, size=SIZE)


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path) -> tuple[str, list[str]]:
    """A fresh store (URI for the Python API, CLI flags for the same store)."""
    if request.param == "local":
        uri = str(tmp_path / "store")
        return uri, ["--store", uri]
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = new_bucket(endpoint)
    return f"s3://{bucket}/t?endpoint={endpoint}", ["--store", f"s3://{bucket}/t", "--endpoint-url", endpoint]


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory, gear) -> Path:
    folder = tmp_path_factory.mktemp("good")
    for i in range(5):
        save_png(gear.good(i), folder / f"{i:02d}.png")
    return folder


# --- 3: numeric settings -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, key",
    [
        ({"threshold": {"sigmas": math.inf}}, "threshold.sigmas"),
        ({"threshold": {"sigmas": math.nan}}, "threshold.sigmas"),
        ({"scoring": {"score_sigma": 1e9}}, "scoring.score_sigma"),
        ({"scoring": {"score_sigma": math.inf}}, "scoring.score_sigma"),
        ({"scoring": {"output_size": -5}}, "scoring.output_size"),
        ({"scoring": {"forward_windows": [100001, 7, 5]}}, "scoring.forward_windows"),
        ({"scoring": {"layer_weights": [1, math.inf, 1]}}, "scoring.layer_weights"),
        ({"scoring": {"map_sigma": math.nan}}, "scoring.map_sigma"),
        ({"templates": {"sheets": 10**9}}, "templates.sheets"),
        ({"threshold": {"folds": True}}, "threshold.folds"),
        ({"batch_size": 10**7}, "batch_size"),
    ],
)
def test_out_of_range_and_non_finite_settings_are_refused(data, key) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        DetectorConfig.from_dict(data)


def test_service_and_replica_numbers_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"service\.job_wait_s"):
        ServiceConfig(job_wait_s=math.inf)
    with pytest.raises(ConfigError, match=r"service\.store_poll_s"):
        ServiceConfig(store_poll_s=math.nan)
    with pytest.raises(ConfigError, match=r"user_config\.sigmas"):
        ReplicaSettings(sigmas=math.inf)
    assert ScoringConfig(output_size=None).output_size is None  # null stays allowed where it is the default


@pytest.mark.parametrize("text", ['{"threshold": {"sigmas": NaN}}', '{"threshold": {"sigmas": Infinity}}'])
def test_config_files_with_non_finite_numbers_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"threshold\.sigmas"):
        load_config(path)
    (tmp_path / "c.yaml").write_text("threshold:\n  sigmas: .inf\n")
    with pytest.raises(ConfigError, match=r"threshold\.sigmas"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_set_flag_refuses_non_finite_numbers(capsys, good_folder: Path, tmp_path: Path, value: str) -> None:
    code, _, err = run(capsys, "fit", good_folder, "--product", "p", "--store", tmp_path / "s", *FLAGS,
                       "--set", f"threshold.sigmas={value}")  # fmt: skip
    one_line_error(code, err, "threshold.sigmas")
    assert not (tmp_path / "s").exists()


def test_predict_sigmas_must_be_finite_and_in_range(capsys, good_folder: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    assert run(capsys, "fit", good_folder, "--product", "p", "--store", store, *FLAGS)[0] == 0
    for bad in ("nan", "inf", "-5"):
        code, _, err = run(capsys, "predict", good_folder, "--product", "p", "--store", store, "--sigmas", bad,
                             "--json", tmp_path / "r.json")  # fmt: skip
        one_line_error(code, err, "threshold.sigmas")
        assert not (tmp_path / "r.json").exists()
    code, _, _ = run(capsys, "predict", good_folder, "--product", "p", "--store", store, "--sigmas", "2",
                     "--json", tmp_path / "r.json")  # fmt: skip
    assert code == 0
    json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))


def test_configuration_reference_lists_every_numeric_setting_with_its_range() -> None:
    """The generated configuration reference states NUMERIC_RANGES, and every numeric field of every
    config class has a range."""
    from hetmm_ray.reference import config_rows

    rows = {row.key: row.allowed for row in config_rows()}
    for key, (lo, hi, kind) in NUMERIC_RANGES.items():
        assert key in rows, f"the configuration reference lacks {key}"
        assert f"{'integer' if kind is int else 'number'} in [{lo:g}, {hi:g}]" in rows[key], key
    import dataclasses
    import typing

    from hetmm_ray.config import BackboneConfig, TemplateConfig, ThresholdConfig

    classes = {
        "backbone.": BackboneConfig,
        "scoring.": ScoringConfig,
        "templates.": TemplateConfig,
        "threshold.": ThresholdConfig,
        "": DetectorConfig,
        "service.": ServiceConfig,
        "user_config.": ReplicaSettings,
    }
    for prefix, cls in classes.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = str(hints[f.name])
            if re.search(r"\b(int|float)\b", hint) and "str" not in hint:
                assert prefix + f.name in NUMERIC_RANGES, f"{prefix + f.name} ({hint}) has no declared range"


# --- 9: names, HEAD repair, temporary files, folder mode, one-line errors ----------------------------
def test_product_names_must_match_entirely(location, gear) -> None:
    uri, _ = location
    for bad in ("nl\n", "ok\n", "a\nb", "x\r"):
        with pytest.raises(StoreError, match="invalid product name"):
            check_product_name(bad)
    store = open_store(uri)
    from hetmm_ray.detection.detector import HETMM

    det = HETMM(DetectorConfig.from_dict({"backbone": {"name": "resnet18", "weights": "random", "image_size": SIZE}}))
    det.fit([gear.good(i) for i in range(2)])
    with pytest.raises(StoreError, match="invalid product name"):
        store.put("nl\n", det.templates)
    assert store.products() == []
    if "://" not in uri:
        assert not any(p.name.startswith("nl") for p in Path(uri).glob("*"))


def _three_versions(capsys, flags: list[str], good_folder: Path, more: Path) -> None:
    assert run(capsys, "fit", good_folder, "--product", "p", *flags, *FLAGS)[0] == 0
    for i in range(2):
        folder = more / str(i)
        save_png(SyntheticProduct(seed=11, size=SIZE).good(100 + i), folder / "n.png")
        assert run(capsys, "update", folder, "--product", "p", *flags)[0] == 0


@pytest.mark.parametrize("damage", ["garbage", "deleted"])
def test_repair_rebuilds_head_from_the_newest_valid_manifest(capsys, location, good_folder, tmp_path, damage) -> None:
    uri, flags = location
    _three_versions(capsys, flags, good_folder, tmp_path / "more")
    store = open_store(uri)
    assert store.head("p") == 3
    if damage == "garbage":
        store.backend.write("p/HEAD", b"\x00garbage{")
        with pytest.raises(StoreCorrupt):
            store.head("p")
        code, _, err = run(capsys, "rollback", "--product", "p", "--version", "2", *flags)
        one_line_error(code, err, "head pointer")  # still refused: the HEAD is unreadable
    else:
        store.backend.delete(["p/HEAD"])
        assert store.products() == []
    # A broken newest manifest is skipped: the head goes to the newest version that loads.
    key = "p/versions/000003.json"
    good3, _ = store.backend.read(key)
    store.backend.write(key, good3.replace(b'"images"', b'"imagez"', 1))
    code, out, err = run(capsys, "repair", "--product", "p", *flags)
    assert code == 0, err
    assert "HEAD rebuilt at v2" in out and "[1, 2]" in out
    assert store.head("p") == 2 and store.versions("p") == [1, 2]
    assert store.get("p").meta["version"] == 2
    # Fixed manifest, repair again: a sound HEAD is left alone.
    store.backend.write(key, good3)
    code, out, _ = run(capsys, "repair", "--product", "p", *flags)
    assert code == 0 and "left alone" in out and store.head("p") == 2
    # And the next publish continues the numbering (no orphaned versions).
    folder = tmp_path / "more" / "x"
    save_png(SyntheticProduct(seed=11, size=SIZE).good(200), folder / "n.png")
    assert run(capsys, "update", folder, "--product", "p", *flags)[0] == 0
    assert store.head("p") == 4 and store.get("p", 4).meta["parent"] == 2


def test_a_garbage_head_does_not_block_delete(capsys, location, good_folder) -> None:
    uri, flags = location
    assert run(capsys, "fit", good_folder, "--product", "p", *flags, *FLAGS)[0] == 0
    store = open_store(uri)
    store.backend.write("p/HEAD", b"not json")
    code, _, err = run(capsys, "delete", "--product", "p", "--yes", *flags)
    assert code == 0, err
    assert list(store.backend.list("p/")) == []


def test_stale_temporary_files_are_swept(capsys, good_folder, tmp_path) -> None:
    store_dir = tmp_path / "store"
    assert run(capsys, "fit", good_folder, "--product", "p", "--store", store_dir, *FLAGS)[0] == 0
    objects = store_dir / "p" / "objects"
    stale = objects / ".abc.safetensors.k1ll3d.tmp"  # what a SIGKILL mid-write leaves
    stale.write_bytes(b"x" * 1000)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = objects / ".def.safetensors.wr1t1ng.tmp"  # a writer in another process, still writing
    fresh.write_bytes(b"y")
    code, out, _ = run(capsys, "repair", "--product", "p", "--store", store_dir)
    assert code == 0 and "removed 1 stale temporary file" in out
    assert not stale.exists() and fresh.exists()
    stale2 = store_dir / "p" / ".HEAD.zzz.tmp"
    stale2.write_bytes(b"{")
    os.utime(stale2, (old, old))
    folder = tmp_path / "n"
    save_png(SyntheticProduct(seed=11, size=SIZE).good(77), folder / "n.png")
    assert run(capsys, "update", folder, "--product", "p", "--store", store_dir)[0] == 0  # publishing sweeps too
    assert not stale2.exists() and fresh.exists()


def test_folder_mode_reports_what_it_skips(capsys, gear, tmp_path) -> None:
    folder = tmp_path / "mixed"
    for i in range(2):
        save_png(gear.good(i), folder / f"{i}.png")
    Image.fromarray(gear.good(5)).save(folder / "anim.gif")
    os.mkfifo(folder / "pipe.png")
    (folder / "loop.png").symlink_to(folder / "loop.png")
    (folder / "dir.png").mkdir()
    (folder / ".hidden.png").write_bytes(b"")
    code, out, err = run(capsys, "fit", folder, "--product", "p", "--store", tmp_path / "s", *FLAGS)
    assert code == 0, err
    skipped = {Path(m.group(1)).name: m.group(2) for m in re.finditer(r"hetmm: skipped: (\S+): (.+)", err)}
    assert set(skipped) == {"anim.gif", "pipe.png", "loop.png", "dir.png"}, err
    assert "FIFO" in skipped["pipe.png"] and "directory" in skipped["dir.png"]
    assert "image suffix" in skipped["anim.gif"] and "cannot be read" in skipped["loop.png"]
    assert "from 2 good images" in out


def test_fit_with_one_image_is_a_one_line_error(capsys, gear, tmp_path) -> None:
    save_png(gear.good(0), tmp_path / "one" / "0.png")
    code, _, err = run(capsys, "fit", tmp_path / "one", "--product", "p", "--store", tmp_path / "s", *FLAGS)
    one_line_error(code, err, "at least 2 good images")


def test_serve_on_an_open_address_without_a_token_is_a_one_line_error(capsys, monkeypatch) -> None:
    monkeypatch.delenv("HETMM_ADMIN_TOKEN", raising=False)
    code, _, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", "1")
    one_line_error(code, err, "refusing to serve on non-loopback address", "HETMM_ADMIN_TOKEN")


# --- 5: idempotent hot updates (the CLI path; the HTTP path is in test_hardening_serve.py) ------------
def test_update_skips_images_already_in_the_bank(capsys, location, good_folder, tmp_path, gear) -> None:
    uri, flags = location
    assert run(capsys, "fit", good_folder, "--product", "p", *flags, *FLAGS)[0] == 0
    store = open_store(uri)
    threshold = store.manifest("p", 1)["calibration"]
    retry = tmp_path / "retry"
    for i in range(3):  # three images the product already has, one new
        save_png(gear.good(i), retry / f"again{i}.png")
    save_png(gear.good(50), retry / "new.png")
    code, out, err = run(capsys, "update", retry, "--product", "p", *flags)
    assert code == 0 and "skipped: 3 image(s) already in v1" in err
    assert "with 1 more good images, 6 in all" in out
    code, out, err = run(capsys, "update", retry, "--product", "p", *flags)  # the same again: a retry
    assert code == 0 and "no new images; head stays v2" in out and "skipped: 4" in err
    assert store.head("p") == 2 and store.versions("p") == [1, 2]
    assert store.get("p").n_images == 6 and len(set(store.get("p").image_digests)) == 6
    assert threshold == store.manifest("p", 1)["calibration"]


# --- 8: the embedded Ray listens on loopback only -----------------------------------------------------
START_RAY = r"""
from hetmm_ray.distributed.runtime import connect
import ray
connect(num_cpus=1)
@ray.remote
def pid():
    import os
    return os.getpid()
ray.get([pid.remote() for _ in range(2)])
extra = {}
"""

# The embedded service: one product, one predict over HTTP (ingress -> detector replica over Serve's
# inter-deployment gRPC), then the same listener census, Serve's replicas included.
START_SERVICE = r"""
import io, socket, tempfile
import httpx
from PIL import Image
import ray
from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.serve.run import start_service, stop_service
from hetmm_ray.store import open_store
store = tempfile.mkdtemp()
gear = SyntheticProduct(seed=0, size=64)
config = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
    templates=TemplateConfig(kind="all"),
    threshold=ThresholdConfig(max_images=4, folds=2),
)
HETMM(config).fit([gear.good(i) for i in range(4)]).save(open_store(store), "p")
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
running = start_service(store=store, port=port, num_cpus=2)
buf = io.BytesIO()
Image.fromarray(gear.good(9)).save(buf, format="PNG")
answer = httpx.post(f"{running.url}/v1/products/p/predict", content=buf.getvalue(),
                    headers={"content-type": "image/png"}, timeout=120)
extra = {"predict_status": answer.status_code}
"""

LISTENERS = r"""
import json, os, re, subprocess, sys
import psutil
from hetmm_ray.compat.ray import driver_node
node = driver_node()
roots = [p.process.pid for procs in node.all_processes.values() for p in procs] + [os.getpid()]
pids = set()
for r in roots:
    try:
        pids |= {r, *(c.pid for c in psutil.Process(r).children(recursive=True))}
    except psutil.Error:
        pass
out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
found = []
for line in out.splitlines():
    if any(int(p) in pids for p in re.findall(r"pid=(\d+)", line)):
        found.append((line.split()[3], re.search(r'\(\("([^"]+)"', line).group(1)))
print(json.dumps({"node_ip": node.node_ip_address, "listeners": found, **extra}))
"""


def listener_census(start: str) -> dict:
    """Run ``start`` (it joins the embedded Ray) then list every socket its processes listen on."""
    if subprocess.run(["which", "ss"], capture_output=True).returncode != 0:
        pytest.skip("ss (iproute2) is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    script = start + LISTENERS + "ray.shutdown()\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["node_ip"] == "127.0.0.1"
    for address, name in report["listeners"]:
        host = address.rsplit(":", 1)[0].strip("[]")
        assert host in ("127.0.0.1", "::ffff:127.0.0.1", "::1"), f"{name} listens on {address}"
    return report


def test_embedded_ray_listens_on_loopback_only() -> None:
    """Every socket the embedded Ray's processes listen on (``ss -ltnp``) is bound to 127.0.0.1."""
    report = listener_census(START_RAY)
    print(f"\nembedded Ray listeners: {report}")
    names = {name for _, name in report["listeners"]}
    assert {"gcs_server", "raylet"} <= names, names


def test_embedded_service_listens_on_loopback_only() -> None:
    """The embedded service too: Serve's proxy and replicas, whose inter-deployment gRPC server Ray
    binds to every interface unless told otherwise (distributed.runtime.serve_grpc_on_loopback),
    after a predict has crossed it."""
    report = listener_census(START_SERVICE)
    print(f"\nembedded service listeners: {report}")
    assert report["predict_status"] == 200
    names = {name for _, name in report["listeners"]}
    assert any(n.startswith("ray::ServeRepl") for n in names), names  # the replicas were counted
