"""One error taxonomy: every expected failure is a :class:`HetmmError` with a code, a status and a line.

Exact semantics:

- Every exception class the project raises on purpose derives from :class:`HetmmError` (and
  keeps its historical built-in base, e.g. ``ConfigError`` is still a ``ValueError``).
- :data:`ERRORS` is the one table: class name -> (HTTP status, stable code). A subclass
  missing from it fails at import time (``TypeError``), so a new error class cannot reach a
  surface unmapped. :class:`Refused` (the HTTP service's refusals: one rule, many outcomes, such as
  413 ``too_large`` or 401 ``unauthorized``) carries a per-instance status and code; its table
  entry is the default.
- Both surfaces map mechanically through :func:`describe`: the CLI prints
  ``hetmm: error: <one line>`` and exits 2; HTTP answers ``status`` with
  ``{"error": {"code", "message"}}``. A Ray task's re-raised error (a subclass of its cause)
  describes as its cause.

This module imports nothing from the project, so every layer (``core/`` included) may use it.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ERRORS", "GRPC_CODES", "HetmmError", "Refused", "all_error_classes", "describe", "grpc_code", "one_line"]

# class name -> (HTTP status, code). Client mistakes are 4xx, the server's or a dependency's 5xx.
ERRORS: dict[str, tuple[int, str]] = {
    "HetmmError": (500, "internal"),
    # a user's input
    "ConfigError": (400, "bad_config"),
    "InsecureBind": (400, "bad_config"),
    "ImageError": (400, "bad_image"),
    "SourceError": (400, "bad_source"),
    "ArchiveError": (400, "bad_archive"),  # hetmm inspect: a SOURCE or DEST it cannot use
    "DatasetError": (400, "bad_dataset"),
    "CLIError": (400, "bad_request"),
    "Refused": (400, "bad_request"),  # per instance
    # a product's stored state
    "ProductNotFound": (404, "unknown_product"),
    "StoreConflict": (409, "conflict"),
    "TemplateError": (409, "incompatible_templates"),
    # the product's weights cannot be had or do not fit its backbone: the request is well formed,
    # the product as configured cannot be served (not the server's bug, so not a bare 500)
    "WeightsError": (422, "bad_weights"),
    "KeyMappingError": (422, "bad_weights"),
    # dependencies
    "StoreError": (502, "store_error"),
    "StoreCorrupt": (502, "store_error"),
    "StoreUnavailable": (503, "store_unavailable"),
    "ClusterUnavailable": (503, "cluster_unavailable"),
    # A station's service away (the part waits in its queue), and its queue full (the part is refused).
    "ServiceUnavailable": (503, "service_unavailable"),
    "QueueFull": (503, "queue_full"),
}


class HetmmError(Exception):
    """Base of every expected failure: ``status`` (HTTP), ``code`` (stable) and a one-line message."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__module__.startswith("hetmm_ray"):
            return  # Ray's RayTaskError(<cause>) subclasses: they inherit the cause's entry
        if cls.__name__ not in ERRORS:
            raise TypeError(f"{cls.__module__}.{cls.__name__}: add it to hetmm_ray.errors.ERRORS (status, code)")
        cls.status, cls.code = ERRORS[cls.__name__]


class Refused(HetmmError):
    """A request the HTTP service refuses: an HTTP status, a stable code and a one-line message.

    The one refusal class of the service (bodies, auth, sources, routes): :func:`describe` answers
    its own status and code, and a JSON error is built from it like from any other error.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def one_line(exc: BaseException) -> str:
    """The last non-empty line of ``str(exc)`` without a leading ``"<ClassName>: "`` (Ray's)."""
    lines = [s for s in str(exc).strip().splitlines() if s.strip()]
    text = lines[-1] if lines else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith(type(exc).__name__ + ": ") else text


def describe(exc: BaseException) -> tuple[int, str, str] | None:
    """``(status, code, one-line message)`` of a project error (or a Ray error caused by one); None otherwise."""
    cause = getattr(exc, "cause", None)
    for e in (cause, exc):  # a Ray task's error: its cause holds the message
        if isinstance(e, HetmmError):
            message = getattr(e, "message", None)
            return int(e.status), str(e.code), message if isinstance(message, str) and message else one_line(e)
    return None


def all_error_classes() -> list[type[HetmmError]]:
    """Every :class:`HetmmError` subclass defined so far (import the modules first), sorted by name."""
    seen: dict[str, type[HetmmError]] = {}
    todo: list[type[HetmmError]] = [HetmmError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("hetmm_ray.") and f"{sub.__module__}.{sub.__qualname__}" not in seen:
                seen[f"{sub.__module__}.{sub.__qualname__}"] = sub
                todo.append(sub)
    return sorted(seen.values(), key=lambda c: c.__name__)


# The gRPC surface (serve/grpc/): an error's HTTP status in the table above -> the gRPC status code
# (the name of its ``grpc.StatusCode``) it is answered with; the stable code leads the details
# (``"<code>: <message>"``). Close to gRPC's own HTTP mapping, with the client's mistakes kept apart:
# a wrong input INVALID_ARGUMENT, a size or count limit RESOURCE_EXHAUSTED, a state that must change
# first FAILED_PRECONDITION. README's gRPC table; tests/unit/serve/test_grpc_codes.py keeps the two
# equal and every status the project answers mapped.
GRPC_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "FAILED_PRECONDITION",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    422: "FAILED_PRECONDITION",
    499: "CANCELLED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
}


def grpc_code(status: int) -> str:
    """The gRPC status code name of an HTTP ``status`` (:data:`GRPC_CODES`; INTERNAL if unlisted)."""
    return GRPC_CODES.get(status, "INTERNAL")
