"""The console's Do menu (`/do`): serve a model (with `ctl plan`'s verdict first), retry a parked model,
approve a pending node, cordon / drain / uncordon a node, enable the judge, stop / start the system, guards on / off; and how to add a machine (`llmgw server add`).

Every action is two POSTs: the first shows what will happen and asks to confirm, the second does it
through the admin API's own operations (`control/ops`: models, judges, system, settings) and shows the result,
so its effect shows in `ctl` too. Viewers and forms without this session's CSRF token are refused
by `console_route(action=True)`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quart import request

from llmgw.console import do_add, do_serve
from llmgw.console.actions import ActionError, committer, new_token, run
from llmgw.console.auth import console_route
from llmgw.console.sessions import Session, csrf_field
from llmgw.console.layout import esc, page, table
from llmgw.control.ops import Commit, Created
from llmgw.control.ops import judges as judge_ops
from llmgw.control.ops import models as model_ops
from llmgw.control.ops import nodes as node_ops
from llmgw.control.ops import settings as setting_ops
from llmgw.control.ops import system as system_ops
from llmgw.control.ops.plan import plan_doc
from llmgw.domain.guard import enabled as guards_enabled
from llmgw.domain.judges import judge_status, pick_guard_file
from llmgw.domain.settings import effective

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

SYSTEM = {"stop": True, "start": False}  # the form's `to` -> serving.stopped
GUARDS = {"on": True, "off": False}  # the form's `to` -> guard.enabled
CORDON_WORDS = {  # the confirmation's words, by the form's `verb`
    "cordon": "node {name} takes no new replica once cordoned; what runs there stays",
    "drain": "node {name} is cordoned and its replicas move to other nodes one at a time, each replacement ready "
             "before the old one stops: no model loses its last ready replica",
    "uncordon": "node {name} takes replicas again (a drain in progress stops; what moved stays where it is)",
}
PARKED_SHOWN = 50  # rows of the retry list; the rest are on Models (state parked), each page with its Retry


def register(app: QuartTrio) -> None:
    @console_route(app, "/do")
    def do_page(session: Session, ctx: Context) -> str:
        return _page("Do", menu(session, ctx), session)

    @console_route(app, "/do/serve", ("POST",), action=True)
    async def serve(session: Session, ctx: Context) -> str:
        form = await _form()
        try:
            doc = do_serve.definition(form)
            model = do_serve.model_of(doc)
        except do_serve.FormError as e:
            body = (_outcome(False, str(e), "serve") + "<h2>Serve a model</h2>" +
                    do_serve.form_html(csrf_field(session), form))
            return _page("Serve a model", body, session)
        if form.get("confirm") != "yes":
            plan = plan_doc(model, ctx.state(), ctx.observed())
            body = do_serve.plan_html(plan) + _confirm(session, "/do/serve", f"Serve {model.name}",
                                                       {"definition": _json(model.to_doc())}, "serve")
            return _page(f"Serve {model.name}: the plan", body, session)

        async def act() -> str:
            answer = await model_ops.serve(ctx, committer(ctx, session, form.get("token")), model.to_doc())
            verb = ("defined" if isinstance(answer, Created) else
                    "replaced (its replicas are replaced by the new definition)")
            return (f"model {model.name} {verb}; the reconciler places it now. Follow it on "
                    f'<a href="/models/{esc(model.name)}">its page</a> or with '
                    f"<code>llmgw ctl model show {esc(model.name)}</code>.")
        return await _result(session, f"Serve {model.name}", "serve", act())

    @console_route(app, "/do/retry", ("POST",), action=True)
    async def retry(session: Session, ctx: Context) -> str:
        form = await _form()
        name = form.get("name", "")
        if form.get("confirm") != "yes":
            health = ctx.state().model_health(name)
            said = (f"{name} is parked after {health.failures_in_row} failed start(s): "
                    f"{health.last_error or 'no error'}"
                    if health.parked else f"{name} is not parked now; retrying clears its failed starts anyway")
            body = f"<p>{esc(said)}</p><p>Retry places it again, from a clean count of failures.</p>"
            return _page(f"Retry {name}", body + _confirm(session, "/do/retry", f"Retry {name}",
                                                                {"name": name}, "retry"), session)

        async def act() -> str:
            await model_ops.retry(ctx, committer(ctx, session, form.get("token")), name)
            return (f"model {esc(name)} retried: its failed starts are cleared and the reconciler places it again "
                    f'(<a href="/models/{esc(name)}">its page</a>, <code>llmgw ctl model show {esc(name)}</code>).')
        return await _result(session, f"Retry {name}", "retry", act())

    @console_route(app, "/do/approve", ("POST",), action=True)
    async def approve(session: Session, ctx: Context) -> str:
        form = await _form()
        name = form.get("name", "")
        if form.get("confirm") != "yes":
            pending = name in ctx.state().pending_nodes(ctx.hub.nodes)
            said = (f"node {name} is connected and waiting for approval: once approved, replicas may be placed on it"
                    if pending else f"node {name} is not waiting for approval now; approving it records it anyway")
            return _page(f"Approve {name}", f"<p>{esc(said)}</p>" + _confirm(
                session, "/do/approve", f"Approve {name}", {"name": name}, "approve"), session)

        async def act() -> str:
            answer = await node_ops.approve(ctx, committer(ctx, session, form.get("token")), name)
            return (f"node {esc(name)} {'was already approved' if answer['already'] else 'approved'}: the reconciler "
                    f'may place replicas on it (<a href="/nodes/{esc(name)}">its page</a>, '
                    f"<code>llmgw ctl nodes</code>).")
        return await _result(session, f"Approve {name}", "approve", act())

    @console_route(app, "/do/cordon", ("POST",), action=True)
    async def cordon(session: Session, ctx: Context) -> str:
        form = await _form()
        name, verb = form.get("name", ""), form.get("verb", "")
        if verb not in node_ops.CORDON_VERBS:
            return _page("Cordon", _outcome(False, f"unknown action {verb!r}: cordon, drain or uncordon", "cordon"),
                         session)
        title = f"{verb.capitalize()} {name}"
        if form.get("confirm") != "yes":
            said = CORDON_WORDS[verb].format(name=name)
            return _page(title, f"<p>{esc(said)}</p>" + _confirm(
                session, "/do/cordon", title, {"name": name, "verb": verb}, "cordon"), session)

        async def act() -> str:
            answer = await node_ops.cordon(ctx, committer(ctx, session, form.get("token")), name, verb)
            drain = answer.get("drain")
            words = drain["words"] if drain else {"cordon": "cordoned", "none": "uncordoned"}[answer["cordon"]]
            return (f"node {esc(name)}: {esc(words)} (<a href=\"/nodes/{esc(name)}\">its page</a>, "
                    f"<code>llmgw ctl nodes</code>).")
        return await _result(session, title, "cordon", act())

    @console_route(app, "/do/judge", ("POST",), action=True)
    async def judge(session: Session, ctx: Context) -> str:
        form = await _form()
        doc: dict[str, Any] = {k: form[k].strip() for k in ("name", "source") if form.get(k, "").strip()}
        if form.get("replace"):
            doc["replace"] = True
        if form.get("confirm") != "yes":
            missing = [j["model"] for j in judge_status(ctx.state(), ctx.observed(), None, None)
                       if j["status"] in ("missing", "not_a_judge")]
            name = doc.get("name") or " or ".join(missing) or "the judge the policies ask for"
            source = doc.get("source") or _found_source(ctx) or "(none given, and none found in the nodes' storage)"
            said = (f"Serve {name} as a judge: Llama Guard on CPU via llama.cpp, role guard, one replica, from "
                    f"{source}." + (" A model of that name that is not a judge is replaced." if doc.get("replace")
                                    else ""))
            fields = {k: str(v).lower() if isinstance(v, bool) else v for k, v in doc.items()}
            return _page("Enable the judge", f"<p>{esc(said)}</p>" + _confirm(
                session, "/do/judge", "Enable the judge", fields, "judge"), session)

        async def act() -> str:
            answer = await judge_ops.enable(ctx, committer(ctx, session, form.get("token")), doc)
            name = esc(answer["judge"])
            words = (f"judge {name} served from {esc(answer['model']['source'])}" if answer["changed"] else
                     f"judge {name} was already defined this way: nothing changed")
            if answer.get("replaced"):
                words += f" (it replaced a model of role {esc(answer['replaced'])})"
            warnings = "".join(f"<br>warning: {esc(w)}" for w in answer.get("warnings") or ())
            return (f"{words}; <code>llmgw ctl guard judge status</code> follows it "
                    f'(<a href="/guardrails">Guardrails</a>).{warnings}')
        return await _result(session, "Enable the judge", "judge", act())

    @console_route(app, "/do/system", ("POST",), action=True)
    async def system(session: Session, ctx: Context) -> str:
        async def done(to: str, commit: Commit) -> str:
            answer = await system_ops.switch(ctx, commit, SYSTEM[to])
            state = "stopped" if answer["stopped"] else "started"
            if not answer["changed"]:
                return f"the system was already {state}: nothing changed (<code>llmgw status</code>)."
            return (f"the system is {state}: {answer['models']} model(s), {answer['replicas_placed']} replica(s) "
                    f"still placed on {answer['gpus_placed']} GPU(s) "
                    f"{'being stopped' if answer['stopped'] else 'from before'} (<code>llmgw status</code>).")

        return await _switch(session, ctx, Switch(
            "/do/system", "system", SYSTEM, "Stop / start the system", lambda to: f"{to.capitalize()} the system",
            lambda to: f"{to.capitalize()} the system",
            lambda to: ("Stop the system: every replica is stopped, every GPU freed, and the gateways answer every "
                        "request 503 system_stopped until it is started; no model's definition changes."
                        if to == "stop" else "Start the system: every model is placed again as it asks."), done))

    @console_route(app, "/do/guards", ("POST",), action=True)
    async def guards(session: Session, ctx: Context) -> str:
        async def done(to: str, commit: Commit) -> str:
            await setting_ops.put(ctx, commit, "guard.enabled", GUARDS[to])
            return f"guards are {to} (guard.enabled = {str(GUARDS[to]).lower()}; <code>llmgw ctl guard list</code>)."

        return await _switch(session, ctx, Switch(
            "/do/guards", "guards", GUARDS, "Guards on / off", lambda to: f"Guards {to}",
            lambda to: f"Turn the guards {to}",
            lambda to: ("Turn the guards off: every policy checks nothing, so no request is judged, until they are "
                        "turned on." if to == "off" else "Turn the guards on: every policy checks again."), done))


@dataclass(frozen=True)
class Switch:
    """An action that sets a switch one way or the other (`to`, from the form): its form's path, its id, its
    values, and its words: the title of a refusal, of the page for one value, of the confirm button, what it
    will do, and the action itself (with the form's commit), which answers what it did."""

    path: str
    testid: str
    values: Mapping[str, bool]
    title: str
    page_title: Callable[[str], str]
    confirm: Callable[[str], str]
    said: Callable[[str], str]
    done: Callable[[str, Commit], Awaitable[str]]


async def _switch(session: Session, ctx: Context, switch: Switch) -> str:
    """A switch's two POSTs: what it will do and a confirmation; then the action and its result."""
    form = await _form()
    to = form.get("to", "")
    if to not in switch.values:
        return await _result(session, switch.title, switch.testid,
                             _refuse(f"to must be {' or '.join(switch.values)}, not {to[:20]!r}"))
    if form.get("confirm") != "yes":
        return _page(switch.page_title(to), f"<p>{esc(switch.said(to))}</p>" + _confirm(
            session, switch.path, switch.confirm(to), {"to": to}, switch.testid), session)
    async def act() -> str:  # the form's id is checked inside the action: a bad one is its refusal
        return await switch.done(to, committer(ctx, session, form.get("token")))
    return await _result(session, switch.page_title(to), switch.testid, act())


# --- the menu ---------------------------------------------------------------------------------------


def menu(session: Session, ctx: Context) -> str:
    state = ctx.state()
    csrf = csrf_field(session)
    out = []
    if session.role != "admin":
        out.append('<p class="banner info" data-testid="viewer-notice">You are signed in with a viewer key: you see '
                   'these forms, and each action is refused.</p>')
    out.append('<section class="card" id="do-serve"><h2>Serve a model</h2><p>First the plan: where it would '
               'run now (as <code>llmgw ctl plan</code> says), then a confirmation.</p>' + do_serve.form_html(csrf)
               + "</section>")
    parked = sorted(n for n in state.models if state.model_health(n).parked)
    rows = [[n, state.model_health(n).failures_in_row, state.model_health(n).last_error or "",
             _button("/do/retry", csrf, {"name": n}, "Retry…", f"retry-{n}")] for n in parked[:PARKED_SHOWN]]
    more = (f'<p class="more" data-testid="more-parked">… and {len(parked) - PARKED_SHOWN} more parked: '
            '<a href="/models?state=parked">all parked models</a>, each with its Retry.</p>'
            if len(parked) > PARKED_SHOWN else "")
    out.append('<section class="card" id="do-retry"><h2>Retry a parked model</h2>' +
               table(["Model", "Failed starts", "Last error", ""], rows, sortable=False, testid="parked-table",
                     empty="no model is parked") + more + "</section>")
    if state.settings.get("nodes.require_approval") is True:
        waiting = sorted(state.pending_nodes(ctx.hub.nodes))
        rows = [[n, _button("/do/approve", csrf, {"name": n}, "Approve…", f"approve-{n}")]
                for n in waiting[:PARKED_SHOWN]]
        more = (f'<p class="more">… and {len(waiting) - PARKED_SHOWN} more: <code>llmgw ctl nodes</code>.</p>'
                if len(waiting) > PARKED_SHOWN else "")
        out.append('<section class="card" id="do-approve"><h2>Approve a pending node</h2>' +
                   table(["Node", ""], rows, sortable=False, testid="pending-table",
                         empty="no node is waiting for approval") + more + "</section>")
    known = node_ops.known_nodes(ctx)
    rows = [[esc(n), esc(state.cordoned_nodes.get(n, "-")),
             " ".join(_button("/do/cordon", csrf, {"name": n, "verb": v}, f"{v.capitalize()}…", f"{v}-{n}")
                      for v in (("uncordon",) if n in state.cordoned_nodes else ("cordon", "drain")))]
            for n in known[:PARKED_SHOWN]]
    more = (f'<p class="more">… and {len(known) - PARKED_SHOWN} more: <code>llmgw ctl nodes cordon|drain NAME'
            f'</code>.</p>' if len(known) > PARKED_SHOWN else "")
    out.append('<section class="card" id="do-cordon"><h2>Cordon or drain a node</h2><p>For maintenance: a cordoned '
               'node takes no new replica; a drained one also has its replicas moved elsewhere, one at a time.</p>' +
               table(["Node", "Cordon", ""], rows, sortable=False, testid="cordon-table", empty="no node is known")
               + more + "</section>")
    out.append('<section class="card" id="do-judge"><h2>Enable the judge</h2>' + judge_form(ctx, csrf) + "</section>")
    stopped = bool(effective(state.settings, "serving.stopped"))
    out.append(f'<section class="card" id="do-system"><h2>Stop / start the system</h2><p data-testid="system-state">'
               f'The system is {"stopped" if stopped else "running"}.</p>' +
               _button("/do/system", csrf, {"to": "start" if stopped else "stop"},
                       "Start the system…" if stopped else "Stop the system…", "system-form") + "</section>")
    on = guards_enabled(state)
    out.append(f'<section class="card" id="do-guards"><h2>Guards on / off</h2><p data-testid="guards-state">Guards '
               f'are {"on" if on else "off"}.</p>' +
               _button("/do/guards", csrf, {"to": "off" if on else "on"},
                       "Turn the guards off…" if on else "Turn the guards on…", "guards-form") + "</section>")
    out.append(add_machines(request.host_url, csrf))
    return '<div class="grid">' + "".join(out) + "</div>"


def add_machines(control_url: str, csrf: str) -> str:
    """Add a node, a gateway or a control plane: `llmgw server add`'s operation run from here (this control
    plane's ssh key and zipapp: `do_add.py`), or the command to run where the admin key and an ssh key are."""
    url = esc(control_url.rstrip("/"))
    return (
        '<section class="card" id="do-add" data-testid="do-add"><h2>Add a node or a control plane</h2>'
        "<p>The machine is checked first (ssh, Python 3.11, its ports, its clock, its disk, not in the cluster "
        "already) and nothing changes when a check fails; then the zipapp is copied, the role installed and started "
        "as a service with a one-time join token, and the add waits until the machine has joined (docs/install.md, "
        '"From one machine to a fleet"). From here, this control plane connects with its own ssh key (authorize it '
        "on the machine) and installs the zipapp it runs from; a control plane gets this member's cluster secret.</p>"
        + do_add.form_html(csrf) +
        "<p>Or from a machine that holds the admin key and an ssh key to the new machine:</p>"
        f'<p>A node (it shows on <a href="/nodes">Nodes</a> once its agent connects with its own certificate):<br>'
        f'<code data-testid="add-node-command">llmgw server add root@NEW_HOST --role agent --url {url} '
        f"--name NODE_NAME [--storage /models:FABRIC:shared] [--fabric FABRIC]</code></p>"
        f'<p>A gateway:<br><code data-testid="add-gateway-command">llmgw server add root@NEW_HOST --role gateway '
        f"--url {url} --listen NEW_HOST:8080</code></p>"
        "<p>A control plane (added to the Raft group and caught up before it returns; the Overview lists it with "
        'the leader and standbys):<br><code data-testid="add-control-command">llmgw server add root@NEW_HOST '
        f"--role control --url {url} --cluster-secret-file COPY_OF_cluster.secret "
        "[--floating-address ADDR/PREFIX --floating-interface IF]</code></p>"
        "<p>By hand, without ssh: <code>llmgw ctl nodes token create</code>, then start the role on the machine "
        'with <code>--join-token</code>; a control plane then <code data-testid="add-member-command">llmgw ctl '
        "members add NEW_HOST:RAFT_PORT</code> (docs/install.md).</p></section>")


def judge_form(ctx: Context, csrf: str) -> str:
    state = ctx.state()
    judges = judge_status(state, ctx.observed(), None, ctx.clock())
    wrong = [j for j in judges if j["status"] in ("missing", "not_a_judge")]
    found = _found_source(ctx)
    said = ("no guard policy names a judge yet: add a policy first (<code>llmgw ctl guard set NAME --judge MODEL"
            "</code>), or name the judge to serve" if not judges else
            "the judges the policies ask for are defined: " + esc(", ".join(j["model"] for j in judges))
            if not wrong else "missing: " + esc("; ".join(j["problem"] for j in wrong)))
    hint = (f"found in the nodes' storage: {esc(found)}" if found else
            "no Llama Guard 3 1B file found in the nodes' storage")
    return (f'<p data-testid="judge-state">{said}</p><form method="post" action="/do/judge" data-testid="judge-form" '
            f'class="do">{csrf}<label>Judge name <input name="name" placeholder="the one the policies ask for" '
            f'data-testid="judge-name"></label> <label>Source <input name="source" size="40" '
            f'placeholder="{esc(found or "/models/Llama-Guard-3-1B.Q4_K_M.gguf")}" data-testid="judge-source"></label>'
            f' <label><input type="checkbox" name="replace" value="1" data-testid="judge-replace"> replace a model of '
            f'that name that is not a judge</label><br><small>{hint}</small> '
            f'<button type="submit" data-testid="judge-submit">Enable the judge…</button></form>')


def _found_source(ctx: Context) -> str | None:
    found = pick_guard_file(ctx.observed())
    return found[0] if found else None


# --- the steps every action shares ----------------------------------------------------------------------


def _page(title: str, body: str, session: Session) -> str:
    """A Do page: never refreshed live (a form being filled in, a result being read, stay as they are)."""
    return page(title, "Do", f"<div data-no-refresh>{body}</div>", session=session)


async def _form() -> dict[str, str]:
    form = await request.form
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _button(action: str, csrf: str, fields: Mapping[str, str], label: str, testid: str) -> str:
    hidden = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items())
    return (f'<form method="post" action="{esc(action)}" class="inline" data-testid="{esc(testid)}">{csrf}{hidden}'
            f'<button type="submit">{esc(label)}</button></form>')


