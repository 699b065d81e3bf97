"""A product's operations over a template store, written once: what ``hetmm fit``, ``update``,
``compress``, ``region`` and ``calibrate`` do, returning records the caller prints or answers with.

Exact semantics (every operation works on any product, tiled or not: ``interface.Detector``):

- **Publishing** (:func:`publish`): a new template set is stored as the product's next version,
  live (HEAD moves) or as a candidate beside HEAD, by ``config.publishes_candidate`` (the request's
  mode, else the product's ``publish`` setting, else ``default``). ``expect_head``: the version the
  operation started from; another writer in between makes it fail (``StoreConflict``) instead of
  losing that writer's version.
- :func:`fit`: a new product's detector fitted on ``frames`` (its geometry resolved from them by
  ``geometry_rule.choose_geometry``), stored as v1 (always live: a first version is HEAD) with what that
  rule chose and why in ``meta["geometry_choice"]`` (``GeometryChoice.to_json``; none when nothing
  was chosen).
- :func:`update`: frames added to HEAD's bank (those already held skipped and counted); with
  nothing new, nothing is stored (``Outcome.changed`` False, ``version`` stays HEAD).
- :func:`compress`: a version's selection made again (PTS or a baseline), recalibrated.
- :func:`set_region`: a version's templates under another region, recalibrated; refused for a
  product on the ``validation`` rule and for a region that counts no map pixel, before any loading.
- :func:`set_far_rule`: HEAD's rule set to ``far`` at a rate, a new version of the same templates
  and out-of-fold scores (``VersionedStore.republish``: nothing recomputed).
- :func:`calibrate_labelled`: a version's threshold chosen on labelled images
  (``validation.calibrate_with_labels``).
- :func:`drop`: good frames removed from HEAD's bank by content digest (every copy), and with
  ``repeats`` the later copies of each frame the bank holds more than once (the first copy kept:
  ``core.good_outliers.repeated_frames``), re-selected and recalibrated, published with HEAD
  expected (never done unasked: :func:`good_outliers` only names the frames standing apart and
  the repeated ones, ``core/good_outliers.py``).

Promote and discard are the store's own (``VersionedStore.promote`` / ``discard``). The service's
registry runs the same detector calls in its tasks (``distributed/registry_tasks.py``) and publishes
through its shards; HTTP and gRPC routes reach them as its jobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import OUTLIER_MADS, DetectorConfig, publishes_candidate
from ..core.good_outliers import LaterCopies, OutlierReport, outlier_report, repeated_frames
from ..core.region import check_region_change
from ..core.scoring import OperatingPoint
from ..core.templates import TemplateSet
from ..detection.detector_choice import check_region, load_detector, new_detector
from ..detection.geometry_rule import choose_geometry
from ..detection.interface import Detector
from ..detection.scorer import ImageInput

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = [
    "Outcome",
    "calibrate_labelled",
    "compress",
    "drop",
    "fit",
    "good_outliers",
    "publish",
    "set_far_rule",
    "set_region",
    "update",
]


@dataclass(frozen=True)
class Outcome:
    """What an operation did to a product: the version it wrote (or HEAD, when nothing changed), the
    version it started from, whether it is a candidate, the threshold before and after, and the
    detector it leaves (for the caller's own report; None where nothing was loaded)."""

    product: str
    version: int
    base: int | None
    candidate: bool
    operating_point: OperatingPoint | None
    before: OperatingPoint | None = None
    changed: bool = True
    added: int = 0
    skipped: int = 0
    seconds: float = 0.0
    detector: Detector | None = field(default=None, repr=False, compare=False)
    record: dict[str, Any] | None = None  # a labelled calibration's choice (validation.choose_threshold)


def publish(
    store: Store,
    product: str,
    ts: TemplateSet,
    *,
    mode: str | None = None,
    expect_head: int | None = None,
    default: str = "live",
) -> tuple[int, bool]:
    """Store ``ts`` as ``product``'s next version (module docstring); returns it and whether it is a candidate."""
    candidate = publishes_candidate(mode, ts.config.publish, default)
    return int(store.put(product, ts, expect_head=expect_head, candidate=candidate)), candidate


def fit(
    store: Store,
    product: str,
    config: DetectorConfig,
    frames: Sequence[ImageInput],
    *,
    on_start: Callable[[Detector], None] | None = None,
    **options: Any,
) -> Outcome:
    """A new product from good ``frames``, stored as its first version with what the geometry rule
    chose (``geometry_rule.choose_geometry``; ``GeometryChoice.stored_with``) (``options``: ``progress=``,
    ``steps=``; ``on_start``: called with the detector before the long work, e.g. to say its cost)."""
    if len(frames) < 2:
        raise ValueError(f"fit needs at least 2 good images, got {len(frames)}")
    choice = choose_geometry(config, frames)
    det = new_detector(choice.config, **options)
    if on_start is not None:
        on_start(det)
    start = time.perf_counter()
    det.fit(frames)
    version = det.version = int(store.put(product, choice.stored_with(det.template_set())))
    return Outcome(
        product,
        version,
        None,
        False,
        det.operating_point(),
        seconds=time.perf_counter() - start,
        detector=det,
        added=len(frames),
    )


def update(
    store: Store, product: str, frames: Sequence[ImageInput], *, mode: str | None = None, **options: Any
) -> Outcome:
    """HEAD grown by the good ``frames`` not already held (module docstring)."""
    head = store.head(product)
    det = load_detector(store, product, head, **options)
    before = det.operating_point()
    held = det.template_set().n_images
    det.update(frames)
    grown = det.template_set()
    added = grown.n_images - held  # the bank grows by the frames not already held, the rest are skipped
    skipped = len(frames) - added
    if not added:
        return Outcome(product, head, head, False, before, before, changed=False, skipped=skipped, detector=det)
    version, candidate = publish(store, product, grown, mode=mode, expect_head=head)
    return Outcome(
        product,
        version,
        head,
        candidate,
        det.operating_point(),
        before,
        added=added,
        skipped=skipped,
        detector=det,
    )


def compress(
    store: Store,
    product: str,
    version: int | None = None,
    *,
    kind: str | None = None,
    sheets: int | str | None = None,
    seed: int | None = None,
    mode: str | None = None,
    **options: Any,
) -> Outcome:
    """``version``'s (default HEAD) selection made again, recalibrated, published (module docstring)."""
    base = store.head(product) if version is None else version
    det = load_detector(store, product, base, **options)
    before = det.operating_point()
    start = time.perf_counter()
    det.compress(kind, sheets, seed=seed)
    seconds = time.perf_counter() - start
    new, candidate = publish(store, product, det.template_set(), mode=mode)
    return Outcome(product, new, base, candidate, det.operating_point(), before, seconds=seconds, detector=det)


def set_region(
    store: Store,
    product: str,
    region: dict[str, Any] | None,
    version: int | None = None,
    *,
    mode: str | None = None,
    **options: Any,
) -> Outcome:
    """``version``'s (default HEAD) templates under ``region``, recalibrated, published with HEAD expected."""
    head = store.head(product)
    base = head if version is None else version
    config = store.record(product, base).config
    check_region_change(config)  # before any loading: the validation rule's refusal
    check_region(config.replace(region=region))
    det = load_detector(store, product, base, **options)
    before = det.operating_point()
    new_det = det.with_region(region)
    new, candidate = publish(store, product, new_det.template_set(), mode=mode, expect_head=head)
    return Outcome(product, new, base, candidate, new_det.operating_point(), before, detector=new_det)


def set_far_rule(store: Store, product: str, rate: float, *, mode: str | None = None) -> Outcome:
    """HEAD's rule set to ``far`` at ``rate`` (module docstring); TemplateError without out-of-fold
    scores, ConfigError for a rate out of range, both before anything is written."""
    head = store.head(product)
    rec = store.record(product, head)
    config = rec.under_far_rule(rate)
    candidate = publishes_candidate(mode, rec.config.publish)
    new = int(store.republish(product, config=config, expect_head=head, candidate=candidate))
    before = rec.operating_point()
    return Outcome(product, new, head, candidate, store.record(product, new).operating_point(), before)


def calibrate_labelled(
    store: Store,
    product: str,
    images: Sequence[ImageInput],
    labels: Sequence[int],
    version: int | None = None,
    *,
    objective: str = "f1",
    max_false_alarm_rate: float = 0.01,
    mode: str | None = None,
    **options: Any,
) -> Outcome:
    """``version``'s (default HEAD) threshold chosen on labelled images, published with HEAD expected."""
    from .validation import calibrate_with_labels

    head = store.head(product)
    base = head if version is None else version
    det = load_detector(store, product, base, **options)
    before = det.operating_point()
    ts, record = calibrate_with_labels(
        det, images, labels, objective=objective, max_false_alarm_rate=max_false_alarm_rate
    )
    new, candidate = publish(store, product, ts, mode=mode, expect_head=head)
    return Outcome(product, new, base, candidate, store.record(product, new).operating_point(), before, record=record)


def good_outliers(detector: Detector, *, mads: float = OUTLIER_MADS) -> OutlierReport | None:
    """The good frames of ``detector``'s bank whose out-of-fold score stands apart, and its threshold
    with and without them (``core/good_outliers.py``); None without a calibration."""
    calibration = detector.calibration
    if calibration is None:
        return None
    return outlier_report(calibration, detector.config, detector.template_set().image_digests, mads=mads)


def drop(
    store: Any,
    product: str,
    digests: Sequence[str] | Callable[[tuple[str, ...]], Sequence[str]],
    *,
    repeats: bool = False,
    mode: str | None = None,
    **options: Any,
) -> Outcome:
    """HEAD without the good frames of ``digests`` (every copy of each; module docstring; a
    callable: given HEAD's bank digests, returns those to drop, e.g. names resolved against them)
    and, with ``repeats``, without the later copies of each repeated frame (the first copy kept).
    ValueError, before anything is written: nothing named, a digest HEAD's bank does not hold,
    ``repeats`` on a bank that holds no frame twice, or leaving fewer than 2 frames.
    ``Outcome.record``: the dropped digests (every copy), the repeat groups whose later copies were
    dropped (``digest``, the bank ``indices``, the first kept), the frames left and the threshold
    before and after."""
    head = store.head(product)
    det = load_detector(store, product, head, **options)
    held = det.template_set().image_digests
    if callable(digests):
        digests = digests(held)
    named = list(dict.fromkeys(str(d) for d in digests))
    groups = [g for g in repeated_frames(held) if g.digest not in named] if repeats else []
    if repeats and not groups:
        whole = "every frame it holds twice is named to drop whole" if repeated_frames(held) else "no frame twice"
        raise ValueError(f"v{head}'s bank of {len(held)} frames holds {whole}: --repeats has no later copy to drop")
    if not named and not groups:
        raise ValueError("name at least one frame to drop")
    before = det.operating_point()
    start = time.perf_counter()
    det.drop([*named, *(LaterCopies(g.digest) for g in groups)])
    seconds = time.perf_counter() - start
    kept = det.template_set()
    new, candidate = publish(store, product, kept, mode=mode, expect_head=head)
    after = det.operating_point()
    record = {
        "dropped": sorted(named),
        "repeats": [{"digest": g.digest, "indices": list(g.indices)} for g in groups],
        "images": kept.n_images,
        "threshold_before": None if before is None else before.threshold,
        "threshold_after": None if after is None else after.threshold,
    }
    return Outcome(product, new, head, candidate, after, before, seconds=seconds, detector=det, record=record)
