"""The console's candidates in a real browser against a real service: the Versions view
lists a candidate, Compare shows its verdict flips as image pairs (the head's heat-map beside the
candidate's), Discard drops one and Promote makes one head. Reuses the console suite's service,
browser and page (tests/integration/serve/test_console.py: skipped the same way without a browser);
kept to one test."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
from test_console import (  # noqa: F401 - pytest fixtures, used by name
    FLAGGED,
    GEAR,
    TOKEN,
    api,
    browser,
    fresh_product,
    gear,
    goto,
    head,
    label_by_api,
    page,
    score,
    service,
    set_token,
    store,
    until,
    use_product,
)

from hetmm_ray.store import open_store


def test_candidates_compare_discard_promote_in_the_console(
    page: Any,  # noqa: F811 - the fixtures imported above
    api: httpx.Client,  # noqa: F811
    store: str,  # noqa: F811
    fresh_product: str,  # noqa: F811
) -> None:
    product = fresh_product
    assert score(api, FLAGGED, product)["is_anomaly"]  # flagged at v1
    label_by_api(api, product, GEAR.good(60), "good")
    label_by_api(api, product, FLAGGED, "defective")
    # two candidates written by another writer: a far higher threshold (the defect flips to ok), twice
    s = open_store(store)
    rec = s.record(product, 1)
    config = replace(rec.config, threshold=replace(rec.config.threshold, rule="sigmas", sigmas=100.0)).stored_dict()
    assert [s.republish(product, config=config, expect_head=1, candidate=True) for _ in range(2)] == [2, 3]
    set_token(page, TOKEN)
    use_product(page, product)
    goto(page, "versions")
    until(page, "() => document.querySelectorAll('[data-testid=candidate-row]').length === 2")
    page.click("[data-testid=compare-2]")
    until(page, "() => document.querySelectorAll('[data-testid=flip]').length >= 1")
    flip = page.locator("[data-testid=flip]").first
    for side in ("flip-base", "flip-candidate"):
        img = flip.locator(f"[data-testid={side}]")
        until(page, "(img) => img.complete && img.naturalWidth > 0", arg=img.element_handle())
    assert "defective.png" in flip.inner_text()
    page.click("[data-testid=discard-3]")
    until(page, "() => document.querySelectorAll('[data-testid=candidate-row]').length === 1")
    assert open_store(store).candidates(product) == [2] and head(api, product) == 1
    page.click("[data-testid=promote-2]")
    until(page, "() => document.querySelectorAll('[data-testid=candidate-row]').length === 0")
    assert open_store(store).head(product) == 2
    assert [(m["kind"], m["to"]) for m in open_store(store).moves(product)] == [("promote", 2)]
