"""Request bodies for the ingress: bounded reads, raw images, multipart forms, JSON objects.

Exact semantics:

- :func:`read_body` refuses a body over ``limit`` bytes before reading it when the request
  declares its length (413), and while reading it otherwise (413); a body that does not
  arrive within ``timeout`` seconds is a 408, so a slow client gives its slot back.
- :func:`parse_form` parses a multipart body that was already read (and bounded) with
  starlette's public parser: no private request attributes.
- :func:`uploads` returns the images of a raw-image body (one, named ``<body>``) or of a
  multipart body (every file part, in order) and the multipart's text fields; more than
  ``max_images`` files is a 413, a body without images a 400, another content type a 415.
- :func:`labelled_uploads` is the same for the calibrate route: file parts named ``good``
  (label 0) or ``defective`` (label 1).
- JSON bodies are typed (pydantic models: :class:`SourceBody`, :class:`LabelledSourceBody`,
  :class:`FarRuleBody`, :class:`RollbackBody`), checked by :func:`typed` after :func:`json_object`
  read them. Not as FastAPI body parameters: FastAPI would read the body unbounded (no 413 before
  reading, no 408), accept ``NaN`` and any depth, and two routes take JSON or multipart.
  A body that does not fit its model is a 400 ``bad_request`` with the route's one line.
- The admin routes' fields: :func:`publish_mode` (``?publish=``), :func:`check_region_field` (a
  region that counts no map pixel is a 400 before any job), :func:`tiles_field` (a create's grid) and
  :func:`geometry_fields` (the grid and the smallest defect, ``min_defect_px``).

Every refusal is an :class:`~hetmm_ray.errors.Refused` (status, code, one line).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, ValidationError, model_validator
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartParser
from starlette.requests import Request

from ..config import MAX_IMAGE_BYTES, ConfigError, DetectorConfig, publishes_candidate
from ..data.region_file import region_from_json
from ..errors import Refused, one_line
from .security import parse_json_object

__all__ = [
    "RAW_IMAGE_TYPES",
    "CompareBody",
    "FarRuleBody",
    "LabelledSourceBody",
    "PromoteBody",
    "RollbackBody",
    "SourceBody",
    "check_region_field",
    "content_type",
    "geometry_fields",
    "json_object",
    "labelled_uploads",
    "parse_form",
    "publish_mode",
    "read_body",
    "tiles_field",
    "typed",
    "uploads",
]

RAW_IMAGE_TYPES = ("image/png", "image/jpeg", "image/bmp", "image/tiff", "image/x-ms-bmp", "application/octet-stream")
MAX_FORM_FIELDS = 16  # text fields of a multipart body (config, objective, ...)


def content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_body(request: Request, *, limit: int, timeout: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Refused(400, "bad_request", "Content-Length is not a number")
        if int(declared) > limit:
            raise Refused(413, "too_large", f"request body of {declared} bytes exceeds {limit} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):  # a slow client must give its slot back
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise Refused(413, "too_large", f"request body exceeds {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise Refused(
            408, "body_timeout", f"the request body did not arrive within {timeout:g} s ({size} bytes received)"
        ) from None
    return b"".join(chunks)


async def parse_form(request: Request, body: bytes, *, max_files: int) -> FormData:
    """The multipart form in ``body`` (already read from ``request``); parser errors are a 400,
    more than ``max_files`` files a 413."""

    async def stream():  # the parser's input: the body we already hold, then the end
        yield body
        yield b""

    parser = MultiPartParser(
        request.headers, stream(), max_files=max_files, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_IMAGE_BYTES
    )
    try:
        return await parser.parse()
    except Exception as exc:  # noqa: BLE001 - the multipart parser's errors vary
        if "Too many files" in str(exc):  # the parser stops at max_files + 1: docs/service.md's 413
            raise Refused(413, "too_many_images", f"more than {max_files} images in one request") from None
        raise Refused(400, "bad_multipart", f"malformed multipart body ({one_line(exc)})") from None


async def uploads(
    request: Request, *, max_images: int, limit: int, timeout: float
) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """Images of a raw-image or multipart body, and the multipart's text fields."""
    ctype = content_type(request)
    body = await read_body(request, limit=limit, timeout=timeout)  # bounded first, whatever the type
    if ctype not in RAW_IMAGE_TYPES and ctype != "multipart/form-data":
        allowed = ", ".join((*RAW_IMAGE_TYPES[:4], "multipart/form-data"))
        raise Refused(415, "unsupported_media_type", f"content type {ctype or '(none)'!r}; send one of {allowed}")
    if ctype in RAW_IMAGE_TYPES:
        if not body:
            raise Refused(400, "empty_body", "the request body is empty: send an image")
        return [("<body>", body)], {}
    form = await parse_form(request, body, max_files=max_images)
    images, fields = [], {}
    for key, value in form.multi_items():
        if isinstance(value, str):
            fields[key] = value
        else:
            images.append((value.filename or key, await value.read()))
    if not images:
        raise Refused(400, "empty_body", "the multipart body holds no image files")
    if len(images) > max_images:
        raise Refused(413, "too_many_images", f"{len(images)} images in one request; the limit is {max_images}")
    return images, fields


