"""``InspectionClient`` against a real gRPC server in this process (``hetmm.v1.Inspection`` answered by
a small servicer).

It sends a call refused UNAVAILABLE again until ``wait_s`` has passed: a
refusal of UNAVAILABLE is sent again and the answer that follows returned; any other refusal, or
``wait_s`` 0, is raised after one call; a service that stays UNAVAILABLE is given up on after
``wait_s``; a service whose port has no listener yet is reached once it has one (the channel's
reconnect backoff is the client's own, not gRPC's growing one).

``predict_all(skip_bad_images=True)`` finds the undecodable images of a request the service refused
``bad_image`` by halves, gives each as an ``ImageRefused`` in its place and every other image's result
in order; without it the refusal is raised.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from hetmm_ray.serve.grpc import inspection_pb2 as pb
from hetmm_ray.serve.grpc.client import ImageRefused, InspectionClient, error_code
from hetmm_ray.serve.grpc.inspection_pb2_grpc import InspectionServicer, add_InspectionServicer_to_server


class Refusing(InspectionServicer):
    """Refuses the first ``refusals`` calls with ``code``, then answers; counts every call."""

    def __init__(self, refusals: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, details: str = "") -> None:
        self.refusals = refusals
        self.code = code
        self.details = details  # "": the application's own "<code>: <message>"
        self.calls = 0
        self.lock = threading.Lock()

    def _refuse(self, context: grpc.ServicerContext) -> bool:
        with self.lock:
            self.calls += 1
            refuse = self.calls <= self.refusals
        if refuse:
            context.set_code(self.code)
            context.set_details(self.details or f"{self.code.name.lower()}: refused, call {self.calls}")
        return refuse

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        return pb.HealthReply() if self._refuse(context) else pb.HealthReply(status="ok")

    def Predict(self, request: pb.PredictRequest, context: grpc.ServicerContext) -> pb.PredictReply:
        if self._refuse(context):
            return pb.PredictReply()
        return pb.PredictReply(results=[pb.Result(name=image.name, score=1.0) for image in request.images])


def _serve(servicer: InspectionServicer, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    add_InspectionServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


@pytest.fixture
def serving():
    servers: list[grpc.Server] = []

    def start(servicer: InspectionServicer, port: int = 0) -> int:
        server, bound = _serve(servicer, port)
        servers.append(server)
        return bound

    yield start
    for server in servers:
        server.stop(None)


def test_unavailable_is_sent_again_until_answered(serving) -> None:
    servicer = Refusing(refusals=3)
    port = serving(servicer)
    with InspectionClient(f"127.0.0.1:{port}", wait_s=60) as client:
        assert client.health().status == "ok"
        assert servicer.calls == 4
        servicer.refusals = servicer.calls + 2
        reply = client.predict("p", [("a.png", b"x"), ("b.png", b"y")])
    assert [r.name for r in reply.results] == ["a.png", "b.png"]
    assert servicer.calls == 7


def test_predict_all_waits_through_unavailable(serving) -> None:
    servicer = Refusing(refusals=2)
    port = serving(servicer)
    images = [(f"{i}.png", b"x") for i in range(5)]
    with InspectionClient(f"127.0.0.1:{port}", wait_s=60) as client:
        results = list(client.predict_all("p", images, per_request=2, in_flight=2))
    assert [r.name for r in results] == [name for name, _ in images]


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND])
def test_other_refusals_are_not_sent_again(serving, code: grpc.StatusCode) -> None:
    servicer = Refusing(refusals=1, code=code)
    port = serving(servicer)
    with InspectionClient(f"127.0.0.1:{port}", wait_s=60) as client, pytest.raises(grpc.RpcError) as refused:
        client.health()
    assert refused.value.code() == code
    assert error_code(refused.value) == code.name.lower()
    assert servicer.calls == 1


def test_a_proxy_without_the_application_yet_is_waited_for(serving) -> None:
    """Serve's gRPC proxy of a restarting service is up before the gRPC application is deployed, and
    says NOT_FOUND in its own words (no ``<code>: ``): the service is not there yet, as UNAVAILABLE."""
    proxy_words = "Application 'hetmm-grpc' not found. Ping /ray.serve.RayServeAPIService/ListApplications"
    servicer = Refusing(refusals=2, code=grpc.StatusCode.NOT_FOUND, details=proxy_words)
    port = serving(servicer)
    with InspectionClient(f"127.0.0.1:{port}", wait_s=60) as client:
        assert client.health().status == "ok"
    assert servicer.calls == 3


def test_wait_zero_sends_once(serving) -> None:
    servicer = Refusing(refusals=1)
    port = serving(servicer)
    with InspectionClient(f"127.0.0.1:{port}", wait_s=0) as client, pytest.raises(grpc.RpcError) as refused:
        client.health()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls == 1


def test_gives_up_after_wait_s(serving) -> None:
    servicer = Refusing(refusals=10**9)
    port = serving(servicer)
    t0 = time.monotonic()
    with InspectionClient(f"127.0.0.1:{port}", wait_s=1.5) as client, pytest.raises(grpc.RpcError) as refused:
        client.health()
    elapsed = time.monotonic() - t0
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert elapsed >= 1.5  # it waited the whole time...
    assert elapsed < 60  # ...and then gave up (generous: a loaded machine)
    assert 3 <= servicer.calls <= 10  # pauses of 0.25, 0.5, 1 s (the last cut to the deadline): about 4


def test_reaches_a_service_that_starts_listening_later(serving) -> None:
    """No listener at first: calls fail UNAVAILABLE and the channel backs off; once a server listens on
    the port, the waiting call is answered within the client's own backoff (at most 2 s, not gRPC's 120)."""
    probe, port = _serve(Refusing(refusals=0))  # a free port, then nothing on it
    probe.stop(None).wait()
    answered: list[str] = []
    failures = threading.Event()
    with InspectionClient(f"127.0.0.1:{port}", wait_s=120) as client:

        def watch(state: grpc.ChannelConnectivity) -> None:
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                failures.set()

        client.channel.subscribe(watch)
        caller = threading.Thread(target=lambda: answered.append(client.health().status))
        caller.start()
        assert failures.wait(60), "the channel never failed to connect"
        t0 = time.monotonic()
        servicer = Refusing(refusals=0)
        serving(servicer, port)
        caller.join(90)
        client.channel.unsubscribe(watch)
    assert answered == ["ok"]
    assert servicer.calls == 1
    assert time.monotonic() - t0 < 60  # generous: at most about 2 s of backoff on a quiet machine


def test_negative_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="wait_s"):
        InspectionClient("127.0.0.1:1", wait_s=-1)


class RefusingBadImages(InspectionServicer):
    """Refuses a whole request INVALID_ARGUMENT ``bad_image`` when any image's data is ``b"bad"`` (the
    service decodes every image before it scores any); otherwise scores each image by its length."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []

    def Predict(self, request: pb.PredictRequest, context: grpc.ServicerContext) -> pb.PredictReply:
        self.requests.append([image.name for image in request.images])
        bad = [image.name for image in request.images if image.data == b"bad"]
        if bad:
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(f"bad_image: {bad[0]}: not a recognised image format")
            return pb.PredictReply()
        return pb.PredictReply(results=[pb.Result(name=im.name, score=len(im.data)) for im in request.images])


