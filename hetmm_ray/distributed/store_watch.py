"""The registry follows the store: a poll of every served product's HEAD.

The store has other writers (the CLI, a second cluster, another line's
service). Every ``interval_s`` seconds the registry re-reads the HEAD of each
product it holds; a moved head (a rollback, a new version) is loaded and
published, a product whose HEAD is gone (deleted) is forgotten, so replicas
swap before their next batch and the ingress answers 404. A change written
elsewhere is therefore served within about ``interval_s`` + the time to load
the new version (+ the ingress's existence cache, also ``interval_s``, for a
delete). A store that cannot be read keeps the old versions serving; the next
poll tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["follow_store"]

logger = logging.getLogger(__name__)


async def follow_store(sync: Callable[[], Awaitable[None]], interval_s: Callable[[], float]) -> None:
    """Call ``sync`` every ``interval_s()`` seconds until cancelled; failures are logged, not fatal."""
    while True:
        await asyncio.sleep(interval_s())
        try:
            await sync()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a flaky store must not stop the watch
            logger.warning("store poll failed (%s: %s); retrying in %.1f s", type(exc).__name__, exc, interval_s())
