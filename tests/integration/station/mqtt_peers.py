"""The MQTT peers of the station tests: a real Mosquitto the test starts, and a subscriber."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from helpers import free_port

MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
WAIT_S = 90.0  # a condition on a loaded 2-core machine


class Broker:
    """A Mosquitto on 127.0.0.1 with persistence (sessions and queued messages survive a restart)."""

    def __init__(self, folder: Path, users: dict[str, str] | None = None) -> None:
        assert MOSQUITTO is not None, "mosquitto is not installed (CI=true: .ci/run installs it)"
        self.port = free_port()
        self.conf = folder / "mosquitto.conf"
        (folder / "data").mkdir()
        # user: started as root, mosquitto drops to the "mosquitto" user unless told otherwise, and
        # could then not save its persistence file (the sessions) in this test's folder.
        user = pwd.getpwuid(os.getuid()).pw_name
        login = "allow_anonymous true\n"
        if users:  # these users only, each with its password (mosquitto_passwd writes the hashes)
            passwords = folder / "passwords"
            for name, password in users.items():
                create = [] if passwords.exists() else ["-c"]
                subprocess.run(["mosquitto_passwd", *create, "-b", str(passwords), name, password], check=True)
            passwords.chmod(0o600)
            login = f"allow_anonymous false\npassword_file {passwords}\n"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n{login}persistence true\n"
            f"persistence_location {folder / 'data'}/\nlog_dest stderr\nuser {user}\n"
        )
        self.log = (folder / "mosquitto.log").open("ab")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=self.log, stderr=self.log)
        end = time.monotonic() + WAIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, "mosquitto exited at start"
                assert time.monotonic() < end, "mosquitto did not listen"
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: it saves its persistence file
            self.proc.wait(timeout=60)
            assert (self.conf.parent / "data" / "mosquitto.db").is_file(), "mosquitto saved no sessions"


class Subscriber:
    """A persistent-session subscriber at QoS 1 that keeps what it receives."""

    def __init__(self, port: int, topics: list[str], client_id: str = "test-sub", clean: bool = False) -> None:
        import paho.mqtt.client as mqtt

        self.messages: list[tuple[str, bytes, bool]] = []
        self.result_topic = topics[0]
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
        self.client.reconnect_delay_set(1, 2)
        self.client.on_connect = lambda c, *_: [c.subscribe(t, qos=1) for t in topics]
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=15)
        self.client.loop_start()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((msg.topic, msg.payload, bool(msg.retain)))

    def results(self) -> list[dict]:
        with self.lock:
            return [json.loads(p) for t, p, _ in self.messages if t == self.result_topic]

    def wait(self, ok, what: str) -> None:
        end = time.monotonic() + WAIT_S
        while not ok():
            assert time.monotonic() < end, f"waited {WAIT_S} s for {what}; got {self.messages}"
            time.sleep(0.05)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
