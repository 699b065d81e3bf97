"""Map post-processing, image scores and threshold calibration (ALGORITHM.md §3)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .geometry import Box, crop

FoldScorer = Callable[[list[int], list[int]], Sequence[float]]
"""``score_fold(held_out, kept)``: scores of the held-out images against templates of the kept ones."""

__all__ = ["Calibration", "calibrate", "gaussian_blur", "gaussian_kernel", "image_scores"]


def gaussian_kernel(sigma: float, *, device: torch.device | None = None) -> Tensor:
    """1-D kernel of size ``2*ceil(4*sigma)+1`` (truncated at 4 sigma, like scipy), summing to 1."""
    radius = math.ceil(4 * sigma)
    x = torch.arange(-radius, radius + 1, dtype=torch.float32, device=device)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def gaussian_blur(maps: Tensor, sigma: float) -> Tensor:
    """Separable Gaussian blur of (B, H, W) maps with reflect padding; sigma 0 is identity."""
    if sigma <= 0:
        return maps
    k = gaussian_kernel(sigma, device=maps.device).to(maps.dtype)
    r = k.numel() // 2
    x = maps[:, None]
    # Reflect padding needs pad < size: clamp, then fall back to replicate for tiny maps.
    h, w = maps.shape[-2:]
    mode = "reflect" if r < min(h, w) else "replicate"
    x = F.conv2d(F.pad(x, (0, 0, r, r), mode=mode), k.view(1, 1, -1, 1))
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode=mode), k.view(1, 1, 1, -1))
    return x[:, 0]


def image_scores(maps: Tensor, sigma: float, boxes: Sequence[Box] | None = None) -> Tensor:
    """``max(G_sigma(S))`` per image: (B,).

    ``boxes`` (letterboxed images, ``core.geometry``, in the maps' pixels): the blur and the
    max run on each image's content only (reflect padding at the content's edge), so padded
    pixels never count.
    """
    if boxes is None or all(b.is_full(maps.shape[-1]) for b in boxes):
        return gaussian_blur(maps, sigma).flatten(1).amax(dim=1)
    return torch.stack([gaussian_blur(m[None], sigma).amax() for m in crop(maps, boxes)])


def content_maps(maps: Tensor, sigma: float, boxes: Sequence[Box] | None = None) -> list[Tensor]:
    """Localisation maps ``G_sigma(S)`` of each image's content (blurred on the crop, as the score)."""
    if boxes is None:
        return list(gaussian_blur(maps, sigma))
    return [gaussian_blur(m[None], sigma)[0] for m in crop(maps, boxes)]


@dataclass(frozen=True)
class Calibration:
    """Out-of-fold image scores of good training images, and the threshold rule on them."""

    scores: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores)

    @property
    def std(self) -> float:
        m = self.mean
        n = len(self.scores)
        return math.sqrt(sum((s - m) ** 2 for s in self.scores) / max(n - 1, 1))

    def threshold(self, sigmas: float) -> float:
        """``mean + sigmas * std`` of the good images' scores."""
        return self.mean + sigmas * self.std


def calibrate(
    n_images: int,
    *,
    folds: int,
    max_images: int,
    seed: int,
    score_fold: FoldScorer,
) -> Calibration:
    """Leave-some-out scores of good images.

    Up to ``max_images`` training images are drawn (seeded) and split into
    ``folds``; ``score_fold(held_out, kept)`` scores the held-out indices against
    templates built from the kept indices (every training image not held out).
    """
    if n_images < 2:
        raise ValueError("threshold calibration needs at least 2 good images")
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(n_images, generator=g)[: min(max_images, n_images)].tolist()
    folds = min(folds, len(chosen))
    scores: list[float] = []
    for f in range(folds):
        held = sorted(chosen[f::folds])
        held_set = set(held)
        kept = [i for i in range(n_images) if i not in held_set]
        scores.extend(float(s) for s in score_fold(held, kept))
    return Calibration(scores=tuple(scores))
