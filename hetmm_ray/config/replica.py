"""The detector replicas' live settings: Serve's ``user_config``, changed without a restart.

Exact semantics: a :class:`ReplicaSettings` is built from each ``reconfigure(user_config)`` of a
replica (and checked when the application is built from ``deploy.yaml``); its settings are named
``user_config.<field>`` in messages and in the configuration reference, each range declared on its
field. At most one of ``sigmas`` and ``false_alarm_rate`` may be set: each overrides every
product's threshold rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._constraints import ConfigError, Range, Settings, setting

__all__ = ["ReplicaSettings"]


@dataclass(frozen=True, kw_only=True)
class ReplicaSettings(Settings):
    """Live settings of detector replicas (``user_config``; changed without a restart)."""

    _prefix: ClassVar[str] = "user_config."

    max_batch_size: int = setting(
        8, Range(1, 256, int), description="Images a detector replica scores together per product."
    )  # images scored together per product
    # Batching is greedy (serve/greedy.py): a free replica takes everything queued for a product
    # at once, so a lone request never waits and a busy replica's next batch holds what queued
    # meanwhile. A window > 0 makes a free replica wait up to this long for its batch to fill
    # (every lone request then pays the window: serve/greedy.py).
    batch_wait_timeout_s: float = setting(
        0.0,
        Range(0.0, 10.0),
        description=(
            "How long a free replica may wait for its batch to fill; 0: greedy (it takes what is queued at once and "
            "never waits)."
        ),
    )
    # torch intra-op threads per replica; 0 = the CPUs the replica was given
    threads: int = setting(
        0, Range(0, 1024, int), description="Torch threads per replica; 0: the CPUs the replica was given."
    )
    # override every product's threshold rule (None: each product's own)
    sigmas: float | None = setting(
        None,
        Range(0.0, 100.0),
        description=(
            "Override every product's threshold rule with mean + sigmas x std (null: each product's own rule). At most"
            " one of `sigmas` and `false_alarm_rate`."
        ),
    )
    # Or: every product's threshold at this estimated false-alarm rate (None: each product's own rule).
    false_alarm_rate: float | None = setting(
        None,
        Range(0.0001, 0.5),
        description=(
            "Override every product's threshold with the far rule at this rate (null: each product's own rule)."
        ),
    )

    def _check(self) -> None:
        if self.sigmas is not None and self.false_alarm_rate is not None:
            raise ConfigError(
                "sigmas and false_alarm_rate: set at most one (each overrides every product's threshold rule)"
            )