async def labelled_uploads(
    request: Request, *, max_images: int, limit: int, timeout: float
) -> tuple[list[tuple[str, bytes]], list[int], dict[str, str]]:
    """Files named ``good`` / ``defective`` of a multipart body, their labels (1 = defective), text fields."""
    if content_type(request) != "multipart/form-data":
        raise Refused(415, "unsupported_media_type", "send multipart/form-data (files named good / defective)")
    body = await read_body(request, limit=limit, timeout=timeout)
    form = await parse_form(request, body, max_files=max_images)
    images, labels, fields = [], [], {}
    for key, value in form.multi_items():
        if isinstance(value, str):
            fields[key] = value
        elif key in ("good", "defective"):
            images.append((value.filename or key, await value.read()))
            labels.append(int(key == "defective"))
        else:
            raise Refused(400, "bad_request", f"file field {key!r}: name each file 'good' or 'defective'")
    return images, labels, fields


async def json_object(request: Request, *, limit: int, timeout: float) -> dict:
    ctype = content_type(request)
    if ctype != "application/json":
        raise Refused(415, "unsupported_media_type", f"content type {ctype or '(none)'!r}; send application/json")
    return parse_json_object(await read_body(request, limit=limit, timeout=timeout))


# --- typed JSON bodies --------------------------------------------------------------------
class SourceBody(BaseModel):
    """``POST /v1/products/{p}`` as JSON: a server-side ``source`` (checked by
    ``security.resolve_source``), an optional ``config`` object and an optional inspection
    ``region`` (``config/region.py``; both checked by the route), and optional ``tiles`` (the tile
    grid: ``[rows, cols]``, ``"RxC"`` or ``"auto"``, as the form's field) and ``min_defect_px`` (the
    smallest defect to find, frame pixels: :func:`geometry_fields`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: Any
    config: Any = None
    region: Any = None
    tiles: Any = None
    min_defect_px: Any = None


class LabelledSourceBody(BaseModel):
    """``POST .../calibrate`` as JSON, labelled rule: a labelled folder (or ``store:labels``),
    ``objective`` and ``max_false_alarm_rate`` (checked by the route, as the multipart fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: Any
    objective: Any = "f1"
    max_false_alarm_rate: Any = 0.01


class FarRuleBody(BaseModel):
    """``POST .../calibrate`` as JSON, far rule: ``{"rule": "far", "false_alarm_rate": r}``
    (``rule`` optional); ``r`` is checked against the ``threshold.false_alarm_rate`` range by the
    route (config.check_number). Each refusal names what to give."""

    model_config = ConfigDict(frozen=True)
    rule: str = "far"
    false_alarm_rate: Any

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        # Refused (not a ValueError) passes through pydantic unwrapped: the route's exact answers.
        unknown = set(data) - {"rule", "false_alarm_rate"}
        if unknown:
            raise Refused(
                400,
                "bad_request",
                f"JSON body: unknown field(s) {', '.join(sorted(map(str, unknown)))}; the far rule takes "
                "'rule': 'far' and 'false_alarm_rate' (the labelled rule: 'source', 'objective', "
                "'max_false_alarm_rate')",
            )
        if data.get("rule", "far") != "far":
            raise Refused(
                400,
                "bad_request",
                f"rule: {data['rule']!r} cannot be set by a rate; give 'far' (the labelled rule: give 'source')",
            )
        if "false_alarm_rate" not in data:
            raise Refused(400, "bad_request", "JSON body: give 'false_alarm_rate' for the far rule")
        return data


class RollbackBody(BaseModel):
    """``POST .../rollback``: ``{"version": n}``, an integer (not a bool, not 2.0); other keys ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    version: StrictInt


class CompareBody(BaseModel):
    """``POST .../versions/{v}/compare`` as JSON: a server-side ``source`` (folder or
    s3:// prefix, as create's; ``store:labels``: the console's labelled set), ``labelled`` (the
    folder is good/ + defect sub-folders: then recall per version), ``base`` (default HEAD), and
    ``since`` / ``until`` (a time range of the product's inspection record: the images it kept)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: Any = None
    labelled: StrictBool = False
    base: StrictInt | None = None
    since: Any = None
    until: Any = None


class PromoteBody(BaseModel):
    """``POST .../versions/{v}/promote``: optional ``{"expect_head": n}`` (refused with 409 unless the
    head is still ``n``: the head the candidate was compared with)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    expect_head: StrictInt | None = None


Body = TypeVar("Body", bound=BaseModel)


def typed(model: type[Body], spec: dict[str, Any], *, refusal: str) -> Body:
    """``spec`` (a request's JSON object) as ``model``; 400 ``bad_request`` with ``refusal`` if it
    does not fit (a model's own refusals pass through as they are)."""
    try:
        return model.model_validate(spec)
    except ValidationError:
        raise Refused(400, "bad_request", refusal) from None


# --- fields of the admin routes -------------------------------------------------------------------
def publish_mode(publish: str | None) -> str | None:
    """A request's ``?publish=``: ``live``, ``candidate`` or absent (the product's setting,
    else the service's); anything else is a 400."""
    if publish is not None:
        try:
            publishes_candidate(publish, None)  # the one check of a mode (config.publishes_candidate)
        except ConfigError as exc:
            raise Refused(400, "bad_request", str(exc)) from None
    return publish


def check_region_field(config: dict[str, Any]) -> None:
    """ConfigError (400) for a region that counts no pixel, at the reference size or on the map (a
    tiled product's: on one tile's map at least; ``detector_choice.check_region``)."""
    from ..detection.detector_choice import check_region  # the backbone's modules, only when a region is given

    region = config.get("region")
    if region is not None:
        region_from_json(region)
        check_region(DetectorConfig.from_dict(config))


def tiles_field(given: Any) -> dict[str, Any]:
    """A create request's ``tiles``: ``auto``, ``RxC`` (``2x2``) or ``[rows, cols]`` (JSON text in a
    form field, a list in a JSON body), as ``geometry`` settings (checked with the product's configuration)."""
    if isinstance(given, list):
        return {"tiles": given}
    if not isinstance(given, str):
        raise Refused(400, "bad_request", f"'tiles': give auto, RxC (2x2) or [rows, cols], not {type(given).__name__}")
    value = given.strip()
    if value == "auto":
        return {"tiles": "auto"}
    rows, sep, cols = value.lower().partition("x")
    if sep and rows.strip().isdigit() and cols.strip().isdigit():
        return {"tiles": [int(rows), int(cols)]}
    try:
        grid = json.loads(value)
    except ValueError:
        grid = None
    if not isinstance(grid, list):
        raise Refused(400, "bad_request", f"the 'tiles' field: auto, RxC (2x2) or [rows, cols], not {value[:40]!r}")
    return {"tiles": grid}  # its values are checked with the product's configuration


def geometry_fields(tiles: Any, min_defect_px: Any) -> dict[str, Any]:
    """A create request's ``tiles`` (:func:`tiles_field`) and ``min_defect_px`` (frame pixels: an int, or
    its text in a form field) as ``geometry`` settings, as given: what they mean is the fit's one rule
    (``geometry_rule.choose_geometry``), as on every other path. Values are checked with the product's configuration."""
    out = {} if tiles is None else tiles_field(tiles)
    if min_defect_px is not None:
        if isinstance(min_defect_px, str):
            text = min_defect_px.strip()
            if not text.isdigit():
                raise Refused(400, "bad_request", f"'min_defect_px': give frame pixels (an integer), not {text[:40]!r}")
            min_defect_px = int(text)
        out = {**out, "min_defect_px": min_defect_px}
    return out
