"""The three stages of ``hetmm inspect``, as Ray Data runs them (job.py builds the pipeline).

Exact semantics:

- :func:`read_and_fit` (CPU tasks): for each listed file, the bytes (``locations.read_bytes``: the
  size limit checked before reading), then ``data.decode.decode_image`` (header, pixel-count and side
  limits checked before any pixel is decoded), then the canvas fit ``resize_to_geometry(image,
  image_size, geometry)`` that ``hetmm predict`` applies (tiled products keep the whole frame: their
  detector cuts it). Any failure is the row's ``error``; the task never raises for a bad file.
- :class:`DetectorActor` (an actor pool): loads the product's version once per actor, as ``hetmm
  predict`` does (``detector_choice.load_detector`` over ``store.open_store``), with ``threads`` torch threads
  (> 0), else :func:`actor_threads` of its node's CPUs and its reservation; each call is one ``predict`` on the batch's
  decoded images, so a row's score is ``hetmm predict``'s (scores do not depend on which images share
  a batch), and a row's result fields are the one result record's (``result.result_records``, with the
  product's review band). Rows with an error pass through unscored. Heat-map PNGs are written from here.
- :func:`write_part` (CPU tasks): one Parquet part per block, named by a digest of its paths
  (``part-<sha1[:24]>.parquet``: a retried task rewrites the same name with the same rows, never a
  second copy), written atomically (``locations.write_atomic``). Returns one small row per image
  (``node``, ``failed``) for the driver's counts.
"""

from __future__ import annotations

import hashlib
import io
import math
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..config.archive import PART_PREFIX, PART_SUFFIX
from ..data.decode import ImageError, decode_image, resize_to_geometry
from ..result import RECORD_FIELDS, result_records, review_threshold_of
from .locations import FsSpec, read_bytes, write_atomic
from .schema import DECODED_SCHEMA, OUTPUT_SCHEMA

__all__ = ["DetectorActor", "actor_threads", "part_name", "peak_of", "read_and_fit", "write_part"]


