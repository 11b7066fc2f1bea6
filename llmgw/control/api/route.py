"""The one `route` wrapper of the admin API: who may call (the route's role), leader forwarding,
idempotent writes, and the admin error shape, for every route of the table (`api/table.py`).

A route's operation is called with a `Call`: the context, the request's path arguments, query and
body (parsed JSON, for routes that take one), the caller's `Authorization` (to ask other members and
gateways on its behalf), and the request's idempotent `commit` and `note`. It returns a JSON-ready
document (`ops.Created` for a 201), or `Raw` bytes. A write returns after it is committed, so a read
that follows it sees it, and applies at most once per `Idempotency-Key`: a keyed write this member
already answered is answered again byte for byte.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import re
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import trio
from cryptography import x509
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from llmgw.control.context import Context
from llmgw.control.members import ANSWERED_BY
from llmgw.control.ops import Created, command_refusal, store_error
from llmgw.domain import commands
from llmgw.domain.commands import CommandError
from llmgw.domain.keys import hash_key
from llmgw.errors import AdminError
from llmgw.store import NotLeader, StoreUnavailable
from llmgw.trust import ca
from llmgw.trust.peer import PeerRefused, authorize
from llmgw.trust.tls import peer_certificate

log = logging.getLogger("llmgw.control.admin")

MAX_BODY_BYTES = 1 << 20
IDEMPOTENCY_KEY_MAX_CHARS = 200
KEPT_REPLIES = 1024  # answers to keyed writes this member replays byte for byte
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})

# Who may call a route: anyone (probes, scrapers, API tools), a viewer or admin key (reads), an admin key, or a
# machine of the cluster by its certificate (mutual TLS; an admin key too).
Role = Literal["public", "viewer", "admin", "machine"]
PUBLIC: Role = "public"
VIEWER: Role = "viewer"
ADMIN: Role = "admin"
MACHINE: Role = "machine"


@dataclass(frozen=True)
class Raw:
    """An answer that is not JSON built per request: its bytes and content type as they are."""

    body: bytes
    content_type: str
    status: int = 200


@dataclass(frozen=True)
class File:
    """An answer that is a file on this member's disk, streamed as it is read."""

    path: Path
    content_type: str = "application/octet-stream"


Answer = dict[str, Any] | Raw | File


@dataclass
class Call:
    """One request as an operation sees it."""

    ctx: Context
    path: Mapping[str, str]
    args: Mapping[str, str]
    authorization: str | None
    body: Any = None  # the parsed JSON body (routes with `body=True`)
    chunks: AsyncIterator[bytes] | None = None  # the body as it arrives (routes with `stream=True`)
    headers: Any = field(default_factory=dict)  # the request's headers (`Content-Range`): a read-only mapping
    commit: Callable[[dict[str, Any]], Awaitable[Any]] = field(default=lambda c: _no_write())
    note: Callable[[str], None] = field(default=lambda d: None)


async def _no_write() -> Any:
    raise AssertionError("a read route committed a command")


Op = Callable[[Call], Awaitable[Answer]]


@dataclass(frozen=True)
class Route:
    """One line of the route table: method, rule (werkzeug's), role, the operation, and whether it reads
    a JSON body, and whether a standby answers it itself (`local`) rather than forwarding to the leader."""

    method: str
    rule: str
    role: Role
    op: Op
    body: bool = False
    local: bool = False
    # The operation reads the body itself, as it arrives (`Call.chunks`), up to `STREAM_MAX_BYTES` (a release file:
    # api/__init__.py lets such a route's requests past the app's 1 MiB limit).
    stream: bool = False

    @property
    def writes(self) -> bool:
        return self.method in WRITE_METHODS


@dataclass
class _Write:
    """One write request's idempotency: its command id, and the fingerprint of what it asked."""

    cid: str
    keyed: bool  # the client sent an Idempotency-Key (else `cid` is fresh, never seen again)
    digest: str = ""


@dataclass(frozen=True)
class _Reply:
    digest: str
    status: int
    body: bytes


class _Replayed(Exception):
    """A keyed write this member already answered: the first answer is sent again."""

    def __init__(self, reply: _Reply) -> None:
        self.reply = reply


_write: contextvars.ContextVar[_Write] = contextvars.ContextVar("llmgw_admin_write")


def idempotency_key(headers: Any) -> str | None:
    """The request's `Idempotency-Key` (None when absent); 400 unless 1..200 printable ASCII."""
    key: str | None = headers.get("idempotency-key")
    if key is None:
        return None
    if not (0 < len(key) <= IDEMPOTENCY_KEY_MAX_CHARS and all(" " <= ch <= "~" for ch in key)):
        raise AdminError(400, "invalid_idempotency_key",
                         f"Idempotency-Key must be 1..{IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters"
                         " (a UUID is a good one)")
    return key


