"""The agent ↔ control stream's messages, one typed value per message type, both ways.

`read_up` (agent → control) and `read_down` (control → agent) check a decoded message against
its type's schema and return the typed value, `Unknown` for a type this side does not know
(a newer peer: ignored), or raise `ProtocolError` whose reason names the field.

Up: hello, inventory (again whenever it changes), replicas (the full list, on every change),
renew (a certificate request, at two thirds of its certificate's life), heartbeat, rejected. Down:
welcome, start_replica, stop_replica, load_adapters (a replica's LoRA adapters), sleep_replica and wake_replica (fast
wake), restart_agent, upgrade_agent, certificate (the renewed one, with the trust bundle), refused
(not the leader, or stepped down), heartbeat, rejected. `rejected` answers a malformed message of a known type
(`message_type`, `reason`, `replica_id` when one was readable); the stream goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Union

from llmgw.domain.model import DefinitionError, ModelDef, check_adapter_source
from llmgw.domain.observed import MAX_ADAPTERS, REPLICA_STATES, NodeInfo, ReplicaObs
from llmgw.wire.protocol import ProtocolError

# Replica ids (`<model>-r<n>`) and node names: no slash, no leading dot, nothing a shell or a path
# would read specially. Anything else is refused before it reaches the supervisor.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
MAX_REASON_CHARS = 2000
SHA256 = re.compile(r"[0-9a-f]{64}")  # a release file's hash (llmgw/release.py)


@dataclass(frozen=True)
class Unknown:
    type: str


@dataclass(frozen=True)
class Heartbeat:
    pass


@dataclass(frozen=True)
class Rejected:
    message_type: str
    reason: str
    replica_id: str | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"type": "rejected", "message_type": self.message_type, "reason": self.reason,
                "replica_id": self.replica_id}


# --- up: agent → control ---------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    protocol: int
    node: str
    version: str
    # The sha256 of the release file the agent runs (llmgw/release.py), or None with why (`release_reason`):
    # what `ctl upgrade` judges a node's release by. Optional: an older agent says neither.
    release_sha256: str | None = None
    release_reason: str = ""


@dataclass(frozen=True)
class Inventory:
    inventory: NodeInfo


@dataclass(frozen=True)
class Replicas:
    replicas: tuple[ReplicaObs, ...]


@dataclass(frozen=True)
class Renew:
    csr: str  # PEM


# --- down: control → agent -------------------------------------------------------------------


@dataclass(frozen=True)
class Certificate:
    certificate: str  # PEM: the machine's, then its intermediate
    ca: str  # PEM: the bundle the machine trusts


@dataclass(frozen=True)
class Welcome:
    node: str
    leader: str


@dataclass(frozen=True)
class GroupSpec:
    """This node's part in a replica spread over several nodes."""

    rank: int  # 0 serves; the others join it
    size: int  # ranks in all, >= 2
    leader: str  # "host:port" of rank 0's rendezvous
    members: tuple[str, ...] = ()  # rank 0's: "host:port" of each other rank, in rank order
    address: str | None = None  # "host:port" of this rank in the group, when control says


@dataclass(frozen=True)
class MirrorSource:
    """Where an agent fetches a `mirror://NAME` source (the model mirror, docs/mirror.md): the file's sha256 and
    size, and the blob URLs of the control planes holding it, the leader's first (each answers `GET` with
    HTTP range requests, to machines of the cluster only)."""

    name: str
    sha256: str
    size: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class StartReplica:
    replica_id: str
    model: dict[str, Any]  # a definition ModelDef.from_doc accepts
    gpus: tuple[int, ...]
    group: GroupSpec | None = None
    mirror: MirrorSource | None = None  # the model's source is `mirror://NAME`: where to fetch it


@dataclass(frozen=True)
class StopReplica:
    replica_id: str


@dataclass(frozen=True)
class SleepReplica:
    """Fast wake: put a ready replica's engine to sleep at `level` (1: weights to CPU RAM, 2: discarded); it
    is reported `sleeping` and serves nothing until `WakeReplica`."""

    replica_id: str
    level: int


@dataclass(frozen=True)
class WakeReplica:
    """Fast wake: wake a sleeping replica's engine; it is reported starting (phase `waking`), then ready."""

    replica_id: str