def actor_threads(node_cpus: float, actor_cpus: float) -> int:
    """Torch threads of a detector actor on a node of ``node_cpus`` logical CPUs that reserves
    ``actor_cpus`` of them (``config.archive.ACTOR_THREADS``): the node's CPUs divided by the actors
    the default pool places on it (``(node_cpus - 1) // actor_cpus``, at least 1: one logical CPU of
    each node is left to reading, decoding and writing), and never fewer than the reservation's
    ``ceil``. 2 CPUs, 1 reserved: 2 threads; 16 CPUs, 1 reserved (15 actors): 1; 16 CPUs, 4 reserved
    (3 actors): 5."""
    per_node = max(1, int((node_cpus - 1) // actor_cpus))
    return max(1, math.ceil(actor_cpus), int(node_cpus // per_node))


def read_and_fit(batch: pa.Table, *, spec: FsSpec, canvas: tuple[int, str] | None) -> pa.Table:
    """Decoded, canvas-fitted pixels (or the error) of each listed file (module docstring); ``canvas``:
    the product's ``DetectorConfig.decode_canvas`` (None: frames kept whole, a tiled product cuts them)."""
    rows: dict[str, list[Any]] = {name: [] for name in DECODED_SCHEMA.names}
    for uri, size in zip(batch.column("uri").to_pylist(), batch.column("size").to_pylist(), strict=True):
        image = fitted = None
        error = None
        t0 = time.perf_counter()
        t1 = None  # when the bytes were in: reading ends, decoding starts
        try:
            raw = read_bytes(uri, size, spec)
            t1 = time.perf_counter()
            image = decode_image(raw, source=uri)
            fitted = image if canvas is None else resize_to_geometry(image, *canvas)
        except ImageError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - never stop the archive on one file: the row says why
            error = f"{uri}: {type(exc).__name__}: {exc}".splitlines()[0]
        t2 = time.perf_counter()
        read_ms = 1000 * ((t1 or t2) - t0)
        decode_ms = 0.0 if t1 is None else 1000 * (t2 - t1)
        rows["path"].append(uri)
        rows["width"].append(None if image is None else int(image.shape[1]))
        rows["height"].append(None if image is None else int(image.shape[0]))
        rows["pixels"].append(None if fitted is None else np.ascontiguousarray(fitted).tobytes())
        rows["fit_h"].append(None if fitted is None else int(fitted.shape[0]))
        rows["fit_w"].append(None if fitted is None else int(fitted.shape[1]))
        rows["read_ms"].append(read_ms)
        rows["decode_ms"].append(decode_ms)
        rows["error"].append(error)
    return pa.table(rows, schema=DECODED_SCHEMA)


def peak_of(amap: np.ndarray, region: np.ndarray | None, width: int, height: int) -> tuple[int, int, float]:
    """(x, y, value) of the map's maximum (inside ``region`` when given), in source-image pixels."""
    values = np.asarray(amap, dtype=np.float32)
    if region is not None and np.asarray(region).any():
        values = np.where(np.asarray(region, dtype=bool), values, -np.inf)
    r, c = np.unravel_index(int(np.argmax(values)), values.shape)
    h, w = values.shape
    x = min(width - 1, int((c + 0.5) * width / w))
    y = min(height - 1, int((r + 0.5) * height / h))
    return x, y, float(amap[r, c])


class DetectorActor:
    """One detector (one model) per actor: scores decoded batches (module docstring)."""

    def __init__(
        self,
        *,
        store: str,
        endpoint_url: str | None,
        product: str,
        version: int,
        overrides: dict[str, Any],
        sigmas: float | None,
        false_alarm_rate: float | None,
        heatmaps: str | None,
        spec: FsSpec,
        threads: int = 0,
    ) -> None:
        import ray

        from ..detection.detector_choice import load_detector
        from ..distributed.runtime import use_assigned_cpus
        from ..store import open_store

        self.node = ray.get_runtime_context().get_node_id()
        if threads <= 0:  # the rule: the node's cores shared by the actors placed there (actor_threads)
            node_cpus = next(n["Resources"].get("CPU", 1.0) for n in ray.nodes() if n["NodeID"] == self.node)
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
            threads = actor_threads(node_cpus, cpus)
        self.threads = use_assigned_cpus(threads)
        self.det = load_detector(open_store(store, endpoint_url=endpoint_url), product, version, **overrides)
        self.product, self.version = product, version
        self.rule = {"sigmas": sigmas, "false_alarm_rate": false_alarm_rate}
        op = self.det.operating_point(**self.rule)
        self.threshold = float("inf") if op is None else float(op.threshold)
        self.review = review_threshold_of(self.det)  # the product's review band (result.py)
        self.heatmaps, self.spec = heatmaps, spec

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        cols = batch.to_pydict()
        out: dict[str, list[Any]] = {name: [None] * n for name in OUTPUT_SCHEMA.names}
        for name in ("path", "width", "height", "read_ms", "decode_ms", "error"):
            out[name] = cols[name]
        out["product"] = [self.product] * n
        out["version"] = [self.version] * n
        out["threshold"] = [self.threshold] * n
        good = [i for i in range(n) if cols["error"][i] is None]
        if good:
            images = [
                np.frombuffer(cols["pixels"][i], dtype=np.uint8).reshape(cols["fit_h"][i], cols["fit_w"][i], 3)
                for i in good
            ]
            t0 = time.perf_counter()
            pred = self.det.predict(images, **self.rule)
            per_image = 1000 * (time.perf_counter() - t0) / len(good)
            records = result_records(pred, review_threshold=self.review)
            for k, i in enumerate(good):
                region = None if pred.regions is None else pred.regions[k]
                x, y, value = peak_of(pred.maps[k], region, cols["width"][i], cols["height"][i])
                for name in RECORD_FIELDS:  # the one result record's fields, as every path has them
                    out[name][i] = records[k][name]
                out["version"][i] = self.version
                out["peak_x"][i], out["peak_y"][i], out["peak_value"][i] = x, y, value
                out["score_ms"][i] = per_image
                out["node"][i] = self.node
                if self.heatmaps is not None:
                    out["heatmap"][i] = self._heatmap(cols["path"][i], images[k], pred, k, region)
        return pa.table(out, schema=OUTPUT_SCHEMA)

    def _heatmap(self, path: str, image: np.ndarray, pred: Any, k: int, region: np.ndarray | None) -> str:
        from PIL import Image

        from ..visualize import draw_overlay

        overlay = draw_overlay(image, pred.maps[k], threshold=pred.threshold, region=region)
        buf = io.BytesIO()
        Image.fromarray(overlay).save(buf, format="PNG")
        stem = path.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
        name = f"heatmaps/{stem}-{hashlib.sha1(path.encode()).hexdigest()[:12]}.png"
        assert self.heatmaps is not None
        return write_atomic(self.heatmaps, name, buf.getvalue(), self.spec)


def part_name(paths: list[str]) -> str:
    """``part-<sha1 of the paths, newline-joined, first 24 hex>.parquet``."""
    return f"{PART_PREFIX}{hashlib.sha1(chr(10).join(paths).encode()).hexdigest()[:24]}{PART_SUFFIX}"


def write_part(batch: pa.Table, *, dest: str, spec: FsSpec) -> pa.Table:
    """Write the block as one Parquet part of DEST; one ``(node, failed)`` row per image back."""
    table = batch.select(OUTPUT_SCHEMA.names).cast(OUTPUT_SCHEMA)
    if table.num_rows:
        buf = io.BytesIO()
        pq.write_table(table, buf)
        write_atomic(dest, part_name(table.column("path").to_pylist()), buf.getvalue(), spec)
    failed = pc.is_valid(table.column("error"))
    return pa.table({"node": table.column("node"), "failed": failed})