@pytest.mark.parametrize("bad_at", [(), (0,), (5,), (2, 3), (0, 9), tuple(range(10))])
def test_skip_bad_images_gives_each_in_its_place(serving, bad_at: tuple[int, ...]) -> None:
    servicer = RefusingBadImages()
    port = serving(servicer)
    images = [(f"{i}.png", b"bad" if i in bad_at else b"x" * (i + 1)) for i in range(10)]
    with InspectionClient(f"127.0.0.1:{port}", wait_s=0) as client:
        out = list(client.predict_all("p", iter(images), per_request=4, skip_bad_images=True))
    assert [o.name for o in out] == [name for name, _ in images]
    for i, o in enumerate(out):
        if i in bad_at:
            assert isinstance(o, ImageRefused) and o.details == f"bad_image: {i}.png: not a recognised image format"
        else:
            assert not isinstance(o, ImageRefused) and o.score == i + 1
    answered = [n for names in servicer.requests if not {f"{i}.png" for i in bad_at} & set(names) for n in names]
    assert sorted(answered) == sorted(f"{i}.png" for i in range(10) if i not in bad_at)  # each scored once


def test_bad_images_raise_without_skip(serving) -> None:
    port = serving(RefusingBadImages())
    images = [("a.png", b"x"), ("b.png", b"bad")]
    with InspectionClient(f"127.0.0.1:{port}", wait_s=0) as client, pytest.raises(grpc.RpcError) as refused:
        list(client.predict_all("p", images))
    assert error_code(refused.value) == "bad_image"


def test_on_wait_hears_each_refusal_before_its_pause(serving) -> None:
    servicer = Refusing(refusals=3)
    port = serving(servicer)
    heard: list[str] = []
    with InspectionClient(f"127.0.0.1:{port}", wait_s=60, on_wait=lambda e: heard.append(e.details())) as client:
        assert client.health().status == "ok"
    assert heard == [f"unavailable: refused, call {i}" for i in (1, 2, 3)]


def test_cli_says_once_that_it_waits(serving, tmp_path, capsys) -> None:
    """``hetmm predict --grpc`` on a service still refusing UNAVAILABLE: one line on stderr saying it
    tries again, then the results (a servicer that scores each image by its length)."""
    from hetmm_ray import cli

    port = serving(Refusing(refusals=3))
    files = [tmp_path / f"{i}.png" for i in range(2)]
    for i, f in enumerate(files):
        f.write_bytes(b"x" * (i + 1))
    assert cli.main(["predict", "--grpc", f"127.0.0.1:{port}", "--product", "p", *map(str, files)]) == 0
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if "trying again" in line]
    assert len(said) == 1 and said[0].startswith(f"hetmm: 127.0.0.1:{port}: UNAVAILABLE (unavailable: refused")
    assert said[0].endswith("trying again for up to 60 s")
    assert "2 images, product p" in captured.out
