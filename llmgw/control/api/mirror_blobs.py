"""`GET /mirror/blobs/<sha256>`: the model mirror's verified files (`STATE_DIR/mirror/blobs/<sha256>`), served
by every control plane, leader or standby, to the cluster's machines only (docs/mirror.md, "Who may fetch").

Who may fetch: a registered agent or a control plane, by its certificate from the cluster's CA (mutual TLS:
valid, not expired, not revoked, the one the cluster holds for it), or a machine inside this control plane's
process by its in-memory credential (`llmgw up`'s own agent on plain loopback HTTP: `Bearer llmgw-local-...`,
the credential its stream already uses). Anything else is refused 401 (no credential, a bad one), 403 (another
role's: a gateway's; a revoked certificate), logged with the reason. No key is taken, an admin key included: a
person copies a file with `ctl mirror`, not here.

Served from disk as it is read (never the whole file in memory), with one HTTP byte range at most per request
(`Range: bytes=A-B`, `A-`, `-N`): 206 with `Content-Range`, 416 with `Content-Range: bytes */SIZE` for a range
past the end; 404 for a blob this member does not hold; 503 `mirror_busy` (with Retry-After) while it already
sends `MAX_SENDS` files, so a fetch goes to the next control plane of its list (a standby) instead.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
import trio
from quart import Response, request
from quart_trio import QuartTrio

from llmgw.control.api.streams import authenticate, local_credential
from llmgw.control.context import Context
from llmgw.mirror.blobs import BlobStore
from llmgw.errors import AdminError
from llmgw.trust.ca import Identity
from llmgw.trust.tls import peer_certificate
from llmgw.wire import protocol

log = logging.getLogger("llmgw.control.mirror")

CHUNK = 1 << 20  # bytes read from the disk, then sent, at a time
MAX_SENDS = 16  # files sent at once by one control plane; past it: 503 mirror_busy
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)\Z")


@dataclass(frozen=True)
class Span:
    """The bytes [start, end) of a file of `size` bytes to send, and whether that is a part of it (206)."""

    start: int
    end: int
    size: int
    partial: bool

    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end - 1}/{self.size}"


class Unsatisfiable(ValueError):
    """A range with no byte inside the file (416)."""


def parse_range(header: str | None, size: int) -> Span:
    """The span a `Range` header asks of a file of `size` bytes. No header, or one this does not read (another
    unit, several ranges: RFC 9110 lets a server ignore it), is the whole file. Raises Unsatisfiable for a range
    that starts at or past the end (or `bytes=-0`)."""
    whole = Span(0, size, size, False)
    if not header:
        return whole
    found = _RANGE.match(header.strip().replace(" ", ""))
    if found is None or (not found.group(1) and not found.group(2)):
        return whole
    first, last = found.group(1), found.group(2)
    if not first:  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise Unsatisfiable(header)
        return Span(max(0, size - n), size, size, True)
    start = int(first)
    end = size if not last else min(size, int(last) + 1)
    if start >= size or (last and int(last) < start):
        raise Unsatisfiable(header)
    return Span(start, end, size, True)



def who_may_fetch(ctx: Context, cert_der: bytes | None, local: str | None) -> Identity | AdminError:
    """The machine asking (an agent or a control plane of the cluster), or the refusal (401/403)."""
    if local is None and cert_der is None:
        return AdminError(401, "unauthorized", "the mirror serves the cluster's machines only: an agent or a control "
                          "plane, by its certificate from the cluster's CA (mutual TLS), or a machine inside this "
                          "control plane's process by its credential; none was presented (docs/mirror.md)")
    if local is None and ctx.trust is None:
        return AdminError(401, "unauthorized", "this control plane serves plain HTTP on loopback: only machines "
                          "inside its process may fetch from its mirror")
    who = authenticate(ctx, "agent", cert_der, local=local)
    if isinstance(who, AdminError) and who.code == "forbidden":  # another role's credential: a control plane's?
        other = authenticate(ctx, "control", cert_der, local=local)
        if isinstance(other, AdminError) and other.code == "forbidden":
            return AdminError(403, "forbidden", "the mirror serves agents and control planes only: "
                              f"{who.message.split(' cannot ')[0]} cannot fetch from it")
        who = other
    if isinstance(who, AdminError) and who.code == "revoked":  # its machine is refused, as on every route
        return AdminError(403, "revoked", who.message)
    return who


def register(app: QuartTrio, ctx: Context) -> None:
    """Add the blob route to the admin app (every member answers it itself, never forwarded)."""
    sending = _Sends()

    @app.route(protocol.MIRROR_BLOBS_PATH + "<sha256>", methods=["GET"])
    async def mirror_blob(sha256: str) -> Response:
        who = who_may_fetch(ctx, peer_certificate(), local_credential(request.headers))
        if isinstance(who, AdminError):
            log.warning("refused a mirror fetch of %.12s from %s: %s", sha256, request.remote_addr, who.message)
            return _error(who)
        if not _SHA256.match(sha256):
            return _error(AdminError(400, "invalid_sha256", "a mirror file is named by its sha256: 64 lowercase "
                                     "hex digits"))
        path = BlobStore(ctx.state_dir / "mirror").blob_path(sha256) if ctx.state_dir is not None else None
        try:
            size = path.stat().st_size if path is not None else -1
        except OSError:
            size = -1
        if path is None or size < 0:
            return _error(AdminError(404, "mirror_file_not_found", f"this control plane holds no mirror file "
                                     f"{sha256[:12]}"))
        try:
            span = parse_range(request.headers.get("range"), size)
        except Unsatisfiable:
            response = _error(AdminError(416, "range_not_satisfiable", f"the range asked is past the end of the "
                                         f"file ({size} bytes)"))
            response.headers["Content-Range"] = f"bytes */{size}"
            return response
        if sending.now >= MAX_SENDS:
            response = _error(AdminError(503, "mirror_busy", f"this control plane sends {MAX_SENDS} mirror files "
                                         f"already: fetch from another control plane, or again later"))
            response.headers["Retry-After"] = "5"
            return response
        log.info("%s %s fetches mirror file %.12s (bytes %d-%d of %d)", who.role, who.name, sha256, span.start,
                 span.end, size)
        response = Response(_read(path, span, sending), status=206 if span.partial else 200,
                            content_type="application/octet-stream")
        response.headers["Content-Length"] = str(span.end - span.start)
        response.headers["Accept-Ranges"] = "bytes"
        if span.partial:
            response.headers["Content-Range"] = span.content_range()
        return response


class _Sends:
    now = 0  # files being sent now (counted while their body is read: one never started holds no place)


async def _read(path: Path, span: Span, sending: _Sends) -> AsyncIterator[bytes]:
    """The span's bytes, read as they are sent; the send's place is given back however it ends."""
    sending.now += 1
    try:
        async with await trio.open_file(path, "rb") as f:
            await f.seek(span.start)
            left = span.end - span.start
            while left > 0:
                data = await f.read(min(CHUNK, left))
                if not data:
                    break  # the file shrank under us (it never should): the client sees a short body
                left -= len(data)
                yield data
    finally:
        sending.now -= 1


def _error(error: AdminError) -> Response:
    return Response(json.dumps(error.doc()), status=error.status, content_type="application/json")
