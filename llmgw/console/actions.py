"""What the console's Do menu commits through: the admin API's commands, each applied at most once
(the confirmation form carries a fresh id, so a form sent twice applies once), every refusal in words.

The console acts on the leader only: a standby says which member leads rather than forwarding.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from llmgw.domain import commands
from llmgw.domain.commands import CommandError
from llmgw.errors import AdminError
from llmgw.control.ops import Commit, store_error

if TYPE_CHECKING:
    from llmgw.console.sessions import Session
    from llmgw.control.context import Context

log = logging.getLogger("llmgw.console")

_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,64}\Z")


class ActionError(Exception):
    """An action refused or failed: the words the result page shows."""


def new_token() -> str:
    """The id a confirmation form carries: the action it confirms is committed under it once."""
    return secrets.token_urlsafe(18)


def committer(ctx: Context, session: Session, token: str | None) -> Commit:
    """A `commit` as the admin API's routes take it, for this session's confirmed form `token`."""
    if token is None or not _TOKEN_RE.match(token):
        raise ActionError("this confirmation has no valid form id (it did not come from the confirmation page); "
                          "nothing was done. Start the action again from Do.")
    cid = "c:" + hashlib.sha256(f"console\n{session.key_id}\n{token}".encode()).hexdigest()[:32]

    async def commit(command: dict[str, Any]) -> Any:
        leading = ctx.store.is_leader()
        if not leading and ctx.members is not None:
            raise ActionError(f"this control plane is a standby, so nothing was done: {_leader_words(ctx)}")
        try:
            return await ctx.store.submit(commands.with_cid(command, cid))
        except CommandError as e:
            raise ActionError(f"refused ({e.code}): {e.message}") from None

    return commit


async def run(call: Awaitable[Any]) -> Any:
    """Await an action, its refusals and store failures as ActionError in words (an AdminError keeps its
    code, as `ctl` shows it; a bug is logged and said to be)."""
    try:
        return await call
    except (ActionError, AdminError) as e:
        if isinstance(e, AdminError):
            raise ActionError(f"refused ({e.code}): {e.message}") from None
        raise
    except Exception as e:
        known = store_error(e, keyed=True)
        if known is None:
            log.exception("console action failed")
            raise ActionError(f"this control plane failed on the action ({type(e).__name__}); it is logged") from None
        if known.code == "commit_unknown":
            raise ActionError(f"the action was handed to the Raft log but its commit was not confirmed ({e}): it may "
                              "or may not have been applied. Sending this confirmation again is safe: it applies at "
                              "most once.") from None
        raise ActionError(known.message) from None


def _leader_words(ctx: Context) -> str:
    leader = ctx.store_status().get("leader")
    return (f"open the console on the leader (Raft address {leader})" if leader else
            "no leader is known now (an election may be under way); try again shortly")
