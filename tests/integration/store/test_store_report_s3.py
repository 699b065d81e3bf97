"""The latest evaluation report (store/reports.py) on both backends, S3 over moto's HTTP server
included (the ``location`` fixture): stored and read back byte for byte, replaced by a later report
whose predecessor's objects go, refused for a name out of the report before any object is written,
and removed with its product. The local-only cases are tests/unit/store/test_report_store.py."""

from __future__ import annotations

import pytest
from stored_reports import page, png_bytes, report, tiny_set

from hetmm_ray.store import ProductNotFound, StoreError, open_store

PRODUCT = "widget"


def test_report_round_trip_replace_refuse_and_delete(location: str) -> None:
    store = open_store(location)
    store.put(PRODUCT, tiny_set())
    assert store.latest_report(PRODUCT) is None
    prefix = f"{PRODUCT}/report/"

    with pytest.raises(StoreError, match="report file name"):
        store.put_report(PRODUCT, {**report(1), "../HEAD.png": png_bytes(1)}, version=1)
    assert list(store.backend.list(prefix)) == []

    first = store.put_report(PRODUCT, report(10), version=1)
    for name, data in report(10).items():
        assert store.get_report_file(PRODUCT, name) == data
    assert store.latest_report(PRODUCT) == first

    v2 = store.put(PRODUCT, tiny_set(seed=4))
    second = store.put_report(PRODUCT, {"index.html": page("roc.png"), "roc.png": png_bytes(7)}, version=v2)
    again = open_store(location)  # another reader of the same store sees the replacement
    assert again.latest_report(PRODUCT).version == v2 == second.version
    assert again.get_report_file(PRODUCT, "roc.png") == png_bytes(7)
    with pytest.raises(ProductNotFound):
        again.get_report_file(PRODUCT, "histogram.png")
    assert sorted(store.backend.list(prefix)) == sorted(
        [f"{prefix}LATEST.json", f"{prefix}{second.id}/index.html", f"{prefix}{second.id}/roc.png"]
    )

    store.delete_product(PRODUCT)
    assert list(store.backend.list(prefix)) == []
    assert again.latest_report(PRODUCT) is None
