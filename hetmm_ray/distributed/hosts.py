"""Template hosts: a bounded number of long-lived actors, each holding many (product, layer) shards.

A Python + torch process costs hundreds of megabytes before it holds a template, so one actor per
(product, layer) would make processes and memory grow with products. Here a shard is data
(:class:`~.shard.LayerShard`) and a :class:`TemplateHost` actor holds any number of them; the
registry starts a fixed number of hosts (``ServiceConfig.template_hosts``, e.g. one per GPU or
node; SPREAD over nodes) and places every shard on one by the rendezvous rule of placement.py.

Semantics:

- A host is a numbered *slot*. Its actor restarts without limit (``max_restarts=-1``) and a
  restarted incarnation starts empty (a new ``incarnation`` id). Calls on a shard run in the
  host's threads (``max_concurrency``): one product's PTS does not block another's reads.
- :class:`HostPool` lives in the registry. ``place`` loads a product's layers (one version,
  each read from the store on its own, store/layout.py) on the slots that are up; a slot
  that fails while loading is marked down and the placement is redone without it.
- ``check`` pings every slot. A slot whose actor is dead or unavailable, or that answers
  with a new incarnation, has lost its shards (a ping that merely times out, e.g. a host
  still starting on a busy machine, changes nothing): their products are returned so the registry loads them
  again, on the slots that are up (by the same rule, so each lost shard goes to its
  next-best slot: the others, from the store, bit for bit). A slot whose actor is gone for
  good (killed without restart) is started afresh for later placements.
- Candidates: beside HEAD's ``(product, layer)`` shards a host holds a candidate
  version's shards keyed by ``(product, version, layer)``, placed by the same rule (so a
  candidate's layer lands on the slot of HEAD's same layer while the slots that are up do not
  change). HEAD's keys, placement and behaviour are untouched by them. :meth:`HostPool.adopt`
  (promote) moves a fully loaded candidate's shards under HEAD's keys on their hosts (nothing
  is read from the store; HEAD's old shards there are replaced, freed); ``drop_candidate``
  frees them. A lost host's candidate shards are forgotten with it (the registry's store poll
  loads an incomplete candidate again). ``holdings`` reports the bytes held per (product,
  version) shard set.
- :class:`ShardHandle` looks like the old per-shard actor handle (``handle.info.remote()``,
  ``handle.select.remote(...)``) and forwards each call to its host, so the registry's hot
  update and PTS fan-out run through hosts unchanged.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from .placement import place
from .shard import LayerShard, ShardPlacement

__all__ = ["HOST_CONCURRENCY", "PING_TIMEOUT_S", "HostPool", "ShardHandle", "ShardMissing", "TemplateHost"]

HOST_CONCURRENCY = 16  # shard calls a host runs at once (threads): reads go on while one product's PTS waits
HOST_MALLOC_ARENAS = 2  # glibc heaps in a host process (MALLOC_ARENA_MAX): see _host_options
PING_TIMEOUT_S = 5.0  # a host that does not answer a ping within this is taken as down


class ShardMissing(KeyError):
    """The host does not hold this shard (it restarted, or the shard was moved)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "shard not held here"