@dataclass(frozen=True)
class LoadAdapters:
    """The LoRA adapters a replica's engine should have loaded (the whole set, name -> source): the agent loads
    the missing ones, unloads the others, and reports each as loaded only once its engine lists it."""

    replica_id: str
    adapters: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RestartAgent:
    """Control asks the agent to restart itself (`ctl nodes restart`): it ends its stream, leaves its
    engines running, and runs again as the same process (same pid, same flags), adopting them."""

    reason: str


@dataclass(frozen=True)
class UpgradeAgent:
    """Control asks the agent to upgrade (`ctl upgrade`): fetch the release `sha256` from the control it is
    connected to, write it beside the file it runs, and restart into it as `RestartAgent` does; or, with
    `rollback`, restart into the file it ran before. A refusal comes back as `rejected` with the reason."""

    sha256: str | None
    rollback: bool


@dataclass(frozen=True)
class Refused:
    reason: str
    leader: str | None = None
    leader_url: str | None = None


UpMessage = Union[Hello, Inventory, Replicas, Renew, Heartbeat, Rejected, Unknown]
DownMessage = Union[Welcome, StartReplica, StopReplica, SleepReplica, WakeReplica, LoadAdapters, RestartAgent, UpgradeAgent, Certificate, Refused, Heartbeat,
                    Rejected, Unknown]
PEM_MAX_CHARS = 20_000


def read_up(message: Mapping[str, Any], node: str) -> UpMessage:
    """An agent's message, checked; `node` is the name its hello gave (inventories and replicas
    are that node's, whatever they say)."""
    kind = _type(message)
    if kind == "hello":
        version = message.get("version", "")  # optional: said for `ctl nodes`, never relied on
        if not isinstance(version, str):
            raise ProtocolError(f"hello.version: must be a string, not {type(version).__name__}")
        sha, why = message.get("release_sha256"), message.get("release_reason", "")
        if sha is not None and not (isinstance(sha, str) and SHA256.fullmatch(sha)):
            raise ProtocolError("hello.release_sha256: must be a file's sha256 (64 lowercase hex digits) or null")
        if not isinstance(why, str):
            raise ProtocolError(f"hello.release_reason: must be a string, not {type(why).__name__}")
        return Hello(_int(message, "protocol", kind), _id(message, "node", kind), version, sha,
                     why[:MAX_REASON_CHARS])
    if kind == "inventory":
        return Inventory(_inventory(message.get("inventory"), node))
    if kind == "replicas":
        return Replicas(_replicas(message.get("replicas"), node))
    if kind == "renew":
        return Renew(_pem(message, "csr", kind))
    if kind == "heartbeat":
        return Heartbeat()
    if kind == "rejected":
        return _rejected(message)
    return Unknown(kind)


def read_down(message: Mapping[str, Any]) -> DownMessage:
    """Control's message, checked."""
    kind = _type(message)
    if kind == "welcome":
        return Welcome(_str(message, "node", kind), _str(message, "leader", kind))
    if kind == "start_replica":
        model = message.get("model")
        if not isinstance(model, dict):
            raise ProtocolError(f"{kind}.model: {_missing_or('an object', model)}")
        try:
            ModelDef.from_doc(model)
        except DefinitionError as e:
            raise ProtocolError(f"{kind}.model: not a valid definition: {e}") from None
        return StartReplica(_id(message, "replica_id", kind), dict(model), _gpus(message.get("gpus"), kind),
                            _group(message.get("group"), kind), _mirror(message.get("mirror"), kind))
    if kind == "stop_replica":
        return StopReplica(_id(message, "replica_id", kind))
    if kind == "sleep_replica":
        level = message.get("level")
        if not _is_int(level) or level not in (1, 2):
            raise ProtocolError(f"{kind}.level: must be 1 or 2")
        return SleepReplica(_id(message, "replica_id", kind), level)
    if kind == "wake_replica":
        return WakeReplica(_id(message, "replica_id", kind))
    if kind == "load_adapters":
        return LoadAdapters(_id(message, "replica_id", kind), _adapters(message.get("adapters"), kind))
    if kind == "certificate":
        return Certificate(_pem(message, "certificate", kind), _pem(message, "ca", kind))
    if kind == "restart_agent":
        return RestartAgent(str(message.get("reason", ""))[:MAX_REASON_CHARS])
    if kind == "upgrade_agent":
        sha, rollback = message.get("sha256"), message.get("rollback", False)
        if not isinstance(rollback, bool) or (sha is None) != rollback:
            raise ProtocolError(f"{kind}: give either sha256 or rollback: true")
        if sha is not None and not (isinstance(sha, str) and SHA256.fullmatch(sha)):
            raise ProtocolError(f"{kind}.sha256: must be a file's sha256 (64 lowercase hex digits)")
        return UpgradeAgent(sha, rollback)
    if kind == "refused":
        return Refused(str(message.get("reason", ""))[:MAX_REASON_CHARS], _opt_str(message.get("leader")),
                       _opt_str(message.get("leader_url")))
    if kind == "heartbeat":
        return Heartbeat()
    if kind == "rejected":
        return _rejected(message)
    return Unknown(kind)


