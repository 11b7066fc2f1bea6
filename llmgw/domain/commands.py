"""Versioned commands and the deterministic `apply(state, command) -> (state, result)`.

A command is a JSON object `{"v": 1, "op": ..., "at": <unix time>, ...}`; time
arrives inside it, never from a clock here, so every replica computes the same
state. New operations are added to `_OPS`; the Raft method table never changes.
An optional `cid` (idempotency id) makes a command apply at most once: see `apply_entry`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Sequence, TypeVar

from llmgw.domain import groups, guard_commands, health, keys_commands, usage
from llmgw.domain.frozen import freeze
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.settings import SettingError, effective, validate
from llmgw.domain.state import ClusterState, Member, Outcome, Placement, Refusal

VERSION = 1
CID_MAX_CHARS = 200
# Idempotency ids are remembered in chunks of OUTCOME_CHUNK; past OUTCOME_CHUNKS chunks the
# oldest chunk is dropped whole. So at least the last 10,000 ids are kept (at most 10,250),
# and which ones depends only on the log: every member drops the same ids at the same entry.
OUTCOME_CHUNK = 250
OUTCOME_CHUNKS = 41
KEEP_REFUSALS = 32  # the newest refusals of committed commands kept in the state
MESSAGE_MAX_CHARS = 2000  # a refusal's words, as kept in the state
MEMBER_FIELD_MAX_CHARS = 300  # a member's address, URL or version, as announced


class CommandError(ValueError):
    """A command that cannot apply to this state; the state stays as it was."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def encode(command: dict[str, Any]) -> bytes:
    return json.dumps(command, separators=(",", ":"), sort_keys=True).encode()


def decode(blob: bytes) -> dict[str, Any]:
    """The command in `blob`, refused (CommandError) unless every member would accept its shape:
    the stateless checks run here, before a command enters the log."""
    command = _loads(blob)
    check(command)
    return command


def _loads(blob: bytes) -> dict[str, Any]:
    try:
        command = json.loads(blob)
    except ValueError:
        raise CommandError("bad_command", "a command is a JSON object") from None
    # `type(...) is int`: JSON true and 1.0 equal 1 in Python but are not version 1.
    if not isinstance(command, dict) or type(command.get("v")) is not int or command["v"] != VERSION:
        raise CommandError("bad_command", f"unsupported command version: {command!r:.80}")
    return command


def _name(c: dict[str, Any], key: str) -> str:
    """A string field of a command; anything else is refused, never a TypeError inside apply."""
    value = c.get(key)
    if not isinstance(value, str) or not value:
        raise CommandError("bad_command", f"{key} must be a non-empty string")
    return value


def make(op: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "op": op, "at": at, **fields}


def with_cid(command: dict[str, Any], cid: str) -> dict[str, Any]:
    """The command carrying idempotency id `cid`: committed twice, it applies once."""
    return {**command, "cid": cid}


def digest(command: dict[str, Any]) -> str:
    """A fingerprint of what a command asks, without its time and id: a retry has the same one."""
    fresh = keys_commands.FRESH_FIELDS if command.get("op") == "key.add" else ()
    asked = {k: v for k, v in command.items() if k not in ("at", "cid") and k not in fresh}
    return hashlib.sha256(encode(asked)).hexdigest()[:32]


# --- constructors, so callers never spell op names by hand ------------------


def put_model(model: ModelDef, at: float) -> dict[str, Any]:
    return make("model.put", at, model=model.to_doc())


def remove_model(name: str, at: float) -> dict[str, Any]:
    return make("model.remove", at, name=name)


def retry_model(name: str, at: float) -> dict[str, Any]:
    return make("model.retry", at, name=name)


def put_setting(key: str, value: Any, at: float) -> dict[str, Any]:
    return make("setting.put", at, key=key, value=value)


add_key = keys_commands.add_key  # and its siblings: the key commands live in `keys_commands`
revoke_key = keys_commands.revoke_key


