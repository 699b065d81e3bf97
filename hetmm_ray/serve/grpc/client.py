"""A Python client of ``hetmm.v1.Inspection`` (``hetmm predict --grpc HOST:PORT``, tests, benchmarks).

Exact semantics: :class:`InspectionClient` opens one insecure channel to ``target`` (``host:port``)
and sends every call with the metadata Serve's gRPC proxy routes by: ``application`` (the gRPC
application, ``config.GRPC_APP_NAME``) and, for ``predict``, ``multiplexed_model_id`` (the
product), plus ``authorization: Bearer <token>`` when a token is given. A refused call raises
:class:`grpc.RpcError`; its ``details()`` is ``"<code>: <message>"`` (``errors.GRPC_CODES``), and
:func:`error_code` reads the stable code back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from ...config import GRPC_APP_NAME, MAX_IMAGE_BYTES
from . import inspection_pb2 as pb
from .inspection_pb2_grpc import InspectionStub

__all__ = ["InspectionClient", "error_code"]


def error_code(error: grpc.RpcError) -> str:
    """The stable code (``too_large``, ``unknown_product``...) of a refused call's details."""
    details = error.details() or ""  # type: ignore[attr-defined]
    return details.split(":", 1)[0] if ":" in details else ""


class InspectionClient:
    """``hetmm.v1.Inspection`` on ``target``; ``timeout`` seconds per call."""

    def __init__(self, target: str, *, token: str | None = None, timeout: float = 60.0) -> None:
        # messages up to the images' own limit (16 images of the largest accepted size and the reply)
        size = 16 * MAX_IMAGE_BYTES + 2**20
        options = [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]
        self.channel = grpc.insecure_channel(target, options=options)
        self.stub = InspectionStub(self.channel)
        self.timeout = timeout
        self._metadata: list[tuple[str, str]] = [("application", GRPC_APP_NAME)]
        if token:
            self._metadata.append(("authorization", f"Bearer {token}"))

    def predict(
        self,
        product: str,
        images: Sequence[tuple[str, bytes]],
        *,
        heatmap: bool = False,
        version: int | None = None,
        threshold: float | None = None,
    ) -> pb.PredictReply:
        """Score ``images`` ((name, encoded bytes) pairs) of ``product``."""
        request = pb.PredictRequest(
            product=product, images=[pb.Image(name=n, data=d) for n, d in images], heatmap=heatmap
        )
        if version is not None:
            request.version = version
        if threshold is not None:
            request.threshold = threshold
        metadata = [*self._metadata, ("multiplexed_model_id", product)]
        return self.stub.Predict(request, metadata=metadata, timeout=self.timeout)

    def list_products(self) -> pb.ListProductsReply:
        return self.stub.ListProducts(pb.ListProductsRequest(), metadata=self._metadata, timeout=self.timeout)

    def health(self) -> pb.HealthReply:
        return self.stub.Health(pb.HealthRequest(), metadata=self._metadata, timeout=self.timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> InspectionClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