def replica_id_of(message: Mapping[str, Any]) -> str | None:
    """The message's replica id if it is a valid one (for a `rejected` answer), else None."""
    rid = message.get("replica_id")
    return rid if isinstance(rid, str) and ID_RE.fullmatch(rid) else None


# --- checks ------------------------------------------------------------------------------------


def _pem(message: Mapping[str, Any], key: str, kind: str) -> str:
    value = message.get(key)
    if not isinstance(value, str) or "-----BEGIN " not in value or len(value) > PEM_MAX_CHARS:
        raise ProtocolError(f"{kind}.{key}: {_missing_or('PEM text', value)}")
    return value


def _type(message: Mapping[str, Any]) -> str:
    kind = message.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("type: a message is an object with a string 'type'")
    return kind


def _missing_or(what: str, value: Any) -> str:
    return "missing" if value is None else f"must be {what}, not {type(value).__name__}"


def _str(message: Mapping[str, Any], key: str, kind: str) -> str:
    value = message.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"{kind}.{key}: {_missing_or('a string', value)}")
    return value


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(message: Mapping[str, Any], key: str, kind: str) -> int:
    value = message.get(key)
    if not _is_int(value):
        raise ProtocolError(f"{kind}.{key}: {_missing_or('an integer', value)}")
    assert isinstance(value, int)
    return value


def _id(message: Mapping[str, Any], key: str, kind: str) -> str:
    value = _str(message, key, kind)
    if not ID_RE.fullmatch(value):
        raise ProtocolError(f"{kind}.{key}: {value[:80]!r} is not an id (letters, digits, '.', '_', ':', '-'; "
                            f"first a letter or digit; at most 200)")
    return value


def _gpus(value: Any, kind: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ProtocolError(f"{kind}.gpus: must be a list of GPU indexes, not {type(value).__name__}")
    for i, g in enumerate(value):
        if not _is_int(g) or g < 0:
            raise ProtocolError(f"{kind}.gpus[{i}]: must be a GPU index (an integer >= 0), not {g!r}")
    if len(set(value)) != len(value):
        raise ProtocolError(f"{kind}.gpus: {value} names a GPU twice")
    return tuple(value)


def _group(value: Any, kind: str) -> GroupSpec | None:
    if value is None:
        return None
    where = f"{kind}.group"
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: must be an object, not {type(value).__name__}")
    rank, size = _int(value, "rank", where), _int(value, "size", where)
    if size < 2:
        raise ProtocolError(f"{where}.size: a group has 2 nodes or more, not {size}")
    if not 0 <= rank < size:
        raise ProtocolError(f"{where}.rank: must be 0..{size - 1}, not {rank}")
    leader = _host_port(_str(value, "leader", where), f"{where}.leader")
    members = value.get("members", [])
    if not isinstance(members, list):
        raise ProtocolError(f"{where}.members: must be a list of HOST:PORT, not {type(members).__name__}")
    for i, member in enumerate(members):
        _host_port(member, f"{where}.members[{i}]")
    address = value.get("address")
    if address is not None:
        _host_port(address, f"{where}.address")
    return GroupSpec(rank, size, leader, tuple(members), address)


MAX_MIRROR_URLS = 16


def _mirror(value: Any, kind: str) -> MirrorSource | None:
    if value is None:
        return None
    where = f"{kind}.mirror"
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: must be an object, not {type(value).__name__}")
    sha, size, urls = value.get("sha256"), value.get("size"), value.get("urls")
    if not (isinstance(sha, str) and SHA256.fullmatch(sha)):
        raise ProtocolError(f"{where}.sha256: must be a file's sha256 (64 lowercase hex digits)")
    if type(size) is not int or size < 0:
        raise ProtocolError(f"{where}.size: must be a count of bytes")
    if (not isinstance(urls, list) or not 0 < len(urls) <= MAX_MIRROR_URLS
            or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls)):
        raise ProtocolError(f"{where}.urls: must be 1 to {MAX_MIRROR_URLS} http(s) URLs")
    return MirrorSource(_str(value, "name", where), sha, size, tuple(urls))


