"""Versioned commands and the deterministic `apply(state, command) -> (state, result)`.

A command is a JSON object `{"v": 1, "op": ..., "at": <unix time>, ...}` (`core`); time
arrives inside it, never from a clock here, so every replica computes the same state. Each
aggregate's module builds, checks and changes its own commands: models, placements, health,
keys, guard, usage, members, settings, trust, mirror, nodes. `_OPS` below is the one table of them all: a new
operation is a builder and a check and change in its aggregate's module, and a line here; the
Raft method table never changes. An optional `cid` (idempotency id) makes a command apply at
most once: see `apply_entry`. One brought after the first store level carries its level and
applies only once the group's level reached it (`llmgw.domain.levels`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any

from llmgw.domain import levels
from llmgw.domain.commands import (guard, health, keys, members, mirror, models, nodes, placements, settings, trust,
                                   usage)
from llmgw.domain.commands import conditions
from llmgw.domain.commands.conditions import update_conditions
from llmgw.domain.commands.core import (
    CID_MAX_CHARS,
    VERSION,
    Change,
    Check,
    CommandError,
    encode,
    loads,
    make,
    readonly,
    with_cid,
)
from llmgw.domain.commands.guard import remove_policy, set_policy
from llmgw.domain.commands.health import became_ready, start_failed
from llmgw.domain.commands.keys import add_key, revoke_key
from llmgw.domain.commands.members import announce_member, forget_member, raise_level
from llmgw.domain.commands.mirror import pin_file, put_file, remove_file
from llmgw.domain.commands.nodes import approve_nodes, cordon_nodes, forget_node
from llmgw.domain.commands.models import put_model, remove_model, retry_model
from llmgw.domain.commands.placements import add_group, add_placement, remove_placement, sleep_placement
from llmgw.domain.commands.settings import put_setting
from llmgw.domain.commands.usage import add_usage
from llmgw.domain.state import ClusterState, Outcome, Refusal

__all__ = [
    "CID_MAX_CHARS",
    "KEEP_REFUSALS",
    "MESSAGE_MAX_CHARS",
    "OUTCOME_CHUNK",
    "OUTCOME_CHUNKS",
    "VERSION",
    "CommandError",
    "add_group",
    "add_key",
    "add_placement",
    "add_usage",
    "announce_member",
    "approve_nodes",
    "apply",
    "apply_entry",
    "became_ready",
    "check",
    "cordon_nodes",
    "decode",
    "digest",
    "encode",
    "forget_member",
    "forget_node",
    "make",
    "pin_file",
    "put_file",
    "put_model",
    "put_setting",
    "raise_level",
    "remove_file",
    "remove_model",
    "remove_placement",
    "remove_policy",
    "replay",
    "result_of",
    "retry_model",
    "revoke_key",
    "set_policy",
    "sleep_placement",
    "start_failed",
    "update_conditions",
    "with_cid",
]

# Idempotency ids are remembered in chunks of OUTCOME_CHUNK; past OUTCOME_CHUNKS chunks the
# oldest chunk is dropped whole. So at least the last 10,000 ids are kept (at most 10,250),
# and which ones depends only on the log: every member drops the same ids at the same entry.
OUTCOME_CHUNK = 250
OUTCOME_CHUNKS = 41
KEEP_REFUSALS = 32  # the newest refusals of committed commands kept in the state
MESSAGE_MAX_CHARS = 2000  # a refusal's words, as kept in the state

# Each operation: (stateless check, change), from its aggregate's module. `check` runs the first
# before a command is logged and again before the change is applied, so the change may trust the
# fields' shape. The op names and their documents are the log's format: never renamed.
_OPS: dict[str, tuple[Check, Change]] = {
    "model.put": (models.check_put, models.apply_put),
    "model.remove": (models.check_name, models.apply_remove),
    "model.retry": (models.check_name, models.apply_retry),
    "setting.put": (settings.check_put, settings.apply_put),
    "key.add": (keys.check_add, keys.apply_add),
    "key.revoke": (keys.check_revoke, keys.apply_revoke),
    "placement.add": (placements.check_add, placements.apply_add),
    "placement.add_group": (placements.check_add_group, placements.apply_add_group),
    "placement.remove": (placements.check_remove, placements.apply_remove),
    "placement.sleep": (placements.check_sleep, placements.apply_sleep),
    "health.start_failed": (health.check, health.apply_start_failed),
    "health.ready": (health.check, health.apply_ready),
    "member.announce": (members.check_announce, members.apply_announce),
    "member.forget": (members.check_raft_addr, members.apply_forget),
    "cluster.level": (members.check_level, members.apply_level),
    "usage.add": (usage.check_add, usage.apply_add),
    "guard.set": (guard.check_set, guard.apply_set),
    "guard.remove": (guard.check_remove, guard.apply_remove),
    "trust.ca_add": (trust.check_ca_add, trust.apply_ca_add),
    "trust.token_add": (trust.check_token_add, trust.apply_token_add),
    "trust.token_remove": (trust.check_token_remove, trust.apply_token_remove),
    "trust.issue": (trust.check_issue, trust.apply_issue),
    "trust.revoke": (trust.check_revoke, trust.apply_revoke),
    "trust.raft_tls": (trust.check_raft_tls, trust.apply_raft_tls),
    "mirror.put": (mirror.check_put, mirror.apply_put),
    "mirror.remove": (mirror.check_name, mirror.apply_remove),
    "mirror.pin": (mirror.check_pin, mirror.apply_pin),
    "node.approve": (nodes.check_approve, nodes.apply_approve),
    "node.cordon": (nodes.check_cordon, nodes.apply_cordon),
    "node.forget": (nodes.check_forget, nodes.apply_forget),
    "condition.update": (conditions.check_update, conditions.apply_update),
}


def decode(blob: bytes) -> dict[str, Any]:
    """The command in `blob`, refused (CommandError) unless every member would accept its shape:
    the stateless checks run here, before a command enters the log."""
    command = loads(blob)
    check(command)
    return command


def digest(command: dict[str, Any]) -> str:
    """A fingerprint of what a command asks, without its time and id: a retry has the same one."""
    fresh = keys.FRESH_FIELDS if command.get("op") == "key.add" else ()
    asked = {k: v for k, v in command.items() if k not in ("at", "cid") and k not in fresh}
    return hashlib.sha256(encode(asked)).hexdigest()[:32]


def check(command: dict[str, Any]) -> None:
    """The stateless checks: a known operation, a valid time and id, well-formed fields.

    Raises CommandError; `levels.NewerThanThisRelease` for a command a newer release wrote (never a
    refusal: an older member must not skip what the others apply). Needs no state, so it runs before a
    command enters the log."""
    levels.check_readable(command)
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

    Ignores `cid`: what was already applied is `apply_entry`'s business. A command of a store level
    above the group's is refused (`upgrade_pending`): some member may not read it."""
    check(command)
    needs = levels.command_level(command)
    if needs > state.store_level:
        raise CommandError("upgrade_pending", members.upgrade_pending(state, command.get("op"), needs))
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
    """Apply one committed log entry (a blob or a decoded command). Total: never raises, but for
    `levels.NewerThanThisRelease` (an entry a newer release wrote: this member must stop, not skip it).

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
            command = loads(entry)
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
        new_state, result = apply(state, command)
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
        chunks = (*chunks[:-1], readonly(chunks[-1] | {cid: outcome}))
    else:
        chunks = (*chunks, readonly({cid: outcome}))[-OUTCOME_CHUNKS:]
    return replace(state, outcomes=chunks)
