"""Good frames whose out-of-fold score stands apart, good frames held more than once, and how much
of the threshold rests on each (pure math: no I/O, no Ray).

The rule (stated with every report)
    With ``x`` the out-of-fold (OOF) scores of a product's good frames, ``med = median(x)`` and
    ``spread = 1.4826 * median(|x - med|)`` (the MAD scaled to a normal's standard deviation), a
    frame stands apart when its score exceeds ``cut = med + mads * spread``; ``mads`` is
    ``config.OUTLIER_MADS`` unless a caller gives another. Neither number moves with a few
    outliers, so a handful of marked frames cannot hide one another. A spread of 0 (half the
    scores equal) names nothing: there is no scale to stand apart on.

Which frame a score belongs to
    A template set's OOF scores are stored in the order its fold plan scored them
    (:func:`~hetmm_ray.core.calibration.fold_plan` with the set's ``threshold.folds``,
    ``max_images`` and ``seed`` and its image digests as keys: fold 0's frames in bank order, then
    fold 1's, ...). :func:`calibration_order` rebuilds that order, so score ``i`` is bank frame
    ``calibration_order(...)[i]``. Frames beyond ``max_images`` have no OOF score and are never named.

Repeated frames (:func:`repeated_frames`)
    A content digest held at two or more bank indices is one repeat group: its indices in
    ascending order, the first the copy kept, the others its *later copies* (what ``hetmm drop
    --repeats`` removes). Groups are ordered by their first index; a digest held once is in no
    group. A copy's OOF score is computed with templates that hold its twin whenever the fold plan
    put the twin in another fold (it always does for two scored copies and 2 or more folds: equal
    keys sort side by side in the fold plan's draw and consecutive frames go to different folds), so it scores near 0
    and pulls the calibration low; the report says, per group, whether every scored copy's fold
    left another copy in the bank (``twin_in_bank``).

Which bank frames a drop list names (:func:`drop_positions`)
    ``hetmm drop`` gives digests: a plain digest names every index holding it; a
    :class:`LaterCopies` digest names its repeat group's later copies only (every index holding it
    but the first). The positions named are the union, ascending. A plain digest the bank does not
    hold, or a :class:`LaterCopies` digest it holds fewer than twice, is a ValueError.

How much of the threshold rests on them
    :func:`outlier_report` gives the threshold of the product's own rule on every OOF score, on
    the scores without the frames standing apart, and on the scores without the later copies of
    each repeat group (:func:`threshold_without`: the same rule, its other settings unchanged, on
    the remaining scores): what dropping them would do to the threshold before any refit. A refit
    without them re-selects the templates and recomputes every OOF score (the kept copy's too, no
    longer lowered by its twin), so its threshold can differ. Nothing here drops anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import DetectorConfig
from .calibration import _median, fold_plan
from .scoring import Calibration, operating_point

__all__ = [
    "MAD_TO_SIGMA",
    "OutlierReport",
    "RepeatGroup",
    "LaterCopies",
    "StandingApart",
    "calibration_order",
    "drop_positions",
    "outlier_report",
    "repeated_frames",
    "standing_apart",
    "threshold_without",
]

MAD_TO_SIGMA = 1.4826
"""1 / Phi^-1(3/4): the MAD of a normal sample times this estimates its standard deviation."""


@dataclass(frozen=True)
class StandingApart:
    """One good frame standing apart: its bank position, content digest and OOF score."""

    index: int
    digest: str
    score: float

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "digest": self.digest, "score": self.score}


@dataclass(frozen=True)
class RepeatGroup:
    """One content digest held at two or more bank indices (ascending; ``indices[0]`` is the copy
    kept, the others the later copies), each index's OOF score (None: beyond ``max_images``), and
    whether every scored copy's fold left another copy in the bank (module docstring)."""

    digest: str
    indices: tuple[int, ...]
    scores: tuple[float | None, ...] = ()
    twin_in_bank: bool = False

    @property
    def later(self) -> tuple[int, ...]:
        """The bank indices ``hetmm drop --repeats`` removes: every copy but the first."""
        return self.indices[1:]

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "indices": list(self.indices),
            "scores": list(self.scores),
            "twin_in_bank": self.twin_in_bank,
        }


