"""``hetmm inspect`` from and to S3 (a real moto server on 127.0.0.1) through ``pyarrow.fs``.

The endpoint follows the template store's rules: ``--endpoint-url``, else the URI's ``?endpoint=``,
else boto3's chain (``AWS_ENDPOINT_URL``), resolved by the driver; workers only get credentials
from their environment. Ray starts after the dummy credentials are set, so its workers have them.
"""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import numpy as np
import pytest
from archive_helpers import PRODUCT, bad_bytes, gear_images, read_rows
from helpers import png

from hetmm_ray.archive import FsSpec, JobOptions, inspect_archive
from hetmm_ray.detection.detector_choice import load_detector

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BUCKET = "archive"
N = 10


@pytest.fixture(scope="module")
def bucket(own_ray, s3_endpoint: str) -> Iterator[dict[str, np.ndarray]]:
    from hetmm_ray.distributed.runtime import connect

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    images = gear_images(N)
    for name, image in images.items():
        client.put_object(Bucket=BUCKET, Key=f"in/{name}", Body=png(image))
    good = png(next(iter(images.values())))
    client.put_object(Bucket=BUCKET, Key="in/truncated.png", Body=bad_bytes("truncated.png", good))
    client.put_object(Bucket=BUCKET, Key="in/notes.txt", Body=b"not an image")
    client.put_object(Bucket=BUCKET, Key="in/.hidden.png", Body=b"left out")
    connect()  # the embedded Ray, started now: its workers inherit the dummy credentials
    yield images


def _expected_scores(store: str, images: dict[str, np.ndarray]) -> dict[str, float]:
    from hetmm_ray.data.decode import decode_image, resize_to_geometry
    from hetmm_ray.store import open_store

    det = load_detector(open_store(store), PRODUCT)
    bb = det.config.backbone
    names = sorted(images)
    pred = det.predict([resize_to_geometry(decode_image(png(images[n])), bb.image_size, bb.geometry) for n in names])
    return {f"s3://{BUCKET}/in/{n}": float(s) for n, s in zip(names, pred.scores, strict=True)}


def test_s3_source_and_sink_score_as_in_process(bucket: dict, gear_store: str, s3_endpoint: str) -> None:
    dest = f"s3://{BUCKET}/out"
    opts = JobOptions(store=gear_store, endpoint_url=s3_endpoint, batch_size=4, block_size=5)
    report = inspect_archive(f"s3://{BUCKET}/in", PRODUCT, dest, opts, heatmaps=True)
    assert (report.written, report.errors) == (N + 2, 2)
    rows = {r["path"]: r for r in read_rows(dest, FsSpec(s3_endpoint))}
    assert len(rows) == N + 2
    expected = _expected_scores(gear_store, bucket)
    np.testing.assert_allclose([rows[p]["score"] for p in sorted(expected)], sorted_values(expected), rtol=1e-5)
    assert "truncated or corrupt" in rows[f"s3://{BUCKET}/in/truncated.png"]["error"]
    assert rows[f"s3://{BUCKET}/in/notes.txt"]["score"] is None
    heatmap = rows[sorted(expected)[0]]["heatmap"]
    assert heatmap.startswith(f"s3://{BUCKET}/out/heatmaps/")
    body = boto3.client("s3", endpoint_url=s3_endpoint).get_object(Bucket=BUCKET, Key=heatmap[len(f"s3://{BUCKET}/") :])
    assert body["Body"].read().startswith(b"\x89PNG")


def sorted_values(d: dict[str, float]) -> list[float]:
    return [d[k] for k in sorted(d)]


def test_endpoint_from_the_environment_a_list_on_s3_and_a_restart(
    bucket: dict, gear_store: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    listed = sorted(bucket)[:4]
    client.put_object(Bucket=BUCKET, Key="lists/four.txt", Body="".join(f"s3://{BUCKET}/in/{n}\n" for n in listed))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # boto3's chain, as the store reads it
    dest = f"s3://{BUCKET}/out-list"
    opts = JobOptions(store=gear_store, batch_size=4)
    first = inspect_archive(f"s3://{BUCKET}/lists/four.txt", PRODUCT, dest, opts)
    assert (first.written, first.errors) == (4, 0)
    again = inspect_archive(f"s3://{BUCKET}/lists/four.txt", PRODUCT, dest, opts)
    assert (again.skipped, again.written) == (4, 0)
    rows = read_rows(dest, FsSpec.for_uri(dest))
    assert sorted(r["path"] for r in rows) == [f"s3://{BUCKET}/in/{n}" for n in listed]


def test_the_uri_names_its_endpoint_and_a_missing_prefix_is_one_line(
    bucket: dict, gear_store: str, s3_endpoint: str
) -> None:
    from hetmm_ray.archive import ArchiveError

    source = f"s3://{BUCKET}/in/g000.png?endpoint={s3_endpoint}"
    dest = f"s3://{BUCKET}/out-one?endpoint={s3_endpoint}"
    report = inspect_archive(source, PRODUCT, dest, JobOptions(store=gear_store))
    assert report.written == 1 and report.errors == 0
    with pytest.raises(ArchiveError, match="no objects under this prefix"):
        inspect_archive(
            f"s3://{BUCKET}/nothing-here?endpoint={s3_endpoint}", PRODUCT, dest, JobOptions(store=gear_store)
        )


def test_a_record_in_an_s3_store_is_a_source(bucket: dict, s3_endpoint: str, tmp_path) -> None:
    """``--since/--until`` on an S3 template store: the kept images are read from the store's bucket
    with the operator's endpoint; paths are their ``s3://`` URIs; scores as in process."""
    from archive_helpers import SyntheticProduct, tiny_config

    from hetmm_ray.archive import RecordSource
    from hetmm_ray.data.decode import decode_image, resize_to_geometry
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.record.writer import InspectionRecorder, RecordSettings
    from hetmm_ray.store import open_store

    store = f"s3://{BUCKET}/templates"
    templates = open_store(store, endpoint_url=s3_endpoint)
    gear = SyntheticProduct(seed=0, size=tiny_config().backbone.image_size)
    HETMM(tiny_config()).fit([gear.good(i) for i in range(6)]).save(templates, PRODUCT)  # the store's own product
    images = dict(list(bucket.items())[:4])
    settings = RecordSettings(1000, 3600.0, 10_000, 1.0, 2**30, 100_000)  # pass_sample 1: every image kept
    rec = InspectionRecorder(templates.backend, settings)
    for k, (name, image) in enumerate(images.items()):
        rec.submit(
            PRODUCT, [(name, png(image))], [{"score": 0.0, "threshold": 1.0, "verdict": "ok", "version": 1}], f"r{k}"
        )
    assert rec.flush(120.0)
    rec.close()
    opts = JobOptions(store=store, endpoint_url=s3_endpoint, batch_size=2)
    report = inspect_archive(RecordSource(store, PRODUCT), PRODUCT, str(tmp_path / "out"), opts)
    rows = read_rows(str(tmp_path / "out"))
    assert report.written == len(rows) == len(images) and report.errors == 0
    assert all(r["path"].startswith(f"{store}/{PRODUCT}/inspection-images/") for r in rows)
    det = load_detector(templates, PRODUCT)
    bb = det.config.backbone
    canvases = [resize_to_geometry(decode_image(png(image)), bb.image_size, bb.geometry) for image in images.values()]
    expected = sorted(float(s) for s in det.predict(canvases).scores)
    np.testing.assert_allclose(sorted(r["score"] for r in rows), expected, rtol=1e-5, atol=2e-6)