def _slot(slot: int | None) -> dict[str, Any]:
    return {} if slot is None else {"slot": slot}


def add_placement(model: str, node: str, gpus: tuple[int, ...], launch_hash: str, at: float,
                  *, slot: int | None = None) -> dict[str, Any]:
    return make("placement.add", at, model=model, node=node, gpus=list(gpus), launch_hash=launch_hash,
                **_slot(slot))


def add_group(
    model: str, members: Sequence[tuple[str, tuple[int, ...], str]], launch_hash: str, at: float,
    *, slot: int | None = None,
) -> dict[str, Any]:
    """Place one multi-node replica: members (node, gpus, host) in rank order, all or none."""
    docs = [{"node": node, "gpus": list(gpus), "host": host} for node, gpus, host in members]
    return make("placement.add_group", at, model=model, members=docs, launch_hash=launch_hash, **_slot(slot))


def remove_placement(replica_id: str, at: float, *, reason: str = "") -> dict[str, Any]:
    return make("placement.remove", at, replica_id=replica_id, reason=reason)


def start_failed(model: str, replica_id: str, error: str, at: float,
                 *, slot: int | None = None, node: str = "") -> dict[str, Any]:
    """A replica failed to start: counted against the model, and its slot and node when given."""
    where = {**_slot(slot), **({"node": node} if node else {})}
    return make("health.start_failed", at, model=model, replica_id=replica_id, error=error, **where)


def became_ready(model: str, at: float, *, slot: int | None = None, node: str = "",
                 placed_at: float | None = None) -> dict[str, Any]:
    """A replica serves: with its slot (node, placement time) it clears what `health.ready_clears` says."""
    if slot is None:
        return make("health.ready", at, model=model)
    return make("health.ready", at, model=model, slot=slot, node=node, placed_at=placed_at or 0.0)


def announce_member(raft_addr: str, admin_url: str, version: str, at: float) -> dict[str, Any]:
    return make("member.announce", at, raft_addr=raft_addr, admin_url=admin_url, version=version)


def forget_member(raft_addr: str, at: float) -> dict[str, Any]:
    return make("member.forget", at, raft_addr=raft_addr)


# --- apply ------------------------------------------------------------------

_V = TypeVar("_V")


def _readonly(mapping: dict[str, _V]) -> MappingProxyType[str, _V]:
    """A dict built here and kept by no one, handed to the next state read-only.

    Copy a state's mapping with `.copy()` or `|`, not `{**m}` or `dict(m)`: those take
    a slow path on a `MappingProxyType`, ten times slower than on a dict."""
    return MappingProxyType(mapping)


def check(command: dict[str, Any]) -> None:
    """The stateless checks: a known operation, a valid time and id, well-formed fields.

    Raises CommandError. Needs no state, so it runs before a command enters the log."""
    op = command.get("op")
    entry = _OPS.get(op) if isinstance(op, str) else None
    if entry is None:
        raise CommandError("bad_command", f"unknown operation {op!r}")
    at = command.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise CommandError("bad_command", "command has no valid time")
    cid = command.get("cid")
    if cid is not None and not (isinstance(cid, str) and 0 < len(cid) <= CID_MAX_CHARS):
        raise CommandError("bad_command", f"cid must be a string of 1..{CID_MAX_CHARS} characters")
    entry[0](command)


def apply(state: ClusterState, command: dict[str, Any]) -> tuple[ClusterState, Any]:
    """Apply one command. Raises CommandError (state unchanged) when it does not apply.

    Ignores `cid`: what was already applied is `apply_entry`'s business."""
    check(command)
    return _change(state, command)


def _change(state: ClusterState, command: dict[str, Any]) -> tuple[ClusterState, Any]:
    """`apply` after `check` passed."""
    new_state, result = _OPS[command["op"]][1](state, command, float(command["at"]))
    return replace(new_state, revision=state.revision + 1), result


