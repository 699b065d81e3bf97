"""Image input: safe decoding, the MVTec AD folder reader and a synthetic product."""

from hetmm_ray.data.decode import (
    ACCEPTED_FORMATS,
    ImageError,
    decode_image,
    images_to_tensor,
    load_image,
    resize_rgb,
)
from hetmm_ray.data.mvtec import IMAGE_EXTENSIONS, DatasetError, MVTecCategory, Sample
from hetmm_ray.data.synthetic import DEFECT_KINDS, MASK_THRESHOLD, SyntheticProduct, write_mvtec_layout

__all__ = [
    "ACCEPTED_FORMATS",
    "DEFECT_KINDS",
    "IMAGE_EXTENSIONS",
    "MASK_THRESHOLD",
    "DatasetError",
    "ImageError",
    "MVTecCategory",
    "Sample",
    "SyntheticProduct",
    "decode_image",
    "images_to_tensor",
    "load_image",
    "resize_rgb",
    "write_mvtec_layout",
]
