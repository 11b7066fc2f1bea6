"""The `members` commands: the control planes of the group (who leads, who stands by, who is
missing or behind), and adding or removing one, one change at a time."""

from __future__ import annotations

import cyclopts

from llmgw.cli.ctl.errors import EXIT_OK
from llmgw.cli.ctl.render import cell, dig, render_members
from llmgw.cli.ctl.session import SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(members_app)


members_app = cyclopts.App(name="members", help="The control planes of the group; add or remove one.")


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


def _group(doc: object) -> str:
    members = dig(doc, "members")
    return ", ".join(str(m) for m in members) if isinstance(members, list) and members else "-"
