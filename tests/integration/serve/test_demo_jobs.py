"""Issue 10's demo defect: a ``?wait=true`` call answered 202 (the job still running on a slow machine)
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


def _server(job_states: list[str]) -> ThreadingHTTPServer:
    """POST /v1/products/p -> 202 with a running job; each GET /v1/jobs/j1 -> the next state."""
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
            self._send(202, {"job": {"id": "j1", "kind": "create", "state": "running", "result": None, "error": None}})

        def do_GET(self) -> None:
            state = next(states)
            result = {"version": 1} if state == "succeeded" else None
            error = "boom" if state == "failed" else None
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
            with pytest.raises(RuntimeError, match="create job failed: boom"):
                _finished_job(client, client.post("/v1/products/p?wait=true", content=b"x"))
    finally:
        server.shutdown()
