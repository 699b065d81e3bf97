"""``geometry.min_defect_px`` gives the same stored product on every path that creates one: ``hetmm
fit --set``, ``hetmm fit --config`` (a YAML file), the Python API (``operations.fit``), an HTTP create
(a JSON body naming a server-side folder) and the request the console's JavaScript would send (the
console has no create form: its ``api()`` pattern, a multipart upload with the admin token and the page's
origin, the job then followed on ``GET /v1/jobs/{id}``, against the one create route). Every product
stores the same grid and canvas, the rule's choice and why (``meta["geometry_choice"]``), the same
frames and threshold. A grid the defect size contradicts is refused on the CLI (exit 2, the setting
named), over HTTP (400, the JSON error shape) and on a tiled detector built directly, and changes no
store.

Frames are 48 x 128 (a non-square frame, so the choice matters): a 16-px defect at resnet18's finest
tap (``layer2``, stride 8) allows 2 frame px per canvas px, so on a 32-px canvas the 48-px height fits
one row and the 128-px width needs two 64-px columns; each 64 x 48 tile then gets the aspect canvas
``round(32 * 64 / 48) = 43``. Tiny frames and a random backbone: CI is a loaded 2-core machine."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from helpers import free_port, png, tiny_cli_flags, until
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.config import ConfigError, DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.geometry_rule import choose_geometry
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

pytestmark = pytest.mark.usefixtures("local_ray")

HEIGHT, WIDTH, CANVAS, PX, STRIDE = 48, 128, 32, 16, 8
IMAGES = 4
TOKEN_ENV = "HETMM_TEST_DEFECT_PATHS_TOKEN"
TOKEN = "defect-paths-token-7c21"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
# the product's settings, every one given (the service's defaults and today's never enter)
PRODUCT = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": CANVAS, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "templates": {"kind": "all"},
    "threshold": {"folds": 2},
    "geometry": {"tile_overlap": 0, "canvas": "aspect"},
}
CLI_FLAGS = [
    *tiny_cli_flags(CANVAS),
    *("--templates", "all", "--set", "threshold.folds=2"),
    *("--set", "geometry.tile_overlap=0", "--set", "geometry.canvas=aspect"),
]


def _expected_geometry() -> tuple[tuple[int, int], int]:
    """The grid and canvas side worked out by hand from the rule's definition (module docstring)."""
    scale = PX / STRIDE  # frame px per canvas px that keep the defect one feature cell wide
    rows, cols = math.ceil(HEIGHT / (scale * CANVAS)), math.ceil(WIDTH / (scale * CANVAS))
    tile_h, tile_w = math.ceil(HEIGHT / rows), math.ceil(WIDTH / cols)
    return (rows, cols), round(CANVAS * max(tile_h, tile_w) / min(tile_h, tile_w))


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of ``IMAGES`` good 48 x 128 PNG frames."""
    folder = tmp_path_factory.mktemp("defectpaths") / "good"
    folder.mkdir()
    part = SyntheticProduct(seed=5, size=WIDTH)
    for i in range(IMAGES):
        Image.fromarray(np.ascontiguousarray(part.good(i)[40 : 40 + HEIGHT])).save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, frames: Path) -> Iterator[dict[str, Any]]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    store = str(tmp_path_factory.mktemp("defectserved") / "store")
    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        args={"admin_token_env": TOKEN_ENV, "template_hosts": 1, "source_roots": [str(frames.parent)]},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    with httpx.Client(base_url=running.url, timeout=300) as client:
        yield {"store": store, "client": client, "url": running.url}
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


def _tree(root: str | Path) -> dict[str, int]:
    """Every file under ``root`` and its size: what a refused create must leave as it was."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(Path(root).rglob("*")) if p.is_file()}


def _console_create(service: dict[str, Any], name: str, frames: Path, fields: dict[str, str]) -> httpx.Response:
    """What the console's ``api("POST", ...)`` sends for a create, the route it would call (it has no
    create form): a ``FormData`` of the files under ``images`` plus text fields, the admin token as a
    bearer header, the page's own origin; 202 with the job, which ``followJob`` then polls."""
    files = [("images", (p.name, p.read_bytes(), "image/png")) for p in sorted(frames.glob("*.png"))]
    headers = {**ADMIN, "Origin": service["url"]}
    return service["client"].post(f"/v1/products/{name}", files=files, data=fields, headers=headers)


def _followed(service: dict[str, Any], started: httpx.Response) -> dict[str, Any]:
    """The job ``started`` once it has ended (the console's ``followJob``: ``GET /v1/jobs/{id}``)."""
    assert started.status_code == 202, started.text
    job_id = started.json()["job"]["id"]

    def ended() -> dict[str, Any] | None:
        job = service["client"].get(f"/v1/jobs/{job_id}", headers=ADMIN).json()["job"]
        return job if job["state"] != "running" else None

    return until(ended, f"create job {job_id} ends", timeout=240)


def _stored(store_dir: str | Path, product: str) -> dict[str, Any]:
    """What a stored version holds of the geometry, its choice and its calibration."""
    store = open_store(store_dir)
    rec = store.record(product, 1)
    return {
        "config": rec.config.stored_dict(),
        "tiles": rec.config.geometry.tiles,
        "image_size": rec.config.backbone.image_size,
        "tile_record": (rec.tiles["grid"], rec.tiles["frame"], rec.tiles.get("whole_view")),
        "choice": store.manifest(product, 1)["meta"].get("geometry_choice"),
        "images": rec.images,
        "digests": rec.image_digests,
        "threshold": load_detector(store, product, device="cpu").operating_point().threshold,
    }


