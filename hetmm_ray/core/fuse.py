"""Batch-norm folding: ``BN(conv(x))`` becomes one convolution (exact in real arithmetic).

An eval-mode BatchNorm is a per-channel affine map ``y = (x - mean) * g / sqrt(var + eps) + b``.
Right after a convolution it folds into the convolution's weights and bias:

    W' = W * s[:, None, None, None],   bias' = (bias - mean) * s + b,   s = g / sqrt(var + eps)

so the network runs one op where it ran two (batch norms and activations run as separate passes
over memory are a large share of a mobilenet-class backbone's CPU time). In float32 the
folded network equals the unfolded one up to rounding (tests/unit/test_throughput.py: 1e-4 of the output scale).

Which BatchNorm follows which convolution is found by running the network once on a small
input and recording, for every BatchNorm, whether its input tensor *is* (same object) the
output of a Conv2d, so it works for torchvision's and timm's networks alike without knowing
their module names. A BatchNorm is folded only when that convolution's output feeds nothing
else (it is consumed by exactly this BatchNorm in the recorded run); the BatchNorm module is
then replaced by what remains of it: nothing (``nn.Identity``) for a plain BatchNorm, the
activation for timm's ``BatchNormAct2d`` (BN + drop + act in one module).

Pure module surgery: call it on an eval-mode network before wrapping it (e.g. before
torchvision's ``create_feature_extractor``), on the CPU, in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["fold_batch_norms", "fold_into_conv"]


def fold_into_conv(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    """Fold ``bn`` (eval statistics) into ``conv`` in place; ``conv`` gains a bias if it had none."""
    mean, var = bn.running_mean, bn.running_var
    if mean is None or var is None:
        raise ValueError("fold_into_conv: the batch norm keeps no running statistics")
    with torch.no_grad():
        var = var.double()
        scale = (bn.weight.double() if bn.weight is not None else torch.ones_like(var)) / torch.sqrt(var + bn.eps)
        shift = bn.bias.double() if bn.bias is not None else torch.zeros_like(var)
        bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(var)
        w = conv.weight.double() * scale.view(-1, *([1] * (conv.weight.dim() - 1)))
        conv.weight.copy_(w.to(conv.weight.dtype))
        new_bias = ((bias - mean.double()) * scale + shift).to(conv.weight.dtype)
        if conv.bias is None:
            conv.bias = nn.Parameter(new_bias, requires_grad=False)
        else:
            conv.bias.copy_(new_bias)


def _remainder(bn: nn.Module) -> nn.Module:
    """What is left of a BatchNorm module once its affine map lives in the convolution."""
    act = getattr(bn, "act", None)
    drop = getattr(bn, "drop", None)
    rest = [m for m in (drop, act) if isinstance(m, nn.Module) and not isinstance(m, nn.Identity)]
    if not rest:
        return nn.Identity()
    return rest[0] if len(rest) == 1 else nn.Sequential(*rest)


def _pairs(model: nn.Module, sample: Tensor) -> list[tuple[str, str]]:
    """(conv name, bn name) for every BatchNorm whose input is a Conv2d's output used nowhere else."""
    names = {m: n for n, m in model.named_modules()}
    conv_out: dict[int, tuple[nn.Module, Tensor]] = {}  # id(output) -> (conv, output): kept alive
    uses: dict[int, int] = {}  # id(conv output) -> how many module calls read it
    found: list[tuple[nn.Module, nn.Module, int]] = []
    handles = []

    def after_conv(mod: nn.Module, _inp: tuple, out: Tensor) -> None:
        conv_out[id(out)] = (mod, out)

    def before_any(mod: nn.Module, inp: tuple) -> None:
        for x in inp:
            if isinstance(x, Tensor) and id(x) in conv_out:
                uses[id(x)] = uses.get(id(x), 0) + 1
                if isinstance(mod, nn.BatchNorm2d):
                    found.append((conv_out[id(x)][0], mod, id(x)))

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(after_conv))
        if not list(m.children()) or isinstance(m, nn.BatchNorm2d):
            handles.append(m.register_forward_pre_hook(before_any))
    try:
        with torch.no_grad():
            model(sample)
    finally:
        for h in handles:
            h.remove()
    pairs = []
    for conv, bn, key in found:
        # Read by the BN alone (leaf modules inside a BatchNormAct2d see the BN's output, not this).
        if uses.get(key) == 1 and conv in names and bn in names:
            pairs.append((names[conv], names[bn]))
    return pairs


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, module)


def fold_batch_norms(model: nn.Module, sample: Tensor) -> int:
    """Fold every BatchNorm2d that directly follows a Conv2d into it, in place; returns how many.

    ``model`` must be in eval mode; ``sample`` is one input it accepts (its values do not matter,
    only which module feeds which). A convolution's output that something besides its
    BatchNorm reads (a feature tap, a skip connection) is left alone.
    """
    if any(m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        raise ValueError("fold_batch_norms: the model must be in eval mode (running statistics)")
    pairs = _pairs(model, sample)
    for conv_name, bn_name in pairs:
        conv = model.get_submodule(conv_name)
        bn = model.get_submodule(bn_name)
        fold_into_conv(conv, bn)  # type: ignore[arg-type]
        _set(model, bn_name, _remainder(bn))
    return len(pairs)
