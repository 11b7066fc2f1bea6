"""The `members` commands: the control planes of the group (who leads, who stands by, who is
missing or behind), and adding or removing one, one change at a time."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError, UsageError
from llmgw.cli.ctl.render import cell, dig, render_members
from llmgw.cli.ctl.session import SessionParam, api_path
from llmgw.domain.timeouts import TIMEOUTS


def register(app: cyclopts.App) -> None:
    app.command(members_app)


members_app = cyclopts.App(name="members", help="The control planes of the group; add, remove or restart one.")


@members_app.default
def members(*, session: SessionParam) -> int:
    """Every member: role, state, commit and applied index, lag, last contact, state hash."""
    return session.show_answer("GET", api_path("cluster", "members"), render=render_members)


@members_app.command(name="add")
def members_add(raft_addr: str, /, *, session: SessionParam) -> int:
    """Add a member that already runs (`llmgw control --join ...`); the change is committed through Raft.

    Parameters
    ----------
    raft_addr
        The new member's --raft-addr, as its peers dial it (HOST:PORT).
    """
    return session.show_answer("POST", api_path("cluster", "members"), body={"raft_addr": raft_addr}, send_body=True,
                               render=lambda d: f"added {cell(dig(d, 'added'))}; the group is now: {_group(d)}")


@members_app.command(name="remove")
def members_remove(member: str, /, *, session: SessionParam) -> int:
    """Remove a member from the group (stop its process afterwards); not the leader itself.

    Parameters
    ----------
    member
        The member's id: its Raft address, as `llmgw ctl members` lists it.
    """
    _, doc = session.request("DELETE", api_path("cluster", "members", member))
    session.show(doc, lambda d: f"removed {cell(dig(d, 'removed'))}; the group is now: {_group(d)}. "
                                f"Stop its process now: it is no longer part of the group")
    return EXIT_OK


@members_app.command(name="restart")
def members_restart(member: str, /, *, wait: Annotated[bool, Parameter(
        negative="--no-wait", help="Wait until it answers again, restarted and caught up (default), or return "
                                   "at once.")] = True, session: SessionParam) -> int:
    """Restart a member in place: it stops as on SIGTERM (a leader hands leadership over first) and runs again
    as the same process with the same flags. Asked of the member itself, at its admin URL.

    Parameters
    ----------
    member
        The member's id: its Raft address, as `llmgw ctl members` lists it.
    """
    _, table = session.request("GET", api_path("cluster", "members"))
    rows = [r for r in dig(table, "members") or [] if isinstance(r, Mapping)]
    row = next((r for r in rows if r.get("id") == member), None)
    if row is None:
        raise UsageError(f"no member {member!r} in the group: " + (", ".join(str(r.get("id")) for r in rows) or "-"))
    url = row.get("admin_url")
    if not isinstance(url, str) or not url:
        raise CtlError(f"member {member} has not announced its admin URL (is it running?): restart it on its "
                       f"machine (`llmgw service restart control`)")
    _, before = session.request("GET", url + api_path("cluster", "self"))
    _, asked = session.request("POST", url + api_path("cluster", "self", "restart"))
    if not wait:
        session.show(asked, lambda d: f"member {member}: asked to restart (pid {cell(dig(d, 'pid'))})")
        return EXIT_OK
    deadline = time.monotonic() + TIMEOUTS.ctl_member_restart_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        time.sleep(TIMEOUTS.ctl_poll_s)
        try:
            _, doc = session.request("GET", url + api_path("cluster", "self"))
        except CtlError as e:  # stopping, or not listening yet
            last = str(e)
            continue
        if dig(doc, "started_at") != dig(before, "started_at") and dig(doc, "ready") and dig(doc, "leader"):
            session.show(doc, lambda d: f"member {member}: restarted (pid {cell(dig(d, 'pid'))}), {cell(dig(d, 'role'))}"
                                        f", leader {cell(dig(d, 'leader'))}")
            return EXIT_OK
        last = f"answering, {'not restarted yet' if dig(doc, 'started_at') == dig(before, 'started_at') else 'not caught up'}"
    raise CtlError(f"member {member} was asked to restart but is not back within {TIMEOUTS.ctl_member_restart_s:g} s "
                   f"({last}); its log says why (`llmgw service status control` on its machine)")


def _group(doc: object) -> str:
    members = dig(doc, "members")
    return ", ".join(str(m) for m in members) if isinstance(members, list) and members else "-"
