"""Builders that read like prose, for tests of the pure core and beyond.

`node("n1").gpus(8, "h100-80g", memory_gib=80).engines("vllm").build()` makes an
inventory; `model("demo").sim().build()` a validated definition; `state_with(...)`
a `ClusterState` made by committing real commands through `MemoryStore`;
`ReconcileLoop` runs `decide` against obedient fake agents.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, ParamSpec

from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo, Observed, ReplicaObs
from llmgw.domain.state import ClusterState
from llmgw.reconcile import AgentAction, Plan, decide
from llmgw.testing import MemoryStore

_P = ParamSpec("_P")

GIB = 1 << 30
DEFAULT_ENGINES = ("sim", "llama.cpp")


# --- nodes ------------------------------------------------------------------


class NodeBuilder:
    """An agent's inventory, one clause at a time."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._gpus: list[Gpu] = []
        self._engines: tuple[str, ...] = DEFAULT_ENGINES
        self._fabric = ""
        self._cpus = 8
        self._memory_gib = 64

    def gpus(
        self,
        count: int,
        gpu_class: str = "h100-80g",
        *,
        memory_gib: float = 80,
        used_gib: float | None = 0,
        unhealthy: Iterable[int] = (),
    ) -> NodeBuilder:
        """Add `count` whole GPUs, indexed after the ones already added."""
        sick = set(unhealthy)
        start = 1 + max((g.index for g in self._gpus if g.index < 1000), default=-1)
        for index in range(start, start + count):
            self._gpus.append(
                Gpu(
                    index=index,
                    uuid=f"GPU-{self._name}-{index}",
                    name=gpu_class.upper(),
                    gpu_class=gpu_class,
                    memory_total=int(memory_gib * GIB),
                    memory_used=None if used_gib is None else int(used_gib * GIB),
                    healthy=index not in sick,
                )
            )
        return self

    def mig(self, card: int, card_class: str, *profiles: tuple[str, float]) -> NodeBuilder:
        """A card in MIG mode, reported as its instances (S6): index 1000 + 100 × card + n."""
        for n, (profile, memory_gib) in enumerate(profiles):
            index = 1000 + 100 * card + n
            self._gpus.append(
                Gpu(
                    index=index,
                    uuid=f"MIG-{self._name}-{card}-{n}",
                    name=f"{card_class} MIG {profile}",
                    gpu_class=f"{card_class}-mig-{profile}",
                    memory_total=int(memory_gib * GIB),
                    memory_used=0,
                )
            )
        return self

    def unhealthy(self, *indexes: int) -> NodeBuilder:
        self._gpus = [
            Gpu(g.index, g.uuid, g.name, g.gpu_class, g.memory_total, g.memory_used, g.index not in indexes)
            for g in self._gpus
        ]
        return self

    def engines(self, *names: str) -> NodeBuilder:
        self._engines = tuple(names)
        return self

    def fabric(self, name: str) -> NodeBuilder:
        self._fabric = name
        return self

    def memory_gib(self, gib: int) -> NodeBuilder:
        """The machine's own memory (what CPU replicas are sized against); 0 = not said."""
        self._memory_gib = gib
        return self

    def build(self) -> NodeInfo:
        return NodeInfo(
            node=self._name,
            hostname=self._name,
            cpus=self._cpus,
            memory_total=self._memory_gib * GIB,
            gpus=tuple(self._gpus),
            engines=self._engines,
            fabric=self._fabric,
            version="test",
        )


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def cpu_node(name: str = "local", *engines: str) -> NodeInfo:
    """A node with no GPU; by default it has the sim and llama.cpp engines."""
    return node(name).engines(*(engines or DEFAULT_ENGINES)).build()


def fleet(*infos: NodeInfo | NodeBuilder) -> dict[str, NodeInfo]:
    """Nodes keyed by name, as `place` and `Observed.nodes` take them."""
    built = [i.build() if isinstance(i, NodeBuilder) else i for i in infos]
    return {n.node: n for n in built}


# --- models -----------------------------------------------------------------


