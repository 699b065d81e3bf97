"""A product's latest evaluation report in a local store (store/reports.py): stored, read back byte for
byte, replaced by a later one (whose predecessor's files go), refused for names outside the rule (no
path out of the report, only .html/.png) and for oversized files, checked against its sha256, and
removed with its product. The same over S3: tests/integration/store/test_store_report_s3.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from stored_reports import page, png_bytes, report, tiny_set

from hetmm_ray.store import ProductNotFound, StoreCorrupt, StoreError, VersionedStore, open_store, reports
from hetmm_ray.store.reports import check_report_name, collect_report

PRODUCT = "widget"


@pytest.fixture
def store(tmp_path: Path) -> VersionedStore:
    s = open_store(tmp_path / "store")
    s.put(PRODUCT, tiny_set())
    return s


def stored_keys(store: VersionedStore) -> list[str]:
    return list(store.backend.list(f"{PRODUCT}/report/"))


def test_round_trip_every_file_byte_for_byte_with_its_version_and_time(store: VersionedStore) -> None:
    assert store.latest_report(PRODUCT) is None
    files = report(10)
    record = store.put_report(PRODUCT, files, version=1)
    latest = store.latest_report(PRODUCT)
    assert latest == record
    assert latest.version == 1 and latest.product == PRODUCT
    assert abs(latest.created - record.created) < 1e-6 and latest.created > 1.7e9
    assert sorted(latest.files) == sorted(files)
    assert latest.size == sum(len(d) for d in files.values())
    for name, data in files.items():
        assert store.get_report_file(PRODUCT, name) == data
        assert latest.files[name].sha256 == hashlib.sha256(data).hexdigest()
    assert latest.to_json() == {
        "version": 1,
        "created": latest.created,
        "files": ["gallery/000-frame.png", "histogram.png", "index.html"],
        "bytes": latest.size,
    }
    # the store's other readers are not confused by the report beside the versions
    assert store.products() == [PRODUCT] and store.versions(PRODUCT) == [1]


def test_a_later_report_replaces_the_earlier_and_its_files_go(store: VersionedStore) -> None:
    first = store.put_report(PRODUCT, report(10), version=1)
    v2 = store.put(PRODUCT, tiny_set(seed=5))
    second_files = {"index.html": page("roc.png"), "roc.png": png_bytes(99)}
    second = store.put_report(PRODUCT, second_files, version=v2)
    assert second.id != first.id
    assert store.latest_report(PRODUCT).version == v2
    assert store.get_report_file(PRODUCT, "roc.png") == png_bytes(99)
    assert store.get_report_file(PRODUCT, "index.html") == second_files["index.html"]
    with pytest.raises(ProductNotFound, match="no file"):  # the earlier report's file is not served
        store.get_report_file(PRODUCT, "histogram.png")
    prefix = f"{PRODUCT}/report/"
    assert sorted(stored_keys(store)) == sorted(
        [f"{prefix}LATEST.json", f"{prefix}{second.id}/index.html", f"{prefix}{second.id}/roc.png"]
    )


def test_a_dead_writers_files_are_swept_once_stale_a_fresh_ones_stay(store: VersionedStore) -> None:
    old_stamp = 1_000_000_000 * 10**9  # 2001: long stale
    store.backend.write(f"{PRODUCT}/report/{old_stamp:020d}-deadbeef/index.html", b"<html></html>")
    fresh = f"{PRODUCT}/report/99999999999999999999-0badf00d/index.html"  # a writer still uploading
    store.backend.write(fresh, b"<html></html>")
    record = store.put_report(PRODUCT, report(3), version=1)
    ids = {k.split("/")[2] for k in stored_keys(store) if not k.endswith("LATEST.json")}
    assert ids == {record.id, "99999999999999999999-0badf00d"}


@pytest.mark.parametrize(
    "name",
    [
        "../HEAD",
        "../versions/000001.json",
        "/etc/passwd.html",
        "gallery/../../x.png",
        "..",
        "a/b/c.png",  # deeper than the report's own layout
        "gallery\\x.png",
        "index.htm",
        "x.js",
        "x.svg",
        "x.PNG",
        "report.json",
        ".hidden.png",
        "",
        "gallery/",
        "index.html\n",
    ],
)
def test_names_outside_the_rule_are_refused_on_write_and_not_found_on_read(store: VersionedStore, name: str) -> None:
    with pytest.raises(StoreError, match="report file name"):
        check_report_name(name)
    with pytest.raises(StoreError, match="report file name"):
        store.put_report(PRODUCT, {**report(1), name: png_bytes(1)}, version=1)
    assert stored_keys(store) == []  # refused before anything was written
    store.put_report(PRODUCT, report(1), version=1)
    with pytest.raises(ProductNotFound):
        store.get_report_file(PRODUCT, name)


def test_the_names_a_report_holds_pass() -> None:
    for name in ("index.html", "histogram.png", "pro.png", "gallery/000000-overlay.png", "a_b-c.d.png"):
        assert check_report_name(name) == name
    assert reports.media_type("index.html") == "text/html; charset=utf-8"
    assert reports.media_type("gallery/1.png") == "image/png"


def test_contents_and_sizes_are_checked_before_anything_is_written(
    store: VersionedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = {
        "holds index.html": {"histogram.png": png_bytes(1)},
        "not a PNG": {**report(1), "histogram.png": b"GIF89a..."},
        "not UTF-8": {**report(1), "index.html": b"\xff\xfe<html>"},
    }
    for message, files in cases.items():
        with pytest.raises(StoreError, match=message):
            store.put_report(PRODUCT, files, version=1)
    monkeypatch.setattr(reports, "MAX_FILE_BYTES", 1000)
    with pytest.raises(StoreError, match="more than 1000"):
        store.put_report(PRODUCT, {**report(1), "histogram.png": png_bytes(1) + b"\x00" * 1000}, version=1)
    monkeypatch.setattr(reports, "MAX_FILE_BYTES", 32 * 2**20)
    monkeypatch.setattr(reports, "MAX_REPORT_BYTES", 100)
    with pytest.raises(StoreError, match="at most 100 bytes"):
        store.put_report(PRODUCT, report(1), version=1)
    monkeypatch.setattr(reports, "MAX_REPORT_BYTES", 256 * 2**20)
    monkeypatch.setattr(reports, "MAX_FILES", 2)
    with pytest.raises(StoreError, match="at most 2 files"):
        store.put_report(PRODUCT, report(1), version=1)
    assert stored_keys(store) == []


def test_the_tag_must_be_a_stored_version(store: VersionedStore) -> None:
    with pytest.raises(ProductNotFound):
        store.put_report(PRODUCT, report(1), version=7)
    with pytest.raises(ProductNotFound):
        store.put_report("nothing-here", report(1), version=1)
    with pytest.raises(StoreError, match="invalid product name"):
        store.latest_report("../widget")
    assert stored_keys(store) == []


def test_a_flipped_byte_is_caught_and_a_garbage_index_is_corrupt(store: VersionedStore) -> None:
    record = store.put_report(PRODUCT, report(10), version=1)
    key = f"{PRODUCT}/report/{record.id}/histogram.png"
    data = bytearray(store.backend.read(key)[0])
    data[-5] ^= 0xFF
    store.backend.write(key, bytes(data))
    with pytest.raises(StoreCorrupt, match="checksum"):
        store.get_report_file(PRODUCT, "histogram.png")
    assert store.get_report_file(PRODUCT, "index.html") == report(10)["index.html"]
    store.backend.write(f"{PRODUCT}/report/LATEST.json", b"{not json")
    with pytest.raises(StoreCorrupt, match="unreadable report index"):
        store.latest_report(PRODUCT)
    index = {"format": 1, "id": "../x", "version": 1, "created": 1.0, "files": {}}
    store.backend.write(f"{PRODUCT}/report/LATEST.json", json.dumps(index).encode())
    with pytest.raises(StoreCorrupt):
        store.latest_report(PRODUCT)
    store.put_report(PRODUCT, report(11), version=1)  # a new report replaces a garbage index
    assert store.get_report_file(PRODUCT, "histogram.png") == png_bytes(11)


def test_deleting_the_product_removes_its_report(store: VersionedStore) -> None:
    store.put_report(PRODUCT, report(10), version=1)
    assert stored_keys(store)
    store.delete_product(PRODUCT)
    assert stored_keys(store) == []
    assert store.latest_report(PRODUCT) is None
    with pytest.raises(ProductNotFound):
        store.get_report_file(PRODUCT, "index.html")


def test_collect_reads_the_page_and_exactly_what_it_refers_to(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    (folder / "gallery").mkdir(parents=True)
    html = (
        '<html><body><img src="histogram.png"><img src="gallery/000-frame.png"><img src="histogram.png">'
        '<a href="#top">top</a><a href="https://example.com/x.png">elsewhere</a><img src="data:image/png;base64,AA">'
        '<a href="../secret.png">out</a><a href="rows.csv">rows</a></body></html>'
    )
    (folder / "index.html").write_text(html)
    (folder / "histogram.png").write_bytes(png_bytes(1))
    (folder / "gallery" / "000-frame.png").write_bytes(png_bytes(2))
    (folder / "gallery" / "999-stale.png").write_bytes(png_bytes(3))  # in the folder, not on the page
    (tmp_path / "secret.png").write_bytes(png_bytes(4))
    files, left_out = collect_report(folder)
    assert files == {
        "index.html": html.encode(),
        "histogram.png": png_bytes(1),
        "gallery/000-frame.png": png_bytes(2),
    }
    assert left_out == ["../secret.png", "rows.csv"]
    (folder / "histogram.png").unlink()
    with pytest.raises(StoreError, match=r"refers to histogram\.png"):
        collect_report(folder)
    with pytest.raises(StoreError, match="cannot read the report"):
        collect_report(tmp_path / "nowhere")