def scoped_cid(key_hash: str, key: str) -> str:
    """The command id of a client's key: scoped to its admin key, so two clients never collide."""
    return "k:" + hashlib.sha256(f"{key_hash}\n{key}".encode()).hexdigest()[:32]


def caller_key(ctx: Context, headers: Any, role: Role) -> str:
    """The caller's key hash; 401 unless it carries a key of this cluster that `role` admits (a viewer key
    reads what the console shows, and is refused every change with a 403)."""
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise AdminError(401, "unauthorized", "send the admin key as 'Authorization: Bearer <key>'")
    key_hash = hash_key(key.strip())
    found = ctx.state().key_role(key_hash)
    if found == "viewer" and role == ADMIN:
        raise AdminError(403, "viewer_key", "this is a viewer key: it reads (GET) but changes nothing; "
                                            "use an admin key")
    if found != "admin" and found != "viewer":
        raise AdminError(401, "unauthorized", "this key is not an admin key of this cluster")
    return key_hash


def cluster_machine(ctx: Context) -> bool:
    """Did this connection present a current certificate of a machine of this cluster (any role)? False when it
    presented none (a person or script: its key decides); 401/403 when it presented one that is not valid."""
    cert = peer_certificate()
    if cert is None:
        return False
    refused: PeerRefused | None = None
    for role in ("agent", "gateway", "control"):
        try:
            authorize(cert, ctx.state(), ctx.clock(), role=role)
            return True
        except PeerRefused as e:
            if e.code != "forbidden":  # not a role mismatch: the certificate itself is refused
                refused = e
                break
    raise AdminError(401 if refused is None or refused.code == "unauthorized" else 403,
                     refused.code if refused is not None else "unauthorized",
                     refused.message if refused is not None else "the certificate presented names no machine role")


def _file_response(answer: File, asked: str | None = None) -> Response:
    """The file, streamed; with `asked` (a `Range: bytes=START-` header) from START on, as a 206 (a resumed pull)."""
    size = answer.path.stat().st_size
    start = 0
    if asked is not None:
        m = re.fullmatch(r"bytes=(\d+)-", asked.strip())
        if m is not None and int(m.group(1)) < size:
            start = int(m.group(1))

    async def body() -> AsyncIterator[bytes]:
        async with await trio.open_file(answer.path, "rb") as f:
            await f.seek(start)
            while data := await f.read(1 << 20):
                yield data

    response = Response(body(), status=206 if start else 200, content_type=answer.content_type)
    response.headers["Content-Length"] = str(size - start)
    response.headers["Accept-Ranges"] = "bytes"
    if start:
        response.headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
    return response


def revoked_peer(ctx: Context) -> None:
    """403 when the connection's client certificate (a machine's: a standby forwarding, an agent) is
    revoked: its machine is refused whatever key the request carries (docs/security.md)."""
    cert = peer_certificate()
    if cert is None:
        return
    try:
        serial = ca.serial_hex(x509.load_der_x509_certificate(cert))
    except ValueError:
        return
    revoked = ctx.state().revoked.get(serial)
    if revoked is not None:
        raise AdminError(403, "revoked", f"the certificate this connection presented ({revoked.role} "
                                         f"{revoked.name}, serial {serial}) is revoked")


async def confirm_leading(ctx: Context) -> None:
    """Before the leader answers a read: a majority confirms it still leads (the store's ReadIndex
    round), so the answer misses no write acknowledged before the read arrived, whichever member
    acknowledged it. A leader cut off from its peers answers 503, never what may be stale."""
    try:
        await ctx.store.confirm_leader()
    except NotLeader as e:
        where = (f"the leader is now the member with Raft address {e.leader}" if e.leader else
                 "no leader is known (an election may be under way)")
        raise AdminError(503, "not_leader", f"this member stopped leading while it confirmed the read, so it does "
                                            f"not answer it; {where}: ask again (any member forwards it)") from None
    except StoreUnavailable as e:
        raise AdminError(503, "leader_unreachable", f"the read was not answered: {e}. Retry, or ask another "
                                                    f"member") from None


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


