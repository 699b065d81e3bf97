"""Plain helpers of the gRPC service (no Ray): result dicts as messages, and peers.

Exact semantics: :func:`result_message` turns one image's result as the HTTP answer holds it (the result record of
hetmm_ray/result.py, with ``name`` and ``timing``) into a ``Result`` (``heatmap_png`` base64 -> bytes;
rule fields and ``review_threshold`` that are None left unset);
:func:`peer_is_loopback` reads a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``,
``unix:...``; grpc may percent-encode the brackets) and :func:`host_is_loopback` a configured host name or address;
:func:`metadata_value` reads one key of a call's metadata (case-insensitive; ``""`` when absent);
:func:`refuse` sets a call's status from a refusal: the gRPC code of its HTTP status (``errors.GRPC_CODES``)
and details ``"<code>: <message>"``; :data:`METRIC_ROUTES` names each Inspection method's route in the
ingress's request metrics (``hetmm_requests_total``), for the replicas and the stand-in alike;
:data:`RULE_FIELDS` are a ``Result``'s optional rule fields (set only when the rule has them);
:func:`record_of` is a ``Result`` read back as the result record (what a client keeps);
:func:`upload_of` reads an ``Image`` as what the replica decodes (its encoded ``data``, or its ``raw``
frame as a ``RawFrame``: one of the two, or 400 ``bad_image``) and :func:`image_message` is the
client's way back.
"""

from __future__ import annotations

import base64
import ipaddress
from typing import Any
from urllib.parse import unquote

import grpc

from ...data.raw_frame import RawFrame
from ...errors import Refused, grpc_code
from ...result import RECORD_FIELDS, RULE_FIELDS
from . import inspection_pb2 as pb

__all__ = [
    "METRIC_ROUTES",
    "RULE_FIELDS",
    "Observed",
    "host_is_loopback",
    "image_message",
    "metadata_value",
    "peer_is_loopback",
    "record_of",
    "refuse",
    "result_message",
    "upload_of",
]

METRIC_ROUTES = {"Predict": "grpc_predict", "ListProducts": "grpc_list_products", "Health": "grpc_health"}
Observed = tuple[str, list[tuple[str, bytes | RawFrame]], list[dict[str, Any]]]
"""A gRPC prediction as a replica forwards it to the ingress: (product, uploads, results)."""


def metadata_value(grpc_context: Any, key: str) -> str:
    """The value of ``key`` in the call's invocation metadata (names compared case-insensitively), or ``""``."""
    for name, value in grpc_context.invocation_metadata():
        if name.lower() == key:
            return str(value)
    return ""


def refuse(grpc_context: Any, err: Refused) -> None:
    """Answer the call with ``err``: its status's gRPC code and ``"<code>: <message>"`` as details."""
    grpc_context.set_code(getattr(grpc.StatusCode, grpc_code(err.status)))
    grpc_context.set_details(f"{err.code}: {err.message}")


def host_is_loopback(host: str) -> bool:
    """Whether ``host`` (``localhost``, an IPv4 or IPv6 address) is a loopback address."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(unquote(host).strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 from a dual-stack listener
    return (mapped or address).is_loopback


def peer_is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) is local."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    return host_is_loopback(rest.rsplit(":", 1)[0]) if kind in ("ipv4", "ipv6") else False


def result_message(result: dict[str, Any]) -> pb.Result:
    """One image's result (the HTTP answer's dict) as a ``Result`` message."""
    timing = result["timing"]
    msg = pb.Result(
        name=result.get("name", ""),
        score=result["score"],
        threshold=result["threshold"],
        is_anomaly=result["is_anomaly"],
        verdict=result["verdict"],
        record_version=result["record_version"],
        version=result["version"],
        timing=pb.Timing(**{k: timing[k] for k in pb.Timing.DESCRIPTOR.fields_by_name if k in timing}),
    )
    for key in (*RULE_FIELDS, "review_threshold"):
        if result.get(key) is not None:
            setattr(msg, key, result[key])
    if "heatmap_png" in result:
        msg.heatmap_png = base64.b64decode(result["heatmap_png"])
        msg.heatmap_scale.CopyFrom(pb.HeatmapScale(**result["heatmap_scale"]))
    return msg


def record_of(result: pb.Result) -> dict[str, Any]:
    """The result record (hetmm_ray/result.py ``RECORD_FIELDS``) a ``Result`` message carries; an
    optional field left unset is None."""
    optional = {*RULE_FIELDS, "review_threshold"}
    return {k: (getattr(result, k) if k not in optional or result.HasField(k) else None) for k in RECORD_FIELDS}


def upload_of(image: pb.Image) -> bytes | RawFrame:
    """What the replica decodes of ``image``: its ``raw`` frame, or else its encoded ``data``."""
    if not image.HasField("raw"):
        return image.data
    if image.data:
        name = image.name or "<image>"
        raise Refused(400, "bad_image", f"{name}: give the image as data or as raw, not both")
    raw = image.raw
    return RawFrame(width=raw.width, height=raw.height, pixel_format=raw.pixel_format, pixels=raw.pixels)


def image_message(name: str, data: bytes | RawFrame) -> pb.Image:
    """An ``Image`` of encoded bytes or of a :class:`RawFrame` (sent as it is, never encoded)."""
    if isinstance(data, RawFrame):
        raw = pb.RawFrame(width=data.width, height=data.height, pixel_format=data.pixel_format, pixels=data.pixels)
        return pb.Image(name=name, raw=raw)
    return pb.Image(name=name, data=data)
