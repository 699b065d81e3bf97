"""Inspection calls while the gRPC application is not running: a clear, retryable refusal (not INTERNAL).

Serve's gRPC proxy is up (``grpc_options``) with only the HTTP application deployed, as during the
service's start-up, before the gRPC application is ready: Serve 2.60 then routes every gRPC call to
the one application there is, the HTTP ``Ingress`` (``serve/grpc/standin.py``). Each of the three
methods must answer UNAVAILABLE ``unavailable`` when the call names the gRPC application and
NOT_FOUND ``not_found`` when it names another; HTTP keeps serving; and once the gRPC application is
deployed the same client is answered. Without the stand-in every such call failed with ``INTERNAL:
Unexpected error (StatusCode.OK): .`` (seen on ``hetmm serve --grpc-port`` started a few seconds earlier).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest
from helpers import free_port

from hetmm_ray.config import GRPC_APP_NAME, GRPC_ROUTE_PREFIX, GRPC_SERVICER, HTTP_APP_NAME

DETECTOR = {"num_replicas": 1, "user_config": {"threads": 1}}


@pytest.fixture(scope="module")
def http_only(own_ray, tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """(HTTP URL, gRPC target, store) of a service whose gRPC proxy runs without the gRPC application."""
    import ray
    from helpers import LOCAL_RAY_ARGS
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    store = str(tmp_path_factory.mktemp("grpc_standin") / "store")
    ray.init(**LOCAL_RAY_ARGS)
    port, grpc_port = free_port(), free_port()
    # The proxy with gRPC on, as `hetmm serve --grpc-port` starts it; start_service then finds Serve
    # running and deploys the HTTP application only.
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER]},
    )
    running = start_service(store=store, port=port, deployments={"Detector": DETECTOR})
    yield running.url, f"127.0.0.1:{grpc_port}", running.store
    stop_service(running)
    serve.shutdown()


def _call(target: str, method: str, application: str | None) -> grpc.RpcError | None:
    """One Inspection call with raw metadata; the error it raised (None: answered)."""
    from hetmm_ray.serve.grpc import inspection_pb2 as pb
    from hetmm_ray.serve.grpc.inspection_pb2_grpc import InspectionStub

    request = {
        "Predict": pb.PredictRequest(product="gear", images=[pb.Image(name="a.png", data=b"\x89PNG")]),
        "ListProducts": pb.ListProductsRequest(),
        "Health": pb.HealthRequest(),
    }[method]
    metadata = [] if application is None else [("application", application)]
    with grpc.insecure_channel(target) as channel:
        try:
            getattr(InspectionStub(channel), method)(request, metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            return exc
    return None


def _refused(url: str, route: str, status: int) -> float:
    """``hetmm_requests_total`` of ``route`` and ``status`` in the service's ``/metrics``."""
    key = f'hetmm_requests_total{{route="{route}",status="{status}"}} '
    lines = httpx.get(f"{url}/metrics", timeout=60).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(key))


ROUTES = {"Predict": "grpc_predict", "ListProducts": "grpc_list_products", "Health": "grpc_health"}


@pytest.mark.parametrize("method", ["Predict", "ListProducts", "Health"])
def test_naming_the_grpc_application_gets_unavailable(http_only, method) -> None:
    url, target, _ = http_only
    before = _refused(url, ROUTES[method], 503)
    error = _call(target, method, GRPC_APP_NAME)
    assert error is not None, "answered, but no gRPC application is deployed"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    assert error.details().startswith(f"unavailable: the gRPC application {GRPC_APP_NAME!r} is not running")
    assert httpx.get(f"{url}/v1/products", timeout=60).status_code == 200  # HTTP keeps serving
    assert _refused(url, ROUTES[method], 503) == before + 1  # counted as the gRPC replicas count theirs


@pytest.mark.parametrize("application", [HTTP_APP_NAME, "typo", None])
def test_naming_another_application_gets_not_found(http_only, application) -> None:
    url, target, _ = http_only
    before = _refused(url, "grpc_health", 404)
    error = _call(target, "Health", application)
    assert error is not None
    assert error.code() == grpc.StatusCode.NOT_FOUND, (error.code(), error.details())
    assert error.details().startswith("not_found: ") and f"application: {GRPC_APP_NAME}" in error.details()
    assert _refused(url, "grpc_health", 404) == before + 1


def test_answered_once_the_grpc_application_is_up(http_only) -> None:
    """The refusal says retry: after the gRPC application is deployed, the same call is answered."""
    from ray import serve

    from hetmm_ray.serve.grpc.app import build_grpc_application
    from hetmm_ray.serve.grpc.client import InspectionClient

    _, target, store = http_only
    serve.run(
        build_grpc_application({"store": store}, {"Detector": DETECTOR}),
        name=GRPC_APP_NAME,
        route_prefix=GRPC_ROUTE_PREFIX,
    )
    try:
        # The proxy learns the new route by long poll; until then the stand-in answers UNAVAILABLE, which
        # the client sends again (serve/grpc/client.py) until it is answered.
        with InspectionClient(target, timeout=60, wait_s=120) as client:
            assert client.health().status == "ok"
            assert list(client.list_products().products) == []  # the store is empty
    finally:
        serve.delete(GRPC_APP_NAME)
