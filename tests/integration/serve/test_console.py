"""The inspection console (``GET /ui/``) in a real browser against a real service.

Debian's ``chromium`` driven by Playwright (``executable_path``; Playwright's own browser
download is never used) clicks through the page like a line engineer, against the
deploy.yaml application started by ``start_service`` on 127.0.0.1 (real Ray Serve, real
HTTP, a local store) with an admin token. The product is a synthetic gear at 64 px with a
random ResNet-18 (the claims are about the loop, not accuracy) and ``templates: all``, so
an image inserted as a normal matches itself: "good part" must really bring its score
below the threshold of the new version.

Missing browser or Playwright: the module is skipped with the reason, except under
``CI=true`` where it fails (``.ci/run`` installs chromium with apt-get).

Screenshots of the main views go to ``out/ui/`` (docs/service.md, "Console"); the time to
first render with 20 products and 500 recent predictions goes to ``out/ui/timings.json``.

Every test sets up what it needs and runs alone or in any subset (``-k``): the module builds
the store, the service, the browser and the page once; a test that changes a product works on
a product of its own (:func:`fresh_product`: v1 of the same fitted gear under a new name) and
brings it to the state it starts from through the API, never through another test. Waits poll
a condition with bounds sized for a loaded 2-core CI machine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from browser import launch, skip_without_browser
from helpers import REPO, finished_job, free_port, png

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SHOTS = REPO / "out" / "ui"
TOKEN_ENV = "HETMM_CONSOLE_TEST_TOKEN"
TOKEN = "console-token-81d3"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
PRODUCT = "gear"  # read-only: its v1 is never changed (tests that change a product make their own)
EXTRA_PRODUCTS = [f"line-{i:02d}" for i in range(19)]  # 20 products in all
WARNED = "line-warned"  # a threshold far above every good score (sigmas 100): its row carries the warning
RECENT = 500  # predictions of PRODUCT recorded before the load measurement
SIZE = 64
GEAR = SyntheticProduct(seed=7, size=SIZE)
# Chosen for this seed/size/backbone (checked at the top of the flow test): flagged at v1.
FLAGGED = GEAR.defective(1, "hole")[0]
CONFIRMED = GEAR.defective(2, "hole")[0]

# Every request the page sent that needs the admin token (writes, job progress), replayed without it.
_requests: list[dict[str, Any]] = []
UI_WAIT_S = 120.0  # a condition in the page (a loaded 2-core CI machine renders slowly)
JOB_WAIT_S = 300.0  # a hot update or calibration job (a fit of new images on that machine)
_console: list[str] = []  # the page's console errors (a Content-Security-Policy violation would be one)


MISSING = skip_without_browser()  # at import: Ray and the service never start


@pytest.fixture(scope="module", autouse=True)
def _browser_required_under_ci() -> None:
    if MISSING is not None:  # only reached under CI=true: fail every test here, run the other modules
        pytest.fail(f"console browser tests under CI=true: {MISSING}", pytrace=False)


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=6, folds=3),
        batch_size=8,
    )


@pytest.fixture(scope="module")
def gear() -> HETMM:
    """The gear product's v1, fitted once: saved as PRODUCT and as every test's own product."""
    return HETMM(config()).fit([GEAR.good(j) for j in range(6)])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, gear: HETMM) -> str:
    uri = str(tmp_path_factory.mktemp("console") / "store")
    s = open_store(uri)
    gear.save(s, PRODUCT)
    other = HETMM(config()).fit([SyntheticProduct(seed=3, size=SIZE).good(j) for j in range(4)])
    for name in EXTRA_PRODUCTS:  # the Products view with 20 rows (scoring them is not the point)
        other.save(s, name)
    far_above = config().replace(**{"threshold.rule": "sigmas", "threshold.sigmas": 100.0})
    HETMM(far_above).fit([SyntheticProduct(seed=3, size=SIZE).good(j) for j in range(4)]).save(s, WARNED)
    return uri


@pytest.fixture(scope="module")
def service(store: str) -> Iterator[str]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        args={"admin_token_env": TOKEN_ENV, "recent_per_product": RECENT, "max_images_per_request": 50},
        deployments={
            "Detector": {
                "num_replicas": 1,
                "ray_actor_options": {"num_cpus": 0.5},
                "user_config": {"max_batch_size": 16, "batch_wait_timeout_s": 0.002, "threads": 1},
            }
        },
    )
    yield running.url
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


@pytest.fixture(scope="module")
def api(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def browser(service: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser: Any, service: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(1000 * UI_WAIT_S)

    def keep(request: Any) -> None:
        if (request.method != "GET" and "/v1/" in request.url) or "/v1/jobs/" in request.url:
            _requests.append(
                {
                    "method": request.method,
                    "url": request.url,
                    "headers": dict(request.headers),
                    "body": request.post_data_buffer,
                }
            )

    pg.on("request", keep)
    pg.on("console", lambda m: _console.append(m.text) if m.type == "error" else None)
    pg.goto(f"{service}/ui/#products")
    pg.wait_for_selector("body[data-ready=products]")
    yield pg
    context.close()


def until(page: Any, js: str, arg: Any = None, timeout: float = UI_WAIT_S) -> None:
    """Poll ``js`` (a function of ``arg``) in the page until it is truthy. Not wait_for_function: that
    evaluates strings with eval inside the page, which the console's Content-Security-Policy refuses."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(js, arg):
        assert time.monotonic() < deadline, f"timed out waiting for {js}"
        time.sleep(0.05)


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def goto(page: Any, view: str) -> None:
    page.evaluate(  # on that view already: no hashchange, nothing to wait for
        "(v) => { if (location.hash === '#' + v) return; document.body.dataset.ready = ''; location.hash = '#' + v; }",
        view,
    )
    page.wait_for_selector(f"body[data-ready={view}]")


