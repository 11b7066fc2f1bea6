"""LoRA adapters in the plan (docs/api.md, "LoRA adapters"): which replicas are asked to load which
adapters, and each adapter's route. Pure.

An adapter (a definition with `base`) has no replicas of its own: every ready replica of its base is asked to
load every adapter of that base (adapters are small), and an adapter's endpoints are the base's ready replicas
whose agent reports it `loaded`, which the agent says only once the engine lists it. A request for an adapter
that no replica lists yet waits as for an activation (the route is `starting`, or its base's state while the
base has no ready replica); one that failed to load on every ready replica is refused at once with why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from llmgw.domain.activation import Progress
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute, Observed
from llmgw.domain.state import ClusterState, Placement

LOADED = "loaded"
LOADING = "loading"
FAILED = "failed: "  # then why


def adapters_by_base(models: Mapping[str, ModelDef]) -> dict[str, dict[str, str]]:
    """Base model -> {adapter name: its source}, for every base that has adapters."""
    found: dict[str, dict[str, str]] = {}
    for name in sorted(models):
        model = models[name]
        if model.base:
            found.setdefault(model.base, {})[name] = model.source
    return found


def with_launch_lora(state: ClusterState) -> ClusterState:
    """`state` with each llama.cpp base carrying its adapters' files in `lora` (in adapter name order): llama.cpp
    loads adapters at launch, so they are part of what its replicas start from (the launch hash): a new adapter
    replaces the base's replicas by ones started with it, rolled as any changed definition (new before old).
    The same state when no llama.cpp model has adapters (the common case: no copy)."""
    wanted = {base: files for base, files in adapters_by_base(state.models).items()
              if (m := state.models.get(base)) is not None and m.engine == "llama.cpp" and not m.base}
    if not wanted:
        return state
    models = dict(state.models)
    for base, files in wanted.items():
        models[base] = replace(models[base], lora=tuple(files[name] for name in sorted(files)))
    return replace(state, models=MappingProxyType(models))


def adapter_loads(models: Mapping[str, ModelDef], observed: Observed,
                  kept: Mapping[str, Placement]) -> list[tuple[str, str, dict[str, str]]]:
    """(node, replica id, adapters wanted) for each ready replica whose agent reports another set of adapters
    than its base's: the whole set is sent (an agent drops those no longer wanted). Level-triggered: an agent
    reports a set as soon as it is asked (each `loading` first), so a set is sent again only if it was lost."""
    wanted = adapters_by_base(models)
    loads = []
    for rid in sorted(kept):
        p = kept[rid]
        obs = observed.replicas.get(rid)
        if not p.serves or obs is None or obs.state != "ready" or p.node not in observed.nodes:
            continue
        want = wanted.get(p.model, {})
        if set(want) != set(obs.adapters):
            loads.append((p.node, rid, want))
    return loads


@dataclass(frozen=True)
class AdapterRoute:
    state: str  # a ROUTE_STATES value
    reason: str
    endpoints: tuple[Endpoint, ...]
    activation: Progress | None = None
    lora_id: int | None = None  # llama.cpp: the adapter's id on every one of `endpoints`
    off_until: float | None = None  # its base's schedule allows no replica until then (`ModelRoute.off_until`)


def adapter_state(model: ModelDef, base_route: ModelRoute | None, base_reason: str,
                  observed: Observed) -> AdapterRoute:
    """Where an adapter can be served: the base's ready endpoints whose replica lists it loaded; else why not."""
    name, base = model.name, model.base
    if base_route is None:
        return AdapterRoute("absent", f"its base model {base!r} is not defined", ())
    states = {e.replica_id: (o.adapter(name) if (o := observed.replicas.get(e.replica_id)) else "")
              for e in base_route.endpoints}
    loaded = tuple(e for e in base_route.endpoints if states[e.replica_id] == LOADED)
    ids = {e.replica_id: i for e in loaded
           if (o := observed.replicas.get(e.replica_id)) is not None and (i := o.adapter_ids.get(name)) is not None}
    if ids:  # named by id (llama.cpp): one id (and count) on every endpoint, the first replica's (alike if started alike)
        first = min(ids)
        lora_id, count = ids[first], next(e.loras for e in loaded if e.replica_id == first)
        loaded = tuple(e for e in loaded if ids.get(e.replica_id) == lora_id and e.loras == count)
        return AdapterRoute("ready", "", loaded, lora_id=lora_id)
    if loaded:
        return AdapterRoute("ready", "", loaded)
    if base_route.state != "ready":
        why = base_reason or base_route.reason or base_route.state
        return AdapterRoute(base_route.state, f"base model {base!r}: {why}", (), base_route.activation,
                            off_until=base_route.off_until)
    failed = {rid: s[len(FAILED):] for rid, s in states.items() if s.startswith(FAILED)}
    if failed and len(failed) == len(states):
        rid, why = sorted(failed.items())[0]
        more = f" (and {len(failed) - 1} more replicas)" if len(failed) > 1 else ""
        return AdapterRoute("unplaceable", f"adapter {name!r} did not load on any ready replica of {base!r}: "
                                           f"{rid}: {why}{more}", ())
    return AdapterRoute("starting", f"loading adapter {name!r} on the replicas of {base!r}", ())
