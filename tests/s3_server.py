"""A real S3 endpoint for the tests: moto's server on 127.0.0.1, dummy credentials, fresh buckets.

Helpers shared by every module that talks to S3; the fixtures ``aws_env`` and ``s3_endpoint``
(tests/integration/conftest.py) are built on them.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import uuid

import pytest

# --- the S3 endpoint --------------------------------------------------------------------------
_AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
_AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def aws_environment():
    """A generator: dummy credentials for boto3 (and the subprocesses), restored afterwards; no proxy for 127.0.0.1."""
    saved = {k: os.environ.get(k) for k in (*_AWS_ENV, *_AWS_UNSET, "NO_PROXY", "no_proxy")}
    os.environ.update(_AWS_ENV)
    for k in _AWS_UNSET:
        os.environ.pop(k, None)
    for k in ("NO_PROXY", "no_proxy"):
        os.environ[k] = ",".join(x for x in (os.environ.get(k), "127.0.0.1", "localhost") if x)
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.WARNING)  # no access log line per request
    yield
    werkzeug.setLevel(level)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def start_moto(port: int = 0):
    """A moto S3 server on 127.0.0.1 (``port`` 0: any free port); returns it and its endpoint URL."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    _one_request_at_a_time(server)
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def _one_request_at_a_time(server) -> None:
    """Make moto's conditional writes atomic, as a real S3 endpoint's are.

    moto checks ``If-None-Match``/``If-Match`` and then stores the object in two
    steps, while its server handles each connection in its own thread, so two
    racing conditional PUTs could both pass the check. Serving one request at a
    time (still over HTTP, interleaved request by request) closes that window;
    it changes nothing else.
    """
    wsgi = server._server  # the werkzeug server behind ThreadedMotoServer
    app = wsgi.app
    lock = threading.Lock()

    def serialised(environ, start_response):
        with lock:
            return list(app(environ, start_response))

    wsgi.app = serialised


@functools.cache
def s3_admin(endpoint: str):
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=endpoint)


def new_bucket(endpoint: str) -> str:
    name = f"hetmm-{uuid.uuid4().hex[:12]}"
    s3_admin(endpoint).create_bucket(Bucket=name)
    return name


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
