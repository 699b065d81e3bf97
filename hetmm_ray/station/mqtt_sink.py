"""The MQTT sink: a station's results published to a broker (paho-mqtt, MQTT 3.1.1).

Exact semantics:

- One client per sink, client id ``cfg.client_id`` or ``hetmm-<line>-<station>``, with a
  persistent session (``clean_session`` false): the broker keeps what a subscriber with a
  persistent session has not received yet, and this client keeps what it has not delivered.
- Each result is one message on ``cfg.topic`` at ``cfg.qos`` (1 by default: at least once), its
  payload the JSON object of :class:`~hetmm_ray.station.runner.PartResult` (``station``,
  ``part_id``, ``status``, ``product``, ``latency_ms``, ``frame``, ``late``, ``error``, then the
  result record's fields: docs/result-record.md), UTF-8, keys in that order.
- The station's state is retained on ``<topic>/state`` as ``{"station", "state"}``: ``ok`` once
  connected, then each change the station shows (``degraded`` while parts wait for an absent
  service, ``offline`` while its camera is gone, ``ok`` again; again on a reconnect), ``offline``
  when the sink closes, and ``offline`` as the broker's last will when the station's connection is
  lost without a goodbye (a killed process).
- ``username`` (and ``password_env``, the environment variable holding its password) log in; a
  broker that refuses the connection (bad credentials, not authorised) is said once on stderr,
  naming the broker and its reason, and the station shows ``degraded`` until it accepts (results
  wait meanwhile, as while the broker is away).
- While the broker is away, results wait in this client's queue and go out in order when it is
  back; the client reconnects every 1-2 s. With ``outbox_in`` (the station gives every QoS 1 or 2
  sink its queue folder), each result is kept in an on-disk outbox there (``outbox.py``;
  ``mqtt-outbox-<client id>``) before it goes out and until the broker acknowledges it, so a killed
  station sends, at its next start and before anything new, what the broker had not acknowledged;
  :meth:`MqttPublisher.published_keys` says which frames' results were out before that start.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..config.station import MqttLogin, MqttSink
from .outbox import Outbox

__all__ = ["MqttPublisher", "Refusals", "connect", "mqtt_client", "state_topic", "trigger_subscriber"]

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


def connect(client: Any, broker: str, login: MqttLogin | None = None) -> None:
    """Connect in the background to ``host:port`` (as ``login``'s user, its password read from
    the environment variable it names) and start the client's network thread."""
    if login is not None and login.username is not None:
        password = None
        if login.password_env is not None:
            password = os.environ.get(login.password_env)
            if password is None:
                raise ConfigError(f"password_env: {login.password_env} is not set in the station's environment")
        client.username_pw_set(login.username, password)
    host, port = broker.rsplit(":", 1)
    client.connect_async(host.strip("[]"), int(port), keepalive=KEEPALIVE_S)
    client.loop_start()


class Refusals:
    """A broker's refusals of one client's connection (bad credentials, not authorised): each new
    one said once on stderr, and ``problem`` while it lasts."""

    def __init__(self, who: str, broker: str) -> None:
        self.who, self.broker = who, broker
        self.problem: str | None = None

    def seen(self, reason: Any) -> bool:
        """Note a CONNACK's ``reason``; True when the connection was accepted."""
        if not reason.is_failure:
            if self.problem is not None:
                print(f"hetmm station: the MQTT broker {self.broker} accepts {self.who} now", file=sys.stderr)
            self.problem = None
            return True
        problem = f"the MQTT broker {self.broker} refused {self.who}: {reason}"
        if problem != self.problem:
            print(f"hetmm station: {problem}", file=sys.stderr, flush=True)
        self.problem = problem
        return False


def trigger_subscriber(client_id: str, cfg: Any, on_message: Any, who: str) -> tuple[Any, threading.Event, Refusals]:
    """A client subscribed to ``cfg.topic`` at ``cfg.broker`` (as ``cfg``'s login) with manual
    acknowledgement, as every trigger source takes its messages: the client, an Event set while the
    broker has acknowledged the subscription, and the broker's refusals of ``who``."""
    client = mqtt_client(client_id, manual_ack=True)
    subscribed = threading.Event()
    refusals = Refusals(who, cfg.broker)
    client.on_connect = lambda c, _u, _f, reason, _p: refusals.seen(reason) and c.subscribe(cfg.topic, qos=1)
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_disconnect = lambda *_: subscribed.clear()
    client.on_message = on_message
    connect(client, cfg.broker, cfg)
    return client, subscribed, refusals


