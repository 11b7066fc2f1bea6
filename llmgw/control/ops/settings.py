"""Cluster settings: every one with its value, default and help; read one; change one."""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, command_refusal
from llmgw.domain import commands, levels
from llmgw.domain.settings import SETTINGS, SettingError, effective, validate
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")


def _unknown(key: str) -> AdminError:
    return AdminError(404, "unknown_setting", f"unknown setting {key!r}; known: {', '.join(sorted(SETTINGS))}")


async def list_settings(ctx: Context) -> dict[str, Any]:
    stored = ctx.state().settings
    return {"settings": {
        k: {"value": effective(stored, k), "default": s.default, "help": s.help, "set": k in stored}
        for k, s in sorted(SETTINGS.items())
    }}


async def get(ctx: Context, key: str) -> dict[str, Any]:
    if key not in SETTINGS:
        raise _unknown(key)
    stored = ctx.state().settings
    return {"key": key, "value": effective(stored, key), "default": SETTINGS[key].default, "set": key in stored}


async def put(ctx: Context, commit: Commit, key: str, value: Any) -> dict[str, Any]:
    """Change a setting; refused at once (nothing stored) when the key is unknown or the value wrong."""
    try:
        validate(key, value)
    except SettingError as e:
        if key not in SETTINGS:
            raise AdminError(404, "unknown_setting", str(e)) from None
        raise AdminError(400, "invalid_setting", str(e)) from None
    if key == "nodes.require_approval" and value is True and effective(ctx.state().settings, key) is not True:
        # Turning approval on holds back only nodes that come later: every node known now (connected, within
        # its grace period, lost and not forgotten, or holding a placement) is approved first.
        # Approvals are a level-3 field: a group still writing below it could never approve a node, so the
        # setting waits for the upgrade too.
        from llmgw.control.ops.nodes import known_nodes
        from llmgw.domain.commands.members import upgrade_pending

        state = ctx.state()
        needs = levels.op_level("node.approve")
        if state.store_level < needs:
            raise command_refusal(commands.CommandError("upgrade_pending", upgrade_pending(state, key, needs)))
        known = known_nodes(ctx)
        if known:  # its own command, with no idempotency id (the request's id is the setting's): a repeat is a no-op
            try:
                await ctx.store.submit(commands.approve_nodes(known, ctx.clock()))
            except commands.CommandError as e:
                raise command_refusal(e) from None
            log.info("nodes.require_approval turned on: the %d node(s) known now are approved", len(known))
    await commit(commands.put_setting(key, value, ctx.clock()))
    log.info("setting %s changed", key)
    return {"key": key, "value": value}
