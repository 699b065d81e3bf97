"""A Python client of ``hetmm.v1.Inspection`` (``hetmm predict --grpc HOST:PORT``, tests, benchmarks).

Exact semantics: :class:`InspectionClient` opens one insecure channel to ``target`` (``host:port``)
and sends every call with the metadata Serve's gRPC proxy routes by: ``application`` (the gRPC
application, ``config.GRPC_APP_NAME``) and, for ``predict``, ``multiplexed_model_id`` (the
product), plus ``authorization: Bearer <token>`` when a token is given. An image is its encoded bytes
or a camera's :class:`~hetmm_ray.data.raw_frame.RawFrame`, sent as pixels (``Image.raw``), never encoded
here; its size against the request limits is its bytes either way. A refused call raises
:class:`grpc.RpcError`; its ``details()`` is ``"<code>: <message>"`` (``errors.GRPC_CODES``), and
:func:`error_code` reads the stable code back.

:meth:`InspectionClient.predict_all` scores any number of images: it reads them as it needs them, cuts
them into requests (:func:`request_chunks`: consecutive, at most ``per_request`` images and ``max_bytes``
in all, an image larger than that alone), keeps ``in_flight`` requests in flight and yields each
image's result in the order given. A request of several images refused RESOURCE_EXHAUSTED (the
service's limits are lower: ``too_many_images``, ``too_large``) is split in halves and sent again, down
to single images; any other refusal, or one image refused, raises. With ``skip_bad_images``, a request
refused INVALID_ARGUMENT ``bad_image`` (an image the service cannot decode: it refuses the whole
request before scoring any of it) is split the same way, and the image refused alone is given as an
:class:`ImageRefused` in its place, the others scored, as ``hetmm predict`` skips unreadable files in
process.

Every call refused because the service is not (yet) there (:func:`service_away`: UNAVAILABLE: no
listener yet, the gRPC application still starting, a replica going; or NOT_FOUND from Serve's own
proxy, not from the application: a service whose proxy is up before its gRPC application is
deployed, as after a restart) is sent again after ``config.GRPC_CLIENT_RETRY_PAUSE_S`` (0.25 s, doubling to 2 s) until
``wait_s`` seconds have passed since its first try, then raises the last refusal; ``wait_s`` 0 sends
once. The channel reconnects on the same schedule (gRPC's own backoff grows to 120 s). A ``Predict``
is sent again only when so refused: the stand-in's and the proxy's refusals score nothing;
a connection lost mid-call may have scored (and recorded) the images once already.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from ...config import (
    GRPC_APP_NAME,
    GRPC_CLIENT_IMAGES_PER_REQUEST,
    GRPC_CLIENT_IN_FLIGHT,
    GRPC_CLIENT_REQUEST_MIB,
    GRPC_CLIENT_RETRY_PAUSE_S,
    GRPC_CLIENT_WAIT_S,
    MAX_IMAGE_BYTES,
)
from ...data.raw_frame import RawFrame
from . import inspection_pb2 as pb
from .inspection_pb2_grpc import InspectionStub
from .messages import image_message

__all__ = ["ImageRefused", "InspectionClient", "error_code", "request_chunks", "service_away"]

Upload = tuple[str, bytes | RawFrame]  # (name, encoded image or a camera's raw frame, sent as it is)
Reply = TypeVar("Reply")


@dataclass(frozen=True)
class ImageRefused:
    """An image the service refused on its own (``predict_all(skip_bad_images=True)``), in its place."""

    name: str
    details: str  # "<code>: <message>", e.g. "bad_image: part.png: not a recognised image format ..."


def request_chunks(images: Iterable[Upload], per_request: int, max_bytes: int) -> Iterator[list[Upload]]:
    """``images`` in consecutive chunks of at most ``per_request`` images and ``max_bytes`` bytes in all
    (an image of more than ``max_bytes`` forms a chunk alone), read from ``images`` as they are needed."""
    if per_request < 1 or max_bytes < 1:
        raise ValueError(f"per_request and max_bytes must be >= 1, not {per_request} and {max_bytes}")
    chunk: list[Upload] = []
    size = 0
    for name, data in images:
        if chunk and (len(chunk) == per_request or size + len(data) > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append((name, data))
        size += len(data)
    if chunk:
        yield chunk


def error_code(error: grpc.RpcError) -> str:
    """The stable code (``too_large``, ``unknown_product``...) of a refused call's details."""
    details = error.details() or ""  # type: ignore[attr-defined]
    return details.split(":", 1)[0] if ":" in details else ""


def service_away(error: grpc.RpcError) -> bool:
    """A refusal that says the service is not (yet) there to score, not that the call is wrong:
    UNAVAILABLE, or NOT_FOUND without the application's ``"<code>: "`` (Serve's proxy saying
    ``Application 'hetmm-grpc' not found``: the application is not deployed yet)."""
    code = error.code()  # type: ignore[attr-defined]
    return code == grpc.StatusCode.UNAVAILABLE or (code == grpc.StatusCode.NOT_FOUND and not error_code(error))


