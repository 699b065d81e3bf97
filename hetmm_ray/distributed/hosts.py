"""Template hosts: a bounded number of long-lived actors, each holding many (product, layer) shards.

One Python + torch process costs ~300 MB before it holds a template, so one actor per
(product, layer) made processes and memory grow with products (issue 14: 3 products -> 9
processes of ~330 MB). Here a shard is data (:class:`~.shard.LayerShard`) and a
:class:`TemplateHost` actor holds any number of them; the registry starts a fixed number of
hosts (``ServiceConfig.template_hosts``, e.g. one per GPU or node; SPREAD over nodes) and
places every shard on one by the rendezvous rule of placement.py.

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
- :class:`ShardHandle` looks like the old per-shard actor handle (``handle.info.remote()``,
  ``handle.select.remote(...)``) and forwards each call to its host, so the registry's hot
  update and PTS fan-out run through hosts unchanged.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from .placement import place
from .shard import LayerShard, ShardPlacement

__all__ = ["HOST_CONCURRENCY", "PING_TIMEOUT_S", "HostPool", "ShardHandle", "ShardMissing", "TemplateHost"]

HOST_CONCURRENCY = 16  # shard calls a host runs at once (threads): reads go on while one product's PTS waits
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

    def ping(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "shards": len(self.shards),
            "tensor_bytes": sum(s.nbytes() for s in list(self.shards.values())),
        }

    def load(self, product: str, layer: str, version: int | None = None, bank: np.ndarray | None = None) -> int:
        """Hold ``product``'s ``layer`` at ``version`` from the store (or from ``bank``); returns the version."""
        shard = LayerShard(product, layer, self.store_uri if bank is None else bank, version)
        self.shards[(product, layer)] = shard  # replaces an older version of the same shard whole
        return -1 if shard.version is None else shard.version

    def drop(self, product: str, layers: list[str]) -> None:
        for layer in layers:
            self.shards.pop((product, layer), None)

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
        # Products whose shards a host took with it when it died under another product's load
        # (place): the next check returns them, so the registry loads them again.
        self.displaced: set[str] = set()

    def _start(self, slot: int) -> Any:
        return TemplateHost.options(**_host_options(self.placement, slot)).remote(slot, self.store_uri)

    @property
    def count(self) -> int:
        return len(self.handles)

    def grow(self, count: int) -> None:
        """More slots (``set_hosts``); existing shards stay where they are."""
        for slot in range(self.count, count):
            self.handles.append(self._start(slot))
            self.incarnations.append(None)
            self.held.append({})
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

    async def place(self, product: str, layers: list[str], version: int) -> dict[str, ShardHandle]:
        """Load ``product``'s ``layers`` at ``version`` on their slots (see the module docstring)."""
        failed_here: set[int] = set()
        while True:
            # No slot known to be up (hosts still starting, or every ping timed out): try them all;
            # a load on a dead host fails with RayActorError and the loop places again without it.
            candidates = sorted(self.up - failed_here) or sorted(set(range(self.count)) - failed_here)
            slots = {layer: place(product, layer, candidates) for layer in layers}
            refs = {layer: self.handles[slot].load.remote(product, layer, version) for layer, slot in slots.items()}
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
                break
            for slot in failed:  # a host died under the load: place again without it
                failed_here.add(slot)
                self.up.discard(slot)
                # the other products it held are displaced too: the next check() reports them (a ping
                # of the dead slot finds nothing left to lose, so without this they stayed unplaced)
                self.displaced |= self._lose(slot) - {product}
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

    def forget(self, product: str) -> None:
        for slot in range(self.count):
            self.held[slot].pop(product, None)

    def drop(self, product: str) -> None:
        """Free every copy of ``product``'s shards (delete, or before the registry forgets it)."""
        for layer, slot in self.where(product).items():
            self.handles[slot].drop.remote(product, [layer])
        self.forget(product)

    async def describe(self) -> list[dict[str, Any]]:
        """Each slot's ping (or its error) and the shards the registry placed there."""
        answers = await asyncio.gather(*(self._ping(slot) for slot in range(self.count)))
        out = []
        for slot, answer in enumerate(answers):
            info = {"slot": slot, "error": f"{type(answer).__name__}"} if isinstance(answer, BaseException) else answer
            info["placed"] = sum(len(v) for v in self.held[slot].values())
            info["up"] = slot in self.up
            out.append(info)
        return out
