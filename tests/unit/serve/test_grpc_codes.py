"""gRPC without Ray: the error table's gRPC codes, the gRPC reference's table, the generated modules.

Every HTTP status the project answers (``errors.ERRORS`` and every ``Refused(<status>, ...)`` in
the package) has a gRPC code in ``errors.GRPC_CODES``, a real ``grpc.StatusCode``; the generated gRPC
reference (``hetmm_ray/reference.py``) states exactly that mapping; the committed ``inspection_pb2*.py`` are what
``python -m hetmm_ray.serve.grpc.protoc`` makes of the ``.proto``.
"""

from __future__ import annotations

import re

import grpc
import pytest
from helpers import REPO

from hetmm_ray.errors import ERRORS, GRPC_CODES, grpc_code


def _refused_statuses() -> set[int]:
    found = set()
    for path in (REPO / "hetmm_ray").rglob("*.py"):
        found |= {int(s) for s in re.findall(r"Refused\(\s*(\d{3})\s*,", path.read_text())}
    return found


def test_every_status_the_project_answers_has_a_grpc_code() -> None:
    statuses = {status for status, _ in ERRORS.values()} | _refused_statuses() | {499}
    assert {401, 403, 404, 413} <= statuses  # the scan found the refusals
    assert statuses <= set(GRPC_CODES), f"unmapped: {sorted(statuses - set(GRPC_CODES))}"
    for status, name in GRPC_CODES.items():
        assert isinstance(getattr(grpc.StatusCode, name), grpc.StatusCode), (status, name)
    assert grpc_code(404) == "NOT_FOUND" and grpc_code(599) == "INTERNAL"


def test_the_grpc_reference_table_is_the_mapping() -> None:
    from hetmm_ray.reference import grpc_reference

    text = grpc_reference()
    head = text.index("| HTTP | gRPC status |")
    rows = {}
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[int(cells[0])] = cells[1]
    assert rows == GRPC_CODES


def test_generated_modules_are_current_and_describe_the_service() -> None:
    from hetmm_ray.serve.grpc import inspection_pb2 as pb
    from hetmm_ray.serve.grpc import protoc

    assert protoc.main(["--check"]) == 0
    service = pb.DESCRIPTOR.services_by_name["Inspection"]
    assert service.full_name == "hetmm.v1.Inspection"
    assert [m.name for m in service.methods] == ["Predict", "ListProducts", "Health"]
    request = pb.PredictRequest(product="gear", images=[pb.Image(name="a.png", data=b"x")])
    assert not request.HasField("version") and not request.HasField("threshold")
    request.threshold = 0.0  # proto3 optional: an explicit 0 is set, not absent
    assert pb.PredictRequest.FromString(request.SerializeToString()).HasField("threshold")


def test_the_reader_refuses_what_it_does_not_know(tmp_path) -> None:
    from hetmm_ray.serve.grpc import protoc

    bad = tmp_path / "x.proto"
    bad.write_text('syntax = "proto3";\npackage a;\nmessage M {\n  map<string, int32> m = 1;\n}\n')
    with pytest.raises(ValueError, match=r"x\.proto:4"):
        protoc.file_descriptor(bad)


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("ipv4:127.0.0.1:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv6:%5B::1%5D:5000", True),
        ("ipv6:[::ffff:127.0.0.1]:5000", True),
        ("unix:/tmp/s", True),
        ("ipv4:10.1.2.3:5000", False),
        ("ipv6:[2001:db8::1]:5000", False),
        ("", False),
    ],
)
def test_loopback_peers(peer: str, local: bool) -> None:
    from hetmm_ray.serve.grpc.messages import peer_is_loopback

    assert peer_is_loopback(peer) is local


def test_result_message_keeps_the_http_fields() -> None:
    import base64

    from hetmm_ray.serve.grpc.messages import result_message

    result = {
        "name": "a.png",
        "score": 1.5,
        "threshold": 1.0,
        "is_anomaly": True,
        "verdict": "reject",
        "review_threshold": None,
        "record_version": 1,
        "threshold_rule": "far",
        "rule_target": 0.01,
        "estimated_false_alarm_rate": None,
        "version": 3,
        "timing": {"queue_ms": 1.0, "score_ms": 2.0, "batch_images": 1, "batch_requests": 1, "replica": "r"},
        "heatmap_png": base64.b64encode(b"PNGDATA").decode(),
        "heatmap_scale": {"vmin": 0.0, "vmax": 2.0},
    }
    msg = result_message(result)
    assert (msg.name, msg.score, msg.threshold, msg.is_anomaly, msg.version) == ("a.png", 1.5, 1.0, True, 3)
    assert msg.threshold_rule == "far" and msg.rule_target == 0.01 and not msg.HasField("estimated_false_alarm_rate")
    assert msg.heatmap_png == b"PNGDATA" and msg.heatmap_scale.vmax == 2.0 and msg.timing.replica == "r"
    # the result record's own fields, and the record read back from the message (record_of)
    assert (msg.verdict, msg.record_version, msg.HasField("review_threshold")) == ("reject", 1, False)
    from hetmm_ray.result import RECORD_FIELDS
    from hetmm_ray.serve.grpc.messages import record_of

    assert record_of(msg) == {k: result[k] for k in RECORD_FIELDS}


def test_deploy_yaml_serves_the_grpc_application() -> None:
    """deploy.yaml's grpc_options register the servicer on config's port, and the gRPC application's
    Detector has the HTTP application's options and args (one autoscaling policy for both pools)."""
    import yaml

    from hetmm_ray.config import DEFAULT_GRPC_PORT, GRPC_APP_NAME, GRPC_ROUTE_PREFIX, GRPC_SERVICER, ServiceConfig

    data = yaml.safe_load((REPO / "deploy.yaml").read_text())
    assert data["grpc_options"] == {"port": DEFAULT_GRPC_PORT, "grpc_servicer_functions": [GRPC_SERVICER]}
    apps = {a["name"]: a for a in data["applications"]}
    http, grpc_app = apps["hetmm"], apps[GRPC_APP_NAME]
    assert grpc_app["route_prefix"] == GRPC_ROUTE_PREFIX
    assert grpc_app["import_path"] == "hetmm_ray.serve.grpc.app:build_grpc_app"
    assert grpc_app["args"] == http["args"]
    assert ServiceConfig.from_dict(grpc_app["args"]).grpc_host == "127.0.0.1"
    detector = next(d for d in http["deployments"] if d["name"] == "Detector")
    assert grpc_app["deployments"] == [detector]