def state_topic(topic: str) -> str:
    return f"{topic.rstrip('/')}/state"


class MqttPublisher:
    """The sink of one station (see the module docstring)."""

    def __init__(self, cfg: MqttSink, *, station: str, line: str, outbox_in: Path | None = None) -> None:
        self.cfg = cfg
        self.station = station
        self.connected = threading.Event()
        self.client_id = cfg.client_id or f"hetmm-{line}-{station}"
        self.client = mqtt_client(self.client_id)
        self.client.max_queued_messages_set(0)  # 0: no limit; nothing is dropped while the broker is away
        self.client.max_inflight_messages_set(100)
        self.state_topic = state_topic(cfg.topic)
        self.shown = "ok"  # the station's state, said again on every (re)connect
        self.client.will_set(self.state_topic, self._state("offline"), qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *_: self.connected.clear()
        self.client.on_publish = self._on_publish
        self.refusals = Refusals(f"station {station}'s results (client {self.client_id})", cfg.broker)
        # Acknowledgements: paho calls on_publish holding its own lock, which publish() takes too, so
        # this lock is never held across a call into paho; an acknowledgement that comes before
        # publish() has returned its mid waits in _early.
        self._lock = threading.Lock()
        self._inflight: dict[int, int | None] = {}  # mid -> outbox seq (None: not kept)
        self._early: set[int] = set()
        self.outbox = None  # in outbox_in (the station's queue folder), named by the client id
        if outbox_in is not None and cfg.qos > 0:
            self.outbox = Outbox(outbox_in / ("mqtt-outbox-" + re.sub(r"[^A-Za-z0-9._-]", "_", self.client_id)))
        self._before = self.outbox.keys() if self.outbox is not None else frozenset()
        for pending in self.outbox.unsent() if self.outbox is not None else []:  # first, in order
            self._send(pending.topic, pending.payload, cfg.qos, False, pending.seq)
        connect(self.client, cfg.broker, cfg)

    def published_keys(self) -> frozenset[str]:
        """The keys of the frames whose results this sink had taken before this start (its outbox)."""
        return self._before

    def _send(self, topic: str, payload: str | bytes, qos: int, retain: bool, seq: int | None) -> None:
        mid = self.client.publish(topic, payload, qos=qos, retain=retain).mid
        if qos == 0:
            return
        with self._lock:
            acked = mid in self._early
            if acked:
                self._early.discard(mid)
            else:
                self._inflight[mid] = seq
        if acked and seq is not None and self.outbox is not None:
            self.outbox.sent(seq)

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, *_: Any) -> None:
        with self._lock:
            if mid not in self._inflight:
                self._early.add(mid)
                return
            seq = self._inflight.pop(mid)
        if seq is not None and self.outbox is not None:
            self.outbox.sent(seq)

    @property
    def problem(self) -> str | None:
        """Why results cannot go out (the broker refuses this client), or None."""
        return self.refusals.problem

    def _state(self, state: str) -> str:
        return json.dumps({"station": self.station, "state": state})

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if self.refusals.seen(reason):
            self._send(self.state_topic, self._state(self.shown), 1, True, None)
            self.connected.set()

    def show_state(self, state: str) -> None:
        """The station's state, retained on its state topic."""
        self.shown = state
        self._send(self.state_topic, self._state(state), 1, True, None)

    def publish(self, result: Any) -> None:
        payload = json.dumps(result.to_dict()).encode()
        seq = None if self.outbox is None else self.outbox.add(self.cfg.topic, payload, result.key)
        self._send(self.cfg.topic, payload, self.cfg.qos, False, seq)

    def close(self, timeout_s: float = 10.0) -> None:
        """Say ``offline`` (retained), deliver what is queued (bounded by ``timeout_s`` when the
        broker is reachable) and disconnect."""
        info = self.client.publish(self.state_topic, self._state("offline"), qos=1, retain=True)
        with self._lock:
            self._inflight[info.mid] = None
        if self.connected.is_set():
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):  # not connected any more: nothing more can go out
                pass
        self.client.disconnect()
        self.client.loop_stop()
