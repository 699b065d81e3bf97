"""What the ingress refuses from hostile or careless clients, in one place.

- :func:`parse_json_object`: a request's JSON object, refusing what Python's parser
  accepts but a service must not: ``NaN``/``Infinity`` (not JSON, and they break every
  later response), nesting deeper than :data:`MAX_JSON_DEPTH` (the parser recurses:
  deep enough nesting is a ``RecursionError``, i.e. a 500).
- :func:`finite_json`: a value with every non-finite float replaced by ``None``, and
  :class:`JSONResponse`, which renders through it with ``allow_nan=False``: a response
  is always valid JSON, whatever an older stored product holds.
- :class:`CrossOriginGuard`: ASGI middleware refusing cross-origin non-GET requests
  (403 ``cross_origin``), built with the origin policy (``allowed``, the service's
  ``allowed_origins``) passed in. A browser marks every request a web page makes with ``Origin``
  and/or ``Sec-Fetch-Site``; a request whose ``Origin`` is not the service's own
  (the ``Host`` it was sent to) nor one of the configured ``allowed_origins``, or that a
  browser marks ``cross-site``/``same-site``, is refused. Requests without either
  header (curl, scripts, the CLI) are not browser requests and pass. This holds with or
  without an admin token: a loopback service without one is otherwise writable by any
  page a line engineer opens.
- :func:`resolve_source`: a create request's server-side ``source`` only under the
  operator's ``source_roots`` (none by default), with the S3 endpoint taken from the
  matching root, never from the client's URI.
- :func:`refuse_open_bind`: a server on a non-loopback address must have an admin token
  (:class:`InsecureBind`, a configuration error: one CLI line).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.responses import JSONResponse as _StarletteJSONResponse

from ..config import ConfigError
from ..errors import Refused

__all__ = [
    "MAX_JSON_DEPTH",
    "CrossOriginGuard",
    "InsecureBind",
    "JSONResponse",
    "finite_json",
    "origin_allowed",
    "parse_json_object",
    "refuse_open_bind",
    "resolve_source",
]

MAX_JSON_DEPTH = 32
"""Deepest nesting accepted in a request's JSON (a configuration needs 3)."""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


# --- JSON in ------------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise Refused(400, "bad_json", f"{name} is not a JSON number; numbers must be finite")


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed value, iteratively (a recursive walk could overflow too)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json_object(text: str | bytes, *, what: str = "JSON body") -> dict[str, Any]:
    """A JSON object from a request, or :class:`Refused` (400 ``bad_json``) with why."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise Refused(400, "bad_json", f"{what}: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise Refused(400, "bad_json", f"{what}: malformed JSON ({exc})") from None
    if _depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise Refused(400, "bad_json", f"{what}: nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(data, dict):
        raise Refused(400, "bad_json", f"{what}: expected a JSON object")
    return data


# --- JSON out -----------------------------------------------------------------------------
def finite_json(value: Any) -> Any:
    """``value`` with every NaN/Infinity float (at any depth) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