@ray.remote
class TemplateHost:
    """Many (product, layer) shards in one process."""

    def __init__(self, slot: int, store_uri: str) -> None:
        self.slot = slot
        self.store_uri = store_uri
        self.incarnation = uuid.uuid4().hex
        self.shards: dict[tuple[str, str], LayerShard] = {}
        self.candidates: dict[tuple[str, int, str], LayerShard] = {}  # (product, version, layer)
        self.loads = 0  # shards read from the store (or a bank) by this incarnation

    def ping(self) -> dict[str, Any]:
        held = [*list(self.shards.values()), *list(self.candidates.values())]
        return {
            "slot": self.slot,
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "shards": len(self.shards),
            "candidate_shards": len(self.candidates),
            "tensor_bytes": sum(s.nbytes() for s in held),
        }

    def holdings(self) -> dict[str, Any]:
        """What this host holds: per (product, version) shard set its layers and tensor bytes
        (``candidate``: held as a candidate), its resident memory (VmRSS, bytes; None where
        /proc is absent) and how many shards it has loaded."""
        sets: dict[tuple[str, int, bool], dict[str, Any]] = {}
        entries = [(p, s.version, False, s) for (p, _), s in list(self.shards.items())]
        entries += [(p, v, True, s) for (p, v, _), s in list(self.candidates.items())]
        for product, version, candidate, shard in entries:
            key = (product, -1 if version is None else int(version), candidate)
            row = sets.setdefault(
                key, {"product": product, "version": key[1], "candidate": candidate, "layers": [], "bytes": 0}
            )
            row["layers"].append(shard.layer)
            row["bytes"] += shard.nbytes()
        return {
            "slot": self.slot,
            "pid": os.getpid(),
            "rss_bytes": _rss_bytes(),
            "loads": self.loads,
            "sets": [sets[k] for k in sorted(sets)],
        }

    def load(self, product: str, layer: str, version: int | None = None, bank: np.ndarray | None = None) -> int:
        """Hold ``product``'s ``layer`` at ``version`` from the store (or from ``bank``); returns the version."""
        shard = LayerShard(product, layer, self.store_uri if bank is None else bank, version)
        self.loads += 1
        self.shards[(product, layer)] = shard  # replaces an older version of the same shard whole
        return -1 if shard.version is None else shard.version

    def drop(self, product: str, layers: list[str]) -> None:
        for layer in layers:
            self.shards.pop((product, layer), None)

    def load_candidate(self, product: str, version: int, layer: str) -> int:
        """Hold candidate ``version``'s ``layer`` of ``product`` from the store, beside HEAD's shard."""
        shard = LayerShard(product, layer, self.store_uri, version)
        self.loads += 1
        self.candidates[(product, int(version), layer)] = shard
        return int(version)

    def drop_candidate(self, product: str, version: int, layers: list[str] | None = None) -> None:
        """Free candidate ``version``'s shards of ``product`` (``layers``: these only; None: all)."""
        for key in [k for k in list(self.candidates) if k[:2] == (product, int(version))]:
            if layers is None or key[2] in layers:
                self.candidates.pop(key, None)
        _release_freed()

    def adopt(self, product: str, version: int, layers: list[str]) -> list[str]:
        """Make candidate ``version``'s held ``layers`` HEAD's shards of ``product`` here (promote):
        moved, not read again; HEAD's old shards of those layers are replaced (freed). All or
        nothing: ShardMissing (nothing moved) if one is not held (the host restarted)."""
        keys = [(product, int(version), layer) for layer in layers]
        missing = [k[2] for k in keys if k not in self.candidates]
        if missing:
            raise ShardMissing(f"template host {self.slot} does not hold candidate v{version} of {product}: {missing}")
        for key in keys:
            self.shards[(product, key[2])] = self.candidates.pop(key)
        _release_freed()  # HEAD's old shards
        return list(layers)

    def held(self) -> list[tuple[str, str]]:
        return sorted(self.shards)

    def call(self, product: str, layer: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``LayerShard.<method>`` on the held shard."""
        shard = self.shards.get((product, layer))
        if shard is None:
            raise ShardMissing(f"template host {self.slot} does not hold {product}/{layer} (restarted or moved)")
        if method.startswith("_") or not callable(getattr(shard, method, None)):
            raise AttributeError(f"shards have no method {method!r}")
        return getattr(shard, method)(*args, **kwargs)


def _release_freed() -> None:
    """Give the heap's freed pages back to the system (glibc ``malloc_trim``; nothing elsewhere):
    a freed shard set's large tensors may sit in the heap (glibc raises its mmap threshold as large
    blocks are freed), so without this the host's RSS stays up after a discard."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_bytes() -> int | None:
    """This process's resident set size (VmRSS) in bytes; None where /proc is absent."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _ShardMethod:
    def __init__(self, handle: ShardHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        h = self.handle
        return h.host.call.remote(h.product, h.layer, self.name, *args, **kwargs)


@dataclass(frozen=True)
class ShardHandle:
    """A shard on a host, called like an actor: ``handle.tiny.remote()`` -> ObjectRef."""

    host: Any  # the TemplateHost actor handle
    slot: int
    product: str
    layer: str

    def __getattr__(self, name: str) -> _ShardMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _ShardMethod(self, name)


def _host_options(placement: ShardPlacement, slot: int) -> dict[str, Any]:
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    return {
        "num_cpus": placement.num_cpus,
        "num_gpus": placement.num_gpus if has_gpus else 0,
        "resources": dict(placement.resources or {}),
        "scheduling_strategy": _spread(slot, placement, has_gpus),
        "max_restarts": -1,  # a restarted host starts empty; the registry reloads its shards from the store
        "max_concurrency": HOST_CONCURRENCY,
        # Shards load in the host's threads; with glibc's default of one heap per thread, a freed
        # shard set's read buffers stayed in ever more thread heaps and RSS crept up over load and
        # free cycles; with 2 heaps it stays flat (benchmarks/bench_cluster.py candidate-memory).
        "runtime_env": {"env_vars": {"MALLOC_ARENA_MAX": str(HOST_MALLOC_ARENAS)}},
    }


def _spread(slot: int, placement: ShardPlacement, has_gpus: bool) -> Any:
    """Slot k on the k-th live node that can hold a host (sorted by node id).

    Ray's "SPREAD" is best effort, and so is a soft node affinity: with ``num_cpus: 0`` both
    put several hosts on one node of a 3-node test cluster. One host per node is what makes a
    node's loss cost only its share, so the affinity is hard; a host whose node is gone dies
    (``ActorDiedError``) and :meth:`HostPool.check` starts its slot afresh on a live node.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    need = dict(placement.resources or {})
    if placement.num_cpus:
        need["CPU"] = placement.num_cpus
    if has_gpus and placement.num_gpus:
        need["GPU"] = placement.num_gpus
    nodes = sorted(
        n["NodeID"]
        for n in ray.nodes()
        if n.get("Alive") and all(n.get("Resources", {}).get(k, 0) >= v for k, v in need.items())
    )
    if not nodes:
        return "SPREAD"
    return NodeAffinitySchedulingStrategy(node_id=nodes[slot % len(nodes)], soft=False)


