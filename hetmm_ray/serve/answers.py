"""The HTTP answers of errors and jobs, in one place: :func:`classify` maps any exception to a
:class:`~hetmm_ray.errors.Refused` through the one error table (``errors.describe``), transport
errors (a client gone, no replica) here, anything else a logged 500; :func:`error_response` is the
JSON error shape ``{"error": {"code", "message"}}``; :func:`job_answer` answers a request that waited
for its job; :func:`timed` wraps a route in the ingress's timing, metrics and error mapping. The
ingress and the gRPC service both use :func:`classify`."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from ray.exceptions import RayActorError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..errors import Refused, describe
from .security import JSONResponse

__all__ = ["answer_errors", "classify", "error_response", "job_answer", "timed"]


def classify(exc: BaseException) -> Refused:
    """The HTTP answer to ``exc``: project errors (refusals included) through the one table
    (``errors.describe``), transport errors (a client gone, no replica) here, anything else a
    logged 500."""
    # The client went away mid-request: starlette says ClientDisconnect; Serve's proxy cancels the
    # replica's pull of the body (TaskCancelledError). Its doing, not a server error: 499, no log.
    if isinstance(exc, ClientDisconnect | TaskCancelledError):
        return Refused(499, "client_closed_request", "the client closed the connection before the body was sent")
    if isinstance(exc, RayActorError | BackPressureError | DeploymentUnavailableError):
        return Refused(503, "unavailable", f"no replica could take the request now ({type(exc).__name__}); retry")
    known = describe(exc)  # Ray re-raises a remote error as a subclass of its cause: describe reads the cause
    if known is not None:
        return Refused(*known)
    cause = getattr(exc, "cause", None) or exc
    return Refused(500, "internal", f"internal error ({type(cause).__name__}); see the server log")


def error_response(err: Refused) -> JSONResponse:
    return JSONResponse({"error": {"code": err.code, "message": err.message}}, status_code=err.status)


def job_answer(record: dict[str, Any]) -> JSONResponse:
    """The answer to an admin request that waited for its job (``?wait=true``): 202 while it runs,
    200 once it succeeded, and for a failed job the status and code of its error in the one table
    (``errors.describe``, recorded by the job board) with the job beside the error."""
    if record["state"] == "running":
        return JSONResponse({"job": record}, status_code=202)
    if record["state"] == "failed":
        err = record.get("error") or {}
        status, code = int(err.get("status", 500)), str(err.get("code", "internal"))
        body = {"error": {"code": code, "message": err.get("message", "")}, "job": record}
        return JSONResponse(body, status_code=status)
    return JSONResponse({"job": record}, status_code=200)


def timed(route: str) -> Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]:
    """A route's timing, metrics and error mapping, in one place: the decorated method runs under
    :meth:`Ingress._timed` (any exception becomes its JSON error, every answer is counted under
    ``route``). Goes below ``@app.get`` / ``@app.post``; the method takes ``request``.
    ``functools.wraps`` keeps the name and signature Serve and FastAPI read the route from."""

    def decorate(method: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        @functools.wraps(method)
        async def endpoint(self: Any, *args: Any, **kwargs: Any) -> Response:
            return await self._timed(kwargs["request"], route, functools.partial(method, self, *args, **kwargs))

        return endpoint

    return decorate


def answer_errors(app: FastAPI) -> None:
    """``app``'s exception handlers: a refusal as it is, FastAPI's 404 / 405 and request validation
    as refusals, anything else through :func:`classify`; every one in the JSON error shape."""

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(Refused(exc.status_code, code, str(exc.detail)))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error_response(Refused(400, "bad_request", f"{where}: {first.get('msg', 'invalid request')}"))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(classify(exc))
