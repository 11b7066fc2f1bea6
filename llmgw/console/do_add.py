"""Do → Add a machine (a node, a gateway, a control plane): `llmgw server add`'s very operation
(`llmgw/remote/server_add.py`) run by this control plane, over ssh with this control plane's own ssh key, with
the zipapp it runs from, through the admin API at the URL the browser reached, with the signed-in key. A
control plane's add takes this member's cluster secret. The form, a confirmation, then every step's event.

What it reaches of the world (`RemoteAccess`: ssh to a target, the zipapp, the admin API's transport) sits in
the app's config under `ACCESS`, so a test gives its own (`llmgw.testing.remote.LocalShell`)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from quart import current_app, request

from llmgw.console.auth import authorization, console_route
from llmgw.console.layout import esc, page, table
from llmgw.console.sessions import Session, csrf_field
from llmgw.interfaces import RemoteShell
from llmgw.remote.admin import AdminApi
from llmgw.remote.server_add import AddFailed, AddRequest, Event, ServerAdd, running_zipapp
from llmgw.remote.ssh import SshShell, SshTarget, check_target
from llmgw.service.spec import SERVICE_ROLES

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

ACCESS = "LLMGW_REMOTE_ACCESS"
FIELDS = ("target", "role", "name", "listen", "floating_address", "floating_interface")


@dataclass(frozen=True)
class RemoteAccess:
    shell: Callable[[str], RemoteShell]  # USER@HOST -> the shell that reaches it
    zipapp: Path | None  # what is installed (None: this control plane does not run from one)
    transport: httpx.AsyncBaseTransport | None = None  # the admin API's (None: the network)


def access(ctx: Context) -> RemoteAccess:
    given = current_app.config.get(ACCESS)
    if isinstance(given, RemoteAccess):
        return given
    connect_s = ctx.timeouts.ssh_connect_s
    return RemoteAccess(lambda target: SshShell(SshTarget(target), connect_timeout_s=connect_s), running_zipapp())


def form_html(csrf: str, form: dict[str, str] | None = None) -> str:
    f = form or {}
    roles = "".join(f'<option value="{r}"{" selected" if f.get("role") == r else ""}>{r}</option>'
                    for r in ("agent", "gateway", "control"))

    def field(name: str, label: str, hint: str) -> str:
        return (f'<label>{label} <input name="{name}" value="{esc(f.get(name, ""))}" placeholder="{esc(hint)}" '
                f'data-testid="add-{name.replace("_", "-")}"></label> ')

    return (f'<form method="post" action="/do/add" class="do" data-testid="add-form">{csrf}'
            + field("target", "Machine", "root@10.0.0.7")
            + f'<label>Role <select name="role" data-testid="add-role">{roles}</select></label> '
            + field("name", "Name", "node or gateway name (default: its host name)")
            + field("listen", "Gateway listens on", "HOST:8080")
            + field("floating_address", "Floating address", "control: ADDR/PREFIX")
            + field("floating_interface", "on interface", "control: eth0")
            + '<br><button type="submit" data-testid="add-submit">Add the machine…</button></form>')


def request_of(form: dict[str, str], ctx: Context, zipapp: Path) -> AddRequest:
    """The add the form asks for; ValueError with every problem of the form in words."""
    target = form.get("target", "").strip()
    role = form.get("role", "")
    wrong = [check_target(target) or ""] if check_target(target) else []
    if role not in SERVICE_ROLES:
        raise ValueError("; ".join([*wrong, f"role {role!r}: agent, gateway or control"]))
    secret = None
    if role == "control" and ctx.trust is not None:
        secret_file = ctx.trust.state_dir / "cluster.secret"
        secret = secret_file.read_text(encoding="utf-8").strip() if secret_file.is_file() else None
    req = AddRequest(role, target.rpartition("@")[2].strip("[]"), zipapp,  # type: ignore[arg-type]  # checked above
                     name=form.get("name") or None, listen=form.get("listen") or None,
                     floating_address=form.get("floating_address") or None,
                     floating_interface=form.get("floating_interface") or None, cluster_secret=secret)
    problems = wrong + req.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return req


def events_html(events: list[Event]) -> str:
    return table(["Step", "", "What"], [[esc(e.step), esc(e.status), esc(e.words)] for e in events], sortable=False,
                 testid="add-events", empty="no step ran")


def register(app: QuartTrio) -> None:
    @console_route(app, "/do/add", ("POST",), action=True)
    async def add(session: Session, ctx: Context) -> str:
        form = {k: v for k, v in (await request.form).items() if isinstance(v, str) and k in (*FIELDS, "confirm")}
        world = access(ctx)
        if world.zipapp is None:
            return _done(session, False, "this control plane does not run from the llmgw zipapp, so it has none to "
                                         "install: run <code>llmgw server add</code> from a machine with the zipapp "
                                         "(<code>--zipapp dist/llmgw.pyz</code>)", [])
        try:
            req = request_of(form, ctx, world.zipapp)
        except (ValueError, OSError) as e:
            return page("Add a machine", "Do", '<div data-no-refresh>' + _outcome(False, esc(str(e))) +
                        form_html(csrf_field(session), form) + "</div>", session=session)
        target = form["target"].strip()
        if form.get("confirm") != "yes":
            hidden = "".join(f'<input type="hidden" name="{k}" value="{esc(form.get(k, ""))}">' for k in FIELDS)
            body = (f"<p>Add a {esc(req.role)} on {esc(target)}: checks first (nothing changes if one fails), then the "
                    f"zipapp, a join token, the service, and a wait until it has joined (up to "
                    f"{ctx.timeouts.server_add_join_s:g} s).</p>"
                    f'<form method="post" action="/do/add" data-testid="confirm-form" data-action="add">'
                    f'{csrf_field(session)}{hidden}<input type="hidden" name="confirm" value="yes"><p>'
                    f'<button type="submit" data-testid="confirm">Confirm: add {esc(target)}</button> '
                    f'<a href="/do" data-testid="cancel">Cancel</a></p></form>')
            return page(f"Add {target}", "Do", f"<div data-no-refresh>{body}</div>", session=session)
        events: list[Event] = []
        verify: ssl.SSLContext | bool = True
        if ctx.trust is not None and ctx.trust.files.ca.is_file():
            verify = ssl.create_default_context(cafile=str(ctx.trust.files.ca))
        api = AdminApi(request.host_url, authorization(session).removeprefix("Bearer "), verify=verify,
                       timeout_s=ctx.timeouts.ctl_request_s, transport=world.transport)
        try:
            done: dict[str, Any] = await ServerAdd(req, world.shell(target), api, events.append, ctx.timeouts).run()
        except AddFailed as e:
            problems = "".join(f"<li><code>{esc(p.code)}</code>: {esc(p.words)}</li>" for p in e.problems)
            return _done(session, False, esc(e.words) + (f"<ul>{problems}</ul>" if problems else ""), events)
        finally:
            await api.aclose()
        return _done(session, True, f"{esc(done['role'])} {esc(done['name'])} on {esc(done['target'])} has joined "
                                    f"({esc(done['manager'])} runs it)", events)


def _outcome(ok: bool, words: str) -> str:
    return (f'<section class="result {"done" if ok else "refused"}" id="action-result" data-testid="action-result" '
            f'data-action="add" data-outcome="{"done" if ok else "refused"}"><strong>{"Done" if ok else "Not done"}'
            f':</strong> {words}</section>')


def _done(session: Session, ok: bool, words: str, events: list[Event]) -> str:
    return page("Add a machine", "Do", "<div data-no-refresh>" + _outcome(ok, words) + events_html(events)
                + '<p><a href="/do">Back to Do</a></p></div>', session=session)
