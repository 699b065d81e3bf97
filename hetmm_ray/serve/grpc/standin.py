"""What a ``hetmm.v1.Inspection`` call gets from the HTTP application: a clear refusal, never INTERNAL.

Exact semantics: Serve 2.60's gRPC proxy routes a call by its ``application`` metadata, except that
while one application is running it sends every call to that one, whatever the metadata names
(``proxy_router.get_handle_for_endpoint``). So while the gRPC application (``config.GRPC_APP_NAME``)
is starting, or was deleted or never deployed beside the HTTP application, Inspection calls reach the
HTTP ``Ingress``; and a client that names the HTTP application reaches it at any time. Without the
three methods below the replica fails before it answers Serve's admission metadata, and the client
reads ``INTERNAL: Unexpected error (StatusCode.OK): .``, which says nothing and is not retryable.

:class:`InspectionStandIn` (a base of ``Ingress``) answers ``Predict``, ``ListProducts`` and ``Health``
with an empty reply and, through the one error table (``errors.GRPC_CODES``):

- the call names the gRPC application: 503 ``unavailable`` -> ``UNAVAILABLE`` (gRPC's retryable
  code): that application is not running here yet;
- it names anything else: 404 ``not_found`` -> ``NOT_FOUND``, saying which application to name.

Each refusal is counted in the ingress's request metrics as the gRPC replicas count their calls
(``messages.METRIC_ROUTES``; status 503 or 404).
"""

from __future__ import annotations

import time
from typing import Any

from ...config import GRPC_APP_NAME
from ...errors import Refused
from ..metrics import ServiceMetrics
from . import inspection_pb2 as pb
from .messages import METRIC_ROUTES, metadata_value, refuse

__all__ = ["InspectionStandIn", "refusal_for"]


def refusal_for(application: str) -> Refused:
    """The refusal of an Inspection call that named ``application`` (module doc)."""
    if application == GRPC_APP_NAME:
        return Refused(
            503,
            "unavailable",
            f"the gRPC application {GRPC_APP_NAME!r} is not running (starting, or the service runs without "
            "gRPC: hetmm serve --grpc-port, deploy.yaml's hetmm-grpc); retry when it is up",
        )
    named = repr(application) if application else "no application"
    return Refused(
        404,
        "not_found",
        f"{named} does not serve hetmm.v1.Inspection; send 'application: {GRPC_APP_NAME}' metadata",
    )


class InspectionStandIn:
    """Inspection's methods on an application that does not serve it (module doc)."""

    metrics: ServiceMetrics  # the ingress's

    async def Predict(self, request: pb.PredictRequest, grpc_context: Any) -> pb.PredictReply:
        self._refuse_call(grpc_context, "Predict")
        return pb.PredictReply()

    async def ListProducts(self, request: pb.ListProductsRequest, grpc_context: Any) -> pb.ListProductsReply:
        self._refuse_call(grpc_context, "ListProducts")
        return pb.ListProductsReply()

    async def Health(self, request: pb.HealthRequest, grpc_context: Any) -> pb.HealthReply:
        self._refuse_call(grpc_context, "Health")
        return pb.HealthReply()

    def _refuse_call(self, grpc_context: Any, method: str) -> None:
        started = time.perf_counter()
        refusal = refusal_for(metadata_value(grpc_context, "application"))
        refuse(grpc_context, refusal)
        self.metrics.observe_request(METRIC_ROUTES[method], refusal.status, time.perf_counter() - started)