class HostPool:
    """The registry's template hosts and where each shard is (see the module docstring)."""

    def __init__(self, store_uri: str, count: int, placement: ShardPlacement) -> None:
        if count < 1:
            raise ValueError(f"template hosts: need at least 1, got {count}")
        self.store_uri = store_uri
        self.placement = placement
        self.handles: list[Any] = [self._start(slot) for slot in range(count)]
        self.incarnations: list[str | None] = [None] * count  # as of the last ping that answered
        self.up: set[int] = set(range(count))
        self.held: list[dict[str, set[str]]] = [{} for _ in range(count)]  # slot -> product -> layers
        # slot -> (product, candidate version) -> layers
        self.cand_held: list[dict[tuple[str, int], set[str]]] = [{} for _ in range(count)]
        self.cand_layers: dict[tuple[str, int], frozenset[str]] = {}  # a loaded candidate's layers
        # Products whose shards a host took with it when it died under another product's load
        # (place): the next check returns them, so the registry loads them again.
        self.displaced: set[str] = set()

    def _start(self, slot: int) -> Any:
        options = _host_options(self.placement, slot)
        return TemplateHost.options(**options).remote(slot, self.store_uri)  # type: ignore[attr-defined]  # an ActorClass: Ray's stubs type @ray.remote(...) as the class

    @property
    def count(self) -> int:
        return len(self.handles)

    def grow(self, count: int) -> None:
        """More slots (``set_hosts``); existing shards stay where they are."""
        for slot in range(self.count, count):
            self.handles.append(self._start(slot))
            self.incarnations.append(None)
            self.held.append({})
            self.cand_held.append({})
            self.up.add(slot)

    async def _ping(self, slot: int) -> dict[str, Any] | BaseException:
        try:
            ref = self.handles[slot].ping.remote()
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), PING_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            return exc

    def _lose(self, slot: int) -> set[str]:
        lost = set(self.held[slot])
        self.held[slot] = {}
        self.cand_held[slot] = {}  # candidates: loaded again by the registry's store poll
        return lost

    async def check(self) -> set[str]:
        """Ping every slot; returns the products that lost a shard (to be loaded again)."""
        answers = await asyncio.gather(*(self._ping(slot) for slot in range(self.count)))
        displaced, self.displaced = self.displaced, set()
        for slot, answer in enumerate(answers):
            unschedulable = isinstance(answer, ray.exceptions.ActorUnschedulableError)  # its node is gone
            gone = isinstance(answer, ray.exceptions.RayActorError) or unschedulable
            if isinstance(answer, BaseException) and not gone:
                continue  # no answer in time: a busy or still starting host, judged by a later ping
            if isinstance(answer, BaseException):
                self.up.discard(slot)
                displaced |= self._lose(slot)
                died = isinstance(answer, ray.exceptions.ActorDiedError) and not getattr(answer, "preempted", False)
                if died or unschedulable:
                    self.handles[slot] = self._start(slot)  # gone for good: a fresh host for later placements
                    self.incarnations[slot] = None
                continue
            if self.incarnations[slot] not in (None, answer["incarnation"]):
                displaced |= self._lose(slot)  # restarted: it came back empty
            self.incarnations[slot] = answer["incarnation"]
            self.up.add(slot)
        return displaced

    def where(self, product: str) -> dict[str, int]:
        """layer -> slot of a placed product."""
        return {layer: slot for slot in range(self.count) for layer in self.held[slot].get(product, ())}

    async def _load_layers(
        self, product: str, layers: list[str], load: Callable[[Any, str], Any], *, head: bool = True
    ) -> dict[str, int]:
        """``load(host, layer)`` (an ObjectRef) for each layer on its slot by the placement rule;
        a slot whose host dies under the load is marked down and the layers are placed again
        without it. Returns layer -> slot. ``head``: HEAD's shards of ``product`` are what is
        loaded (so its own lost shards are not reported as displaced)."""
        failed_here: set[int] = set()
        while True:
            # No slot known to be up (hosts still starting, or every ping timed out): try them all;
            # a load on a dead host fails with RayActorError and the loop places again without it.
            candidates = sorted(self.up - failed_here) or sorted(set(range(self.count)) - failed_here)
            slots = {layer: place(product, layer, candidates) for layer in layers}
            refs = {layer: load(self.handles[slot], layer) for layer, slot in slots.items()}
            futures = [asyncio.wrap_future(r.future()) for r in refs.values()]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = {
                slots[layer]
                for layer, r in zip(refs, results, strict=True)
                if isinstance(r, ray.exceptions.RayActorError)
            }
            if not failed:
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    raise errors[0]  # e.g. the version cannot be read: the store's error
                return slots
            for slot in failed:  # a host died under the load: place again without it
                failed_here.add(slot)
                self.up.discard(slot)
                # the other products it held are displaced too: the next check() reports them (a ping
                # of the dead slot finds nothing left to lose, so without this they stayed unplaced)
                self.displaced |= self._lose(slot) - ({product} if head else set())

    async def place(self, product: str, layers: list[str], version: int) -> dict[str, ShardHandle]:
        """Load ``product``'s ``layers`` at ``version`` on their slots (see the module docstring)."""
        slots = await self._load_layers(product, layers, lambda host, layer: host.load.remote(product, layer, version))
        return self._settle(product, slots)

    def _settle(self, product: str, slots: dict[str, int]) -> dict[str, ShardHandle]:
        """Record ``slots`` (layer -> slot) as where HEAD's shards of ``product`` are now; free old
        copies left on other slots."""
        old = self.where(product)
        stale: dict[int, list[str]] = {}
        for layer, slot in old.items():
            if slots.get(layer) != slot:
                stale.setdefault(slot, []).append(layer)
        self.forget(product)
        for layer, slot in slots.items():
            self.held[slot].setdefault(product, set()).add(layer)
        for slot, gone in stale.items():  # the shard moved (or the product lost a layer): free the old copy
            self.handles[slot].drop.remote(product, gone)
        return {layer: ShardHandle(self.handles[slot], slot, product, layer) for layer, slot in slots.items()}

    # --- candidates --------------------------------------------------------------------------
    def candidate_where(self, product: str, version: int) -> dict[str, int]:
        """layer -> slot of candidate ``version``'s shards of ``product`` (those held)."""
        key = (product, int(version))
        return {layer: slot for slot in range(self.count) for layer in self.cand_held[slot].get(key, ())}

    def candidate_versions(self, product: str) -> set[int]:
        """The candidate versions of ``product`` loaded here (complete, or with shards lost with a host)."""
        held = {v for slot in range(self.count) for (p, v) in self.cand_held[slot] if p == product}
        return held | {v for (p, v) in self.cand_layers if p == product}

    def candidate_complete(self, product: str, version: int) -> bool:
        """Whether every layer of candidate ``version`` of ``product`` is held."""
        layers = self.cand_layers.get((product, int(version)))
        return bool(layers) and set(self.candidate_where(product, version)) == layers

    def candidate_products(self) -> set[str]:
        """Products with a candidate loaded here (see :meth:`candidate_versions`)."""
        held = {p for slot in range(self.count) for (p, _) in self.cand_held[slot]}
        return held | {p for (p, _) in self.cand_layers}

    async def place_candidate(self, product: str, version: int, layers: list[str]) -> dict[str, int]:
        """Load candidate ``version``'s ``layers`` of ``product`` beside HEAD's shards (same rule);
        returns layer -> slot."""
        self.drop_candidate(product, version)  # a partial set (a lost host) is loaded again whole
        try:
            slots = await self._load_layers(
                product, layers, lambda host, layer: host.load_candidate.remote(product, version, layer), head=False
            )
        except BaseException:
            for handle in self.handles:  # layers that did load before the failure: freed, not left behind
                handle.drop_candidate.remote(product, int(version))
            raise
        self.cand_layers[(product, int(version))] = frozenset(layers)
        for layer, slot in slots.items():
            self.cand_held[slot].setdefault((product, int(version)), set()).add(layer)
        return slots

    def drop_candidate(self, product: str, version: int) -> None:
        """Free candidate ``version``'s shards of ``product`` wherever held."""
        key = (product, int(version))
        self.cand_layers.pop(key, None)
        for slot in range(self.count):
            if self.cand_held[slot].pop(key, None) is not None:
                self.handles[slot].drop_candidate.remote(product, int(version))

    async def adopt(self, product: str, version: int, layers: list[str]) -> dict[str, ShardHandle] | None:
        """Promote: candidate ``version``'s shards become HEAD's shards of ``product`` on the hosts
        that hold them (moved, no store read). None, with the candidate's shards freed, when they
        are not all held (never loaded, or a host lost or restarted): load HEAD with :meth:`place`."""
        slots = self.candidate_where(product, version)
        if not layers or set(slots) != set(layers):
            self.drop_candidate(product, version)
            return None
        by_slot: dict[int, list[str]] = {}
        for layer, slot in slots.items():
            by_slot.setdefault(slot, []).append(layer)
        refs = [self.handles[slot].adopt.remote(product, version, sorted(ls)) for slot, ls in by_slot.items()]
        results = await asyncio.gather(*(asyncio.wrap_future(r.future()) for r in refs), return_exceptions=True)
        if any(isinstance(r, BaseException) for r in results):
            # a host lost or restarted meanwhile: some may have moved; HEAD is loaded from the store
            self.drop_candidate(product, version)
            return None
        for slot in by_slot:
            self.cand_held[slot].pop((product, int(version)), None)
        self.cand_layers.pop((product, int(version)), None)
        return self._settle(product, slots)

    def forget(self, product: str) -> None:
        for slot in range(self.count):
            self.held[slot].pop(product, None)

    def drop(self, product: str) -> None:
        """Free every copy of ``product``'s shards (delete, or before the registry forgets it)."""
        for layer, slot in self.where(product).items():
            self.handles[slot].drop.remote(product, [layer])
        self.forget(product)
        for version in self.candidate_versions(product):
            self.drop_candidate(product, version)

    async def holdings(self) -> list[dict[str, Any]]:
        """Each slot's :meth:`TemplateHost.holdings` (bytes per (product, version) shard set, RSS),
        or ``{"slot", "error"}`` for a host that did not answer."""

        async def one(slot: int) -> dict[str, Any]:
            try:
                ref = self.handles[slot].holdings.remote()
                return await asyncio.wait_for(asyncio.wrap_future(ref.future()), PING_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                return {"slot": slot, "error": type(exc).__name__}

        return list(await asyncio.gather(*(one(slot) for slot in range(self.count))))

    async def describe(self) -> list[dict[str, Any]]:
        """Each slot's ping (or its error) and the shards the registry placed there."""
        answers = await asyncio.gather(*(self._ping(slot) for slot in range(self.count)))
        out = []
        for slot, answer in enumerate(answers):
            info = {"slot": slot, "error": f"{type(answer).__name__}"} if isinstance(answer, BaseException) else answer
            info["placed"] = sum(len(v) for v in self.held[slot].values())
            info["candidates_placed"] = sum(len(v) for v in self.cand_held[slot].values())
            info["up"] = slot in self.up
            out.append(info)
        return out
