"""The output of ``hetmm inspect``: one Parquet row per source file, this schema in every part.

Exact semantics of the columns (:data:`OUTPUT_SCHEMA`; null where marked):

- ``path`` (string): the source URI (``/abs/path`` or ``s3://bucket/key``, ``locations.normal_uri``).
- ``product`` (string), ``version`` (int64): the product and the template version that scored it (one
  version per job, resolved at the start: the head unless ``--version``).
- ``score`` (float64, null on error): the image score exactly as ``hetmm predict`` computes it
  (``HETMM.predict`` on the image decoded by ``data.decode.decode_image`` and fitted to the canvas by
  ``resize_to_geometry``; a float32 widened, never rounded). ``threshold`` (float64): the verdict
  threshold of the product's rule, or of ``--sigmas``/``--false-alarm-rate``; ``inf`` before calibration.
- The result record's fields (hetmm_ray/result.py, docs/result-record.md), null on error:
  ``record_version`` (int32), ``is_anomaly`` (bool: ``score > threshold``), ``verdict`` (``ok`` |
  ``review`` | ``reject``; ``reject`` exactly when ``is_anomaly``), ``review_threshold`` (float64, null
  without a review band), ``threshold_rule`` (string), ``rule_target`` and ``estimated_false_alarm_rate``
  (float64; null before calibration). Parts written before ``record_version`` 1 have none of these but
  ``is_anomaly`` and ``verdict``, whose words were ``anomaly`` / ``ok`` (``result.verdict_word`` reads them).
- ``peak_x``, ``peak_y`` (int32), ``peak_value`` (float64), null on error: the top anomaly location, the
  arg-max of the heat map (inside the product's inspection region when it has one), in the source
  image's pixels (``(column + 0.5) * width / map_width``, floored); ``peak_value`` is the map there.
- ``width``, ``height`` (int32, null when unreadable): the source image's size.
- ``heatmap`` (string, null unless ``--heatmaps``): the URI of the PNG overlay (drawn on the image as
  fitted to the canvas, ``visualize.draw_overlay``, the picture ``hetmm predict`` draws).
- ``read_ms``, ``decode_ms`` (float64): reading the bytes; decoding and fitting to the canvas.
  ``score_ms`` (float64, null on error): the actor's ``predict`` time of the batch divided by its images.
- ``node`` (string, null on an error before scoring): the Ray node id of the actor that scored it.
- ``error`` (string, null when scored): ``"<uri>: <problem>"`` (``data.decode.ImageError``'s text) for
  an unreadable, truncated, oversized, empty or non-image file; such a row has no score.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["DECODED_SCHEMA", "OUTPUT_SCHEMA", "SOURCE_SCHEMA"]

SOURCE_SCHEMA = pa.schema([("uri", pa.string()), ("size", pa.int64())])
"""A listing block: each file's URI and its byte count (-1: unknown)."""

DECODED_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("pixels", pa.large_binary()),  # RGB uint8, C order, (fit_h, fit_w, 3); null on error
        ("fit_h", pa.int32()),
        ("fit_w", pa.int32()),
        ("read_ms", pa.float64()),
        ("decode_ms", pa.float64()),
        ("error", pa.string()),
    ]
)
"""Between the decode tasks and the detector actors."""

OUTPUT_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("product", pa.string()),
        ("version", pa.int64()),
        ("score", pa.float64()),
        ("threshold", pa.float64()),
        ("is_anomaly", pa.bool_()),
        ("verdict", pa.string()),
        ("record_version", pa.int32()),
        ("review_threshold", pa.float64()),
        ("threshold_rule", pa.string()),
        ("rule_target", pa.float64()),
        ("estimated_false_alarm_rate", pa.float64()),
        ("peak_x", pa.int32()),
        ("peak_y", pa.int32()),
        ("peak_value", pa.float64()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("heatmap", pa.string()),
        ("read_ms", pa.float64()),
        ("decode_ms", pa.float64()),
        ("score_ms", pa.float64()),
        ("node", pa.string()),
        ("error", pa.string()),
    ]
)
"""Every part's schema (module docstring)."""