@dataclass(frozen=True)
class OutlierReport:
    """The rule's numbers, the frames standing apart (highest score first), and the threshold of the
    product's rule with every OOF score and without those frames (equal when none stands apart);
    the repeat groups and the threshold without their later copies' scores (equal when there are
    none, or none of the later copies has a score)."""

    mads: float
    median: float
    spread: float
    cut: float | None  # None: a spread of 0, nothing can stand apart
    frames: tuple[StandingApart, ...]
    n_scores: int
    rule: str
    threshold: float
    threshold_without: float
    repeats: tuple[RepeatGroup, ...]
    threshold_without_repeats: float

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": f"out-of-fold score > median + {self.mads:g} x 1.4826 x MAD",
            "mads": self.mads,
            "median": self.median,
            "spread": self.spread,
            "cut": self.cut,
            "frames": [f.to_json() for f in self.frames],
            "n_scores": self.n_scores,
            "threshold_rule": self.rule,
            "threshold": self.threshold,
            "threshold_without": self.threshold_without,
            "repeats": [g.to_json() for g in self.repeats],
            "threshold_without_repeats": self.threshold_without_repeats,
        }

    def describe(
        self, names: dict[str, str] | None = None, *, frame_names: Sequence[str] | None = None, product: str = "P"
    ) -> str:
        """What ``hetmm fit``, ``update`` and ``drop`` print: the rule, each frame standing apart by
        name and score, the threshold with and without them, then the repeat groups (when there are
        any, :meth:`describe_repeats`). A frame's name: ``frame_names[index]`` (the bank's frames in
        order), else ``names[digest]``, else its digest's first 12 hex digits."""
        text = self._describe_apart(self._namer(names, frame_names), product)
        repeats = self.describe_repeats(names, frame_names=frame_names, product=product)
        return text if repeats is None else f"{text}\n{repeats}"

    def describe_repeats(
        self, names: dict[str, str] | None = None, *, frame_names: Sequence[str] | None = None, product: str = "P"
    ) -> str | None:
        """The repeat groups (None without any): each group's copies by name (a later copy in the
        first's folder by its file name alone; without frame names, the digest's name and the bank
        indices) with their OOF scores, the threshold with and without the later copies, and the
        command that drops them."""
        if not self.repeats:
            return None
        copies = sum(len(g.later) for g in self.repeats)
        lines = [
            f"repeated good frames: {len(self.repeats)} frame(s) held more than once, {copies} later "
            f"{'copy' if copies == 1 else 'copies'} (same content; the first copy is the one kept):"
        ]
        for g in self.repeats:
            lines.append(f"  {self._copies_named(g, names or {}, frame_names)}  {self._copies_scored(g)}")
        lines.append(
            f"threshold ({self.rule}) {self.threshold:.4f} with them, {self.threshold_without_repeats:.4f} "
            "without the later copies; to keep the first copy of each and drop the others from the bank and "
            f"the calibration as a new version: hetmm drop --product {product} --repeats"
        )
        return "\n".join(lines)

    @staticmethod
    def _copies_named(g: RepeatGroup, names: dict[str, str], frame_names: Sequence[str] | None) -> str:
        """``dir/021.png = 025.png``, or ``3f2a9c01b2d4 (bank frames 20 = 24)`` without frame names."""
        if frame_names is None or not all(0 <= i < len(frame_names) for i in g.indices):
            indices = " = ".join(map(str, g.indices))
            return f"{names.get(g.digest, g.digest[:12])} (bank frames {indices})"
        first = frame_names[g.indices[0]]
        folder = first.rpartition("/")[0]
        later = [frame_names[i] for i in g.later]
        return " = ".join([first, *(n.rpartition("/")[2] if n.rpartition("/")[0] == folder else n for n in later)])

    @staticmethod
    def _copies_scored(g: RepeatGroup) -> str:
        times = "twice" if len(g.indices) == 2 else f"{len(g.indices)} times"
        scores = [s for s in g.scores if s is not None]
        if not scores:
            return f"held {times}, no out-of-fold score (beyond threshold.max_images)"
        why = ": each copy's fold holds another copy" if g.twin_in_bank else ""
        each = (
            f"{scores[0]:.4f} each"
            if len(set(scores)) == 1 and len(scores) > 1
            else ", ".join(f"{s:.4f}" for s in scores)
        )
        return f"held {times}, out-of-fold {each}{why}"

    def _describe_apart(self, name: Any, product: str) -> str:
        if self.cut is None:
            return f"good frames standing apart: none (the {self.n_scores} out-of-fold scores have no spread)"
        rule = (
            f"out-of-fold score > {self.cut:.4f} = median {self.median:.4f} + {self.mads:g} x {self.spread:.4f} "
            f"(1.4826 x MAD)"
        )
        if not self.frames:
            return f"good frames standing apart: none of {self.n_scores} ({rule})"
        lines = [f"good frames standing apart: {len(self.frames)} of {self.n_scores} ({rule}):"]
        lines += [f"  {name(f.index, f.digest)}  {f.score:.4f}" for f in self.frames]
        lines.append(
            f"threshold ({self.rule}) {self.threshold:.4f} with them, {self.threshold_without:.4f} without them; "
            f"to drop them from the bank and the calibration as a new version: hetmm drop --product {product} NAME..."
        )
        return "\n".join(lines)

    @staticmethod
    def _namer(names: dict[str, str] | None, frame_names: Sequence[str] | None) -> Any:
        by_digest = names or {}

        def name(index: int, digest: str) -> str:
            if frame_names is not None and 0 <= index < len(frame_names):
                return frame_names[index]
            return by_digest.get(digest, digest[:12])

        return name


def calibration_order(n_images: int, config: DetectorConfig, digests: Sequence[str]) -> list[int]:
    """The bank positions of a template set's OOF scores, in their stored order (module docstring)."""
    return [i for held in _plan(n_images, config, digests) for i in held]


