"""The MQTT sink: a station's results published to a broker (paho-mqtt, MQTT 3.1.1).

Exact semantics:

- One client per sink, client id ``cfg.client_id`` or ``hetmm-<line>-<station>``, with a
  persistent session (``clean_session`` false): the broker keeps what a subscriber with a
  persistent session has not received yet, and this client keeps what it has not delivered.
- Each result is one message on ``cfg.topic`` at ``cfg.qos`` (1 by default: at least once), its
  payload the JSON object of :class:`~hetmm_ray.station.runner.PartResult` (``station``,
  ``part_id``, ``verdict``, ``score``, ``threshold``, ``product``, ``version``, ``latency_ms``,
  ``frame``, ``late``, ``error``), UTF-8, keys in that order.
- The station's state is retained on ``<topic>/state`` as ``{"station", "state"}``: ``ok`` once
  connected, then each change the station shows (``degraded`` while parts wait for an absent
  service, ``offline`` while its camera is gone, ``ok`` again; again on a reconnect), ``offline``
  when the sink closes, and ``offline`` as the broker's last will when the station's connection is
  lost without a goodbye (a killed process).
- While the broker is away, results wait in this client's queue (in memory, unbounded: the
  station's on-disk queue, a next step of issue 39, is what survives a killed station) and go
  out in order when it is back; the client reconnects every 1-2 s.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from ..config.station import MqttSink

__all__ = ["MqttPublisher", "connect", "mqtt_client", "state_topic"]

RECONNECT_S = (1, 2)  # paho's reconnect delay, first and longest (s)
KEEPALIVE_S = 15


def mqtt_client(client_id: str, **options: Any) -> Any:
    """A paho client as every station client is made: MQTT 3.1.1, a persistent session, a
    reconnect every ``RECONNECT_S``; ``options`` go to ``paho.mqtt.client.Client``."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False, protocol=mqtt.MQTTv311, **options
    )
    client.reconnect_delay_set(*RECONNECT_S)
    return client


def connect(client: Any, broker: str) -> None:
    """Connect in the background to ``host:port`` and start the client's network thread."""
    host, port = broker.rsplit(":", 1)
    client.connect_async(host.strip("[]"), int(port), keepalive=KEEPALIVE_S)
    client.loop_start()


def state_topic(topic: str) -> str:
    return f"{topic.rstrip('/')}/state"


class MqttPublisher:
    """The sink of one station (see the module docstring)."""

    def __init__(self, cfg: MqttSink, *, station: str, line: str) -> None:
        self.cfg = cfg
        self.station = station
        self.connected = threading.Event()
        self.client = mqtt_client(cfg.client_id or f"hetmm-{line}-{station}")
        self.client.max_queued_messages_set(0)  # 0: no limit; nothing is dropped while the broker is away
        self.client.max_inflight_messages_set(100)
        self.state_topic = state_topic(cfg.topic)
        self.shown = "ok"  # the station's state, said again on every (re)connect
        self.client.will_set(self.state_topic, self._state("offline"), qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *_: self.connected.clear()
        connect(self.client, cfg.broker)

    def _state(self, state: str) -> str:
        return json.dumps({"station": self.station, "state": state})

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if not reason.is_failure:
            client.publish(self.state_topic, self._state(self.shown), qos=1, retain=True)
            self.connected.set()

    def show_state(self, state: str) -> None:
        """The station's state, retained on its state topic."""
        self.shown = state
        self.client.publish(self.state_topic, self._state(state), qos=1, retain=True)

    def publish(self, result: Any) -> None:
        self.client.publish(self.cfg.topic, json.dumps(result.to_dict()), qos=self.cfg.qos)

    def close(self, timeout_s: float = 10.0) -> None:
        """Say ``offline`` (retained), deliver what is queued (bounded by ``timeout_s`` when the
        broker is reachable) and disconnect."""
        info = self.client.publish(self.state_topic, self._state("offline"), qos=1, retain=True)
        if self.connected.is_set():
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):  # not connected any more: nothing more can go out
                pass
        self.client.disconnect()
        self.client.loop_stop()
