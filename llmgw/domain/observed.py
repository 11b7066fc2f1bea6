"""What the leader has observed (agents' inventories, replica states, demand).

Lives in the leader's memory only and is rebuilt when agents reconnect.
Unknown is a value: a node that never reported is absent, not empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from llmgw.domain.activation import Progress
from llmgw.domain.frozen import Doc

REPLICA_STATES = ("starting", "ready", "failed", "stopped", "sleeping")  # sleeping: fast wake (reconcile/sleep.py)
MAX_ADAPTERS = 1024  # LoRA adapters one replica reports


MIG_INDEX_BASE = 1000  # a MIG instance's placement index: 1000 + 100 × card + instance


def mig_index(card: int, instance: int) -> int:
    return MIG_INDEX_BASE + 100 * card + instance


@dataclass(frozen=True)
class Gpu:
    """One placeable device (a whole card, or one MIG instance), or a MIG-mode card itself
    (listed with `placeable=False`: its instances are what placement sees).

    Unknown is None, never 0: `memory_used`, `utilization` (always None on a MIG instance),
    `temperature_c` and `power_w` (a MIG instance carries its parent card's)."""

    index: int  # position in the probe's output; a MIG instance: mig_index(card, instance)
    uuid: str  # GPU-…, or the MIG instance's own UUID (MIG-…)
    name: str
    gpu_class: str  # h100-80g, a100-80g-mig-3g.40gb
    memory_total: int  # bytes
    memory_used: int | None  # None = unknown
    healthy: bool = True
    reason: str = ""  # why it is unhealthy, or why it is not placeable; "" when neither
    placeable: bool = True  # False: a MIG-mode card, one with nothing carved, a mode change pending
    mig_profile: str = ""  # "3g.40gb" on a MIG instance; "" on a whole card
    parent_index: int | None = None  # the card a MIG instance is carved from
    utilization: float | None = None  # percent; None = unknown or a MIG instance
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[int, ...] = ()  # pids using this device (instance-local on MIG)

    @property
    def label(self) -> str:
        """How every view names it: "3", or "0/mig1" for a MIG instance."""
        if self.parent_index is not None and self.index >= MIG_INDEX_BASE:
            return f"{self.parent_index}/mig{(self.index - MIG_INDEX_BASE) % 100}"
        return str(self.index)

    @property
    def usable(self) -> bool:
        """Counts as capacity (used or free): healthy and placeable."""
        return self.healthy and self.placeable

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> Gpu:
        def number(key: str) -> float | None:
            value = d.get(key)
            return None if value is None else float(value)

        used = d.get("memory_used")
        parent = d.get("parent_index")
        return cls(
            index=int(d["index"]),
            uuid=str(d.get("uuid", "")),
            name=str(d.get("name", "")),
            gpu_class=str(d.get("gpu_class", "")),
            memory_total=int(d.get("memory_total", 0)),
            memory_used=None if used is None else int(used),
            healthy=bool(d.get("healthy", True)),
            reason=str(d.get("reason", ""))[:500],
            placeable=bool(d.get("placeable", True)),
            mig_profile=str(d.get("mig_profile", "")),
            parent_index=None if parent is None else int(parent),
            utilization=number("utilization"),
            temperature_c=number("temperature_c"),
            power_w=number("power_w"),
            processes=tuple(int(p) for p in d.get("processes", ())),
        )

    def to_doc(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["processes"] = list(self.processes)
        return doc


@dataclass(frozen=True)
class NodeInfo(Doc):
    """An agent's inventory, as reported over its stream (again whenever it changes)."""

    node: str
    hostname: str = ""
    cpus: int = 0
    memory_total: int = 0
    gpus: tuple[Gpu, ...] = ()
    engines: tuple[str, ...] = ()
    fabric: str = ""
    version: str = ""
    address: str = ""  # where this node's engines listen (the agent's engine host)
    cpu_flags: tuple[str, ...] = ()  # of interest to engines: avx2, avx512f, ...
    engine_versions: Mapping[str, str] = field(default_factory=dict)  # engine -> version ("" unknown)
    probe: str = ""  # how GPUs were found: nvml | nvidia-smi | none ("" = not said)
    warnings: tuple[str, ...] = ()  # states in which nothing can run, said by the probe
    storage: tuple[Mapping[str, Any], ...] = ()  # one report per configured directory (S9)
    # Kept for other work (`llmgw agent --reserve`, llmgw.domain.reserve): placement never uses these devices,
    # this many bytes of the node's memory, nor this many bytes of each GPU's memory.
    reserved_gpus: tuple[int, ...] = ()
    reserved_memory: int = 0
    reserved_vram: int = 0

    def reserved(self, gpu: Gpu) -> bool:
        """Whether the device is kept for other work (then it is neither used, free nor unusable)."""
        return gpu.index in self.reserved_gpus

    def placeable(self, gpu: Gpu) -> bool:
        """Usable and not reserved: capacity placement may take."""
        return gpu.usable and gpu.index not in self.reserved_gpus

    @property
    def placeable_memory(self) -> int:
        """The node's memory less its reserve (0: unknown, as `memory_total`)."""
        if not self.memory_total:
            return 0
        return max(self.memory_total - self.reserved_memory, 1)

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> NodeInfo:
        return cls(
            node=str(d["node"]),
            hostname=str(d.get("hostname", "")),
            cpus=int(d.get("cpus", 0)),
            memory_total=int(d.get("memory_total", 0)),
            gpus=tuple(Gpu.from_doc(g) for g in d.get("gpus", ())),
            engines=tuple(str(e) for e in d.get("engines", ())),
            fabric=str(d.get("fabric", "")),
            version=str(d.get("version", "")),
            address=str(d.get("address", "")),
            cpu_flags=tuple(str(f) for f in d.get("cpu_flags", ())),
            engine_versions={str(k): str(v) for k, v in dict(d.get("engine_versions", {})).items()},
            probe=str(d.get("probe", "")),
            warnings=tuple(str(w) for w in d.get("warnings", ())),
            storage=tuple(dict(s) for s in d.get("storage", ())),
            reserved_gpus=tuple(int(i) for i in d.get("reserved_gpus", ())),
            reserved_memory=max(int(d.get("reserved_memory", 0)), 0),
            reserved_vram=max(int(d.get("reserved_vram", 0)), 0),
        )


@dataclass(frozen=True)
class ReplicaObs:
    """An agent's word on one replica it runs (or ran)."""

    replica_id: str
    model: str
    node: str
    state: str  # one of REPLICA_STATES
    url: str = ""  # base URL of the engine, e.g. http://127.0.0.1:40123
    error: str = ""
    since: float = 0.0
    # A failed replica that had served: how long it was ready before it failed, in seconds (on its agent's
    # clock). None: it never served, or an agent that does not say. A flap when under `stable_ready_s`.
    ready_s: float | None = None
    # While starting: "starting" (the agent prepares the engine) or "loading" (its process loads the
    # checkpoint); "" from an agent that does not say (llmgw.domain.activation has the phases).
    phase: str = ""
    weights_bytes: int | None = None  # the checkpoint's size on disk, once the agent has resolved it
    # While `fetching` (a `mirror://` source copied into the node's mirror cache): the bytes it holds so far (of
    # `weights_bytes`), and by when, in seconds from `since`, the copy should end at the rate it goes (None: unknown).
    bytes_done: int | None = None
    fetch_expected_s: float | None = None
    # The LoRA adapters control asked this replica to load: name -> "loading", "loaded" (its engine lists it),
    # or "failed: why". Empty: none asked (or an agent that predates adapters).
    adapters: Mapping[str, str] = field(default_factory=dict)
    # A loaded adapter's id in its engine, where requests name it by id (llama.cpp's `lora` field): name -> id.
    adapter_ids: Mapping[str, int] = field(default_factory=dict)
    # How many adapters its engine lists (llama.cpp: those it loaded at launch, ids 0..n-1); 0: none, or unknown.
    loras: int = 0
    # Whether its engine turns a request's `tools` into tool calls: llama.cpp's `GET /props` says so of its chat
    # template (`chat_template_caps.supports_tool_calls`), read once it is ready. None: unknown (another engine,
    # /props unanswered, an agent that predates it).
    tool_calls: bool | None = None

    def adapter(self, name: str) -> str:
        """The adapter's state on this replica ("" when it was not asked to load it)."""
        return self.adapters.get(name, "")

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], node: str) -> ReplicaObs:
        state = str(d.get("state", ""))
        if state not in REPLICA_STATES:
            raise ValueError(f"unknown replica state {state!r}")
        adapters = d.get("adapters") or {}
        if not isinstance(adapters, Mapping) or len(adapters) > MAX_ADAPTERS:
            raise ValueError(f"adapters must be an object of at most {MAX_ADAPTERS} names")
        size = d.get("weights_bytes")
        return cls(
            replica_id=str(d["replica_id"]),
            model=str(d.get("model", "")),
            node=node,
            state=state,
            url=str(d.get("url", "")),
            error=str(d.get("error", ""))[:2000],
            since=float(d.get("since", 0.0)),
            ready_s=_seconds(d.get("ready_s")),
            phase=str(d.get("phase", ""))[:32],
            weights_bytes=size if type(size) is int and size >= 0 else None,
            bytes_done=done if type(done := d.get("bytes_done")) is int and done >= 0 else None,
            fetch_expected_s=_seconds(d.get("fetch_expected_s")),
            adapters={str(k)[:128]: str(v)[:500] for k, v in adapters.items()},
            adapter_ids=_ids(d.get("adapter_ids")),
            loras=loras if type(loras := d.get("loras")) is int and 0 <= loras <= MAX_ADAPTERS else 0,
            tool_calls=tools if type(tools := d.get("tool_calls")) is bool else None,
        )

    def to_doc(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["adapters"] = dict(self.adapters)  # a leader that predates adapters ignores the key
        doc["adapter_ids"] = dict(self.adapter_ids)
        return doc


def _seconds(value: Any) -> float | None:
    """A count of seconds from an agent's report (a sane, finite one), else None."""
    if type(value) not in (int, float) or not 0 <= value < 1e9:
        return None
    return float(value)


def _ids(value: Any) -> dict[str, int]:
    if not value:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_ADAPTERS:
        raise ValueError(f"adapter_ids must be an object of at most {MAX_ADAPTERS} names")
    return {str(k)[:128]: v for k, v in value.items() if type(v) is int and 0 <= v < 1 << 16}


@dataclass(frozen=True)
class Observed:
    """The leader's view now. `since` is when it took office: nodes never seen count as gone since
    then, and demand is heard only since then, so a model absent from `demand` is unknown (not
    idle) until a whole idle timeout has passed after `since` (see `llmgw.reconcile.demand`)."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)  # connected agents only
    replicas: dict[str, ReplicaObs] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)  # model -> last time a request asked for it
    lost: dict[str, float] = field(default_factory=dict)  # node -> when its stream closed
    since: float = 0.0  # when this observer started (took office)
    # Load, summed over every router that reports: requests in flight to a model's replicas or
    # waiting for one, now; and the most at once over the last `scale_down_delay_s`. Absent = none.
    outstanding: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    # Models this leader evicted to make room for another: model -> (when, why). Such a model
    # wants nothing until a request newer than its eviction asks for it again.
    evicted: dict[str, tuple[float, str]] = field(default_factory=dict)
    # Judge models' last failure to answer, as gateways reported it: model -> (when, what happened).
    judge_failures: dict[str, tuple[float, str]] = field(default_factory=dict)
    # Restarts of each model's replicas (failed starts and crashes this leader counted) within
    # `restart_window_s`, as their times: a restart storm shows even beside a ready replica.
    restarts: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # The header facts of model sources the leader could open where it runs (`pkg://`, a local path), by
    # source, as a storage report entry gives them: a memory estimate for weights no node reports
    # (llmgw/control/source_facts.py).
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)

    def gone_since(self, node: str) -> float:
        return self.lost.get(node, self.since)


# --- what the control plane tells routers -----------------------------------

ROUTE_STATES = ("ready", "starting", "unplaceable", "parked", "stopped", "absent")


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    url: str  # engine base URL, no trailing slash
    node: str = ""  # the node it runs on (for the request log)
    # The LoRA adapters its engine holds when requests must set each one's scale (llama.cpp keeps a request's
    # scales for the next ones on its slot): ids 0..loras-1, each sent at scale 0 but the adapter asked for.
    loras: int = 0
    # Whether its engine makes tool calls of a request's `tools` (ReplicaObs.tool_calls); None: unknown.
    tool_calls: bool | None = None


@dataclass(frozen=True)
class ModelRoute:
    """One model as a router sees it: ready endpoints, or why there are none."""

    model: str
    role: str
    state: str  # one of ROUTE_STATES
    endpoints: tuple[Endpoint, ...] = ()
    reason: str = ""  # words for the client when state is unplaceable/parked/stopped
    # How far its activation has come while it has no ready replica (None: nothing is starting or known).
    activation: Progress | None = None
    # The activation window in force when longer than the definition's (its checkpoint's size at the
    # nominal load rate, llmgw.domain.activation.window_s); 0: the definition's own.
    window_s: float = 0.0
    base: str = ""  # a LoRA adapter's base model: its endpoints are the base's replicas that list it loaded
    # Where the engine names adapters by id (llama.cpp's request field `lora`): the adapter's id on every one of
    # these endpoints (the route holds only replicas where it has this id); None: by its name (vLLM, sim).
    lora_id: int | None = None
    # A schedule rule holds the model at 0 replicas (state absent): until when (unix seconds; 0.0: no end found
    # within the search bound); None: no rule does. Requests are refused at once (`model_scheduled_off`), not
    # held for an activation that the rule forbids.
    off_until: float | None = None


@dataclass(frozen=True)
class BreakerSeen:
    """A replica a gateway's circuit breaker keeps out of rotation (gateway/breaker.py), as control shows it:
    which gateway (its name; "local" for the one inside a control plane), why, since when (unix time)."""

    model: str
    replica_id: str
    gateway: str
    reason: str
    since: float
    half_open: bool = False  # a probe is in flight

    def to_doc(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "gateway": self.gateway, "reason": self.reason,
                "since": round(self.since, 3), "half_open": self.half_open}
