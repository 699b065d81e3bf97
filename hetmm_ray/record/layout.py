"""Where the inspection record lives in the store, its columns, and which images it keeps (no I/O here).

Exact semantics:

Keys, beside the product's versions (store/versioned.py) so the record lives and is listed with
the product, in a local folder or under an S3 prefix alike::

    {product}/inspections/date=YYYY-MM-DD/{t_ns:020d}-{writer}-{seq:06d}.parquet   one batch of rows
    {product}/inspection-images/YYYY-MM-DD/{digest[:32]}-{nbytes}.img              a kept image, as uploaded

``date`` is the UTC day of the batch's first row (a Hive partition: readers prune by it); a file
is written whole (the backend's atomic write), so a reader never sees half a batch. ``writer`` is
the writing process's random id, ``seq`` its batch counter: names never collide. An image's key
carries its size, so the bytes kept per day are a listing away (no object to read).

Columns (:data:`COLUMNS`), one row per inspected image:

=================  ==========  ========================================================
``time``           float64     unix seconds when the ingress had the result
``version``        int64       the template version that scored it
``score``          float64     its image score
``threshold``      float64     the threshold it was judged at
``review_threshold`` float64   the review band's lower threshold (null: no band)
``verdict``        string      ``ok`` | ``review`` | ``reject`` (core/review.py)
``is_anomaly``     bool        as the predict response said
``expected_rate``  float64     the operating point's estimated false-alarm rate (null before calibration)
``image_digest``   string      sha256 (hex) of the uploaded bytes
``image_bytes``    int64       size of the uploaded bytes
``name``           string      the upload's file name (``<body>`` for a raw body)
``request_id``     string      one id per predict request (several images share it)
``recent_id``      string      the console's id of the prediction (serve/recent.py)
``image_key``      string      where the image is kept (null: not kept by the policy)
``label``          string      a person's word, ``good`` | ``defective`` (null: none yet)
=================  ==========  ========================================================

``label`` is never written by the writer (files are immutable): readers fill it from the
product's labelled set (store/labels.py, keyed by the first 16 hex digits of the image digest),
so a label given later shows on every row of that image.

Image policy (:func:`keep_image`): every image judged ``reject`` or ``review`` is kept; of the
``ok`` ones a share ``pass_sample``, chosen by digest (``int(digest[:8], 16) / 2**32 <
pass_sample``: the same image always gets the same answer, no random state); and nothing more
once the product's kept bytes of that UTC day reach ``cap_bytes`` (a kept image may overshoot the
cap by its own size at most).
"""

from __future__ import annotations

import time

__all__ = [
    "COLUMNS",
    "IMAGES",
    "INSPECTIONS",
    "day_of",
    "image_key",
    "image_size_of",
    "keep_image",
    "parquet_key",
]

INSPECTIONS = "inspections"
IMAGES = "inspection-images"
COLUMNS = (
    "time",
    "version",
    "score",
    "threshold",
    "review_threshold",
    "verdict",
    "is_anomaly",
    "expected_rate",
    "image_digest",
    "image_bytes",
    "name",
    "request_id",
    "recent_id",
    "image_key",
    "label",
)


def day_of(t: float) -> str:
    """The UTC day of unix time ``t`` as ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def parquet_key(product: str, t: float, writer: str, seq: int) -> str:
    return f"{product}/{INSPECTIONS}/date={day_of(t)}/{int(t * 1e9):020d}-{writer}-{seq:06d}.parquet"


def image_key(product: str, t: float, digest: str, nbytes: int) -> str:
    return f"{product}/{IMAGES}/{day_of(t)}/{digest[:32]}-{nbytes}.img"


def image_size_of(key: str) -> int:
    """The size an image key records (0 for a key not of this layout)."""
    stem = key.rsplit("/", 1)[-1].removesuffix(".img")
    try:
        return int(stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def keep_image(verdict: str, digest: str, pass_sample: float, kept_today: int, cap_bytes: int) -> bool:
    """Whether the policy of the module docstring keeps an image."""
    if kept_today >= cap_bytes:
        return False
    if verdict in ("reject", "review"):
        return True
    return int(digest[:8], 16) / 2**32 < pass_sample
