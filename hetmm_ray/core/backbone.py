"""Frozen torchvision CNN -> L2-normalised multi-layer features (ALGORITHM.md §1).

Features are tapped by graph node name (torchvision's ``create_feature_extractor``),
so the graph stops after the deepest tap and no hooks are involved. For ResNets
with ``pre_relu`` the tap is the residual sum of the stage's last block
(``layerN.<last>.add``), the tensor before its final ReLU; the next stage still
receives the ReLU'd tensor.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat.torchvision import feature_extraction, models
from ..config import BackboneConfig

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Backbone", "WeightsError", "weights_identity"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class WeightsError(RuntimeError):
    """Pretrained weights could not be had or do not fit the backbone."""


def _tap_node(model: nn.Module, name: str, tap: str, pre_relu: bool) -> str:
    """The graph node whose output is layer ``tap``'s feature."""
    if pre_relu and tap.startswith("layer") and "." not in tap:
        stage = getattr(model, tap)
        return f"{tap}.{len(stage) - 1}.add"
    return tap


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_identity(config: BackboneConfig) -> str:
    """A stable name for the weights, stored with templates to refuse mismatches."""
    w = config.weights
    if config.is_random:
        return f"random:seed={config.seed}"
    path = Path(w)
    if path.suffix in (".pth", ".pt", ".safetensors") or path.exists():
        if not path.is_file():
            raise WeightsError(f"weights file {w} not found")
        return f"sha256:{_file_sha256(path)}"
    return f"torchvision:{config.name}.{w}"


def _load_state_dict(config: BackboneConfig) -> dict[str, Tensor]:
    w = config.weights
    path = Path(w)
    if path.suffix in (".pth", ".pt", ".safetensors") or path.exists():
        if not path.is_file():
            raise WeightsError(f"weights file {w} not found")
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any reader failure means a bad file
            raise WeightsError(f"weights file {w} could not be read as a state dict: {exc}") from None
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise WeightsError(f"weights file {w} holds a {type(state).__name__}, not a state dict")
        return state
    try:
        enum = models.get_model_weights(config.name)
        spec = enum[w] if w != "DEFAULT" else enum.DEFAULT
    except (KeyError, ValueError):
        raise WeightsError(
            f"backbone {config.name}: unknown weights {w!r}; use DEFAULT, a torchvision enum name, "
            "a state-dict file path, or 'random'"
        ) from None
    try:
        return spec.get_state_dict(progress=False, check_hash=False)
    except Exception as exc:  # noqa: BLE001 - network errors come in many types
        cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(spec.url).name
        raise WeightsError(
            f"cannot get the pretrained {config.name} weights {spec} ({type(exc).__name__}: {exc}). "
            f"Either place the file {Path(spec.url).name} at {cache} (torchvision's cache), "
            f"or pass a local state dict with --weights FILE (.pth or .safetensors)"
        ) from None


def _build_model(config: BackboneConfig) -> nn.Module:
    builder = getattr(models, config.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = builder(weights=None)
    # torchvision's blocks apply nn.ReLU(inplace=True) right after the residual sum, which
    # would overwrite a pre-ReLU tap in place: every ReLU must produce a new tensor.
    for module in model.modules():
        if getattr(module, "inplace", False):
            module.inplace = False
    if not config.is_random:
        state = _load_state_dict(config)
        result = model.load_state_dict(state, strict=False)
        missing = [k for k in result.missing_keys if not k.startswith(("fc.", "classifier."))]
        if missing or result.unexpected_keys:
            raise WeightsError(
                f"weights {config.weights} do not fit {config.name}: {len(missing)} missing keys "
                f"(e.g. {missing[:3]}), {len(result.unexpected_keys)} unexpected (e.g. {result.unexpected_keys[:3]})"
            )
    return model


class Backbone(nn.Module):
    """Images (B, 3, H, W) in [0, 1] -> {layer: (B, C, h, w) unit vectors per pixel}."""

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__()
        self.config = config
        model = _build_model(config)
        nodes = {_tap_node(model, config.name, tap, config.pre_relu): tap for tap in config.taps}
        try:
            self.extractor = feature_extraction.create_feature_extractor(model, return_nodes=nodes)
        except ValueError as exc:
            raise ValueError(f"backbone {config.name}: bad layer taps {list(config.taps)}: {exc}") from None
        self.extractor.eval().requires_grad_(False)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.weights_id = weights_identity(config)

    @property
    def layers(self) -> tuple[str, ...]:
        return self.config.taps

    @torch.inference_mode()
    def forward(self, images: Tensor) -> dict[str, Tensor]:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        x = (images.to(self.mean.device, self.mean.dtype) - self.mean) / self.std
        feats = self.extractor(x)
        return {tap: F.normalize(feats[tap].float(), dim=1) for tap in self.config.taps}

    def feature_shapes(self, image_size: int | None = None) -> dict[str, tuple[int, int, int]]:
        """(C, h, w) of every layer for a square input, by a dry run on one blank image."""
        size = image_size or self.config.image_size
        out = self.forward(torch.zeros(1, 3, size, size, device=self.mean.device))
        return {k: tuple(v.shape[1:]) for k, v in out.items()}  # type: ignore[misc]