def _confirm(session: Session, action: str, what: str, fields: Mapping[str, str], testid: str) -> str:
    """The confirmation step: the same fields again, `confirm=yes` and a fresh id (one commit per form)."""
    hidden = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items())
    return (f'<form method="post" action="{esc(action)}" id="confirm-form" data-testid="confirm-form" '
            f'data-action="{esc(testid)}">{csrf_field(session)}{hidden}<input type="hidden" name="confirm" value="yes">'
            f'<input type="hidden" name="token" value="{new_token()}"><p><strong>{esc(what)}?</strong> '
            f'<button type="submit" data-testid="confirm">Confirm: {esc(what)}</button> '
            f'<a href="/do" data-testid="cancel">Cancel</a></p></form>')


async def _refuse(words: str) -> str:
    raise ActionError(words)


async def _result(session: Session, title: str, action: str, call: Any) -> str:
    """Run the action; its result page: done, with what changed, or refused, with why (HTML words)."""
    try:
        words = await run(call)
        ok = True
    except ActionError as e:
        words, ok = esc(e), False
    return _page(title, _outcome(ok, words, action, html=True) + '<p><a href="/do">Back to Do</a></p>',
                session=session)


def _outcome(ok: bool, words: str, action: str, *, html: bool = False) -> str:
    text = words if html else esc(words)
    return (f'<section class="result {"done" if ok else "refused"}" id="action-result" data-testid="action-result" '
            f'data-action="{esc(action)}" data-outcome="{"done" if ok else "refused"}">'
            f'<strong>{"Done" if ok else "Not done"}:</strong> {text}</section>')


def _json(doc: Any) -> str:
    import json

    return json.dumps(doc, separators=(",", ":"))
