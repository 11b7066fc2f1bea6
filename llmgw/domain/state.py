"""`ClusterState`: the durable facts replicated by Raft, as one immutable value.

Nothing here is mutated after construction; `apply` builds the next state.
Its mappings are read-only all the way down, so no reader of a snapshot can
make this member's state diverge from the others'. What agents observe second
by second is not here (see `domain.observed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from types import MappingProxyType
from typing import Any, Iterable

from llmgw.domain.active_conditions import ActiveCondition
from llmgw.domain.frozen import freeze, thaw
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.keys import legacy_key_id
from llmgw.domain.mirror import MirrorFile
from llmgw.domain.model import ModelDef
from llmgw.domain.trust import Authority, JoinToken, MachineCert, Revocation
from llmgw.domain.usage import UsageHour, UsageMark


@dataclass(frozen=True)
class ApiKey:
    """A key as stored: its hash, never the key (docs/api.md, "Keys"). The fields after
    `created_at` came with scopes and limits; a key stored before reads as unscoped,
    unlimited, never expiring, with an id derived from its hash."""

    key_hash: str
    name: str
    role: str  # "admin" | "client" | "viewer" (the console only: sees, cannot act)
    created_at: float
    key_id: str = ""  # the public id (`key_...`); "" for a key stored before ids: see `id`
    models: tuple[str, ...] = ()  # the model names it may use; () = every model
    expires_at: float | None = None  # unix time; None = never
    requests_per_min: int | None = None  # None = no limit
    tokens_per_min: int | None = None
    priority: str = "default"  # its requests' class when a replica's slots are full (llmgw/domain/priority.py)

    @property
    def id(self) -> str:
        return self.key_id or legacy_key_id(self.key_hash)

    @cached_property
    def scope(self) -> frozenset[str] | None:
        """`models` as a set (None: every model), so the gateway's check costs the same for any scope."""
        return frozenset(self.models) if self.models else None


@dataclass(frozen=True)
class Placement:
    """A replica the cluster has decided to run: which node, which devices."""

    replica_id: str
    model: str
    node: str
    gpus: tuple[int, ...]  # device indexes on the node; () = CPU
    launch_hash: str
    placed_at: float
    # A member of a multi-node replica (a group): its id, this member's rank (0 leads and
    # serves), how many members it has, rank 0's rendezvous "host:port" and this member's
    # own "host:port" in the group (the same port on each member's node). "" / 1: a lone replica.
    group: str = ""
    rank: int = 0
    group_size: int = 1
    leader: str = ""
    address: str = ""
    # Which of the model's replicas this is (0 .. replicas - 1): a failed replica's replacement
    # takes the same slot, so failures and backoff are counted per slot (see `domain.health`).
    # Placements written before slots existed read as slot 0.
    slot: int = 0
    # Asleep (fast wake, `ModelDef.sleep_level`): its engine was told to sleep when its model went idle; it keeps
    # its GPUs but serves nothing, a request wakes it (`placement.sleep` with asleep false), and a model that
    # wants its GPUs evicts it (the placement is removed, the engine stopped).
    asleep: bool = False

    @property
    def serves(self) -> bool:
        """Gets traffic and counts as the replica: a lone replica, or a group's rank 0."""
        return self.rank == 0


@dataclass(frozen=True)
class Strikes:
    """Failed starts in a row of one replica slot (`key` "0", "1", ...) or on one node (`key` its
    name), and the last one's error and time."""

    key: str
    failures_in_row: int
    last_error: str = ""
    last_failure_at: float = 0.0


@dataclass(frozen=True)
class ModelHealth:
    """A model's failed starts in a row, across its replicas (parks it at the limit), and the same
    per replica slot (backoff) and per node (a node that keeps failing it is avoided), by key."""

    failures_in_row: int = 0
    parked: bool = False
    last_error: str = ""
    last_failure_at: float = 0.0
    slots: tuple[Strikes, ...] = ()  # sorted by key; a snapshot written before these reads ()
    nodes: tuple[Strikes, ...] = ()
    # Of the failures in the row, the flaps (replicas that served less than `stable_ready_s`, then
    # failed), and the longest any of them served, in seconds.
    flaps: int = 0
    flap_ready_s: float = 0.0

    def slot(self, slot: int) -> Strikes | None:
        return _find(self.slots, str(slot))

    def node(self, node: str) -> Strikes | None:
        return _find(self.nodes, node)


