"""Guard policies: list, show, set, remove. Guards on or off is the setting `guard.enabled`; every answer
here says which, so no listing hides that nothing is checked."""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.domain import commands
from llmgw.domain.guard import GuardPolicy, PolicyError, enabled
from llmgw.domain.judges import GUARDS_OFF, judge_status
from llmgw.domain.state import ClusterState
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")


def guard_state(state: ClusterState) -> dict[str, Any]:
    """What every guard answer starts with: on or off, and the words when off."""
    on = enabled(state)
    return {"enabled": on, "notice": "" if on else GUARDS_OFF}


def _not_found(name: str, hint: str) -> AdminError:
    return AdminError(404, "policy_not_found", f"no guard policy named {name!r} ({hint})")


async def list_policies(ctx: Context) -> dict[str, Any]:
    state = ctx.state()
    return {**guard_state(state), "policies": [p.to_doc() for _, p in sorted(state.guard_policies.items())]}


async def show(ctx: Context, name: str) -> dict[str, Any]:
    state = ctx.state()
    policy = state.guard_policies.get(name)
    if policy is None:
        raise _not_found(name, "`llmgw ctl guard list`")
    return {**guard_state(state), "policy": policy.to_doc()}


async def put(ctx: Context, commit: Commit, name: str, doc: Any) -> dict[str, Any]:
    """Set a policy (`Created` when new), with a warning when its judge is missing or no judge."""
    try:
        policy = GuardPolicy.from_doc(doc, name=name)
    except PolicyError as e:
        raise AdminError(400, "invalid_policy", str(e)) from None
    result = await commit(commands.set_policy(policy, ctx.clock()))
    state = ctx.state()
    judge = next((j for j in judge_status(state, ctx.observed(), ctx.views(), ctx.clock())
                  if j["model"] == policy.judge), None)
    warnings = [judge["problem"]] if judge is not None and judge["status"] in ("missing", "not_a_judge") else []
    log.info("guard policy %s %s", name, "created" if result["created"] else "set")
    answer = {**guard_state(state), "policy": policy.to_doc(), "created": result["created"],
              "changed": result["changed"], "warnings": warnings}
    return Created(answer) if result["created"] else answer


async def remove(ctx: Context, commit: Commit, name: str) -> dict[str, Any]:
    result = await commit(commands.remove_policy(name, ctx.clock()))
    if not result.get("removed"):
        raise _not_found(name, "already removed?")
    log.info("guard policy %s removed", name)
    return {"removed": name}