class ModelBuilder:
    """A definition document; `build()` runs it through `ModelDef.from_doc`."""

    def __init__(self, name: str) -> None:
        self._doc: dict[str, Any] = {"name": name, "engine": "sim", "source": f"sim://{name}"}
        self._profile: dict[str, Any] = {}

    def sim(self) -> ModelBuilder:
        self._doc.update(engine="sim", source=f"sim://{self._doc['name']}")
        return self

    def llamacpp(self, source: str = "/models/smollm2.gguf") -> ModelBuilder:
        self._doc.update(engine="llama.cpp", source=source)
        return self

    def vllm(self, source: str = "hf://org/model") -> ModelBuilder:
        self._doc.update(engine="vllm", source=source)
        return self

    def source(self, source: str) -> ModelBuilder:
        self._doc["source"] = source
        return self

    def adapter_of(self, base: str, source: str | None = None, engine: str = "sim") -> ModelBuilder:
        """A LoRA adapter of `base` (of engine `engine`, the base's), its file at `source`."""
        self._doc.update(base=base, engine=engine, source=source or f"/models/lora/{self._doc['name']}.safetensors")
        return self

    def role(self, role: str) -> ModelBuilder:
        self._doc["role"] = role
        return self

    def replicas(self, minimum: int, maximum: int | None = None) -> ModelBuilder:
        self._doc["replicas"] = {"min": minimum, "max": max(minimum, 1) if maximum is None else maximum}
        return self

    def on_demand(self, idle_timeout_s: float = 900, activation_window_s: float = 120) -> ModelBuilder:
        self._doc.update(mode="on-demand", idle_timeout_s=idle_timeout_s, activation_window_s=activation_window_s)
        return self

    def schedule(self, start: str, low: int, high: int, *, end: str = "", duration_s: float = 0.0) -> ModelBuilder:
        """One more schedule rule: from `start` until `end` (a cron) or for `duration_s`, replicas low..high."""
        rule: dict[str, Any] = {"start": start, "min": low, "max": high}
        rule.update({"end": end} if end else {"duration_s": duration_s})
        self._doc.setdefault("schedules", []).append(rule)
        return self

    def always(self) -> ModelBuilder:
        self._doc["mode"] = "always"
        return self

    def args(self, *args: str) -> ModelBuilder:
        self._doc["args"] = list(args)
        return self

    def gpus(self, count: int, *, tp: int | None = None, pp: int = 1) -> ModelBuilder:
        self._profile.update(gpus=count, tp=count // pp if tp is None else tp, pp=pp, cpu=False)
        return self

    def classes(self, *names: str) -> ModelBuilder:
        self._profile["classes"] = list(names)
        return self

    def memory(self, gib: float) -> ModelBuilder:
        self._profile["memory_gib"] = gib
        return self

    def cpu(self, allowed: bool = True) -> ModelBuilder:
        self._profile["cpu"] = allowed
        return self

    def doc(self) -> dict[str, Any]:
        doc = dict(self._doc)
        if self._profile:
            doc["profile"] = dict(self._profile)
        return doc

    def build(self) -> ModelDef:
        return ModelDef.from_doc(self.doc())


def model(name: str) -> ModelBuilder:
    return ModelBuilder(name)


# --- state ------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """A placement to commit: `launch_hash=None` means the model's current one."""

    model: str
    node: str
    gpus: tuple[int, ...] = ()
    at: float = 0.0
    launch_hash: str | None = None


def placed(model_name: str, on: str, gpus: Iterable[int] = (), *, at: float = 0.0,
           launch_hash: str | None = None) -> Placed:
    return Placed(model_name, on, tuple(gpus), at, launch_hash)


def store_with(
    models: Iterable[ModelDef | ModelBuilder] = (),
    placements: Iterable[Placed] = (),
    settings: Mapping[str, Any] | None = None,
    *,
    at: float = 0.0,
) -> MemoryStore:
    """A MemoryStore that has committed the given settings, models and placements, in that order."""
    store = MemoryStore()
    for key, value in (settings or {}).items():
        store.submit_nowait(commands.put_setting(key, value, at))
    for m in models:
        built = m.build() if isinstance(m, ModelBuilder) else m
        store.submit_nowait(commands.put_model(built, at))
    for p in placements:
        launch = p.launch_hash
        if launch is None:
            launch = store.snapshot().models[p.model].launch_hash()
        store.submit_nowait(commands.add_placement(p.model, p.node, p.gpus, launch, p.at))
    return store


def _snapshot_of(build: Callable[_P, MemoryStore]) -> Callable[_P, ClusterState]:
    def snapshot(*args: _P.args, **kwargs: _P.kwargs) -> ClusterState:
        return build(*args, **kwargs).snapshot()
    return snapshot


state_with = _snapshot_of(store_with)
"""`store_with(...)`'s state: the same arguments, the snapshot they make."""


# --- observations -----------------------------------------------------------


def replica(
    replica_id: str,
    on: str,
    state: str = "ready",
    *,
    model: str | None = None,
    url: str | None = None,
    error: str = "",
    since: float = 0.0,
) -> ReplicaObs:
    """An agent's report; the model defaults to the replica id's prefix (`demo-r1` → `demo`)."""
    name = model if model is not None else replica_id.rsplit("-r", 1)[0]
    if url is None:
        url = f"http://{on}:{40000 + zlib.crc32(replica_id.encode()) % 1000}" if state == "ready" else ""
    return ReplicaObs(replica_id, name, on, state, url, error, since)


def observed(
    nodes: Iterable[NodeInfo | NodeBuilder] = (),
    replicas: Iterable[ReplicaObs] = (),
    *,
    demand: Mapping[str, float] | None = None,
    lost: Mapping[str, float] | None = None,
    since: float = 0.0,
) -> Observed:
    return Observed(
        nodes=fleet(*nodes),
        replicas={r.replica_id: r for r in replicas},
        demand=dict(demand or {}),
        lost=dict(lost or {}),
        since=since,
    )


# --- a reconciler loop with obedient agents -----------------------------------------


class ReconcileLoop:
    """`decide` → commit through a MemoryStore → agents obey, one pass per `tick`.

    Agents are obedient fakes: a start yields a replica in `outcome(action)`'s state
    ("ready" by default) at once, a stop makes the agent forget the replica.
    """

    def __init__(
        self,
        store: MemoryStore,
        nodes: Iterable[NodeInfo | NodeBuilder] = (),
        *,
        now: float = 1000.0,
        since: float | None = None,
    ) -> None:
        self.store = store
        self.nodes = fleet(*nodes)
        self.replicas: dict[str, ReplicaObs] = {}
        self.demand: dict[str, float] = {}
        self.lost: dict[str, float] = {}
        self.now = now
        self.since = now if since is None else since
        # What an agent reports after a start: a replica state, or None for nothing yet.
        self.outcome: Callable[[AgentAction], str | None] = lambda action: "ready"
        self.passes = 0

    @property
    def state(self) -> ClusterState:
        return self.store.snapshot()

    def observed(self) -> Observed:
        return Observed(dict(self.nodes), dict(self.replicas), dict(self.demand), dict(self.lost), self.since)

    def decide(self) -> Plan:
        return decide(self.state, self.observed(), self.now)

    def commit(self, plan: Plan) -> None:
        for cmd in plan.commands:
            self.store.submit_nowait(cmd)

    def obey(self, plan: Plan) -> None:
        for action in plan.actions:
            if action.node not in self.nodes:
                continue
            if action.kind == "stop":
                self.replicas.pop(action.replica_id, None)
                continue
            if action.kind == "adapters":  # an obedient engine: each adapter listed once asked
                if (obs := self.replicas.get(action.replica_id)) is not None:
                    self.replicas[action.replica_id] = replace(obs, adapters={n: "loaded" for n in action.adapters})
                continue
            state = self.outcome(action)
            if state is None:
                continue
            url = f"http://{action.node}:{40000 + zlib.crc32(action.replica_id.encode()) % 1000}"
            self.replicas[action.replica_id] = ReplicaObs(
                action.replica_id,
                str(action.model.get("name", "")),
                action.node,
                state,
                url if state == "ready" else "",
                "engine exited with status 1" if state == "failed" else "",
                self.now,
            )

    def tick(self, dt: float = 1.0) -> Plan:
        plan = self.decide()
        self.commit(plan)
        self.obey(plan)
        self.now += dt
        self.passes += 1
        return plan

    def settle(self, max_passes: int = 50, dt: float = 1.0) -> Plan:
        """Tick until a pass is quiet (see `quiet`); return that plan."""
        for _ in range(max_passes):
            plan = self.tick(dt)
            if quiet(plan):
                return plan
        raise AssertionError(f"no fixed point after {max_passes} passes")

    def lose(self, name: str) -> None:
        """The node's stream closes; its replicas are no longer observed."""
        self.nodes.pop(name)
        self.lost[name] = self.now
        self.replicas = {k: v for k, v in self.replicas.items() if v.node != name}


def quiet(plan: Plan) -> bool:
    """Nothing to commit, nothing to tell agents, and no model still on its way.

    A pass that waits out a retry backoff also issues nothing, so "no commands" alone
    is not a fixed point: a model whose view is "starting" has somewhere to go, and so has a
    ready model short of what it wants (a slot waiting out its own backoff, beside ready ones).
    """
    def settled(v: Any) -> bool:
        return v.state != "starting" and (v.ready >= v.desired or v.name in plan.unplaceable
                                          or v.state in ("parked", "unplaceable", "stopped"))

    return not plan.commands and not plan.actions and all(settled(v) for v in plan.views.values())
