"""``hetmm evaluate --store --report`` stores the report as the product's latest, and the real service
(Ray Serve on 127.0.0.1, the same local store) serves it read-only under the product's path.

On a tiny synthetic set (a random resnet18 on a 32-px canvas: seconds per evaluate) the CLI publishes
``gear`` v1 with its report; the service describes it (``GET .../report``), serves the page byte for
byte under a Content-Security-Policy that runs no script, and every picture the page shows; the
console's page and script carry the link. Names out of the report (a path out of it, another
suffix, a stored object beside it) are 404 in the JSON error shape, as are an unknown product and a
product without a report. A second evaluate replaces the report (tagged v2), and deleting the
product removes it. The console's link in a real browser: tests/integration/serve/test_console.py.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from helpers import free_port, tiny_cli_flags

from hetmm_ray.cli import main
from hetmm_ray.data.synthetic import write_mvtec_layout
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SIZE = 32
FLAGS = tiny_cli_flags(SIZE)
TOKEN_ENV = "HETMM_TEST_REPORT_TOKEN"
TOKEN = "report-token-5c1e"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def evaluate(*args: str) -> str:
    """``hetmm evaluate`` in this process; what it printed (asserting it succeeded)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["evaluate", *args, *FLAGS])
    assert rc == 0, printed.getvalue()
    return printed.getvalue()


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.src: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.src.append(dict(attrs)["src"] or "")


def images_of(html: str) -> list[str]:
    parser = _Images()
    parser.feed(html)
    return parser.src


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("report-http")
    data = write_mvtec_layout(root / "gear", n_train=6, n_test_good=3, n_test_per_defect=2, size=SIZE)
    store = str(root / "store")
    printed = evaluate("--data", str(data), "--store", store, "--report", str(root / "r1"))
    assert "published templates as gear v1" in printed and "stored the report as gear's latest (v1" in printed
    evaluate("--data", str(data), "--store", store, "--product", "plain")  # no --report: no report stored
    assert open_store(store).latest_report("plain") is None
    return {"root": root, "data": data, "store": store, "report": root / "r1"}


@pytest.fixture(scope="module")
def service(evaluated: dict[str, Any]) -> Iterator[str]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=evaluated["store"],
        port=free_port(),
        args={"admin_token_env": TOKEN_ENV},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    yield running.url
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


@pytest.fixture(scope="module")
def api(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, timeout=120) as c:
        yield c


def raw_get(base: str, path: str) -> tuple[int, dict[str, Any] | None]:
    """GET ``path`` exactly as written (no client normalising ``..`` or decoding ``%2F``)."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(body)
    except ValueError:
        return r.status, None


def test_the_service_serves_the_stored_report_page_and_its_pictures(
    api: httpx.Client, evaluated: dict[str, Any]
) -> None:
    folder: Path = evaluated["report"]
    described = api.get("/v1/products/gear/report")
    assert described.status_code == 200, described.text
    report = described.json()["report"]
    assert report["version"] == 1 and report["url"] == "/v1/products/gear/report/"
    page = api.get(report["url"])
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "img-src 'self'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.content == (folder / "index.html").read_bytes()
    images = images_of(page.text)
    assert "histogram.png" in images and "roc.png" in images and any(s.startswith("gallery/") for s in images)
    assert sorted(report["files"]) == sorted({"index.html", *images})
    for src in images:  # every picture the page shows, at the URL a browser resolves it to
        r = api.get(urljoin(str(page.url), src))
        assert r.status_code == 200, (src, r.text)
        assert r.headers["content-type"] == "image/png"
        assert r.content == (folder / src).read_bytes() and r.content.startswith(b"\x89PNG")
    assert report["bytes"] == sum((folder / n).stat().st_size for n in report["files"])


def test_the_console_carries_the_link(api: httpx.Client) -> None:
    page = api.get("/ui/")
    assert page.status_code == 200 and 'data-testid="product-report"' in page.text
    script = api.get("/ui/app.js").text
    assert "/report`" in script and "Latest evaluation report (v${report.version}" in script


@pytest.mark.parametrize(
    "path",
    [
        "/v1/products/gear/report/..%2FHEAD",
        "/v1/products/gear/report/%2E%2E/%2E%2E/gear/HEAD",
        "/v1/products/gear/report/..%2Fversions%2F000001.json",
        "/v1/products/gear/report/LATEST.json",
        "/v1/products/gear/report/gallery/..%2F..%2FLATEST.json",
        "/v1/products/gear/report/app.js",
        "/v1/products/gear/report/nothing.png",
        "/v1/products/gear/report/%2Fetc%2Fpasswd",
    ],
)
def test_names_out_of_the_report_are_json_404s(service: str, path: str) -> None:
    status, body = raw_get(service, path)
    assert status == 404, (path, body)
    assert body is not None and body["error"]["code"] == "not_found", body


def test_unknown_product_and_no_report_are_json_404s(api: httpx.Client) -> None:
    r = api.get("/v1/products/nowhere/report/")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_product"
    assert api.get("/v1/products/nowhere/report").status_code == 404
    assert api.get("/v1/products/plain/report").json() == {"product": "plain", "report": None}
    for path in ("/v1/products/plain/report/", "/v1/products/plain/report/index.html"):
        r = api.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        assert "no evaluation report" in r.json()["error"]["message"]


def test_the_report_routes_are_read_only(api: httpx.Client) -> None:
    for method in ("POST", "PUT", "DELETE"):
        r = api.request(method, "/v1/products/gear/report/index.html", headers=ADMIN)
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed", (method, r.text)


def test_a_later_evaluate_replaces_the_report_and_delete_removes_it(
    api: httpx.Client, evaluated: dict[str, Any]
) -> None:
    root: Path = evaluated["root"]
    evaluate("--data", str(evaluated["data"]), "--store", evaluated["store"], "--product", "gear2",
             "--report", str(root / "g2a"))  # fmt: skip
    evaluate("--data", str(evaluated["data"]), "--store", evaluated["store"], "--product", "gear2",
             "--report", str(root / "g2b"))  # fmt: skip
    assert api.get("/v1/products/gear2/report").json()["report"]["version"] == 2
    page = api.get("/v1/products/gear2/report/")
    assert page.content == (root / "g2b" / "index.html").read_bytes()
    deleted = api.delete("/v1/products/gear2", headers=ADMIN)
    assert deleted.status_code == 200, deleted.text
    assert api.get("/v1/products/gear2/report/").status_code == 404
    assert list(open_store(evaluated["store"]).backend.list("gear2/")) == []
