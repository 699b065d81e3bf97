"""Reader for one category of the MVTec AD folder layout.

::

    <root>/train/good/*.png                       good training images
    <root>/test/good/*.png                        good test images      (label 0)
    <root>/test/<defect_type>/*.png               defective test images (label 1)
    <root>/ground_truth/<defect_type>/<stem>_mask.png   their pixel masks (optional)

Pixel masks are optional per set: a set whose ``ground_truth/`` folder holds no folder for
any defect type is an *image-labels-only* set (``test/good`` plus defect folders): image
metrics and the operating point can be measured, pixel metrics cannot
(:attr:`MVTecCategory.has_pixel_masks` is False). Where a defect type's mask folder exists,
every image of that type needs its mask; a set with masks for some defect types and none for
others is refused (pixel metrics over part of the defects would be biased). Every check runs
in :meth:`MVTecCategory.test_samples`, which evaluation calls before any fitting work.

Image files are recognised by extension (png, jpg, jpeg, bmp, tif, tiff; any
case); hidden files (``.DS_Store``, ``._x.png``) are ignored. Every listing is
sorted so that runs are reproducible.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..config import IMAGE_SUFFIXES
from ..errors import HetmmError

__all__ = ["IMAGE_EXTENSIONS", "DatasetError", "MVTecCategory", "Sample"]

IMAGE_EXTENSIONS = IMAGE_SUFFIXES  # the one list lives in hetmm_ray.config
_LAYOUT = "expected an MVTec AD category folder with train/good, test/<type>, ground_truth/<type>"


class DatasetError(HetmmError, ValueError):
    """A dataset folder does not have the expected layout or content."""


@dataclass(frozen=True)
class Sample:
    """One test image: ``label`` is 0 for ``good``, 1 for any defect type."""

    path: Path
    defect_type: str
    label: int
    mask_path: Path | None


def _is_image(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS


def _images_in(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if _is_image(p)), key=lambda p: p.name)


class MVTecCategory:
    """One MVTec AD category folder (e.g. ``mvtec/bottle``), validated on construction."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetError(f"{self.root} not found: {_LAYOUT}")
        for sub in ("train/good", "test"):
            if not (self.root / sub).is_dir():
                raise DatasetError(f"{self.root / sub} not found: {_LAYOUT}")
        if not _images_in(self.root / "train" / "good"):
            raise DatasetError(
                f"{self.root / 'train' / 'good'} contains no images (extensions: {', '.join(IMAGE_EXTENSIONS)})"
            )

    @property
    def name(self) -> str:
        return self.root.name

    def __repr__(self) -> str:
        return f"MVTecCategory({str(self.root)!r})"

    def train_paths(self) -> list[Path]:
        """Good training images, sorted by file name."""
        return _images_in(self.root / "train" / "good")

    def defect_types(self) -> list[str]:
        """The defect folders under ``test/`` (every folder but ``good``), sorted."""
        test_dir = self.root / "test"
        return sorted(
            p.name for p in test_dir.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "good"
        )

    @property
    def has_pixel_masks(self) -> bool:
        """Whether the set has ground-truth masks (then for every defective test image)."""
        return any((self.root / "ground_truth" / t).is_dir() for t in self.defect_types())

    def test_samples(self) -> list[Sample]:
        """Test images sorted by defect type, then file name (``good`` among them in name order).

        Raises :class:`DatasetError` for a defect type whose mask folder exists without an
        image's mask, or masks for some defect types and none for others (module docstring).
        """
        test_dir = self.root / "test"
        types = sorted([*self.defect_types(), "good"])
        with_masks = [t for t in self.defect_types() if (self.root / "ground_truth" / t).is_dir()]
        if with_masks and len(with_masks) < len(self.defect_types()):
            missing = sorted(set(self.defect_types()) - set(with_masks))
            raise DatasetError(
                f"{self.root / 'ground_truth'} has masks for {', '.join(with_masks)} but not for "
                f"{', '.join(missing)}: give every defect type its masks, or none (image labels only)"
            )
        samples: list[Sample] = []
        for defect_type in types:
            folder = test_dir / defect_type
            for path in _images_in(folder) if folder.is_dir() else []:
                if defect_type == "good":
                    samples.append(Sample(path, defect_type, 0, None))
                else:
                    mask = self._mask_for(path, defect_type) if with_masks else None
                    samples.append(Sample(path, defect_type, 1, mask))
        return samples

    def measurable_samples(self) -> list[Sample]:
        """:meth:`test_samples`, refused unless there are good and defective test images (what
        image AUROC and an operating point need): the layout check ``hetmm evaluate`` runs first."""
        samples = self.test_samples()
        if not any(s.label == 0 for s in samples):
            raise DatasetError(f"{self.root / 'test' / 'good'} holds no images: measuring needs good test images")
        if not any(s.label == 1 for s in samples):
            raise DatasetError(
                f"{self.root / 'test'} has no defect folder with images: measuring needs defective test images"
            )
        return samples

    def _mask_for(self, path: Path, defect_type: str) -> Path:
        folder = self.root / "ground_truth" / defect_type
        expected = folder / f"{path.stem}_mask.png"
        if expected.is_file():
            return expected
        for ext in IMAGE_EXTENSIONS[1:]:
            for candidate in (folder / f"{path.stem}_mask{ext}", folder / f"{path.stem}_mask{ext.upper()}"):
                if candidate.is_file():
                    return candidate
        raise DatasetError(f"{expected} not found: the defective test image {path} has no ground-truth mask")

    def load_mask(self, sample: Sample, size: int | tuple[int, int]) -> np.ndarray:
        """Boolean ``(size, size)`` (or ``size = (height, width)``) mask: all False for good samples
        (and for defective ones of an image-labels-only set: callers check :attr:`has_pixel_masks`).

        The mask file (any mode, read as grayscale) is resized bilinearly as a
        float in ``[0, 1]`` and thresholded at 0.5.
        """
        h, w = (size, size) if isinstance(size, int) else size
        if sample.mask_path is None:
            return np.zeros((h, w), dtype=bool)
        try:
            with Image.open(sample.mask_path) as im:
                gray = np.asarray(im.convert("L"), dtype=np.float32) / 255.0
        except (OSError, SyntaxError, ValueError) as exc:
            raise DatasetError(f"{sample.mask_path}: cannot read mask ({exc})") from None
        resized = Image.fromarray(gray).resize((w, h), Image.Resampling.BILINEAR)
        return np.asarray(resized) >= 0.5
