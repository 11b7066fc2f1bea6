"""The control plane's operations: one module per area (models, settings, keys, guard, judges, nodes,
members, system, plan, requests, notify, status), each a set of plain async functions over the
`Context` and the store. No HTTP: they take values, return JSON-ready documents, and refuse with an
`AdminError`. The admin API's routes (`control/api/`), the console's actions and any later caller
call these, so every caller refuses and answers alike.

A write is committed through the `Commit` its caller passes: the admin API's applies each request at
most once per `Idempotency-Key`, the console's once per confirmation form.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.domain.commands import CommandError
from llmgw.errors import AdminError
from llmgw.store import CommitUnknown, NotLeader, StoreUnavailable

__all__ = ["Commit", "Created", "Note", "command_refusal", "store_error"]

# Hands a command to the replicated store (under the caller's idempotency id); its result once applied.
Commit = Callable[[dict[str, Any]], Awaitable[Any]]
# Tells the caller's idempotency what a write that is no command asks (a membership change): a write
# already answered is answered again by the caller, and the same id for another request is refused.
Note = Callable[[str], None]  # the fingerprint (`commands.digest`) of what it asks


class Created(dict[str, Any]):
    """An operation's answer that says it made something new (the API answers 201)."""


def command_refusal(error: CommandError) -> AdminError:
    """A command the state refused, as the admin error every caller shows."""
    status = {"idempotency_key_reused": 422, "apply_failed": 500, "upgrade_pending": 409, "mirror_file_in_use": 409,
              "mirror_name_taken": 409}.get(
        error.code, 404 if error.code.endswith("not_found") else 400)
    return AdminError(status, error.code, error.message)


def store_error(error: Exception, keyed: bool) -> AdminError | None:
    """The admin error for a store that could not commit (None: not a store error). `keyed`: the write
    carried an idempotency id its caller can send again."""
    if isinstance(error, CommitUnknown):
        retry = ("Retrying with the same Idempotency-Key is safe: the write is applied at most once."
                 if keyed else
                 "This request had no Idempotency-Key: read the state before retrying, or a retry may apply"
                 " it twice.")
        return AdminError(503, "commit_unknown",
                          f"the write was handed to the Raft log but its commit was not confirmed ({error}): it may"
                          f" or may not have been applied. {retry}")
    if isinstance(error, NotLeader):
        where = (f"the leader is the member with Raft address {error.leader}" if error.leader else
                 "no leader is known (an election may be under way; retry shortly)")
        return AdminError(503, "not_leader", f"this member is not the leader, so nothing was written; {where}")
    if isinstance(error, StoreUnavailable):
        return AdminError(503, "store_unavailable", f"the replicated store cannot take writes now, so nothing was"
                                                    f" written: {error}")
    return None
