"""`hetmm serve` on a port another program holds: refused at once, in one line, before Ray starts.

Before, Ray and Serve started, and after about 15 s the command failed with ``unexpected
RayTaskError(RuntimeError): ray::ProxyActor.ready() ...`` (Serve's proxy could not bind).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetmm_ray import cli
from hetmm_ray.config import ConfigError
from hetmm_ray.serve.run import check_ports_free


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program listens on (127.0.0.1)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_held_port_is_refused_naming_its_option(held_port: int) -> None:
    with pytest.raises(ConfigError, match=rf"^--port {held_port}: port {held_port} is in use by another program on"):
        check_ports_free({"--port": ("127.0.0.1", held_port)})
    # the gRPC proxy's check is on every interface: a program on loopback holds it too
    with pytest.raises(ConfigError, match=rf"^--grpc-port {held_port}: port {held_port} is in use by another program;"):
        check_ports_free({"--grpc-port": ("0.0.0.0", held_port)})


def test_free_ports_pass() -> None:
    check_ports_free({"--port": ("127.0.0.1", _free_port()), "--grpc-port": ("0.0.0.0", _free_port())})


def test_serve_refuses_before_ray_starts(held_port: int, tmp_path: Path, capsys) -> None:
    import ray

    code = cli.main(["serve", "--store", str(tmp_path / "store"), "--port", str(held_port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err == [
        f"hetmm: error: --port {held_port}: port {held_port} is in use by another program on 127.0.0.1; "
        "stop it or choose another port"
    ]
    assert not ray.is_initialized()