def _find(strikes: tuple[Strikes, ...], key: str) -> Strikes | None:
    for s in strikes:
        if s.key == key:
            return s
    return None


@dataclass(frozen=True)
class Outcome:
    """What one committed command did: its result, or the refusal it became.

    Kept in the state for a command that carries an idempotency id (`cid`), so a
    retry of it is answered from here instead of being applied again; `digest`
    fingerprints the command (without its time and id), so the same id sent with
    a different command is told apart. `result` is a frozen JSON value."""

    revision: int  # the state's revision once this command was applied
    ok: bool
    result: Any = None
    code: str = ""  # a refusal's code and words ("" when ok)
    message: str = ""
    digest: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", freeze(self.result))

    def plain_result(self) -> Any:
        """The result as plain lists and dicts, ready for `json.dumps`."""
        return thaw(self.result)

    # pickle cannot write the frozen result (a MappingProxyType): it travels thawed.
    def __getstate__(self) -> dict[str, Any]:
        return {f.name: thaw(getattr(self, f.name)) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, state.get(f.name, f.default))
        self.__post_init__()


@dataclass(frozen=True)
class Refusal:
    """A committed command that did not apply (the state had moved under it): kept, bounded,
    so every refusal in the log has its reason in the state."""

    revision: int
    op: str
    code: str
    message: str
    at: float = 0.0
    cid: str = ""


@dataclass(frozen=True)
class Member:
    """A control plane as it announced itself (`member.announce`): its Raft address, which is its
    id in the group, and the admin URL the other members forward writes and reads to."""

    raft_addr: str
    admin_url: str
    version: str = ""
    announced_at: float = 0.0
    level: int = 0  # the store level its release reads (`llmgw.domain.levels`); 0: announced none


# The mappings whose values are frozen dataclasses; `settings` holds JSON values, frozen deeply.
_MAPPINGS = ("models", "keys", "placements", "health", "members", "usage", "usage_marks", "guard_policies",
             "authorities", "join_tokens", "machines", "revoked", "mirror", "approved_nodes",
             "active_conditions", "cordoned_nodes")