class InspectionClient:
    """``hetmm.v1.Inspection`` on ``target``; ``timeout`` seconds per call, a call refused UNAVAILABLE
    sent again for up to ``wait_s`` seconds (module doc), ``on_wait(refusal)`` called before each pause."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        wait_s: float = GRPC_CLIENT_WAIT_S,
        on_wait: Callable[[grpc.RpcError], None] | None = None,
    ) -> None:
        if not wait_s >= 0:
            raise ValueError(f"wait_s must be >= 0, not {wait_s}")
        # messages up to the images' own limit (16 images of the largest accepted size and the reply)
        size = 16 * MAX_IMAGE_BYTES + 2**20
        first_ms, longest_ms = (round(1000 * s) for s in GRPC_CLIENT_RETRY_PAUSE_S)
        options = [
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.initial_reconnect_backoff_ms", first_ms),
            ("grpc.min_reconnect_backoff_ms", first_ms),
            ("grpc.max_reconnect_backoff_ms", longest_ms),
        ]
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = InspectionStub(self.channel)
        self.timeout = timeout
        self.wait_s = wait_s
        self.on_wait = on_wait
        self._metadata: list[tuple[str, str]] = [("application", GRPC_APP_NAME)]
        if token:
            self._metadata.append(("authorization", f"Bearer {token}"))

    def predict(
        self,
        product: str,
        images: Sequence[Upload],
        *,
        heatmap: bool = False,
        version: int | None = None,
        threshold: float | None = None,
    ) -> pb.PredictReply:
        """Score ``images`` ((name, encoded bytes or :class:`RawFrame`) pairs) of ``product``."""
        request = pb.PredictRequest(product=product, images=[image_message(n, d) for n, d in images], heatmap=heatmap)
        if version is not None:
            request.version = version
        if threshold is not None:
            request.threshold = threshold
        return self._call(self.stub.Predict, request, [*self._metadata, ("multiplexed_model_id", product)])

    def predict_all(
        self,
        product: str,
        images: Iterable[Upload],
        *,
        per_request: int = GRPC_CLIENT_IMAGES_PER_REQUEST,
        max_bytes: int = GRPC_CLIENT_REQUEST_MIB * 2**20,
        in_flight: int = GRPC_CLIENT_IN_FLIGHT,
        skip_bad_images: bool = False,
        **options: Any,
    ) -> Iterator[pb.Result | ImageRefused]:
        """Every image of ``images`` scored, one ``Result`` each in their order (module doc; an
        ``ImageRefused`` in place of an undecodable image with ``skip_bad_images``); ``options``:
        :meth:`predict`'s ``heatmap``, ``version`` and ``threshold``."""
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, not {in_flight}")
        with ThreadPoolExecutor(in_flight, thread_name_prefix="hetmm-grpc") as pool:
            pending: deque[Future[list[pb.Result | ImageRefused]]] = deque()
            for chunk in request_chunks(images, per_request, max_bytes):
                if len(pending) >= in_flight:  # no more than in_flight requests out, none read ahead further
                    yield from pending.popleft().result()
                pending.append(pool.submit(self._predict_split, product, chunk, skip_bad_images, options))
            while pending:
                yield from pending.popleft().result()

    def _predict_split(
        self, product: str, chunk: list[Upload], skip: bool, options: dict[str, Any]
    ) -> list[pb.Result | ImageRefused]:
        try:
            return list(self.predict(product, chunk, **options).results)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            bad_image = skip and code == grpc.StatusCode.INVALID_ARGUMENT and error_code(exc) == "bad_image"
            if bad_image and len(chunk) == 1:
                return [ImageRefused(chunk[0][0], exc.details() or "")]  # type: ignore[attr-defined]
            if len(chunk) < 2 or not (bad_image or code == grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise
        # over the service's limits, or one of them undecodable: halves, sent again
        half = len(chunk) // 2
        first = self._predict_split(product, chunk[:half], skip, options)
        return first + self._predict_split(product, chunk[half:], skip, options)

    def list_products(self) -> pb.ListProductsReply:
        return self._call(self.stub.ListProducts, pb.ListProductsRequest(), self._metadata)

    def health(self) -> pb.HealthReply:
        return self._call(self.stub.Health, pb.HealthRequest(), self._metadata)

    def _call(self, method: Callable[..., Reply], request: Any, metadata: list[tuple[str, str]]) -> Reply:
        """``method(request)``, sent again while the service is away until ``wait_s`` has passed."""
        deadline = time.monotonic() + self.wait_s
        pause, longest = GRPC_CLIENT_RETRY_PAUSE_S
        while True:
            try:
                return method(request, metadata=metadata, timeout=self.timeout)
            except grpc.RpcError as exc:
                left = deadline - time.monotonic()
                if not service_away(exc) or left <= 0:
                    raise
                if self.on_wait is not None:
                    self.on_wait(exc)
            time.sleep(min(pause, left))  # the last try falls at the deadline
            pause = min(2 * pause, longest)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> InspectionClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