def _plan(n_images: int, config: DetectorConfig, digests: Sequence[str]) -> list[list[int]]:
    th = config.threshold
    return fold_plan(n_images, folds=th.folds, max_images=th.max_images, seed=th.seed, keys=digests)


def standing_apart(scores: Sequence[float], *, mads: float) -> tuple[float, float, float | None, list[int]]:
    """``(median, spread, cut, positions)``: the positions in ``scores`` above the cut (module
    docstring), highest score first; ``cut`` None (and no position) for a spread of 0."""
    if not scores:
        raise ValueError("standing_apart needs at least one score")
    if not mads > 0:
        raise ValueError(f"mads must be > 0, got {mads!r}")
    xs = [float(s) for s in scores]
    med = _median(xs)
    spread = MAD_TO_SIGMA * _median([abs(s - med) for s in xs])
    if spread <= 0:
        return med, spread, None, []
    cut = med + mads * spread
    above = sorted((i for i, s in enumerate(xs) if s > cut), key=lambda i: (-xs[i], i))
    return med, spread, cut, above


def repeated_frames(digests: Sequence[str]) -> list[RepeatGroup]:
    """Each content digest held at two or more indices of ``digests`` (a bank's, in bank order), its
    indices ascending, the groups ordered by their first index (module docstring); no scores."""
    at: dict[str, list[int]] = {}
    for i, d in enumerate(digests):
        at.setdefault(d, []).append(i)
    return [RepeatGroup(d, tuple(ix)) for d, ix in at.items() if len(ix) > 1]  # dicts keep first-seen order


class LaterCopies(str):
    """A digest in a drop list that names only its later copies (module docstring): the kept copy
    stays. A ``str``, so it passes through every ``drop(digests)`` unchanged."""

    __slots__ = ()


def drop_positions(held: Sequence[str], digests: Iterable[str]) -> list[int]:
    """The bank indices (ascending) that the drop list ``digests`` names in a bank holding ``held``
    (module docstring); ValueError for a digest it does not name any frame by."""
    at: dict[str, list[int]] = {}
    for i, d in enumerate(held):
        at.setdefault(d, []).append(i)
    named = list(digests)
    missing = sorted({str(d) for d in named if d not in at})
    if missing:
        raise ValueError(f"the bank holds no frame with digest {', '.join(missing)}")
    once = sorted({str(d) for d in named if isinstance(d, LaterCopies) and len(at[d]) < 2})
    if once:
        raise ValueError(f"the bank holds one copy of {', '.join(once)}: no later copy to drop")
    return sorted({i for d in named for i in (at[d][1:] if isinstance(d, LaterCopies) else at[d])})


def threshold_without(calibration: Calibration, config: DetectorConfig, positions: Iterable[int]) -> float:
    """The threshold of ``config``'s rule on ``calibration``'s scores without those at ``positions``
    (positions in the stored score order; the validation result, if any, kept); the threshold with
    every score when ``positions`` is empty or would remove them all."""
    gone = set(positions)
    kept = [s for i, s in enumerate(calibration.scores) if i not in gone]
    cal = Calibration(tuple(kept), validation=calibration.validation) if gone and kept else calibration
    op = operating_point(cal, config)
    assert op is not None  # a calibration is given
    return op.threshold


def outlier_report(
    calibration: Calibration, config: DetectorConfig, digests: Sequence[str], *, mads: float
) -> OutlierReport:
    """The frames of a template set (``digests``: its bank's, in bank order) whose OOF score stands
    apart, its repeat groups, and its rule's threshold with every score, without the frames standing
    apart and without the repeat groups' later copies (module docstring)."""
    scores = list(calibration.scores)
    plan = _plan(len(digests), config, digests)
    order = [i for held in plan for i in held]  # calibration_order's
    if len(order) != len(scores):
        raise ValueError(
            f"the calibration holds {len(scores)} out-of-fold scores, the fold plan of {len(digests)} frames "
            f"{len(order)}: it was not computed from this bank"
        )
    med, spread, cut, positions = standing_apart(scores, mads=mads)
    frames = tuple(StandingApart(order[p], digests[order[p]], scores[p]) for p in positions)
    op = operating_point(calibration, config)
    assert op is not None  # a calibration is given
    position_of = {i: p for p, i in enumerate(order)}
    fold_of = {i: f for f, held in enumerate(plan) for i in held}
    repeats = []
    for g in repeated_frames(digests):
        scored = [i for i in g.indices if i in fold_of]
        twin = bool(scored) and all(any(fold_of.get(j) != fold_of[i] for j in g.indices if j != i) for i in scored)
        by_index = tuple(scores[position_of[i]] if i in position_of else None for i in g.indices)
        repeats.append(RepeatGroup(g.digest, g.indices, by_index, twin))
    later = [position_of[i] for g in repeats for i in g.later if i in position_of]
    return OutlierReport(
        mads,
        med,
        spread,
        cut,
        frames,
        len(scores),
        op.rule,
        op.threshold,
        threshold_without(calibration, config, positions),
        tuple(repeats),
        threshold_without(calibration, config, later),
    )