def replay(state: ClusterState, command: dict[str, Any]) -> Outcome | None:
    """The recorded outcome of this command's id: None when it has no id, or the id is not known.

    Raises CommandError `idempotency_key_reused` when the id was used for a different command."""
    cid = command.get("cid")
    if not isinstance(cid, str):
        return None
    recorded = state.outcome(cid)
    if recorded is not None and recorded.digest != digest(command):
        raise CommandError(
            "idempotency_key_reused",
            f"this idempotency key was already used (at revision {recorded.revision}) for a different request;"
            " send a new key for a new request",
        )
    return recorded


def apply_entry(state: ClusterState, entry: bytes | dict[str, Any]) -> tuple[ClusterState, Outcome]:
    """Apply one committed log entry (a blob or a decoded command). Total: never raises.

    - a command whose `cid` was already applied changes nothing, revision included, and
      returns the recorded outcome;
    - a command that does not apply to this state (it moved since the command was checked,
      or the entry is damaged) becomes a no-op: the revision advances, the refusal is kept
      in `refusals` (the newest KEEP_REFUSALS) and, with a `cid`, as that id's outcome;
    - otherwise as `apply`, and with a `cid` its outcome is remembered (OUTCOME_CHUNK...).
    """
    command: dict[str, Any] | None = entry if isinstance(entry, dict) else None
    cid = ""
    fingerprint = ""
    reused = False
    try:
        if command is None:
            assert isinstance(entry, bytes)
            command = _loads(entry)
        # The id first: a retried command the checks refuse gets that refusal back, not a second one.
        raw_cid = command.get("cid")
        if isinstance(raw_cid, str) and 0 < len(raw_cid) <= CID_MAX_CHARS:
            cid = raw_cid
            fingerprint = digest(command)
            try:
                recorded = replay(state, command)
            except CommandError:
                reused = True
                raise
            if recorded is not None:
                return state, recorded
        check(command)
        new_state, result = _change(state, command)
        outcome = Outcome(new_state.revision, True, result, digest=fingerprint)
        return (_remember(new_state, cid, outcome) if cid else new_state), outcome
    except CommandError as e:
        code, message = e.code, e.message
    except Exception as e:  # a bug: the same on every member, so it is recorded like a refusal
        code, message = "apply_failed", f"{type(e).__name__}: {e}"
    message = message[:MESSAGE_MAX_CHARS]
    revision = state.revision + 1
    outcome = Outcome(revision, False, None, code, message, fingerprint)
    op = command.get("op") if command is not None else None
    at = command.get("at") if command is not None else None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        at = 0.0
    refusal = Refusal(revision, op if isinstance(op, str) else "", code, message, float(at), cid)
    refused = replace(state, revision=revision, refusals=(*state.refusals, refusal)[-KEEP_REFUSALS:])
    if cid and not reused:  # a reused key keeps the outcome of the command it was first used for
        refused = _remember(refused, cid, outcome)
    return refused, outcome


def result_of(outcome: Outcome) -> Any:
    """What the submitter gets: the plain result, or the refusal raised as CommandError."""
    if not outcome.ok:
        raise CommandError(outcome.code, outcome.message)
    return outcome.plain_result()


def _remember(state: ClusterState, cid: str, outcome: Outcome) -> ClusterState:
    chunks = state.outcomes
    if chunks and len(chunks[-1]) < OUTCOME_CHUNK:
        chunks = (*chunks[:-1], _readonly(chunks[-1] | {cid: outcome}))
    else:
        chunks = (*chunks, _readonly({cid: outcome}))[-OUTCOME_CHUNKS:]
    return replace(state, outcomes=chunks)


# --- the operations: a stateless check, then the change --------------------------------


def _parse_model(c: dict[str, Any]) -> ModelDef:
    try:
        return ModelDef.from_doc(c.get("model"))
    except DefinitionError as e:
        raise CommandError("invalid_model", str(e)) from None


def _check_model_put(c: dict[str, Any]) -> None:
    _parse_model(c)


