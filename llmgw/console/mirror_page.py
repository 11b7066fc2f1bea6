"""The console's Mirror page (`/mirror`): the model mirror's files as `ctl mirror list` shows them (the admin API's
`ops.mirror.list_files`), which nodes hold each in their mirror cache, the budget, the uploads in progress, and an
upload from the browser (docs/console.md, "The Mirror page").

The upload is the admin API's resumable upload (`ops.mirror`: start, pieces with `Content-Range`, commit), called
here with the signed-in operator's session (an admin key; CSRF token in the `X-CSRF-Token` header), never with a
key the browser holds. Its routes answer JSON for the page's script (console.js): `POST /mirror/uploads`
{name, size, sha256?}, `PUT /mirror/uploads/ID` (one piece, `Content-Range: bytes START-END/TOTAL`; 409
`upload_offset_mismatch` with the offset held), `POST /mirror/uploads/ID/commit`. Uploads go to the leader: a
standby says which member leads.

Unknown stays unknown: a member that did not answer has no holdings to show, a disconnected node no cache.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Awaitable

from quart import Response, request

from llmgw.console.actions import ActionError, committer, new_token, run
from llmgw.console.auth import authorization, console_route
from llmgw.console.layout import UNKNOWN, bar, esc, page, table
from llmgw.console.sessions import Session, csrf_field
from llmgw.control.ops import Created
from llmgw.control.ops import mirror as mirror_ops
from llmgw.control.ops import mirror_serve as serve_ops
from llmgw.control.ops.nodes import node_docs
from llmgw.errors import AdminError

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

PIECE_BYTES = 8 << 20  # what the page's script sends in one PUT (Blob.slice)
PIECE_MAX_BYTES = 16 << 20  # the most one console PUT may carry (the admin app's limit is 1 MiB for the rest)
SHA_SHOWN = 12  # hex digits of a sha256 shown in the table (the whole one on hover and in the copy field)
GIB = 1 << 30
_PIECE_PATH = re.compile(r"/mirror/uploads/[^/]+$")


def register(app: QuartTrio) -> None:
    _piece_limit(app)

    @console_route(app, "/mirror")
    async def mirror_page(session: Session, ctx: Context) -> str:
        try:
            doc: dict[str, Any] | None = await mirror_ops.list_files(ctx, authorization(session) or None)
            problem = ""
        except Exception as e:  # no state dir, a store failure: the page says so rather than failing
            doc, problem = None, str(getattr(e, "message", "") or type(e).__name__)
        body = render(doc, node_docs(ctx), members_known=sorted(ctx.state().members), problem=problem,
                      csrf=session.csrf, leader=ctx.store.is_leader() or ctx.members is None,
                      may_upload=session.role == "admin", added=request.args.get("added"))
        return page("Mirror", "Mirror", body, session=session)

    @console_route(app, "/mirror/uploads", ("POST",), action=True)
    async def mirror_upload_start(session: Session, ctx: Context) -> Response:
        async def act() -> Any:
            _on_leader(ctx)
            try:
                body = json.loads(await request.get_data(as_text=True) or "null")
            except ValueError:
                body = None
            return await mirror_ops.start_upload(ctx, body)
        return await _answer(act())

    @console_route(app, "/mirror/uploads/<uid>", ("PUT",), action=True)
    async def mirror_upload_piece(session: Session, ctx: Context, uid: str) -> Response:
        async def act() -> Any:
            _on_leader(ctx)
            headers = {"content-range": request.headers.get("content-range", "")}
            return await mirror_ops.put_piece(ctx, uid, headers, aiter(request.body))
        return await _answer(act())

    @console_route(app, "/mirror/uploads/<uid>/commit", ("POST",), action=True)
    async def mirror_upload_commit(session: Session, ctx: Context, uid: str) -> Response:
        async def act() -> Any:
            _on_leader(ctx)
            return await mirror_ops.commit_upload(ctx, committer(ctx, session, new_token()), uid)
        return await _answer(act())


    @console_route(app, "/mirror/serve", ("POST",), action=True)
    async def mirror_serve(session: Session, ctx: Context) -> str:
        """Serve a file: the preview (the definition made from its metadata, the memory estimate, the plan),
        then, confirmed, the definition stored; the op is `ops.mirror_serve.serve` (`POST /api/v1/mirror/NAME/serve`)."""
        form = await request.form
        fields = {k: v.strip() for k, v in form.items() if isinstance(v, str) and k in ("file", "name", "token")}
        file, wanted = fields.get("file", ""), fields.get("name") or None
        body: dict[str, Any] = {"name": wanted} if wanted else {}
        confirmed = form.get("confirm") == "yes"
        title = f"Serve mirror file {file}"
        try:
            commit = committer(ctx, session, fields.get("token")) if confirmed else _no_commit
            answer = await run(serve_ops.serve(ctx, commit, file, {**body, "commit": confirmed}))
        except ActionError as e:
            return _serve_page(title, _outcome(False, esc(e)), session)
        if not confirmed:
            return _serve_page(f"{title}: the preview", preview_html(answer) + _confirm(
                session, file, str(answer.get("name") or wanted or "")), session)
        name = esc(answer.get("name"))
        what = "judge" if answer.get("judge") else "model"
        return _serve_page(title, _outcome(True, (
            f'{what} {name} defined from <code>mirror://{esc(file)}</code>; the reconciler places it now: '
            f'<a href="/models/{name}">its page</a>, <code>llmgw ctl model show {name}</code>.')), session)



async def _no_commit(command: dict[str, Any]) -> Any:
    raise ActionError("the preview commits nothing")  # never called: the preview is asked with commit false


def preview_html(answer: Mapping[str, Any]) -> str:
    """The serve preview: what the definition is (and why its profile), its memory estimate and `ctl plan`'s
    verdict, a judge said to be one, the warnings."""
    from llmgw.console.do_serve import plan_html

    said = (f'<p data-testid="mirror-serve-what">{esc(answer.get("name"))}: '
            f'{"a judge (role guard, for the guard policies)" if answer.get("judge") else "a model"} served from '
            f'<code>mirror://{esc(answer.get("file"))}</code>. {esc(answer.get("profile_reason") or "")}</p>')
    warnings = "".join(f'<p class="banner warn">{esc(w)}</p>' for w in answer.get("warnings") or ())
    plan = answer.get("plan")
    definition = json.dumps(answer.get("definition"), indent=2, sort_keys=True)
    return (said + warnings + (plan_html(plan) if isinstance(plan, Mapping) else "") +
            f'<h2>Definition</h2><pre data-testid="mirror-serve-definition">{esc(definition)}</pre>')


def _confirm(session: Session, file: str, name: str) -> str:
    hidden = "".join(f'<input type="hidden" name="{k}" value="{esc(v)}">' for k, v in (
        ("file", file), ("name", name), ("confirm", "yes"), ("token", new_token())))
    return (f'<form method="post" action="/mirror/serve" id="confirm-form" data-testid="confirm-form" '
            f'data-action="mirror-serve">{csrf_field(session)}{hidden}<p><strong>Serve {esc(name)}?</strong> '
            f'<button type="submit" data-testid="confirm">Confirm: serve {esc(name)}</button> '
            f'<a href="/mirror" data-testid="cancel">Cancel</a></p></form>')


def _outcome(ok: bool, words: str) -> str:
    return (f'<section class="result {"done" if ok else "refused"}" id="action-result" data-testid="action-result" '
            f'data-action="mirror-serve" data-outcome="{"done" if ok else "refused"}">'
            f'<strong>{"Done" if ok else "Not done"}:</strong> {words}</section>')


def _serve_page(title: str, body: str, session: Session) -> str:
    return page(title, "Mirror", f'<div data-no-refresh>{body}<p><a href="/mirror">Back to Mirror</a></p></div>',
                session=session)


def _on_leader(ctx: Context) -> None:
    if not ctx.store.is_leader() and ctx.members is not None:
        leader = ctx.store_status().get("leader")
        raise ActionError("this control plane is a standby and uploads go to the leader: open the console on the "
                          f"leader{f' (Raft address {leader})' if leader else ' (none is known now; try again shortly)'}")


async def _answer(call: Awaitable[Any]) -> Response:
    """The operation's answer as JSON; a refusal as `{"error": {"code", "message", "offset"?}}` with its status
    (a store failure in `actions.run`'s words, 409 `refused`)."""
    try:
        done = await run(_keep_codes(call))
    except _Refused as e:
        return _json(e.error.doc(), e.error.status)
    except ActionError as e:
        return _json({"error": {"code": "refused", "message": str(e)}}, 409)
    return _json(done, 201 if isinstance(done, Created) else 200)


class _Refused(ActionError):
    """An AdminError carried through `actions.run` with its status, code (and offset) kept."""

    def __init__(self, error: AdminError) -> None:
        super().__init__(error.message)
        self.error = error


async def _keep_codes(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except AdminError as e:
        raise _Refused(e) from None


def _json(doc: Any, status: int) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json",
                    headers={"cache-control": "no-store", "x-content-type-options": "nosniff"})


def _piece_limit(app: QuartTrio) -> None:
    """A console PUT of a piece may carry `PIECE_MAX_BYTES` (the app's requests are limited to 1 MiB, fixed when
    Quart makes the request, before routing): as `control/api._stream_limit` does for the admin API's uploads."""
    base: Any = app.asgi_http_class

    class ConsolePieces(base):  # type: ignore[misc]
        def _create_request_from_scope(self, send: Any) -> Any:
            made = super()._create_request_from_scope(send)
            if made.method == "PUT" and _PIECE_PATH.match(made.path):
                made.body = made.body_class(made.content_length, PIECE_MAX_BYTES)
            return made

    app.asgi_http_class = ConsolePieces


# --- the page ---------------------------------------------------------------------------------------------


def render(doc: Mapping[str, Any] | None, nodes: Sequence[Mapping[str, Any]], *, members_known: Sequence[str] = (),
           problem: str = "", csrf: str = "", leader: bool = True, may_upload: bool = True,
           added: str | None = None) -> str:
    """The page's content from `list_files`' answer (None: it could not be read, `problem` says why) and the
    nodes as `node_docs` lists them."""
    if doc is None:
        return (f'<p class="refusal" data-testid="mirror-unknown">The mirror cannot be read on this control plane: '
                f'{esc(problem or "unknown")}.</p>')
    files = [f for f in doc.get("files") or () if isinstance(f, Mapping)]
    answered = [str(m) for m in doc.get("members") or ()]
    silent = sorted(set(members_known) - set(answered))
    out = []
    if added and any(f.get("name") == added for f in files):
        out.append(f'<section class="result done" data-testid="mirror-added"><strong>Done:</strong> {esc(added)} '
                   f'added to the mirror (<code>mirror://{esc(added)}</code>).</section>')
    out.append(_budget(doc, len(files)))
    if silent:
        out.append(f'<p data-testid="mirror-silent">Members that did not answer (what they hold is unknown): '
                   f'{esc(", ".join(silent))}.</p>')
    may_act = may_upload and leader
    out.append(table(["Name", "Size", "sha256", "Kind", "Architecture", "Parameters", "Quantisation", "Used by",
                      "Pinned", "Members holding", "Members missing", "Node caches", *(["Serve"] if may_act else [])],
                     [row(f, nodes, silent) + ([serve_button(str(f.get("name")), csrf)] if may_act else [])
                      for f in files], testid="mirror-table",
                     empty="no file in the mirror: upload one below, or `llmgw ctl mirror add FILE`"))
    out.append("<h2>Uploads in progress</h2>")
    uploads = [u for u in doc.get("uploads") or () if isinstance(u, Mapping)]
    out.append(table(["Name", "Received", "Size", "Done", "Started (unix s)", "Id"],
                     [[u.get("name"), _bytes(u.get("offset"), zero=True), _bytes(u.get("size")),
                       _percent(u.get("offset"), u.get("size")), _when(u.get("started_at")), u.get("id")]
                      for u in uploads], testid="mirror-uploads",
                     empty="none (an upload stopped part way stays here; sending the same file again goes on "
                           "from where it stopped)"))
    out.append(upload_form(csrf, leader=leader, may_upload=may_upload))
    return "".join(out)


def _budget(doc: Mapping[str, Any], count: int) -> str:
    stored, budget = doc.get("stored_bytes"), doc.get("budget_bytes")
    if isinstance(stored, int) and isinstance(budget, int):
        meter = bar(stored, budget, label=f"{human(stored)} of {human(budget)}")
    else:
        meter = UNKNOWN
    return (f'<p data-testid="mirror-budget">{count} file(s); stored of the budget (mirror.budget_gib): {meter}'
            "</p>")


def row(f: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], silent: Sequence[str] = ()) -> list[Any]:
    meta = f.get("metadata") if isinstance(f.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    sha = str(f.get("sha256") or "")
    sha_html = (f'<span class="sha" title="{esc(sha)}" data-sha256="{esc(sha)}">{esc(sha[:SHA_SHOWN])}…</span>'
                f' <input class="copy" readonly value="{esc(sha)}" aria-label="sha256 of {esc(f.get("name"))}" '
                f'size="8">') if sha else UNKNOWN
    users = f.get("used_by")
    used = (esc(", ".join(str(u) for u in users)) if users else "nothing") if isinstance(users, list) else UNKNOWN
    members = f.get("members") if isinstance(f.get("members"), Mapping) else {}
    assert isinstance(members, Mapping)
    holding, missing = members.get("holding"), members.get("missing")
    missing_html = _names(missing)
    if silent:
        missing_html += f' <span class="unknown">unknown: {esc(", ".join(silent))}</span>'
    return [f'<span data-testid="mirror-name">{esc(f.get("name"))}</span>', _bytes(f.get("size")), sha_html,
            f.get("kind"), meta.get("architecture") or meta.get("model_type"),
            _params(meta.get("parameter_count")), meta.get("quantization") or _dtypes(meta.get("dtypes")),
            used, "yes" if f.get("pinned") else "no", _names(holding), missing_html, node_caches(sha, nodes)]


def node_caches(sha: str, nodes: Sequence[Mapping[str, Any]]) -> str:
    """The nodes whose mirror cache (a storage directory whose entries are of kind `mirror`) holds this blob; the
    disconnected ones (no storage known) as unknown."""
    holding, unknown = [], []
    for d in nodes:
        storage = d.get("storage")
        if not isinstance(storage, list):
            unknown.append(str(d.get("node")))
            continue
        if any(isinstance(m, Mapping) and m.get("kind") == "mirror" and m.get("sha256") == sha
               for s in storage if isinstance(s, Mapping) for m in s.get("models") or () if isinstance(s.get(
                   "models"), list)):
            holding.append(str(d.get("node")))
    out = esc(", ".join(sorted(holding))) if holding else "none"
    if unknown:
        out += f' <span class="unknown">unknown: {esc(", ".join(sorted(unknown)))}</span>'
    return f'<span data-testid="mirror-nodes">{out}</span>'


def serve_button(name: str, csrf: str) -> str:
    """Serve this file: its preview first (`/mirror/serve`), a model name to give optional."""
    return (f'<form method="post" action="/mirror/serve" class="inline" data-testid="mirror-serve">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}"><input type="hidden" name="file" '
            f'value="{esc(name)}"><input name="name" placeholder="model name" size="10" aria-label="the model\'s name '
            f'(default: from the file)"> <button type="submit">Serve…</button></form>')


def upload_form(csrf: str, *, leader: bool, may_upload: bool) -> str:
    if not may_upload:
        return "<h2>Upload</h2><p>A viewer cannot upload: sign in with an admin key.</p>"
    if not leader:
        return ("<h2>Upload</h2><p>Uploads go to the leader: open the console there (or "
                "<code>llmgw ctl mirror add FILE</code>, which finds it).</p>")
    return ('<h2>Upload</h2><form id="mirror-upload" method="post" action="/mirror/uploads" '
            f'data-testid="mirror-upload" data-piece-bytes="{PIECE_BYTES}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            '<label>File (GGUF or safetensors) <input type="file" name="file" required data-testid="mirror-file">'
            '</label> <label>Name in the mirror <input name="name" placeholder="the file\'s own name" '
            'data-testid="mirror-upload-name"></label> <button type="submit" data-testid="mirror-upload-start">'
            'Upload</button>'
            '<p><progress max="100" value="0" hidden data-testid="mirror-progress"></progress> '
            '<span data-testid="mirror-upload-status" aria-live="polite"></span></p></form>'
            '<p>The file goes to the leader in pieces; a piece that fails is sent again from where the leader '
            'stopped, and the leader checks the whole file (sha256, header) when it is complete. '
            '<code>llmgw ctl mirror add FILE</code> does the same from a shell.</p>')


def _names(value: Any) -> str:
    if not isinstance(value, list):
        return UNKNOWN
    return esc(", ".join(str(v) for v in value)) if value else "none"


def human(value: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _bytes(value: Any, *, zero: bool = False) -> str | None:
    """Bytes in words (the exact count on hover); unknown (None) when not a count, or 0 where 0 means "not said"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not zero):
        return None
    return f'<span title="{value} bytes">{human(value)}</span>' if value >= 1024 else f"{value} B"


def _percent(done: Any, total: Any) -> str | None:
    if not isinstance(done, int) or not isinstance(total, int) or total <= 0:
        return None
    return bar(done, total, label=f"{100 * done / total:.0f}%")


def _params(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def _dtypes(value: Any) -> str | None:
    return ", ".join(str(v) for v in value) if isinstance(value, list) and value else None


def _when(value: Any) -> str | None:
    return f"{value:.0f}" if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None
