"""``one_machine_detector``: a Detector's options when ``start_service`` starts Ray on this machine.

deploy.yaml's Detector autoscales replicas of half a CPU for a cluster. On one machine the service
runs one replica per application whose torch threads are the machine's usable cores
(docs/performance.md), keeping deploy.yaml's other settings; a caller that sets the scaling keeps
its own and deploy.yaml's threads; a stated non-zero ``threads`` is kept.
"""

from __future__ import annotations

from hetmm_ray.core.device import usable_cores
from hetmm_ray.serve.app import DEPLOY_YAML, deployment_options, load_deploy_config
from hetmm_ray.serve.run import _describe_detector, one_machine_detector


def _stated() -> dict:
    app = next(a for a in load_deploy_config(DEPLOY_YAML)["applications"] if a["name"] == "hetmm")
    return deployment_options(app)["Detector"]


def test_deploy_yaml_detector_becomes_one_replica_of_every_core() -> None:
    stated = _stated()
    assert stated["autoscaling_config"]["max_replicas"] > 1 and stated["user_config"]["threads"] == 0  # the premise
    detector = one_machine_detector(stated, {})
    assert detector["num_replicas"] == 1 and "autoscaling_config" not in detector
    assert detector["user_config"] == {**stated["user_config"], "threads": usable_cores()}
    assert detector["ray_actor_options"] == stated["ray_actor_options"]
    assert stated["user_config"]["threads"] == 0 and "num_replicas" not in stated  # deploy.yaml's left as it was
    assert _describe_detector(detector, one_machine=True).startswith(f"1 replica, {usable_cores()} torch threads")


def test_a_caller_that_sets_the_scaling_keeps_it() -> None:
    stated = _stated()
    fixed = one_machine_detector(stated, {"num_replicas": 3})
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["user_config"]["threads"] == 0
    auto = {"min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 2}
    scaled = one_machine_detector(stated, {"autoscaling_config": auto})
    assert scaled["autoscaling_config"] == auto and "num_replicas" not in scaled
    assert scaled["user_config"]["threads"] == 0
    assert _describe_detector(scaled, one_machine=False) == "1-4 replicas (autoscaled), torch threads = its CPUs"


def test_stated_threads_and_caller_settings_win() -> None:
    stated = {**_stated(), "user_config": {"max_batch_size": 8, "threads": 3}}
    assert one_machine_detector(stated, {})["user_config"]["threads"] == 3
    mine = one_machine_detector(_stated(), {"user_config": {"threads": 1}, "max_ongoing_requests": 5})
    assert mine["user_config"] == {"threads": 1} and mine["max_ongoing_requests"] == 5
    assert mine["num_replicas"] == 1
    assert _describe_detector(mine, one_machine=True).startswith("1 replica, 1 torch thread (a Ray on this machine")
    assert _describe_detector({"num_replicas": 3}, one_machine=False) == "3 replicas, torch threads = its CPUs"
