"""Image geometry (core/geometry.py): squash and letterbox, and padded pixels never counting.

Small random resnet18 at 64x64 on the CPU; the claims do not depend on real weights.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetmm_ray.config import BackboneConfig, ConfigError, DetectorConfig, ThresholdConfig, stored_config
from hetmm_ray.core.atmm import anomaly_maps, pixel_major
from hetmm_ray.core.backbone import IMAGENET_MEAN
from hetmm_ray.core.geometry import (
    PAD_VALUE,
    Box,
    boxes_from_features,
    canvas_box,
    cell_boxes,
    resized_shape,
    zero_padding,
)
from hetmm_ray.core.metrics import pixel_auroc, pro_score, roc_auc
from hetmm_ray.core.scoring import gaussian_kernel, image_scores
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.decode import images_to_tensor, resize_rgb, resize_to_geometry
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

SIZE = 64


def config(geometry: str, **changes) -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE, geometry=geometry),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
        device="cpu",
    ).replace(**{"geometry.canvas": "fixed"})  # the letterbox on this canvas as given, whatever the aspect
    return c.replace(**changes) if changes else c


def textured(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth random texture (so that resizing keeps it recognisable) plus a little noise."""
    base = rng.normal(size=(h // 4 + 2, w // 4 + 2, 3))
    up = np.kron(base, np.ones((4, 4, 1)))[:h, :w]
    return np.clip(128 + 40 * up + rng.normal(scale=4, size=(h, w, 3)), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def wide_images() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [textured(rng, 30 + 4 * (i % 3), 64) for i in range(8)]


@pytest.fixture(scope="module")
def wide_detector(wide_images, one_torch_thread) -> HETMM:
    return HETMM(config("letterbox")).fit(wide_images[:6])


# --- canvas -------------------------------------------------------------------------------
def test_letterbox_shapes_and_boxes():
    assert resized_shape(100, 400, 256, "letterbox") == (64, 256)
    assert resized_shape(392, 400, 256, "letterbox") == (251, 256)
    assert resized_shape(400, 89, 256, "letterbox") == (256, 57)
    assert resized_shape(100, 400, 256, "squash") == (256, 256)
    assert canvas_box(100, 400, 256, "letterbox") == Box(96, 0, 64, 256)
    assert canvas_box(300, 300, 256, "letterbox") == Box(0, 0, 256, 256)
    assert canvas_box(10000, 1, 64, "letterbox") == Box(0, 31, 64, 1)  # never 0 pixels wide


def test_pad_value_is_the_imagenet_mean():
    assert PAD_VALUE == IMAGENET_MEAN


def test_letterbox_canvas_holds_the_resized_image_and_the_mean():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (40, 100, 3), dtype=np.uint8)
    canvas = images_to_tensor([image], SIZE, "letterbox")[0]
    top, left, h, w = canvas_box(40, 100, SIZE, "letterbox")
    fitted = resize_to_geometry(image, SIZE, "letterbox")
    assert fitted.shape == (h, w, 3) == (26, 64, 3)
    expected = torch.from_numpy(fitted).permute(2, 0, 1).float() / 255
    assert torch.equal(canvas[:, top : top + h, left : left + w], expected)
    pad = torch.ones(SIZE, SIZE, dtype=torch.bool)
    pad[top : top + h, left : left + w] = False
    for c in range(3):
        assert torch.all(canvas[c][pad] == torch.tensor(PAD_VALUE[c]))
    # An image already resized for the canvas is placed unchanged (decoders may resize early).
    assert torch.equal(images_to_tensor([fitted], SIZE, "letterbox"), canvas[None])


def test_letterbox_of_a_square_image_equals_squash(one_torch_thread):
    rng = np.random.default_rng(2)
    images = [textured(rng, 80, 80) for _ in range(6)]
    assert torch.equal(images_to_tensor(images, SIZE, "letterbox"), images_to_tensor(images, SIZE, "squash"))
    squash = HETMM(config("squash")).fit(images[:4])
    letter = HETMM(config("letterbox")).fit(images[:4])
    a, b = squash.predict(images[4:]), letter.predict(images[4:])
    assert np.array_equal(a.scores, b.scores)
    assert np.array_equal(a.maps, b.maps)
    assert squash.operating_point().threshold == letter.operating_point().threshold


# --- padded pixels never count --------------------------------------------------------------
def test_maps_come_back_at_the_images_aspect(wide_detector, wide_images):
    tall = np.ascontiguousarray(wide_images[6].transpose(1, 0, 2))
    pred = wide_detector.predict([wide_images[6], wide_images[7], tall])
    shapes = [m.shape for m in pred.maps]
    expected = [resize_to_geometry(x, SIZE, "letterbox").shape[:2] for x in (wide_images[6], wide_images[7], tall)]
    assert shapes == expected
    assert shapes[2] == (64, shapes[0][0]) and shapes[0][1] == 64
    same = wide_detector.predict([wide_images[6], wide_images[6]])
    assert isinstance(same.maps, np.ndarray) and same.maps.shape == (2, *expected[0])


def test_huge_values_in_the_padding_do_not_move_the_score(wide_detector, wide_images, monkeypatch):
    """Features of pad cells (query side) and the fused map's pad pixels are set to 1e6:
    the scores and maps stay exactly the same."""
    queries = wide_images[6:]
    clean = wide_detector.predict(queries)
    backbone = wide_detector.backbone
    real_forward = backbone.forward
    boxes = [canvas_box(x.shape[0], x.shape[1], SIZE, "letterbox") for x in queries]

    def poisoned_forward(batch):
        feats = real_forward(batch)
        out = {}
        for name, f in feats.items():
            f = f.clone()
            for b, cb in enumerate(cell_boxes(boxes, SIZE, tuple(f.shape[2:]))):
                pad = torch.ones(f.shape[2:], dtype=torch.bool)
                pad[cb.top : cb.top + cb.height, cb.left : cb.left + cb.width] = False
                f[b][:, pad] = 1e6
            out[name] = f
        return out

    monkeypatch.setattr(backbone, "forward", poisoned_forward)
    real_score = wide_detector.scorer.score_maps

    def poisoned_maps(feats, pm, bxs=None, *, progress=None):
        maps = real_score(feats, pm, bxs, progress=progress).clone()
        for b, box in enumerate(bxs):
            keep = maps[b, box.top : box.top + box.height, box.left : box.left + box.width].clone()
            maps[b] = 1e6
            maps[b, box.top : box.top + box.height, box.left : box.left + box.width] = keep
        return maps

    monkeypatch.setattr(wide_detector.scorer, "score_maps", poisoned_maps)
    dirty = wide_detector.predict(queries)
    assert np.array_equal(clean.scores, dirty.scores)
    assert all(np.array_equal(a, b) for a, b in zip(clean.maps, dirty.maps, strict=True))


def test_template_pad_cells_are_zero_and_never_match(wide_detector):
    ts = wide_detector.templates
    boxes = [Box(*b) for b in ts.meta["image_boxes"]]
    for name, bank in ts.bank.items():
        cells = cell_boxes(boxes, SIZE, tuple(bank.shape[2:]))
        for b, cb in enumerate(cells):
            norms = bank[b].float().norm(dim=0)
            inside = torch.zeros_like(norms, dtype=torch.bool)
            inside[cb.top : cb.top + cb.height, cb.left : cb.left + cb.width] = True
            assert torch.all(norms[~inside] == 0), name
            assert torch.allclose(norms[inside], torch.ones(()), atol=2e-3), name
    # The bank's zero pattern gives the boxes back to within half a cell of the finest layer.
    recovered = boxes_from_features(ts.bank, SIZE)
    for got, want in zip(recovered, boxes, strict=True):
        assert abs(got.top - want.top) <= 2 and abs(got.height - want.height) <= 4
        assert (got.left, got.width) == (want.left, want.width)


def _reference_scores(
    q: dict[str, torch.Tensor],
    t: dict[str, torch.Tensor],
    q_boxes: list[Box],
    t_boxes: list[Box],
    windows: tuple[int, ...],
    canvas: int,
    sigma: float,
) -> list[float]:
    """The masking semantics of core/geometry.py, pixel by pixel in float64 with loops."""
    scores = []
    for b, box in enumerate(q_boxes):
        fused = torch.zeros(canvas, canvas, dtype=torch.float64)
        for j, name in enumerate(q):
            qf, tf = q[name][b].double(), t[name].double()
            _, h, w = qf.shape
            p = windows[j] // 2
            qc = cell_boxes([box], canvas, (h, w))[0]
            tcs = cell_boxes(t_boxes, canvas, (h, w))

            def q_in(y, x, qc=qc):
                return qc.top <= y < qc.top + qc.height and qc.left <= x < qc.left + qc.width

            def t_in(k, y, x, tcs=tcs):
                c = tcs[k]
                return c.top <= y < c.top + c.height and c.left <= x < c.left + c.width

            layer = torch.zeros(h, w, dtype=torch.float64)
            for y in range(h):
                for x in range(w):
                    fwd = bwd = -math.inf
                    for dy in range(-p, p + 1):
                        for dx in range(-p, p + 1):
                            yy, xx = y + dy, x + dx
                            if not (0 <= yy < h and 0 <= xx < w):
                                continue  # off the map: skipped
                            for k in range(tf.shape[0]):
                                # A pad candidate counts as similarity 0 (no evidence of normality).
                                f = float(qf[:, y, x] @ tf[k, :, yy, xx]) if q_in(y, x) and t_in(k, yy, xx) else 0.0
                                bk = float(qf[:, yy, xx] @ tf[k, :, y, x]) if q_in(yy, xx) and t_in(k, y, x) else 0.0
                                fwd, bwd = max(fwd, f), max(bwd, bk)
                    layer[y, x] = 0.5 * (1 - fwd) + 0.5 * (1 - bwd)
            # Pad cells take the nearest content cell's value, then bilinear (align_corners) upsampling.
            rows = [min(max(y, qc.top), qc.top + qc.height - 1) for y in range(h)]
            cols = [min(max(x, qc.left), qc.left + qc.width - 1) for x in range(w)]
            layer = layer[rows][:, cols]
            fused += F.interpolate(layer[None, None], size=(canvas, canvas), mode="bilinear", align_corners=True)[0, 0]
        # The pad counts as no anomaly (0); Gaussian blur of the canvas (reflect at the canvas
        # edge), then the max over the content only.
        outside = torch.ones_like(fused, dtype=torch.bool)
        outside[box.top : box.top + box.height, box.left : box.left + box.width] = False
        fused[outside] = 0.0
        k = gaussian_kernel(sigma).double()
        r = k.numel() // 2
        x = F.pad(fused[None, None], (r, r, r, r), mode="reflect" if r < canvas else "replicate")
        blurred = F.conv2d(F.conv2d(x, k.view(1, 1, -1, 1)), k.view(1, 1, 1, -1))[0, 0]
        scores.append(float(blurred[box.top : box.top + box.height, box.left : box.left + box.width].max()))
    return scores


def test_masked_scoring_equals_a_slow_reference():
    g = torch.Generator().manual_seed(0)
    canvas, windows = 32, (3, 3)
    shapes = {"a": (6, 8, 8), "b": (5, 4, 4)}

    def unit(n):
        return {k: F.normalize(torch.randn(n, *s, generator=g), dim=1) for k, s in shapes.items()}

    q_boxes = [Box(9, 0, 14, 32), Box(0, 0, 32, 32), Box(0, 11, 32, 10)]
    t_boxes = [Box(12, 0, 8, 32), Box(4, 0, 24, 32), Box(0, 0, 32, 32), Box(7, 0, 18, 32)]
    q = zero_padding(unit(len(q_boxes)), q_boxes, canvas)
    t = zero_padding(unit(len(t_boxes)), t_boxes, canvas)
    maps = anomaly_maps(
        q, {k: pixel_major(v) for k, v in t.items()}, windows, windows, (0.5, 0.5), (1.0, 1.0), canvas,
        boxes=q_boxes, canvas=canvas,
    )  # fmt: skip
    fast = image_scores(maps, 1.5, q_boxes).tolist()
    slow = _reference_scores(q, t, q_boxes, t_boxes, windows, canvas, 1.5)
    assert fast == pytest.approx(slow, abs=1e-5)


# --- consistency: calibration, store, old products, metrics ----------------------------------
def test_out_of_fold_scores_use_the_same_boxes_as_predict(wide_detector, wide_images):
    """Calibration scores a held-out bank image as predict would score it (ALL: held-out exact)."""
    ts = wide_detector.templates
    held = [0]
    pm = wide_detector.scorer.prepare(ts, held_out=held)
    other = HETMM(wide_detector.config)
    other.scorer.backbone = wide_detector.backbone
    other.scorer.install(TemplateSet(
        bank={k: v[1:] for k, v in ts.bank.items()}, config=ts.config, weights_id=ts.weights_id,
        image_digests=ts.image_digests[1:],
    ), None, config=other.config)  # fmt: skip
    predicted = other.predict([wide_images[0]]).scores[0]
    boxes = wide_detector.pipeline.bank_boxes(ts, held)
    oof = wide_detector.scorer.score({k: v[held] for k, v in ts.bank.items()}, pm, boxes)[0]
    assert float(oof) == pytest.approx(float(predicted), rel=2e-3)  # the bank is stored in float16


def test_geometry_travels_with_the_product_and_old_products_keep_squash(wide_detector, wide_images, tmp_path):
    store = open_store(str(tmp_path / "store"))
    wide_detector.save(store, "weld")
    again = load_detector(store, "weld")
    assert again.config.backbone.geometry == "letterbox"
    assert again.templates.meta["image_boxes"] == wide_detector.templates.meta["image_boxes"]
    assert np.array_equal(again.predict(wide_images[6:]).scores, wide_detector.predict(wide_images[6:]).scores)
    # A configuration stored before the setting existed has no geometry: it stays squash.
    old = config("squash").to_dict()
    del old["backbone"]["geometry"]
    assert stored_config(json.loads(json.dumps(old))).backbone.geometry == "squash"
    assert DetectorConfig.from_dict(old).backbone.geometry == "letterbox"  # a new product's default


def test_geometry_is_validated():
    with pytest.raises(ConfigError, match="did you mean 'letterbox'"):
        BackboneConfig(geometry="letterbx")


def test_squash_still_resizes_other_sizes_to_the_square(one_torch_thread):
    rng = np.random.default_rng(3)
    images = [textured(rng, 40, 64) for _ in range(5)]
    det = HETMM(config("squash")).fit(images[:4])
    pred = det.predict(images[4:])
    assert pred.maps.shape == (1, SIZE, SIZE)
    assert torch.equal(
        images_to_tensor(images[4:], SIZE, "squash"), images_to_tensor([resize_rgb(images[4], SIZE)], SIZE)
    )


def test_pixel_metrics_take_maps_of_per_image_shapes():
    rng = np.random.default_rng(4)
    a, b = rng.random((4, 5)), rng.random((5, 4))
    ma, mb = np.zeros((4, 5), bool), np.zeros((5, 4), bool)
    ma[1, 1:3] = True
    mb[2:4, 0] = True
    mb[0, 3] = True
    assert pixel_auroc([a, b], [ma, mb]) == roc_auc(np.r_[a.ravel(), b.ravel()], np.r_[ma.ravel(), mb.ravel()])
    # Transposing an image keeps its pixels and its 8-connected regions, so the ragged pair
    # [a, b] has the PRO of the stacked (2, 4, 5) pair [a, b.T].
    stacked = pro_score(np.stack([a, b.T]), np.stack([ma, mb.T]))
    assert pro_score([a, b], [ma, mb]) == pytest.approx(stacked, abs=1e-12)


def test_pts_takes_padding_only_after_every_real_vector():
    from hetmm_ray.core.pts import pts_indices

    g = torch.Generator().manual_seed(5)
    bank = F.normalize(torch.randn(12, 8, 2, 2, generator=g), dim=1)
    padded = bank.clone()
    padded[:5, :, 0, 0] = 0  # images 0-4 are letterbox padding at pixel (0, 0)
    for k in (4, 9):
        got, plain = pts_indices(padded, k), pts_indices(bank, k)
        real = got[:, 0, 0].tolist()[: min(k, 7)]
        assert all(i >= 5 for i in real), real
        if k == 9:
            assert sorted(got[7:, 0, 0].tolist()) == [0, 1]  # then padding, lowest index first
        assert torch.equal(got.flatten(1)[:, 1:], plain.flatten(1)[:, 1:])  # other pixels unaffected