def _empty() -> MappingProxyType[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ClusterState:
    """Every mapping is read-only, so is every value in it. Build the next state with
    `dataclasses.replace(state, models=MappingProxyType(new_dict))` over a dict no one
    else holds; a plain dict given instead (pickle does) is copied, then wrapped."""

    revision: int = 0  # count of applied commands; a read after a write sees >= its revision
    models: MappingProxyType[str, ModelDef] = field(default_factory=_empty)
    settings: MappingProxyType[str, Any] = field(default_factory=_empty)  # lists are tuples, objects read-only
    keys: MappingProxyType[str, ApiKey] = field(default_factory=_empty)
    placements: MappingProxyType[str, Placement] = field(default_factory=_empty)
    health: MappingProxyType[str, ModelHealth] = field(default_factory=_empty)
    next_replica: int = 1
    # Outcomes of commands with an idempotency id, oldest chunk first: each chunk is a read-only
    # mapping cid -> Outcome. Chunks bound the cost of a command (it copies the newest chunk,
    # never all ids); the oldest chunk is dropped whole (see `commands.OUTCOME_CHUNKS`).
    outcomes: tuple[MappingProxyType[str, Outcome], ...] = ()
    refusals: tuple[Refusal, ...] = ()  # the newest last; bounded (`commands.KEEP_REFUSALS`)
    # Control planes by Raft address, as each announced itself. Who is in the Raft group is Raft's
    # own configuration; this maps its addresses to admin URLs (a removed member is forgotten).
    members: MappingProxyType[str, Member] = field(default_factory=_empty)
    # Usage rollups by hour (`str(start)`), and the newest batch applied per gateway process
    # ("gateway/boot"): see `domain.usage`. Bounded by `usage.retention_days`.
    usage: MappingProxyType[str, UsageHour] = field(default_factory=_empty)
    usage_marks: MappingProxyType[str, UsageMark] = field(default_factory=_empty)
    # Guardrail policies by name (`guard.set`, `guard.remove`; domain/guard.py, domain/commands/guard.py).
    guard_policies: MappingProxyType[str, GuardPolicy] = field(default_factory=_empty)
    # Trust between machines (domain/trust.py): intermediate CAs by id, join tokens by hash, machines'
    # certificates by `role/name`, revoked serials.
    authorities: MappingProxyType[str, Authority] = field(default_factory=_empty)
    join_tokens: MappingProxyType[str, JoinToken] = field(default_factory=_empty)
    machines: MappingProxyType[str, MachineCert] = field(default_factory=_empty)
    revoked: MappingProxyType[str, Revocation] = field(default_factory=_empty)
    # When the group began to require TLS between its members (`trust.raft_tls`: every member held a
    # control certificate); 0: not yet, sealed-only connections are still taken. Never goes back.
    raft_tls_since: float = 0.0
    # The store level the group writes at (`llmgw.domain.levels`; `cluster.level`, raised by the leader once
    # every member announced at least it). Never goes back.
    store_level: int = 1
    # The model mirror's catalog by name (domain/mirror.py; `mirror.put`, `mirror.remove`, `mirror.pin`): each file's
    # blob sha256, size, kind and header facts. The blobs themselves are on each control plane's disk (llmgw/mirror/).
    mirror: MappingProxyType[str, MirrorFile] = field(default_factory=_empty)
    # Nodes an operator approved (`node.approve`; `ctl nodes approve`), by name -> when. While the setting
    # `nodes.require_approval` is on, a node not here is pending: it connects and reports, nothing is placed on it.
    approved_nodes: MappingProxyType[str, float] = field(default_factory=_empty)
    # The conditions the leader posted as started and not yet as resolved (`condition.update`;
    # domain/active_conditions.py), by `kind:subject`: a new leader posts their "resolved", never their "started" again.
    active_conditions: MappingProxyType[str, ActiveCondition] = field(default_factory=_empty)
    # Nodes under maintenance (`node.cordon`; `ctl nodes cordon|drain|uncordon`), by name -> "cordon" (nothing new
    # is placed there) or "drain" (also: its replicas move elsewhere, one at a time; reconcile/drain.py).
    cordoned_nodes: MappingProxyType[str, str] = field(default_factory=_empty)

    def __post_init__(self) -> None:
        # A read-only mapping is kept as is: `replace` passes the unchanged fields on, and
        # copying them for every command would make `apply` O(state) in each of them.
        for name in _MAPPINGS:
            value = getattr(self, name)
            if type(value) is not MappingProxyType:
                object.__setattr__(self, name, MappingProxyType(dict(value)))
        if type(self.settings) is not MappingProxyType:
            object.__setattr__(self, "settings", freeze(self.settings))
        chunks = self.outcomes
        if type(chunks) is not tuple or not all(type(c) is MappingProxyType for c in chunks):
            object.__setattr__(self, "outcomes", tuple(MappingProxyType(dict(c)) for c in chunks))
        if type(self.refusals) is not tuple:
            object.__setattr__(self, "refusals", tuple(self.refusals))

    # pysyncobj pickles this value into its snapshot file, and pickle cannot write a
    # MappingProxyType. The pickled form is the plain dicts it was before the state was
    # read-only: older snapshot files still load (frozen on the way in), and vice versa.
    def __getstate__(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _MAPPINGS:
            state[name] = state[name].copy()  # a plain dict (`dict(proxy)` is the slow way)
        state["settings"] = thaw(self.settings)
        state["outcomes"] = [c.copy() for c in self.outcomes]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        empty = ClusterState()  # a field the file lacks takes its default
        for f in fields(self):
            object.__setattr__(self, f.name, state.get(f.name, getattr(empty, f.name)))
        self.__post_init__()

    def outcome(self, cid: str) -> Outcome | None:
        """The recorded outcome of the command with this idempotency id, if it is still kept."""
        for chunk in reversed(self.outcomes):
            found = chunk.get(cid)
            if found is not None:
                return found
        return None

    def pending_nodes(self, nodes: Iterable[str]) -> frozenset[str]:
        """Of `nodes`, those waiting for an operator's approval: none unless the setting
        `nodes.require_approval` is on; then each not in `approved_nodes` (docs/security.md, "Approving nodes")."""
        if self.settings.get("nodes.require_approval") is not True:
            return frozenset()
        return frozenset(n for n in nodes if n not in self.approved_nodes)

    def model_health(self, name: str) -> ModelHealth:
        return self.health.get(name, ModelHealth())

    def placements_of(self, model: str) -> list[Placement]:
        return sorted(
            (p for p in self.placements.values() if p.model == model),
            key=lambda p: (p.placed_at, p.replica_id),
        )

    def key_role(self, key_hash: str) -> str | None:
        k = self.keys.get(key_hash)
        return k.role if k else None
