"""The OPC UA sink: the station is an OPC UA server a PLC or SCADA reads (asyncua).

Exact semantics:

- One server per ``endpoint`` in a process (no security policy: a line's cell network, bound to
  the endpoint's address, loopback by default), shared by every station that names it; its
  namespace is ``cfg.namespace``. It runs in a thread of its own (asyncio), so the station's loop
  never waits on a client.
- Under ``Objects`` each station is an object named after it, with read-only variables:
  ``PartId`` (String), ``Status`` (String: ``scored``, ``timeout`` or ``error``), ``Verdict``
  (String: ``ok``, ``review`` or ``reject``; empty unless scored: hetmm_ray/result.py),
  ``Score`` (Double; NaN when there is none), ``Threshold`` (Double), ``Version`` (Int64, -1 when
  none), ``Late`` (Boolean), ``Counter`` (Int64: results published since the station started,
  the change a PLC polls for), ``State`` (String: ``ok``, ``degraded`` while parts wait for an
  absent service, ``offline`` while its camera is gone and once it stops) and ``LastResult``
  (String: the result's JSON, as the MQTT sink sends it); and a method ``Trigger()`` that counts
  the triggers asked for and returns that count (Int64). A source that takes triggers (a camera's
  software trigger, not built yet) reads them from :attr:`OpcUaStation.triggers`.
- A result's variables are written together, ``Counter`` last, so a client that sees the counter
  change reads that result's values.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any

from ..config.station import OpcUaSink

__all__ = ["OpcUaStation"]

# Each station's variables: initial value and OPC UA type (the name of a ua.VariantType).
VARIABLES: dict[str, tuple[object, str]] = {
    "PartId": ("", "String"),
    "Status": ("", "String"),
    "Verdict": ("", "String"),
    "Score": (math.nan, "Double"),
    "Threshold": (math.nan, "Double"),
    "Version": (-1, "Int64"),
    "Late": (False, "Boolean"),
    "LastResult": ("", "String"),
    "State": ("ok", "String"),
    "Counter": (0, "Int64"),
}
CALL_S = 60.0  # how long the station waits for the server's thread to take a call

_servers: dict[str, _Server] = {}
_servers_lock = threading.Lock()


class _Server:
    """An asyncua server on its own event loop thread, shared by the stations of one endpoint."""

    def __init__(self, endpoint: str, namespace: str) -> None:
        self.endpoint = endpoint
        self.namespace = namespace
        self.users = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="station-opcua", daemon=True)
        self.thread.start()
        self.server: Any = None
        self.index = 0
        self.call(self._start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_S)

    async def _start(self) -> None:
        from asyncua import Server, ua

        self.server = Server()
        await self.server.init()
        self.server.set_endpoint(self.endpoint)
        self.server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        self.server.set_server_name("hetmm-ray station")
        self.index = await self.server.register_namespace(self.namespace)
        await self.server.start()

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CALL_S)


def _server(cfg: OpcUaSink) -> _Server:
    with _servers_lock:
        server = _servers.get(cfg.endpoint)
        if server is None:
            server = _servers[cfg.endpoint] = _Server(cfg.endpoint, cfg.namespace)
        server.users += 1
        return server


class OpcUaStation:
    """One station's object on its endpoint's server (see the module docstring)."""

    def __init__(self, cfg: OpcUaSink, *, station: str) -> None:
        self.cfg = cfg
        self.station = station
        self.triggers = 0
        self.counter = 0
        self._server = _server(cfg)
        self._vars: dict[str, Any] = {}
        self._server.call(self._add())

    async def _add(self) -> None:
        from asyncua import ua
        from asyncua.common.methods import uamethod

        idx = self._server.index
        node = await self._server.server.nodes.objects.add_object(idx, self.station)
        for name, (value, kind) in VARIABLES.items():
            self._vars[name] = await node.add_variable(idx, name, ua.Variant(value, getattr(ua.VariantType, kind)))

        @uamethod
        def trigger(_parent: Any) -> Any:
            self.triggers += 1
            return ua.Variant(self.triggers, ua.VariantType.Int64)

        await node.add_method(idx, "Trigger", trigger, [], [ua.VariantType.Int64])

    async def _write(self, values: dict[str, Any]) -> None:
        from asyncua import ua

        for name, value in values.items():  # in order: Counter last
            await self._vars[name].write_value(ua.Variant(value, getattr(ua.VariantType, VARIABLES[name][1])))

    def publish(self, result: Any) -> None:
        r = result.to_dict()
        self.counter += 1
        values = {
            "PartId": r["part_id"],
            "Status": r["status"],
            "Verdict": r["verdict"] or "",
            "Score": math.nan if r["score"] is None else float(r["score"]),
            "Threshold": math.nan if r["threshold"] is None else float(r["threshold"]),
            "Version": -1 if r["version"] is None else int(r["version"]),
            "Late": bool(r["late"]),
            "LastResult": json.dumps(r),
            "Counter": self.counter,
        }
        self._server.call(self._write(values))

    def show_state(self, state: str) -> None:
        self._server.call(self._write({"State": state}))

    def close(self) -> None:
        """``State`` ``offline``; the server stops with the last station of its endpoint."""
        self._server.call(self._write({"State": "offline"}))
        with _servers_lock:
            self._server.users -= 1
            last = self._server.users == 0
            if last:
                _servers.pop(self.cfg.endpoint, None)
        if last:
            self._server.stop()