async def body_json() -> Any:
    """The request's body as JSON; 400 `invalid_json` when empty, not JSON, or nested too deeply."""
    data = await request.get_data(as_text=False)
    if not data:
        raise AdminError(400, "invalid_json", "the request body is empty; send JSON")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise AdminError(400, "invalid_json", f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise AdminError(400, "invalid_json", "the request body is nested too deeply") from None


class Router:
    """Registers the table's routes on an app, sharing this member's kept replies."""

    def __init__(self, app: QuartTrio, ctx: Context) -> None:
        self.app = app
        self.ctx = ctx
        self._replies: OrderedDict[str, _Reply] = OrderedDict()

    # -- idempotency --------------------------------------------------------------------------

    def _note(self, digest: str) -> None:
        """Note what this write asks (`digest`); a keyed write this member already answered is answered
        again as it was (`_Replayed`), and the same key for another request is refused."""
        write = _write.get()
        write.digest = digest
        kept = self._replies.get(write.cid) if write.keyed else None
        if kept is not None:
            if kept.digest != write.digest:
                raise AdminError(422, "idempotency_key_reused", "this Idempotency-Key was already used for a"
                                 " different request; send a new key for a new request")
            raise _Replayed(kept)

    async def _commit(self, command: dict[str, Any]) -> Any:
        """Commit this request's command under its idempotency id; its result once applied. A keyed
        write another member answered, or this one before a restart, returns the result it recorded."""
        command = commands.with_cid(command, _write.get().cid)
        self._note(commands.digest(command))
        try:
            return await self.ctx.store.submit(command)
        except CommandError as e:
            raise command_refusal(e) from None

    async def _keep(self, write: _Write, response: Response) -> None:
        if write.keyed and write.digest and 200 <= response.status_code < 300:
            self._replies[write.cid] = _Reply(write.digest, response.status_code,
                                              await response.get_data(as_text=False))
            while len(self._replies) > KEPT_REPLIES:
                self._replies.popitem(last=False)

    # -- the wrapper ----------------------------------------------------------------------------

    def add(self, route: Route) -> None:
        ctx = self.ctx

        async def answer(path: dict[str, str]) -> Response:
            call = Call(ctx, path, request.args, request.headers.get("authorization"),
                        commit=self._commit, note=self._note, headers=request.headers)
            if route.body:
                call.body = await body_json()
            if route.stream:
                call.chunks = aiter(request.body)
            done = await route.op(call)
            if isinstance(done, File):
                return _file_response(done, request.headers.get("range"))
            if isinstance(done, Raw):
                return Response(done.body, status=done.status, content_type=done.content_type)
            return json_response(done, 201 if isinstance(done, Created) else 200)

        async def handler(**path: str) -> Response:
            write: _Write | None = None
            try:
                if route.role == PUBLIC:
                    return await answer(path)
                revoked_peer(ctx)
                if not route.local and ctx.members is not None and not ctx.store.is_leader():
                    body = await request.get_data(as_text=False)
                    assert isinstance(body, bytes)
                    relayed = await ctx.members.forward(request.method, _raw_path(), body, request.headers)
                    response = Response(relayed.body, status=relayed.status, content_type=relayed.content_type)
                    response.headers[ANSWERED_BY] = relayed.answered_by
                    return response
                if not route.writes and not route.local:
                    await confirm_leading(ctx)  # before the key check too: a key revoked is refused at once
                if route.role == MACHINE and cluster_machine(ctx):
                    return await answer(path)
                key_hash = caller_key(ctx, request.headers, ADMIN if route.role == MACHINE else route.role)
                if not route.writes:
                    return await answer(path)
                key = idempotency_key(request.headers)
                write = _Write(scoped_cid(key_hash, key) if key else "u:" + uuid.uuid4().hex, key is not None)
                token = _write.set(write)
                try:
                    response = await answer(path)
                finally:
                    _write.reset(token)
                await self._keep(write, response)
                return response
            except AdminError as e:
                return json_response(e.doc(), e.status)
            except _Replayed as r:
                return Response(r.reply.body, status=r.reply.status, content_type="application/json")
            except HTTPException:
                raise  # 404, 405, 413: answered by the error handlers (api/errors.py), in the same shape
            except Exception as e:
                keyed = write.keyed if write is not None else "idempotency-key" in request.headers
                known = store_error(e, keyed)
                if known is None:
                    log.exception("admin request %s %s failed", request.method, request.path)
                    known = AdminError(500, "internal_error", f"this member failed on the request "
                                                              f"({type(e).__name__}); it is logged")
                else:
                    log.warning("%s %s: %s", request.method, request.path, known.message)
                return json_response(known.doc(), known.status)

        handler.__name__ = f"{route.method.lower()}_{_endpoint_name(route.rule)}"
        self.app.route(route.rule, methods=[route.method])(handler)


def _endpoint_name(rule: str) -> str:
    """A unique endpoint name for Quart from a rule: `/api/v1/models/<path:name>` -> `api_v1_models_name`."""
    out = []
    for part in rule.strip("/").split("/"):
        out.append(part.strip("<>").rpartition(":")[2] if part.startswith("<") else part)
    return "_".join(p.replace("-", "_").replace(".", "_") for p in out) or "root"


def _raw_path() -> str:
    """The request's path and query as the client sent them (escapes kept: `a%2Fb` stays one segment)."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else request.path
    query = request.query_string.decode("latin-1")
    return f"{path}?{query}" if query else path