class JSONResponse(_StarletteJSONResponse):
    """Starlette's JSONResponse that never writes NaN/Infinity (they become ``null``)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            finite_json(content), ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")


# --- cross-origin writes ------------------------------------------------------------------
def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    default = {"http": 80, "https": 443}[parts.scheme]
    try:
        port = parts.port or default
    except ValueError:
        return None
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


def origin_allowed(headers: dict[str, str], scheme: str, allowed: tuple[str, ...]) -> bool:
    """Whether a non-GET request with these (lower-case) headers may proceed (see the module doc)."""
    origin = headers.get("origin")
    fetch_site = headers.get("sec-fetch-site")
    if origin is not None:
        given = _origin_of(origin)
        if given is None:  # "null" (sandboxed frames, file://) or garbage
            return False
        own = _origin_of(f"{scheme}://{headers.get('host', '')}")
        return given == own or given in {_origin_of(a) for a in allowed}
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    return True


Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class CrossOriginGuard:
    """ASGI middleware: non-GET requests from another origin get 403 ``cross_origin``.

    ``allowed``: the origins allowed besides the service's own, as a function called at each
    request. The app is built at import time (Serve binds the ingress class to it) and the
    service's configuration reaches the replica later, so the builder passes a function that
    reads the serving ingress's configuration (serve/ingress.py).
    """

    def __init__(self, app: ASGIApp, *, allowed: Callable[[], tuple[str, ...]]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if not origin_allowed(headers, scope.get("scheme", "http"), self.allowed()):
                response = JSONResponse(
                    {
                        "error": {
                            "code": "cross_origin",
                            "message": f"refused a {scope['method']} from origin "
                            f"{headers.get('origin') or headers.get('sec-fetch-site')!r}: cross-origin writes "
                            "are not allowed (allowed_origins in the service's configuration lists exceptions)",
                        }
                    },
                    status_code=403,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# --- server-side sources ------------------------------------------------------------------
def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_source(source: Any, roots: tuple[str, ...]) -> tuple[str, str | None]:
    """``(URI to read, local root it is confined to)`` for a client's ``source``, or :class:`Refused`.

    Local sources must be absolute paths whose real path (symlinks resolved) lies under a
    local root; S3 sources ``s3://bucket/prefix`` (no query: the client never picks an
    endpoint) must lie under an S3 root, whose query (``endpoint``, ``region``) is used.
    """
    if not roots:
        raise Refused(
            400, "bad_source", "server-side sources are disabled: upload the images (the operator can set source_roots)"
        )
    if not isinstance(source, str) or not source or "\x00" in source:
        raise Refused(400, "bad_source", "'source' must be a non-empty path or s3:// URI")
    if source.startswith("s3://"):
        parts = urlsplit(source)
        if parts.query or parts.fragment or "?" in source or "#" in source:
            raise Refused(400, "bad_source", "an s3:// source takes no query: the endpoint is the server's")
        segments = [s for s in parts.path.split("/") if s]
        if any(s in (".", "..") for s in segments):
            raise Refused(400, "bad_source", "an s3:// source must not contain '.' or '..' segments")
        for root in roots:
            if not root.startswith("s3://"):
                continue
            rparts = urlsplit(root)
            rsegments = [s for s in rparts.path.split("/") if s]
            if parts.netloc == rparts.netloc and segments[: len(rsegments)] == rsegments:
                uri = f"s3://{parts.netloc}/{'/'.join(segments)}"
                return (f"{uri}?{rparts.query}" if rparts.query else uri), None
        raise Refused(400, "bad_source", f"{source}: outside the server's source roots")
    if "://" in source:
        raise Refused(400, "bad_source", "'source' must be an absolute folder path or an s3:// URI")
    if not os.path.isabs(source):
        raise Refused(400, "bad_source", "'source' must be an absolute folder path (never the server's working folder)")
    try:
        real = os.path.realpath(source, strict=False)
    except OSError as exc:  # a symlink loop
        why = exc.strerror or type(exc).__name__
        raise Refused(400, "bad_source", f"'source' cannot be resolved ({why})") from None
    for root in roots:
        if root.startswith("s3://"):
            continue
        real_root = os.path.realpath(root)
        if _under(real, real_root):
            try:  # only now: outside the roots, nothing is said about what exists
                os.stat(real)
            except OSError as exc:  # a 300-character component, no such folder
                why = exc.strerror or type(exc).__name__
                raise Refused(400, "bad_source", f"'source' cannot be read ({why})") from None
            return real, real_root
    raise Refused(400, "bad_source", "'source' is outside the server's source roots")


# --- where the server may listen ------------------------------------------------------
def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class InsecureBind(ConfigError, RuntimeError):
    """A non-loopback bind without an admin token (a configuration mistake: one CLI line)."""


def refuse_open_bind(host: str, token: str | None, env: str) -> None:
    """A server reachable from other machines must protect its admin routes."""
    if not _is_loopback(host) and not token:
        raise InsecureBind(
            f"refusing to serve on non-loopback address {host!r} without an admin token: set {env} (or bind 127.0.0.1)"
        )