def upload(page: Any, tmp_path: Path, name: str, image: np.ndarray) -> Any:
    """Pick one file in Inspect; the new result card (the first one)."""
    goto(page, "inspect")
    path = tmp_path / name
    path.write_bytes(png(image))
    before = page.locator("[data-testid=inspect-results] [data-testid=result-card]").count()
    page.set_input_files("[data-testid=file-input]", str(path))
    cards = page.locator("[data-testid=inspect-results] [data-testid=result-card]")
    until(
        page, f"document.querySelectorAll('[data-testid=inspect-results] [data-testid=result-card]').length > {before}"
    )
    return cards.first


def set_token(page: Any, token: str) -> None:
    page.fill("[data-testid=token-input]", token)
    page.click("[data-testid=token-save]")


def head(api: httpx.Client, product: str = PRODUCT) -> int:
    return next(p["version"] for p in api.get("/v1/products").json()["products"] if p["product"] == product)


def score(api: httpx.Client, image: np.ndarray, product: str = PRODUCT) -> dict:
    r = api.post(f"/v1/products/{product}/predict", content=png(image), headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    return r.json()


def product_names(api: httpx.Client) -> list[str]:
    return [p["product"] for p in api.get("/v1/products").json()["products"]]


@pytest.fixture
def fresh_product(request: pytest.FixtureRequest, store: str, gear: HETMM, api: httpx.Client) -> str:
    """A product of this test's own at v1 (the gear's v1 under the test's name), listed by the service."""
    name = "t-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    gear.save(open_store(store), name)
    assert name in product_names(api)  # the registry lists what the store holds
    return name


def use_product(page: Any, product: str) -> None:
    """Select ``product`` in the page: reloaded, so the product list is read again (the token is kept:
    the tab's sessionStorage), on the Products view."""
    page.reload()
    until(page, "() => !!document.body.dataset.ready")  # the first render after the load is done
    goto(page, "products")
    if page.evaluate("() => document.getElementById('product').value") != product:
        page.evaluate("() => { document.body.dataset.ready = ''; }")
        page.select_option("#product", product)  # its change event selects it and renders the view again
        page.wait_for_selector("body[data-ready=products]")


def teach_good_by_api(api: httpx.Client, product: str, image: np.ndarray) -> None:
    """What the page's "Good part" does, through the API: a hot update with ``image``, then its label."""
    body, kind = png(image), {"content-type": "image/png"}
    finished(api, api.post(f"/v1/products/{product}/normals?wait=true", content=body, headers={**ADMIN, **kind}))
    label_by_api(api, product, image, "good")


def finished(api: httpx.Client, started: httpx.Response) -> dict[str, Any]:
    """The job ``started`` answered, once it succeeded (``helpers.finished_job``)."""
    return finished_job(api, started, ADMIN, JOB_WAIT_S)


def label_by_api(api: httpx.Client, product: str, image: np.ndarray, label: str) -> None:
    """Store ``image`` in ``product``'s labelled set (what the page's teach buttons do)."""
    url = f"/v1/products/{product}/labels?label={label}&name={label}.png"
    r = api.post(url, content=png(image), headers={**ADMIN, "content-type": "image/png"})
    assert r.status_code in (200, 201), r.text


# --- tests: each sets up its own product state (they share the service and the page) ----------
def test_products_view_lists_every_product(page: Any, api: httpx.Client) -> None:
    use_product(page, PRODUCT)
    rows = page.locator("[data-testid=products-body] tr")
    names = product_names(api)
    assert len(names) >= 1 + len(EXTRA_PRODUCTS)
    assert [rows.nth(i).get_attribute("data-product") for i in range(rows.count())] == names
    row = page.locator(f"[data-testid=products-body] tr[data-product={PRODUCT}]")
    text = row.inner_text()
    assert "v1" in text and "resnet18" in text and "far" in text
    # threshold_warning (a threshold far above every good score): marked on exactly the products the API
    # warns of, the reason on hover
    warned = {p["product"]: p["threshold_warning"] for p in api.get("/v1/products").json()["products"]}
    warned = {k: v for k, v in warned.items() if v}
    assert WARNED in warned and "sigmas rule" in warned[WARNED]
    cells = page.locator("[data-testid=products-body] [data-testid=threshold-warning]")
    assert cells.count() == len(warned)
    cell = page.locator(f"[data-testid=products-body] tr[data-product={WARNED}] [data-testid=threshold-warning]")
    assert cell.get_attribute("title") == warned[WARNED] and cell.inner_text().endswith("\u26a0")
    shot(page, "products")


def test_wrong_token_is_a_readable_error_and_changes_nothing(
    page: Any, api: httpx.Client, tmp_path: Path, fresh_product: str
) -> None:
    product = fresh_product
    use_product(page, product)
    labels_before = api.get(f"/v1/products/{product}/labels").json()["labels"]
    card = upload(page, tmp_path, "wrong.png", FLAGGED)
    set_token(page, "not-the-token")
    card.locator("[data-testid=good-part]").click()
    error = page.locator("[data-testid=error]")
    error.wait_for(state="visible")
    assert "bearer token is wrong" in error.inner_text() and "403" in error.inner_text()
    card.locator("[data-testid=confirm-defect]").click()
    until(page, "(card) => card.querySelectorAll('[data-testid=action-error]').length > 0", arg=card.element_handle())
    assert "bearer token is wrong" in card.locator("[data-testid=teach]").inner_text()
    page.click("[data-testid=token-forget]")  # no token at all: 401, said as the API says it
    card.locator("[data-testid=confirm-defect]").click()
    until(page, "document.querySelector('[data-testid=error]').textContent.includes('401')")
    assert "send 'Authorization: Bearer <token>'" in error.inner_text()
    assert head(api, product) == 1
    assert api.get(f"/v1/products/{product}/labels").json()["labels"] == labels_before


def test_flagged_good_part_job_progress_then_below_threshold_at_new_version(
    page: Any, api: httpx.Client, tmp_path: Path, fresh_product: str
) -> None:
    product = fresh_product
    before = score(api, FLAGGED, product)
    assert before["is_anomaly"] and before["version"] == 1, before  # the chosen image is a false alarm at v1
    set_token(page, TOKEN)
    use_product(page, product)
    card = upload(page, tmp_path, "flagged.png", FLAGGED)
    assert card.get_attribute("data-flagged") == "true"
    assert card.locator("[data-testid=verdict]").inner_text() == "FLAGGED"
    heat = card.locator("[data-testid=heatmap]")
    until(page, "(img) => img.complete && img.naturalWidth > 0", arg=heat.element_handle())
    assert heat.evaluate("img => img.naturalWidth") == SIZE
    legend = card.locator("[data-testid=legend]").inner_text()
    assert f"{2 * before['threshold']:.3f}" in legend  # the product's fixed scale: 0 .. 2 x threshold
    shot(page, "inspect")

    card.locator("[data-testid=good-part]").click()
    card.locator("[data-testid=job-progress]").wait_for()  # live progress of the hot-update job
    rescored = card.locator("[data-testid=rescored]")
    rescored.wait_for(timeout=1000 * JOB_WAIT_S)
    assert rescored.get_attribute("data-version") == "2"
    assert rescored.get_attribute("data-flagged") == "false"
    assert float(rescored.get_attribute("data-score")) < float(rescored.get_attribute("data-threshold"))
    assert "succeeded: new version v2" in card.locator("[data-testid=job-stage]").inner_text()
    shot(page, "teach")
    after = score(api, FLAGGED, product)  # the service agrees, outside the page
    assert after["version"] == 2 and not after["is_anomaly"] and after["score"] < after["threshold"]
    assert [x["label"] for x in api.get(f"/v1/products/{product}/labels").json()["labels"]] == ["good"]


def test_confirmed_defect_is_stored_and_shown_on_the_calibration_histogram(
    page: Any, api: httpx.Client, tmp_path: Path, fresh_product: str
) -> None:
    product = fresh_product
    teach_good_by_api(api, product, FLAGGED)  # v2 and a "good part" label, as the page's Good part makes them
    set_token(page, TOKEN)
    use_product(page, product)
    card = upload(page, tmp_path, "defect.png", CONFIRMED)
    card.locator("[data-testid=confirm-defect]").click()
    card.locator("[data-testid=label-stored]").wait_for()
    stored = api.get(f"/v1/products/{product}/labels").json()["labels"]
    assert sorted(x["label"] for x in stored) == ["defective", "good"]
    defect = next(x for x in stored if x["label"] == "defective")
    assert api.get(f"/v1/products/{product}/labels/{defect['id']}/image").content == png(CONFIRMED)

    goto(page, "calibration")
    mark = page.locator("[data-testid=mark-defective]")
    assert mark.count() == 1 and page.locator("[data-testid=mark-good]").count() == 1
    expected = score(api, CONFIRMED, product)["score"]  # scored by the head (v2)
    assert float(mark.get_attribute("data-score")) == pytest.approx(expected, rel=1e-5)
    assert page.locator("[data-testid=threshold-line]").count() == 1
    assert page.locator("[data-testid=label-row]").count() == 2
    # Moving the false-alarm rate previews on the labelled set; nothing is applied.
    first = page.locator("[data-testid=preview-text]").inner_text()
    page.locator("[data-testid=far-slider]").fill("95")
    until(page, "(old) => document.querySelector('[data-testid=preview-text]').innerText !== old", arg=first)
    preview = page.locator("[data-testid=preview-text]").inner_text()
    assert "recall on 1 labelled defects" in preview and "labelled recall rule" in preview
    assert page.locator("[data-testid=preview-line]").count() == 1
    assert head(api, product) == 2
    shot(page, "calibration")
    # Apply (far line): the previewed rate as a new version whose threshold is the previewed far threshold.
    text = page.locator("[data-testid=preview-text]")
    rate, far_previewed = float(text.get_attribute("data-rate")), float(text.get_attribute("data-far-threshold"))
    page.click("[data-testid=apply-far]")
    page.locator("[data-testid=calibration-job] [data-testid=job-stage]").wait_for()
    job_says = "document.querySelector('[data-testid=calibration-job]').innerText.includes(arguments_0)"
    until(page, f"(arguments_0) => {job_says}", arg="new version v3", timeout=JOB_WAIT_S)
    listed = next(p for p in api.get("/v1/products").json()["products"] if p["product"] == product)
    assert listed["version"] == 3 and listed["threshold_rule"] == "far", listed
    assert listed["rule_target"] == rate and listed["threshold"] == pytest.approx(far_previewed, rel=1e-9)
    assert score(api, CONFIRMED, product)["threshold"] == pytest.approx(far_previewed, rel=1e-9)  # what predictions use
    # Apply (labelled line, offered explicitly): the labelled recall rule at the same rate.
    until(page, "() => document.querySelector('[data-testid=preview-text]').innerText.includes('In force at v3')")
    previewed = float(text.get_attribute("data-labelled-threshold"))
    page.click("[data-testid=apply-calibration]")
    until(page, f"(arguments_0) => {job_says}", arg="new version v4", timeout=JOB_WAIT_S)
    listed = next(p for p in api.get("/v1/products").json()["products"] if p["product"] == product)
    assert listed["version"] == 4 and listed["threshold_rule"] == "validation"
    assert listed["threshold"] == pytest.approx(previewed, rel=1e-5)


def test_rollback_serves_the_old_version_again(page: Any, api: httpx.Client, fresh_product: str) -> None:
    product = fresh_product
    # Its own four versions, made through the API as the console makes them: a good part taught
    # (v2), a confirmed defect labelled, the far rule applied (v3), the labelled rule applied (v4).
    teach_good_by_api(api, product, FLAGGED)
    label_by_api(api, product, CONFIRMED, "defective")
    for body in (
        {"rule": "far", "false_alarm_rate": 0.05},
        {"source": "store:labels", "objective": "recall", "max_false_alarm_rate": 0.05},
    ):
        finished(api, api.post(f"/v1/products/{product}/calibrate?wait=true", json=body, headers=ADMIN))
    assert head(api, product) == 4
    set_token(page, TOKEN)
    use_product(page, product)
    goto(page, "versions")
    rows = page.locator("[data-testid=version-row]")
    assert [rows.nth(i).get_attribute("data-change") for i in range(rows.count())] == [
        "calibration",  # v4: the labelled rule
        "calibration",  # v3: the far rule
        "normals",
        "create",
    ]
    page.click("[data-testid=rollback-1]")
    until(page, "!document.getElementById('notice').hidden || !document.getElementById('error').hidden")
    assert page.locator("[data-testid=error]").is_hidden(), page.locator("[data-testid=error]").inner_text()
    assert "v1 is head again" in page.locator("[data-testid=notice]").inner_text()
    assert head(api, product) == 1
    # The rollback is a change in the history: first in the page's time line and in the API's.
    first = page.locator("[data-testid=versions-body] tr").first
    assert first.get_attribute("data-testid") == "move-row" and first.get_attribute("data-change") == "rollback"
    assert (first.get_attribute("data-from"), first.get_attribute("data-to")) == ("4", "1")
    assert "rolled back" in page.locator("#versions-hint").inner_text()
    shot(page, "versions")
    history = api.get(f"/v1/products/{product}/versions").json()
    assert {k: history["changes"][0][k] for k in ("change", "from", "version")} == {
        "change": "rollback",
        "from": 4,
        "version": 1,
    }
    assert [c["change"] for c in history["changes"][1:]] == ["calibration", "calibration", "normals", "create"]
    assert history["rolled_back"] and [(m["from"], m["to"]) for m in history["moves"]] == [(4, 1)]
    deadline = time.monotonic() + JOB_WAIT_S  # replicas swap between batches
    while (r := score(api, FLAGGED, product))["version"] != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r["version"] == 1 and r["is_anomaly"]  # the old version serves: the false alarm is back


def test_region_drawn_over_a_training_image_previewed_then_saved(
    page: Any, api: httpx.Client, store: str, tmp_path: Path, fresh_product: str
) -> None:
    """The Region view: a rectangle dragged over a picked training image as an exclude shape, its
    preview (current vs proposed, nothing published), then Save: a new version whose stored
    region is exactly the rectangle drawn, at the previewed threshold."""
    product = fresh_product
    set_token(page, TOKEN)
    use_product(page, product)
    goto(page, "region")
    path = tmp_path / "train.png"
    path.write_bytes(png(GEAR.good(0)))
    until(page, "() => document.getElementById('region-stored').innerText.includes('v1: no stored region')")
    page.set_input_files("[data-testid=region-file]", str(path))
    until(page, "() => document.getElementById('region-size').dataset.width === '64'")
    assert page.locator("[data-testid=part-exclude]").is_checked()  # the default part
    page.check("[data-testid=tool-rect]")
    box = page.locator("[data-testid=region-canvas]").bounding_box()
    scale = box["width"] / SIZE  # the canvas shows the 64-px image scaled to fit

    def at(x: float, y: float) -> tuple[float, float]:  # an image pixel edge, in page coordinates
        return box["x"] + x * scale, box["y"] + y * scale

    page.mouse.move(*at(8, 4))
    page.mouse.down()
    page.mouse.move(*at(20, 10), steps=4)
    page.mouse.move(*at(30, 16), steps=4)
    page.mouse.up()
    shapes = page.locator("[data-testid=region-shape]")
    assert shapes.count() == 1 and shapes.first.get_attribute("data-part") == "exclude"
    assert json.loads(shapes.first.get_attribute("data-shape")) == {"rect": [8, 4, 30, 16]}
    # a second rectangle, deleted from the list
    page.mouse.move(*at(40, 40))
    page.mouse.down()
    page.mouse.move(*at(50, 50), steps=3)
    page.mouse.up()
    assert shapes.count() == 2
    shapes.nth(1).locator("[data-testid=region-delete]").click()
    assert shapes.count() == 1
    # a polygon (clicks, closed by a double-click), listed, then deleted too
    page.check("[data-testid=tool-polygon]")
    for x, y in ((40, 30), (60, 30), (50, 60)):
        page.mouse.click(*at(x, y))
    page.mouse.dblclick(*at(50, 60))
    assert shapes.count() == 2
    assert json.loads(shapes.nth(1).get_attribute("data-shape")) == {"polygon": [[40, 30], [60, 30], [50, 60]]}
    shapes.nth(1).locator("[data-testid=region-delete]").click()
    assert shapes.count() == 1
    drawn = {"size": [SIZE, SIZE], "include": [], "exclude": [{"rect": [8, 4, 30, 16]}]}

    page.click("[data-testid=region-preview]")
    until(page, "() => !document.getElementById('region-compare').hidden", timeout=JOB_WAIT_S)
    table = page.locator("[data-testid=region-compare]")
    assert table.get_attribute("data-version") == "1"
    current = float(table.get_attribute("data-current-threshold"))
    proposed = float(table.get_attribute("data-proposed-threshold"))
    assert current == pytest.approx(head_threshold(api, product), rel=1e-12)
    assert "nothing was published" in page.locator("[data-testid=region-job]").inner_text()
    assert "0 include, 1 exclude (64 x 64)" in table.inner_text()
    assert head(api, product) == 1 and open_store(store).versions(product) == [1]  # the preview published nothing
    shot(page, "region")

    page.click("[data-testid=region-save]")
    until(
        page,
        "() => document.querySelector('[data-testid=region-job]').innerText.includes('new version v2')",
        timeout=JOB_WAIT_S,
    )
    assert head(api, product) == 2
    history = api.get(f"/v1/products/{product}/versions").json()
    assert [v["change"] for v in history["versions"]] == ["region", "create"]
    stored = open_store(store).record(product, 2)
    assert stored.config.region == drawn
    assert stored.operating_point().threshold == pytest.approx(proposed, rel=1e-6)
    assert head_threshold(api, product) == pytest.approx(proposed, rel=1e-6)
    stored_text = "() => document.getElementById('region-stored').innerText"
    until(page, f"{stored_text}.includes('v2: stored region 0 include, 1 exclude')")
    # the view opened again shows the stored region: its shapes listed, ready to edit
    use_product(page, product)
    goto(page, "region")
    until(page, "() => document.querySelectorAll('[data-testid=region-shape]').length === 1")
    assert json.loads(shapes.first.get_attribute("data-shape")) == {"rect": [8, 4, 30, 16]}
    assert shapes.first.get_attribute("data-part") == "exclude"
    assert not [m for m in _console if "Content Security Policy" in m], _console


def head_threshold(api: httpx.Client, product: str) -> float:
    return next(p["threshold"] for p in api.get("/v1/products").json()["products"] if p["product"] == product)


def test_far_rule_route_refuses_bad_input_with_json_errors(api: httpx.Client) -> None:
    """POST .../calibrate {"rule": "far", "false_alarm_rate": r}: r in threshold.false_alarm_rate's range."""
    url = f"/v1/products/{PRODUCT}/calibrate"
    version = head(api)
    for body, status, code, words in [
        ({"rule": "far", "false_alarm_rate": 0.9}, 400, "bad_config", "threshold.false_alarm_rate: must be"),
        ({"false_alarm_rate": 0}, 400, "bad_config", "[0.0001, 0.5]"),
        ({"rule": "far", "false_alarm_rate": "1%"}, 400, "bad_config", "a finite number"),
        ({"rule": "far", "false_alarm_rate": True}, 400, "bad_config", "a finite number"),
        ({"rule": "far"}, 400, "bad_request", "give 'false_alarm_rate'"),
        ({"rule": "sigmas", "false_alarm_rate": 0.01}, 400, "bad_request", "cannot be set by a rate"),
        ({"rule": "far", "false_alarm_rate": 0.01, "sheets": 3}, 400, "bad_request", "unknown field(s) sheets"),
    ]:
        r = api.post(url, json=body, headers=ADMIN)
        assert r.status_code == status and r.json()["error"]["code"] == code, (body, r.text)
        assert words in r.json()["error"]["message"], (body, r.text)
    r = api.post(url, json={"rule": "far", "false_alarm_rate": 0.02})  # no token
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = api.post("/v1/products/nope/calibrate", json={"rule": "far", "false_alarm_rate": 0.02}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_product"
    assert head(api) == version


def test_recent_view_filters_flagged_with_heatmaps(page: Any, api: httpx.Client, fresh_product: str) -> None:
    product = fresh_product
    for image in (FLAGGED, CONFIRMED, GEAR.good(60)):  # two flagged at v1 among its recent predictions
        score(api, image, product)
    assert sum(x["is_anomaly"] for x in api.get(f"/v1/products/{product}/recent").json()["items"]) >= 2
    use_product(page, product)
    goto(page, "recent")
    page.check("[data-testid=flagged-only]")
    until(
        page,
        "[...document.querySelectorAll('[data-testid=recent-results] [data-testid=result-card]')]"
        ".every(c => c.dataset.flagged === 'true')",
    )
    cards = page.locator("[data-testid=recent-results] [data-testid=result-card]")
    assert cards.count() >= 2
    heat = cards.first.locator("[data-testid=heatmap]")
    until(page, "(img) => img.complete && img.naturalWidth > 0", arg=heat.element_handle())
    shot(page, "recent")
    page.uncheck("[data-testid=flagged-only]")
    assert not [m for m in _console if "Content Security Policy" in m], _console  # the page obeys its own CSP


def test_the_pages_own_requests_without_the_token_get_401(
    page: Any, api: httpx.Client, tmp_path: Path, fresh_product: str
) -> None:
    """Every write the page sends (and its job polls), replayed without its Authorization header, is refused."""
    product = fresh_product
    start = len(_requests)
    set_token(page, TOKEN)
    use_product(page, product)
    card = upload(page, tmp_path, "replay.png", FLAGGED)
    card.locator("[data-testid=good-part]").click()  # normals (a job), then labels
    card.locator("[data-testid=rescored]").wait_for(timeout=1000 * JOB_WAIT_S)
    goto(page, "calibration")
    until(page, "() => document.querySelector('[data-testid=preview-text]').dataset.rate !== undefined")
    page.click("[data-testid=apply-far]")  # calibrate (a job)
    until(
        page,
        "() => document.querySelector('[data-testid=calibration-job]').innerText.includes('new version v3')",
        timeout=JOB_WAIT_S,
    )
    goto(page, "versions")
    page.click("[data-testid=rollback-1]")  # rollback
    until(page, "!document.getElementById('notice').hidden || !document.getElementById('error').hidden")
    admin = [r for r in _requests[start:] if "/predict" not in r["url"]]
    kinds = {r["url"].split("?")[0].rsplit("/", 1)[1] for r in admin}
    assert {"normals", "labels", "calibrate", "rollback"} <= kinds, kinds
    version, labels = head(api, product), api.get(f"/v1/products/{product}/labels").json()["labels"]
    for r in admin:
        headers = {k: v for k, v in r["headers"].items() if k.lower() != "authorization"}
        got = api.request(r["method"], r["url"], headers=headers, content=r["body"])
        assert got.status_code == 401, (r["url"], got.text)
        assert got.json()["error"]["code"] == "unauthorized"
    assert head(api, product) == version and api.get(f"/v1/products/{product}/labels").json()["labels"] == labels


def _render_times(browser: Any, service: str, cards: int, products: int, runs: int = 3) -> dict[str, list[float]]:
    """Wall time (ms) from opening /ui/ to the Products view rendered, then to the Recent view rendered
    (with ``cards`` result cards: the first page)."""
    times: dict[str, list[float]] = {"products_ms": [], "recent_ms": []}
    for _ in range(runs):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = context.new_page()
        t0 = time.perf_counter()
        pg.goto(f"{service}/ui/#products")
        pg.wait_for_selector("body[data-ready=products]")
        times["products_ms"].append(1000 * (time.perf_counter() - t0))
        assert pg.locator("[data-testid=products-body] tr").count() == products
        assert pg.evaluate("() => document.getElementById('product').value") == PRODUCT  # the first: recent below
        t0 = time.perf_counter()
        goto(pg, "recent")
        times["recent_ms"].append(1000 * (time.perf_counter() - t0))
        assert pg.locator("[data-testid=recent-results] [data-testid=result-card]").count() == cards
        context.close()
    return times


def test_first_render_with_20_products_and_500_recent_predictions(
    browser: Any, service: str, api: httpx.Client
) -> None:
    for image in (FLAGGED, CONFIRMED):  # a few predictions before the load (the ring may hold more already)
        score(api, image)
    held = len(api.get(f"/v1/products/{PRODUCT}/recent").json()["items"])
    products = len(product_names(api))
    baseline = _render_times(browser, service, min(60, held), products)  # same run, same page: few predictions
    images = [png(GEAR.good(100 + i % 10)) for i in range(50)]
    sent = 0
    while sent < RECENT:
        n = min(50, RECENT - sent)
        files = [("images", (f"line{sent + i}.png", images[i], "image/png")) for i in range(n)]
        assert api.post(f"/v1/products/{PRODUCT}/predict", files=files).status_code == 200
        sent += n
    assert len(api.get(f"/v1/products/{PRODUCT}/recent").json()["items"]) == RECENT
    loaded = _render_times(browser, service, 60, products)  # the page shows 60 at first ("show more")
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    report = {
        "baseline": {"recent_held": held, **{k: median(v) for k, v in baseline.items()}},
        "loaded": {"recent_held": RECENT, **{k: median(v) for k, v in loaded.items()}},
        "runs": {"baseline": baseline, "loaded": loaded},
        "products": products,
    }
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "timings.json").write_text(json.dumps(report, indent=1))
    print(f"console render, medians of 3 (ms): baseline {report['baseline']}, loaded {report['loaded']}")
    assert report["loaded"]["products_ms"] < 5000 and report["loaded"]["recent_ms"] < 5000, report


def test_deleting_a_product_forgets_its_recent_predictions(api: httpx.Client, fresh_product: str) -> None:
    gone = fresh_product
    image = png(GEAR.good(50))
    r = api.post(f"/v1/products/{gone}/predict", content=image, headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    item = r.json()["recent_id"]
    assert [x["id"] for x in api.get(f"/v1/products/{gone}/recent").json()["items"]] == [item]
    assert api.get("/v1/recent").json()["products"][gone]["scored"] == 1
    assert api.delete(f"/v1/products/{gone}", headers=ADMIN).status_code == 200
    r = api.get(f"/v1/products/{gone}/recent")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_product", r.text
    assert api.get(f"/v1/products/{gone}/recent/{item}/image").status_code == 404
    assert gone not in api.get("/v1/recent").json()["products"]  # the ring and its counters, not only the route


def test_static_files_and_unknown_ui_path(api: httpx.Client) -> None:
    r = api.get("/ui/")
    assert r.status_code == 200 and "<title>hetmm inspection console</title>" in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert api.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    r = api.get("/ui/../config.py")
    assert r.status_code == 404
    r = api.get("/ui/nothing.js")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_products_view_links_the_latest_evaluation_report(
    page: Any, api: httpx.Client, store: str, fresh_product: str
) -> None:
    """A product with a stored report (store/reports.py; what ``hetmm evaluate --store --report``
    stores) shows the link in the Products view, and the link opens the page with its pictures."""
    from stored_reports import report

    use_product(page, PRODUCT)  # no report: no link, a hint instead
    until(page, "() => document.getElementById('product-report').textContent.includes('no evaluation report')")
    assert page.locator("[data-testid=report-link]").count() == 0
    record = open_store(store).put_report(fresh_product, report(40), version=1)
    use_product(page, fresh_product)
    link = page.locator("[data-testid=report-link]")
    link.wait_for()
    assert link.inner_text().startswith("Latest evaluation report (v1, ")
    assert link.get_attribute("href") == f"/v1/products/{fresh_product}/report/"
    errors: list[str] = []

    def keep(m: Any) -> None:
        if m.type == "error" and m.page is not page:
            errors.append(m.text)

    page.context.on("console", keep)
    with page.context.expect_page() as opened:
        link.click()
    shown = opened.value
    shown.wait_for_load_state("load")
    assert shown.url.endswith(f"/v1/products/{fresh_product}/report/")
    sizes = shown.evaluate("() => [...document.images].map((i) => i.complete ? i.naturalWidth : -1)")
    assert len(sizes) == len(record.files) - 1 and all(w == 4 for w in sizes), sizes  # every PNG loaded
    shown.close()
    page.context.remove_listener("console", keep)
    assert errors == []  # its inline style and its PNGs within the report's Content-Security-Policy


def test_tiled_product_inspected_and_taught_in_the_console(
    page: Any, api: httpx.Client, store: str, tmp_path: Path
) -> None:
    """A tiled product (2 x 2 tiles of 128-px frames) in the Inspect view: its stitched heat-map at
    the frame's resolution, the verdict as the service scores it, and "good part" hot-updating it
    (TiledHETMM.update in the registry's task) to a new version."""
    from hetmm_ray.detection.tiled import TiledHETMM

    frames = SyntheticProduct(seed=11, size=128)
    product = "t-tiled"
    cfg = config().replace(**{"geometry.tiles": [2, 2], "geometry.tile_overlap": 8})
    TiledHETMM(cfg).fit([frames.good(j) for j in range(5)]).save(open_store(store), product)
    assert product in product_names(api)
    frame = frames.defective(3, "hole")[0]
    expected = score(api, frame, product)
    set_token(page, TOKEN)
    use_product(page, product)
    card = upload(page, tmp_path, "frame.png", frame)
    heat = card.locator("[data-testid=heatmap]")
    until(page, "(img) => img.complete && img.naturalWidth > 0", arg=heat.element_handle())
    assert heat.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [128, 128]  # stitched, frame size
    assert card.get_attribute("data-flagged") == str(expected["is_anomaly"]).lower()
    card.locator("[data-testid=good-part]").click()
    rescored = card.locator("[data-testid=rescored]")
    rescored.wait_for(timeout=1000 * JOB_WAIT_S)
    assert rescored.get_attribute("data-version") == "2"
    assert open_store(store).record(product, 2).images == 6  # the frame joined every tile position's bank
    # the far rule at another rate, previewed and applied (a tiled product was refused it: 409): the
    # previewed frame threshold in force at v3, the frame's score unchanged (its tiles keep their scales)
    before = score(api, frame, product)
    goto(page, "calibration")
    first = page.locator("[data-testid=preview-text]").inner_text()
    page.locator("[data-testid=far-slider]").fill("90")
    until(page, "(old) => document.querySelector('[data-testid=preview-text]').innerText !== old", arg=first)
    text = page.locator("[data-testid=preview-text]")
    rate, far_previewed = float(text.get_attribute("data-rate")), float(text.get_attribute("data-far-threshold"))
    page.click("[data-testid=apply-far]")
    job_says = "document.querySelector('[data-testid=calibration-job]').innerText.includes(arguments_0)"
    until(page, f"(arguments_0) => {job_says}", arg="new version v3", timeout=JOB_WAIT_S)
    after = score(api, frame, product)
    assert after["version"] == 3 and after["rule_target"] == rate, after
    assert after["threshold"] == pytest.approx(far_previewed, rel=1e-9) != before["threshold"]
    assert after["score"] == pytest.approx(before["score"], rel=1e-6)


def test_drift_view_draws_the_flagged_share_and_the_live_windows(
    page: Any, api: httpx.Client, fresh_product: str
) -> None:
    """The Drift view after parts were scored: the chart (one SVG, a point per bucket with
    parts) and one row per live window, each with a state; both read from GET .../drift."""
    for i in range(6):
        score(api, GEAR.good(300 + i), fresh_product)
    use_product(page, fresh_product)
    goto(page, "drift")
    until(page, "() => !!document.querySelector('[data-testid=drift-chart] svg')")
    until(page, "() => document.querySelectorAll('[data-testid=drift-window]').length > 0")
    states = page.eval_on_selector_all("[data-testid=drift-window]", "rows => rows.map(r => r.dataset.state)")
    assert states and all(s in ("ok", "defects", "drift") for s in states), states
    drift = api.get(f"/v1/products/{fresh_product}/drift").json()
    live = drift.get("live") or {}
    assert len(states) == len(live.get("windows", {})), (states, drift)
    shot(page, "drift")


def test_stations_view_shows_what_a_running_station_reports(page: Any, api: httpx.Client, tmp_path: Path) -> None:
    """The console shows the stations. A real station (a watched folder scored in process on
    a store of its own) reports itself to this service every 0.5 s through ``ConsoleReporter`` with the
    admin token; the Stations view shows its state, parts and last part, then ``offline`` once it
    stops, and a station that stops reporting shows silent. A report without the token is a 401, a
    bad one a 400, both in the JSON error shape."""
    import yaml
    from helpers import TINY_CONFIG

    from hetmm_ray.station import load_line
    from hetmm_ray.station.report import ConsoleReporter
    from hetmm_ray.station.runner import build_station
    from hetmm_ray.workflows import operations

    base = api.base_url
    operations.fit(
        open_store(tmp_path / "store"), "cam", DetectorConfig.from_dict(TINY_CONFIG), [GEAR.good(i) for i in range(4)]
    )
    (tmp_path / "in").mkdir()
    line = {
        "line": "press-3",
        "service": {"in_process": "store"},
        "console": {"url": str(base), "every_s": 0.5, "token_env": TOKEN_ENV},
        "stations": [
            {
                "name": "cam1",
                "product": "cam",
                "source": {"kind": "folder", "path": "in", "after": "delete", "settle_ms": 0},
                "deadline_ms": 600_000,
                "sinks": [{"kind": "log", "path": "cam1.csv"}],
            }
        ],
    }
    (tmp_path / "line.yaml").write_text(yaml.safe_dump(line))
    loaded = load_line(tmp_path / "line.yaml")
    runner = build_station(loaded.stations[0], tmp_path, line=loaded.name)
    reporter = ConsoleReporter(loaded.console, loaded.name, [runner])
    reporter.start()
    try:
        for i in range(3):
            (tmp_path / "in" / f"P-{i}.png").write_bytes(png(GEAR.good(400 + i)))
        deadline = time.monotonic() + UI_WAIT_S
        while sum(runner.counts.values()) < 3:
            runner.step()
            assert time.monotonic() < deadline, "the station did not score its parts"
            time.sleep(0.02)
        goto(page, "stations")
        row = "[data-testid=stations-body] tr[data-station='press-3/cam1']"
        until(page, f"() => (document.querySelector(\"{row}\") || {{}}).innerText?.includes('P-2')")
        cells = page.eval_on_selector_all(f"{row} td", "tds => tds.map(td => td.innerText)")
        assert cells[:4] == ["press-3", "cam1", "cam v1", "ok"], cells
        # 3 parts by outcome (ok, review, reject, timeout, error), none waiting
        assert sum(int(c) for c in cells[5:10]) == 3 and cells[4] == "0", cells
        assert cells[10].startswith("P-2: ") and cells[11].endswith(" ms"), cells
        shot(page, "stations")
    finally:
        reporter.stop()  # the last report says offline
        runner.close()
    state = "[data-testid=stations-body] tr[data-station='press-3/cam1'] [data-testid=station-state]"
    until(page, f"() => document.querySelector(\"{state}\").innerText === 'silent (said offline)'", timeout=UI_WAIT_S)

    good = {"product": "cam", "state": "ok", "queue": 0, "parts": {}, "every_s": 2}
    no_token = api.put("/v1/stations/press-3/cam2", json=good)
    assert no_token.status_code == 401 and no_token.json()["error"]["code"] == "unauthorized"
    bad = api.put("/v1/stations/press-3/cam2", json={**good, "state": "asleep"}, headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_station_report", bad.text
    assert "cam2" not in {s["station"] for s in api.get("/v1/stations").json()["stations"]}