def _adapters(value: Any, kind: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or len(value) > MAX_ADAPTERS:
        raise ProtocolError(f"{kind}.adapters: must be a list of at most {MAX_ADAPTERS} {{name, source}}")
    found = []
    for i, item in enumerate(value):
        where = f"{kind}.adapters[{i}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{where}: must be an object, not {type(item).__name__}")
        name, source = _id(item, "name", where), _str(item, "source", where)
        try:
            check_adapter_source(source)
        except DefinitionError as e:
            raise ProtocolError(f"{where}.source: {e.message}") from None
        found.append((name, source))
    return tuple(found)


def _host_port(value: Any, where: str) -> str:
    text = value if isinstance(value, str) else ""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProtocolError(f"{where}: {str(value)[:80]!r} is not HOST:PORT")
    return text


def _rejected(message: Mapping[str, Any]) -> Rejected:
    return Rejected(str(message.get("message_type", "?"))[:100], str(message.get("reason", ""))[:MAX_REASON_CHARS],
                    replica_id_of(message))


_INVENTORY_FIELDS: dict[str, tuple[type, ...]] = {
    "hostname": (str,), "cpus": (int,), "memory_total": (int,), "gpus": (list,), "engines": (list,),
    "fabric": (str,), "version": (str,), "address": (str,), "cpu_flags": (list,), "engine_versions": (dict,),
    "probe": (str,), "warnings": (list,), "storage": (list,),
    "reserved_gpus": (list,), "reserved_memory": (int,), "reserved_vram": (int,),  # `llmgw agent --reserve`
}


def _inventory(doc: Any, node: str) -> NodeInfo:
    if not isinstance(doc, dict):
        raise ProtocolError(f"inventory.inventory: {_missing_or('an object', doc)}")
    for key, types in _INVENTORY_FIELDS.items():
        value = doc.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise ProtocolError(f"inventory.{key}: must be {types[0].__name__}, not {type(value).__name__}")
    for name in ("gpus", "storage"):
        for i, item in enumerate(doc.get(name) or ()):
            if not isinstance(item, dict):
                raise ProtocolError(f"inventory.{name}[{i}]: must be an object, not {type(item).__name__}")
    for i, gpu in enumerate(doc.get("gpus") or ()):
        for key in ("index", "memory_total"):
            if key in gpu and not _is_int(gpu[key]):
                raise ProtocolError(f"inventory.gpus[{i}].{key}: must be an integer, not {gpu[key]!r}")
        if "index" not in gpu:
            raise ProtocolError(f"inventory.gpus[{i}].index: missing")
    for i, index in enumerate(doc.get("reserved_gpus") or ()):
        if not _is_int(index):
            raise ProtocolError(f"inventory.reserved_gpus[{i}]: must be an integer, not {index!r}")
    try:
        return NodeInfo.from_doc({**doc, "node": node})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"inventory: unreadable ({type(e).__name__}: {e})") from None


def _replicas(value: Any, node: str) -> tuple[ReplicaObs, ...]:
    if not isinstance(value, list):
        raise ProtocolError(f"replicas.replicas: {_missing_or('a list', value)}")
    out = []
    for i, doc in enumerate(value):
        where = f"replicas[{i}]"
        if not isinstance(doc, dict):
            raise ProtocolError(f"{where}: must be an object, not {type(doc).__name__}")
        _id(doc, "replica_id", where)
        if doc.get("state") not in REPLICA_STATES:
            raise ProtocolError(f"{where}.state: must be one of {', '.join(REPLICA_STATES)}, not {doc.get('state')!r}")
        try:
            out.append(ReplicaObs.from_doc(doc, node))
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"{where}: unreadable ({type(e).__name__}: {e})") from None
    return tuple(out)
