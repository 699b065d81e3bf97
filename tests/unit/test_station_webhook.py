"""The webhook sink against a real HTTP server on 127.0.0.1: every result POSTed as the
documented JSON, in order; retryable answers retried with backoff; a refusal given up loudly."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hetmm_ray.config.station import WebhookSink
from hetmm_ray.station.runner import FIELDS, PartResult
from hetmm_ray.station.webhook_sink import WebhookPoster


class Receiver:
    """Answers each POST with the next status of ``plan`` (then 200) and keeps the bodies it accepted."""

    def __init__(self, plan: list[int]) -> None:
        self.plan = list(plan)
        self.accepted: list[dict] = []
        self.tries = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.tries += 1
                status = outer.plan.pop(0) if outer.plan else 200
                if status == 200:
                    assert self.headers["content-type"] == "application/json"
                    outer.accepted.append(json.loads(body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/parts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver(request) -> Iterator[Receiver]:
    r = Receiver(getattr(request, "param", []))
    yield r
    r.server.shutdown()
    r.server.server_close()


def result(part: str) -> PartResult:
    return PartResult(
        station="s1",
        part_id=part,
        status="scored",
        product="p",
        latency_ms=12.5,
        frame=f"/in/{part}.png",
        score=0.01,
        threshold=0.02,
        is_anomaly=False,
        verdict="ok",
        version=3,
    )


@pytest.mark.parametrize("receiver", [[503, 429, 500]], indirect=True)
def test_results_are_posted_in_order_and_retryable_answers_are_retried(receiver: Receiver) -> None:
    poster = WebhookPoster(WebhookSink(url=receiver.url, retries=5, backoff_ms=10))
    for part in ("a", "b", "c"):
        poster.publish(result(part))
    poster.close()  # waits for the queue
    assert [r["part_id"] for r in receiver.accepted] == ["a", "b", "c"]
    assert tuple(receiver.accepted[0]) == FIELDS and receiver.accepted[0]["version"] == 3
    assert receiver.tries == 6 and (poster.delivered, poster.given_up) == (3, 0)  # 3 refusals retried, then each once


@pytest.mark.parametrize("receiver", [[400, 503, 503]], indirect=True)
def test_a_refusal_or_the_last_retry_gives_a_result_up_loudly(receiver: Receiver, capsys) -> None:
    poster = WebhookPoster(WebhookSink(url=receiver.url, retries=1, backoff_ms=10))
    poster.publish(result("refused"))  # 400: not retried
    poster.publish(result("unlucky"))  # 503, 503: one retry, then given up
    poster.publish(result("fine"))
    poster.close()
    assert [r["part_id"] for r in receiver.accepted] == ["fine"]
    assert (poster.delivered, poster.given_up) == (1, 2)
    err = capsys.readouterr().err
    assert "gave up part 'refused' (HTTP 400)" in err and "gave up part 'unlucky' (HTTP 503)" in err


def test_an_absent_receiver_is_retried_then_given_up() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    poster = WebhookPoster(WebhookSink(url=f"http://127.0.0.1:{port}/parts", retries=2, backoff_ms=10))
    poster.publish(result("nobody"))
    poster.close()
    assert (poster.delivered, poster.given_up) == (0, 1)
