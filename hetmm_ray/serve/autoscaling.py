"""The detector replicas' autoscaling signal: images in flight, not requests (Serve's custom policy API).

Exact semantics: each replica reports :data:`IMAGES_IN_FLIGHT`, the images of the requests it holds
(queued in its greedy batcher or scoring), through Serve's ``record_autoscaling_stats``
(serve/replica.py). :func:`images_in_flight_policy` (Serve's public ``AutoscalingPolicy``:
``autoscaling_config.policy.policy_function``, deploy.yaml) wants
``(images in flight at the replicas + requests queued at handles) / target_ongoing_requests``
replicas: the same target as Serve's default policy, counted in images, so a load of one-image
requests scales exactly as before and a request of 16 images weighs 16 (a request still queued at a
handle counts one: its size is not known there). Serve applies ``min_replicas``/``max_replicas``,
``upscale_delay_s``/``downscale_delay_s`` and the scaling factors around it, as for its own policy.
Before a replica has reported (a replica just started), its requests in flight stand in.

Why (docs/design.md "Autoscaling"): the cost of a request is its images; ``target_ongoing_requests``
counts a 16-image request as one, so at concurrency 8 of 8-image requests Serve's default sees 8
requests (one replica's target) while 64 images wait.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IMAGES_IN_FLIGHT", "POLICY", "images_in_flight_policy"]

IMAGES_IN_FLIGHT = "images_in_flight"
POLICY = "hetmm_ray.serve.autoscaling:images_in_flight_policy"


def images_in_flight_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """Desired replicas for a ``ray.serve.config.AutoscalingContext`` (see the module doc)."""
    running = ctx.current_num_replicas
    if running == 0:
        return ctx.target_num_replicas, {}
    reported = (ctx.aggregated_metrics or {}).get(IMAGES_IN_FLIGHT) or {}
    if reported:
        images = sum(reported.values()) + (ctx.total_queued_requests or 0.0)
    else:  # no replica has reported yet: requests stand in for images
        images = ctx.total_num_requests
    return images / ctx.config.get_target_ongoing_requests(), {}
