"""Candidate versions in the store: stored and verified, not head, until promoted.

Runs on a local folder and on S3 (moto server), like test_store.py. Checks: a candidate leaves
HEAD's version and history alone (every other reader still gets the old head), several may exist,
promote is a recorded move and a compare-and-swap (two racing promotes: one wins, one conflicts),
discard drops it, and a later publish or rollback keeps the list.
"""

from __future__ import annotations

import json
import threading

import pytest
from test_store import assert_identical, grow, make_set

from hetmm_ray.store import ProductNotFound, StoreConflict, open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_candidate_is_stored_not_head_then_promoted(location):
    store = open_store(location)
    base = make_set(3, seed=1)
    assert store.put("p", base, candidate=True) == 1  # a first version is always head
    assert store.candidates("p") == []
    grown = grow(base, 2, seed=2)
    assert store.put("p", grown, candidate=True) == 2
    other = open_store(location)  # another reader of the same store
    assert other.head("p") == 1 and other.versions("p") == [1] and other.candidates("p") == [2]
    assert_identical(other.get("p"), base, version=1)  # readers of HEAD never see the candidate
    assert_identical(other.get("p", 2), grown, version=2)  # stored and verified, loadable by number
    assert other.record("p", 2).parent == 1
    assert store.moves("p") == []  # storing a candidate moves nothing
    # a second candidate; then promote the first: a recorded move, the other candidate stays
    assert store.put("p", make_set(2, seed=3), candidate=True) == 3
    assert store.candidates("p") == [2, 3]
    assert store.promote("p", 2, expect_head=1) == 2
    assert other.head("p") == 2 and other.versions("p") == [1, 2] and other.candidates("p") == [3]
    assert [(m["kind"], m["from"], m["to"]) for m in store.moves("p")] == [("promote", 1, 2)]
    assert_identical(other.get("p"), grown, version=2)
    with pytest.raises(ProductNotFound, match="no candidate v2"):
        store.promote("p", 2)  # already head: not a candidate any more
    with pytest.raises(StoreConflict, match="head is v2, not v1"):
        store.promote("p", 3, expect_head=1)  # decided against a head that has moved
    # a live publish and a rollback keep the candidate list
    assert store.put("p", grow(grown, 1, seed=4)) == 4
    assert store.candidates("p") == [3] and store.head("p") == 4
    store.rollback("p", 2)
    assert store.candidates("p") == [3]
    assert store.discard("p", 3) == 3
    assert store.candidates("p") == [] and store.head("p") == 2
    head = json.loads(store.backend.read("p/HEAD")[0])
    assert set(head) == {"version", "history"}  # no candidates: HEAD is what older readers parse
    with pytest.raises(ProductNotFound, match="no candidate v3"):
        store.discard("p", 3)
    assert store.put("p", make_set(2, seed=5), candidate=True) == 5  # a discarded number is never reused


def test_retention_keeps_candidates_objects(location):
    store = open_store(location)
    base = make_set(3, seed=1)
    store.put("p", base)
    cand = grow(base, 1, seed=2)  # shares v1's chunk objects
    assert store.put("p", cand, candidate=True) == 2
    store.put("p", make_set(2, seed=3))
    store.put("p", make_set(2, seed=4))
    assert store.retain("p", 1) == [1, 3]
    assert store.candidates("p") == [2]
    assert_identical(store.get("p", 2), cand, version=2)  # v1's chunks are still there for it
    store.promote("p", 2)
    assert store.head("p") == 2


def test_two_promotes_race_one_wins(location):
    """HEAD moves by compare-and-swap only: two writers promoting different candidates at once."""
    first = open_store(location)
    base = make_set(3, seed=1)
    first.put("p", base)
    assert [first.put("p", make_set(2, seed=s), candidate=True) for s in (2, 3)] == [2, 3]
    writers = [open_store(location), open_store(location)]
    barrier = threading.Barrier(2, timeout=60)
    outcome: list[object] = [None, None]

    def promote(i: int) -> None:
        try:
            writers[i].candidates("p")
            barrier.wait()
            outcome[i] = writers[i].promote("p", 2 + i, expect_head=1)
        except Exception as exc:  # noqa: BLE001 - the main thread checks what happened
            outcome[i] = exc

    threads = [threading.Thread(target=promote, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    winners = [i for i in (0, 1) if isinstance(outcome[i], int)]
    losers = [i for i in (0, 1) if isinstance(outcome[i], StoreConflict)]
    assert len(winners) == 1 and len(losers) == 1, outcome
    won = outcome[winners[0]]
    assert first.head("p") == won and first.versions("p") == [1, won]
    assert first.candidates("p") == [5 - won]  # the loser's candidate is still a candidate
    assert [(m["kind"], m["to"]) for m in first.moves("p")] == [("promote", won)]
