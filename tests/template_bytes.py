"""A whole :class:`~hetmm_ray.core.templates.TemplateSet` as one safetensors blob, for tests.

The store keeps a template set as per-layer objects and a JSON manifest (``store/``); nothing
in the package reads or writes a set as a single file. Tests use this one-file form to
fingerprint a set bit for bit and to hand a set to a subprocess. Tensors plus a JSON metadata
header (never pickle).
"""

from __future__ import annotations

import json

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from hetmm_ray.config import ConfigError, stored_config
from hetmm_ray.core.scoring import Calibration, calibration_json
from hetmm_ray.core.templates import TemplateError, TemplateSet

__all__ = ["FORMAT_VERSION", "from_bytes", "to_bytes"]

FORMAT_VERSION = 1


def to_bytes(ts: TemplateSet) -> bytes:
    tensors = {f"bank/{k}": v.contiguous().cpu() for k, v in ts.bank.items()}
    tensors.update(ts.selection_tensors())
    header = {
        "format": FORMAT_VERSION,
        "layers": list(ts.bank),
        "config": ts.config.stored_dict(),
        "weights_id": ts.weights_id,
        "image_digests": list(ts.image_digests),
        "calibration": calibration_json(ts.calibration),
        "meta": dict(ts.meta),
    }
    return st_save(tensors, metadata={"hetmm": json.dumps(header)})


def from_bytes(data: bytes, *, source: str = "templates") -> TemplateSet:
    try:
        tensors = st_load(data)
        header = json.loads(_metadata(data)["hetmm"])
    except Exception as exc:  # noqa: BLE001 - any parse failure means unusable data
        raise TemplateError(f"{source}: not a readable template set ({exc})") from None
    if header.get("format") != FORMAT_VERSION:
        raise TemplateError(f"{source}: unsupported template format {header.get('format')!r}")
    try:
        config = stored_config(header["config"])
        layers = header["layers"]
        return TemplateSet(
            bank={k: tensors[f"bank/{k}"] for k in layers},
            config=config,
            weights_id=header["weights_id"],
            image_digests=tuple(header["image_digests"]),
            calibration=Calibration.from_json(header.get("calibration")),
            meta=header.get("meta", {}),
            **TemplateSet.parse_selection(tensors, layers),
        )
    except ConfigError as exc:
        raise TemplateError(f"{source}: stored configuration is invalid: {exc}") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise TemplateError(f"{source}: incomplete template set (missing or malformed {exc})") from None


def _metadata(data: bytes) -> dict[str, str]:
    """The safetensors JSON header's ``__metadata__`` (8-byte little-endian length prefix)."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n])["__metadata__"]
