"""The one resolution of the image set a route takes: create, calibrate and compare (and the
console's jobs through them).

Exact semantics of :meth:`ImageSets.from_body` (a JSON body's ``source`` / ``labelled`` / ``since`` /
``until``):

- ``since`` / ``until``: the images the product's inspection record kept in that range
  (``compare.record_images``), labelled when a person labelled every one; refused with ``source``.
- ``source == "store:labels"``: the console's labelled set (``store/labels.py``).
- ``labelled``: ``source`` is a server-side labelled folder (``good/`` + defect sub-folders, or the
  MVTec test layout), under the service's ``source_roots`` (``security.resolve_source``).
- otherwise ``source`` is a server-side folder or ``s3://`` prefix under ``source_roots``, read with
  the job's image cap (``data.sources.read_image_source``: nothing beyond it is read).

Uploads (a multipart or raw body) are read by ``bodies.uploads`` / ``bodies.labelled_uploads``
with the same cap. :meth:`ImageSets.checked` then applies the same checks to every set, before any
job starts: at most ``max_images_per_job`` images (413 ``too_many_images``), at least ``minimum``
(400 ``too_few_images``), both good and defective images where labels are needed (400), and every
image decoded (400 naming the bad one).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..config import ServiceConfig
from ..data.decode import decode_image
from ..data.sources import read_image_source
from ..errors import Refused
from ..store.labels import STORED_LABELS
from .security import resolve_source

__all__ = ["ImageSet", "ImageSets", "labelled_folder"]


@dataclass(frozen=True)
class ImageSet:
    """Encoded images by name, and their labels (1 = defective) when the set is labelled."""

    uploads: list[tuple[str, bytes]]
    labels: list[int] | None = None

    @classmethod
    def of_labelled(cls, rows: list[tuple[str, bytes, int]]) -> ImageSet:
        return cls([(name, data) for name, data, _ in rows], [label for _, _, label in rows])

    @property
    def data(self) -> list[bytes]:
        return [d for _, d in self.uploads]


def labelled_folder(source: str) -> list[tuple[str, bytes, int]]:
    """A server-side labelled folder (see data/labelled.py) as (name, bytes, label)."""
    from ..data.labelled import labelled_images
    from ..data.mvtec import DatasetError

    try:
        found = labelled_images(source)
    except DatasetError as exc:
        raise Refused(400, "bad_source", str(exc)) from None
    return [(str(p), p.read_bytes(), label) for p, label in found]


class ImageSets:
    """A service's image sets (module docstring): its source roots, its cap, its console's labels and record."""

    def __init__(self, service: ServiceConfig, console: Any) -> None:
        self.service, self.console = service, console

    async def from_body(
        self, product: str, *, source: Any = None, labelled: bool = False, since: Any = None, until: Any = None
    ) -> ImageSet:
        """The set a JSON body names (module docstring)."""
        if since is not None or until is not None:  # the product's inspection record
            return await self._recorded(product, source, since, until)
        if source == STORED_LABELS:  # the console's labelled set
            return ImageSet.of_labelled(await self.console.labelled(product))
        uri, confine_to = resolve_source(source, self.service.source_roots)
        if labelled:
            return ImageSet.of_labelled(await asyncio.to_thread(labelled_folder, uri))
        cap = self.service.max_images_per_job
        return ImageSet(await asyncio.to_thread(read_image_source, uri, max_images=cap, confine_to=confine_to))

    async def _recorded(self, product: str, source: Any, since: Any, until: Any) -> ImageSet:
        from ..workflows.compare import parse_time, record_images

        if source is not None:
            raise Refused(400, "bad_request", "give 'source' or 'since'/'until', not both")
        try:
            start, end = parse_time(since), parse_time(until)
        except ValueError as exc:
            raise Refused(400, "bad_request", f"since/until: {exc}") from None
        uploads, labels = await asyncio.to_thread(record_images, self.console.store, product, start, end)
        return ImageSet(uploads, labels)

    async def checked(
        self, images: ImageSet, *, minimum: int = 1, too_few: str = "no images", good_and_defective: bool = False
    ) -> ImageSet:
        """``images`` after the checks every route applies before a job starts (module docstring);
        ``too_few``: the refusal's words when fewer than ``minimum``."""
        limit = self.service.max_images_per_job
        n = len(images.uploads)
        if n > limit:
            raise Refused(413, "too_many_images", f"{n} images; the limit is {limit}")
        if good_and_defective and not (images.labels and 0 < sum(images.labels) < len(images.labels)):
            raise Refused(400, "bad_request", "labelled validation needs good and defective images")
        # every bad image is a 400 now, not a failed job later
        await asyncio.to_thread(lambda: [decode_image(data, source=name) for name, data in images.uploads])
        if n < minimum:
            raise Refused(400, "too_few_images" if minimum > 1 else "bad_request", too_few)
        return images