def _model_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model = _parse_model(c)
    health = s.health.copy()
    old = s.models.get(model.name)
    if old is not None and old.launch_hash() != model.launch_hash():
        health.pop(model.name, None)  # a new source or profile un-parks
    models = s.models | {model.name: model}
    return replace(s, models=_readonly(models), health=_readonly(health)), {"created": old is None}


def _check_name(c: dict[str, Any]) -> None:
    _name(c, "name")


def _model_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = c["name"]
    if name not in s.models:
        raise CommandError("model_not_found", f"no model named {name!r}")
    models = {k: v for k, v in s.models.items() if k != name}
    health = {k: v for k, v in s.health.items() if k != name}
    # Placements stay until the reconciler stops their replicas and removes them.
    return replace(s, models=_readonly(models), health=_readonly(health)), {"removed": name}


def _model_retry(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = c["name"]
    if name not in s.models:
        raise CommandError("model_not_found", f"no model named {name!r}")
    health = {k: v for k, v in s.health.items() if k != name}
    return replace(s, health=_readonly(health)), {"retried": name}


def _check_setting_put(c: dict[str, Any]) -> None:
    key = c.get("key")
    if not isinstance(key, str):
        raise CommandError("invalid_setting", "setting key must be a string")
    try:
        validate(key, c.get("value"))
    except SettingError as e:
        raise CommandError("invalid_setting", str(e)) from None


def _setting_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    key, value = c["key"], c.get("value")
    return replace(s, settings=_readonly(s.settings | {key: freeze(value)})), {"key": key, "value": value}


def _refuse_if(problem: tuple[str, str] | None) -> None:
    if problem is not None:
        raise CommandError(*problem)


def _key_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    _refuse_if(keys_commands.add_conflict(s, c))
    return keys_commands.add(s, c, at)


def _key_revoke(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    _refuse_if(keys_commands.revoke_conflict(s, c["key_id"]))
    return keys_commands.revoke(s, c, at)


def _check_slot(c: dict[str, Any]) -> None:
    complaint = health.slot_problem(c)
    if complaint:
        raise CommandError("bad_command", complaint)


def _check_placement_add(c: dict[str, Any]) -> None:
    _name(c, "model")
    _check_slot(c)
    _name(c, "node")
    gpus = c.get("gpus")
    if not isinstance(gpus, list) or not all(type(g) is int and g >= 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise CommandError("bad_command", "gpus must be a list of distinct device indexes")


def _placement_add(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model, node, gpus = c["model"], c["node"], c["gpus"]
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    taken = {g for p in s.placements.values() if p.node == node for g in p.gpus} & set(gpus)
    if taken:
        # A plan made on a stale snapshot: refused, so the reconciler replans (never double-books).
        raise CommandError("gpu_taken", f"GPU(s) {sorted(taken)} on {node} are already placed")
    replica_id = f"{model}-r{s.next_replica}"
    placement = Placement(replica_id, model, node, tuple(gpus), str(c.get("launch_hash", "")), at,
                          slot=int(c.get("slot", 0)))
    return (
        replace(s, placements=_readonly(s.placements | {replica_id: placement}), next_replica=s.next_replica + 1),
        {"replica_id": replica_id},
    )


def _check_placement_add_group(c: dict[str, Any]) -> None:
    _name(c, "model")
    _check_slot(c)
    problem = groups.members_problem(c.get("members"))
    if problem:
        raise CommandError("bad_command", problem)


def _placement_add_group(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model, members = c["model"], c["members"]
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    for m in members:
        taken = {g for p in s.placements.values() if p.node == m["node"] for g in p.gpus} & set(m["gpus"])
        if taken:
            raise CommandError("gpu_taken", f"GPU(s) {sorted(taken)} on {m['node']} are already placed")
    group = f"{model}-g{s.next_replica}"
    first, last = effective(s.settings, "groups.ports")
    port = groups.group_port(group, int(first), int(last))
    added = groups.group_placements(group, model, members, str(c.get("launch_hash", "")), at, port)
    if c.get("slot"):
        added = {rid: replace(p, slot=c["slot"]) for rid, p in added.items()}
    result = {"group": group, "replica_ids": list(added), "leader": added[f"{group}-r0"].leader}
    return replace(s, placements=_readonly(s.placements | added), next_replica=s.next_replica + 1), result


def _check_replica_id(c: dict[str, Any]) -> None:
    _name(c, "replica_id")


def _placement_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    rid = c["replica_id"]
    if rid not in s.placements:
        return s, {"removed": False}  # idempotent: a rerun of the same plan is harmless
    placements = {k: v for k, v in s.placements.items() if k != rid}
    return replace(s, placements=_readonly(placements)), {"removed": True}


def _check_health(c: dict[str, Any]) -> None:
    _name(c, "model")
    complaint = health.fields_problem(c)
    if complaint:
        raise CommandError("bad_command", complaint)


def _check_raft_addr(c: dict[str, Any]) -> None:
    addr = _name(c, "raft_addr")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or len(addr) > MEMBER_FIELD_MAX_CHARS:
        raise CommandError("invalid_member", f"raft_addr must be HOST:PORT, not {addr!r:.80}")


def _check_member_announce(c: dict[str, Any]) -> None:
    _check_raft_addr(c)
    url, version = c.get("admin_url"), c.get("version")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > MEMBER_FIELD_MAX_CHARS:
        raise CommandError("invalid_member", f"admin_url must be an http(s) URL, not {url!r:.80}")
    if not isinstance(version, str) or len(version) > MEMBER_FIELD_MAX_CHARS:
        raise CommandError("invalid_member", "version must be a string")


def _member_announce(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    addr = c["raft_addr"]
    member = Member(addr, c["admin_url"], c["version"], at)
    return replace(s, members=_readonly(s.members | {addr: member})), {"announced": addr}


def _member_forget(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    addr = c["raft_addr"]
    if addr not in s.members:
        return s, {"forgotten": False}
    return replace(s, members=_readonly({k: v for k, v in s.members.items() if k != addr})), {"forgotten": True}


def _usage_check(c: dict[str, Any]) -> None:
    try:
        usage.check_add(c)
    except usage.UsageError as e:
        raise CommandError("bad_command", str(e)) from None


# Each operation: (stateless check, change). `check` runs the first before a command is
# logged and again before the change is applied, so the change may trust the fields' shape.
_Check = Callable[[dict[str, Any]], None]
_Change = Callable[[ClusterState, dict[str, Any], float], tuple[ClusterState, Any]]
_OPS: dict[str, tuple[_Check, _Change]] = {
    "model.put": (_check_model_put, _model_put),
    "model.remove": (_check_name, _model_remove),
    "model.retry": (_check_name, _model_retry),
    "setting.put": (_check_setting_put, _setting_put),
    "key.add": (lambda c: _refuse_if(keys_commands.check_add(c)), _key_add),
    "key.revoke": (lambda c: _refuse_if(keys_commands.check_revoke(c)), _key_revoke),
    "placement.add": (_check_placement_add, _placement_add),
    "placement.add_group": (_check_placement_add_group, _placement_add_group),
    "placement.remove": (_check_replica_id, _placement_remove),
    "health.start_failed": (_check_health, health.start_failed),
    "health.ready": (_check_health, health.ready),
    "member.announce": (_check_member_announce, _member_announce),
    "member.forget": (_check_raft_addr, _member_forget),
    "usage.add": (_usage_check, usage.apply_add),  # a gateway's rollups (domain/usage.py)
    "guard.set": (lambda c: _refuse_if(guard_commands.check_set(c)), guard_commands.put),  # domain/guard_commands.py
    "guard.remove": (lambda c: _refuse_if(guard_commands.check_remove(c)), guard_commands.remove),
}
