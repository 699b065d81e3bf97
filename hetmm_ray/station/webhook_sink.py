"""The webhook sink: each result POSTed as JSON to a URL, retried with exponential backoff.

Exact semantics:

- Results are sent one at a time, in the order they were published, by one background thread,
  so a slow or absent receiver never holds the station's loop up.
- The body is the JSON object of :class:`~hetmm_ray.station.runner.PartResult`
  (``content-type: application/json``). A 2xx answer delivers it; a connection error, a timeout,
  a 408, 429 or 5xx answer is retried after ``backoff_ms``, then twice that, and so on (at most
  30 s between tries), ``retries`` times; any other answer (the receiver refuses this result) or
  the last failed retry gives the result up *loudly*: a line on stderr naming the part and why,
  and :attr:`WebhookPoster.given_up` counts it.
- :meth:`close` waits for what is queued to go out (or be given up) before it returns.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import Any

from ..config.station import WebhookSink

__all__ = ["WebhookPoster"]

RETRYABLE = frozenset({408, 429})  # and every 5xx
MAX_BACKOFF_S = 30.0
TIMEOUT_S = 10.0  # one POST


class WebhookPoster:
    """The sink of one station (see the module docstring)."""

    def __init__(self, cfg: WebhookSink) -> None:
        import httpx

        self.cfg = cfg
        self.client = httpx.Client(timeout=TIMEOUT_S)
        self.delivered = 0
        self.given_up = 0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="station-webhook", daemon=True)
        self._thread.start()

    def publish(self, result: Any) -> None:
        self._queue.put(result)

    def _send(self, result: Any) -> None:
        import httpx

        body = json.dumps(result.to_dict())
        why = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                time.sleep(min(MAX_BACKOFF_S, self.cfg.backoff_ms / 1000 * 2 ** (attempt - 1)))
            try:
                r = self.client.post(self.cfg.url, content=body, headers={"content-type": "application/json"})
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
                continue
            if r.is_success:
                self.delivered += 1
                return
            why = f"HTTP {r.status_code}"
            if not (r.status_code in RETRYABLE or r.status_code >= 500):
                break
        self.given_up += 1
        print(f"hetmm station: webhook {self.cfg.url}: gave up part {result.part_id!r} ({why})", file=sys.stderr)

    def _run(self) -> None:
        while True:
            result = self._queue.get()
            try:
                if result is None:
                    return
                self._send(result)
            finally:
                self._queue.task_done()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self.client.close()