def test_min_defect_px_is_one_rule_on_every_create_path(
    service: dict[str, Any], frames: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid, canvas = _expected_geometry()
    assert (grid, canvas) == ((1, 2), 43)  # the geometry matters here: neither untiled nor the square canvas
    stores = {k: tmp_path / k for k in ("cli_set", "cli_file", "api")}

    # CLI, --set
    code = main(["fit", str(frames), "--product", "p", "--store", str(stores["cli_set"]), *CLI_FLAGS,
                 "--set", f"geometry.min_defect_px={PX}"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("tiles auto:")]
    assert len(said) == 1, out  # what it chose and why, in one line
    assert said[0].startswith(f"tiles auto: {grid[0]} x {grid[1]}, a {PX}-px defect spans at least one {STRIDE}-px")
    assert f"canvas aspect: image_size {canvas}," in said[0]

    # CLI, --config (YAML)
    config_file = tmp_path / "product.yaml"
    on_file = {**PRODUCT, "device": "cpu", "geometry": {**PRODUCT["geometry"], "min_defect_px": PX}}
    config_file.write_text(yaml.safe_dump(on_file))
    assert main(["fit", str(frames), "--product", "p", "--store", str(stores["cli_file"]),
                 "--config", str(config_file)]) == 0  # fmt: skip
    assert said[0] in capsys.readouterr().out.splitlines()

    # Python API
    api = DetectorConfig.from_dict({**PRODUCT, "device": "cpu"}).replace(**{"geometry.min_defect_px": PX})
    operations.fit(open_store(stores["api"]), "p", api, sorted(frames.glob("*.png")))

    # HTTP: a JSON body naming the folder on the server, min_defect_px a number
    body = {"source": str(frames), "config": PRODUCT, "min_defect_px": PX}
    r = service["client"].post("/v1/products/http?wait=true", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    http_job = r.json()["job"]

    # the console's request: a multipart upload with min_defect_px a text field, the job followed
    console_job = _followed(
        service, _console_create(service, "console", frames, {"config": json.dumps(PRODUCT), "min_defect_px": str(PX)})
    )
    assert console_job["state"] == "succeeded", console_job

    products = {name: _stored(path, "p") for name, path in stores.items()}
    products |= {name: _stored(service["store"], name) for name in ("http", "console")}
    cli = products["cli_set"]
    assert cli["tiles"] == grid and cli["image_size"] == canvas
    assert cli["tile_record"] == ([1, 2], [HEIGHT, WIDTH], True)
    assert cli["config"]["geometry"]["min_defect_px"] == PX and cli["images"] == IMAGES
    assert cli["choice"]["tiles"] == list(grid) and f"a {PX}-px defect spans" in cli["choice"]["why"]
    assert cli["choice"]["canvas"].startswith(f"canvas aspect: image_size {canvas}, a 64 x 48 tile")
    for name, got in products.items():
        assert got["config"] == cli["config"], name  # the whole stored configuration: grid, canvas, all
        assert got["tile_record"] == cli["tile_record"], name
        assert got["choice"] == cli["choice"], name
        assert got["images"] == IMAGES and got["digests"] == cli["digests"], name
        assert got["threshold"] == pytest.approx(cli["threshold"], rel=1e-6), name
    # the service's job records say the same as the product stores
    assert http_job["tiles_auto"] == console_job["tiles_auto"] == cli["choice"]


def test_a_grid_the_defect_size_contradicts_is_refused_everywhere(
    service: dict[str, Any], frames: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    contradiction = f"tiles 2 x 1 and min_defect_px {PX} ask for different grids"
    store = tmp_path / "cli"
    assert main(["fit", str(frames), "--product", "p", "--store", str(store), *CLI_FLAGS]) == 0
    capsys.readouterr()
    before = _tree(store)
    code = main(["fit", str(frames), "--product", "q", "--store", str(store), *CLI_FLAGS,
                 "--set", f"geometry.min_defect_px={PX}", "--set", "geometry.tiles=[2,1]"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hetmm: error: geometry:") and contradiction in err, err
    assert "picks 1 x 2" in err
    assert _tree(store) == before

    served = service["store"]
    before = _tree(served)
    fields = {"config": json.dumps(PRODUCT), "min_defect_px": str(PX), "tiles": "2x1"}
    r = _console_create(service, "refused", frames, fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"code", "message"} and error["code"] == "bad_config", error
    assert contradiction in error["message"], error
    body = {"source": str(frames), "config": PRODUCT, "min_defect_px": PX, "tiles": [2, 1]}
    r = service["client"].post("/v1/products/refused?wait=true", json=body, headers=ADMIN)
    assert r.status_code == 400 and contradiction in r.json()["error"]["message"], r.text
    assert "refused" not in open_store(served).products() and _tree(served) == before

    # a tiled detector built directly fits its grid as given: one the defect size contradicts is refused
    given = DetectorConfig.from_dict({**PRODUCT, "device": "cpu"})
    given = given.replace(**{"geometry.min_defect_px": PX, "geometry.tiles": [1, 3]})
    with pytest.raises(ConfigError, match=f"tiles 1 x 3 and min_defect_px {PX} ask for different grids"):
        TiledHETMM(given).fit(sorted(frames.glob("*.png")))


def test_frames_sent_as_bytes_and_as_files_choose_alike(frames: Path) -> None:
    """The HTTP create's rule reads the uploaded bytes' headers, the CLI's the files': one answer."""
    config = DetectorConfig.from_dict(PRODUCT).replace(**{"geometry.min_defect_px": PX})
    paths = sorted(frames.glob("*.png"))
    as_files = choose_geometry(config, paths)
    assert choose_geometry(config, [p.read_bytes() for p in paths]) == as_files
    assert choose_geometry(config, [png(np.asarray(Image.open(p))) for p in paths]) == as_files
    assert choose_geometry(as_files.config, paths).config == as_files.config  # resolved: resolves to itself
