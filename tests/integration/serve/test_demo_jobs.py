"""A demo defect, kept fixed: a ``?wait=true`` call answered 202 (the job still running on a slow machine)
was read as finished, and the demo printed ``vNone`` and failed its predictions. ``_finished_job``
now polls ``GET /v1/jobs/{id}`` until the job ends. Checked against a real HTTP server on 127.0.0.1
that answers like the service does when the wait runs out."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from hetmm_ray.demo import _finished_job
from hetmm_ray.errors import Refused


def _server(job_states: list[str], post_status: int = 202) -> ThreadingHTTPServer:
    """POST /v1/products/p -> 202 with a running job (or ``post_status`` with the service's JSON error);
    each GET /v1/jobs/j1 -> the next state."""
    states = iter(job_states)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if post_status != 202:
                self._send(post_status, {"error": {"code": "conflict", "message": "product 'p' exists"}})
                return
            self._send(202, {"job": {"id": "j1", "kind": "create", "state": "running", "result": None, "error": None}})

        def do_GET(self) -> None:
            state = next(states)
            result = {"version": 1} if state == "succeeded" else None
            # a failed job's error record, as distributed/jobs.py writes it
            error = {"type": "WeightsError", "message": "boom", "status": 422, "code": "bad_weights"}
            error = error if state == "failed" else None
            self._send(200, {"job": {"id": "j1", "kind": "create", "state": state, "result": result, "error": error}})

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_202_is_polled_until_the_job_ends() -> None:
    server = _server(["running", "succeeded"])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}") as client:
            job = _finished_job(client, client.post("/v1/products/p?wait=true", content=b"x"))
        assert job["state"] == "succeeded"
        assert job["result"] == {"version": 1}  # what the demo prints as the version, never None
    finally:
        server.shutdown()


def test_a_job_that_fails_after_the_wait_is_an_error() -> None:
    server = _server(["failed"])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}") as client:
            with pytest.raises(Refused, match="create job failed: bad_weights: boom") as caught:
                _finished_job(client, client.post("/v1/products/p?wait=true", content=b"x"))
        assert (caught.value.status, caught.value.code) == (422, "bad_weights")  # the job's own, as the CLI says it
    finally:
        server.shutdown()


def test_a_refused_call_says_the_services_error() -> None:
    """A 4xx reaches the user as the service's code and message (a Refused the CLI prints), not as
    httpx's bare "Client error '409 Conflict'" (what a second `make demo` printed)."""
    server = _server([], post_status=409)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}") as client:
            with pytest.raises(Refused) as caught:
                _finished_job(client, client.post("/v1/products/p?wait=true", content=b"x"))
        assert (caught.value.status, caught.value.code) == (409, "conflict")
        assert caught.value.message == "POST /v1/products/p: 409 conflict: product 'p' exists"
    finally:
        server.shutdown()
