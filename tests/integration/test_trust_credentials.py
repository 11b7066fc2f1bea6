"""Every route × every kind of credential (issue 20): a control plane serving TLS with its own CA, in
this trio run, asked on every route of the admin API (`api/table.py` ROUTES) and on both streams with
an admin key, a viewer key, a client key, an agent's, a gateway's and the control plane's own
certificate, a certificate from another CA, an expired one, a revoked one, and nothing.

What must hold: the admin API takes keys only (a machine's certificate alone is 401 there: it never
grants admin access), a viewer key reads and is refused every change (403), a client key is 401; a
stream takes only its own role's certificate (the other role's is 403) and no key at all, the admin
key included; another CA's certificate and an expired one do not get through the TLS handshake (or
are refused 401), a revoked one is refused with the code "revoked". And revocation ends a connected
agent's stream at once: its node is lost with no grace period, and its reconnects are refused."""

from __future__ import annotations

import dataclasses
import gc
import logging
import re
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from trio_websocket import HandshakeError

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.api.route import ADMIN as ADMIN_ROLE
from llmgw.control.api.route import MACHINE, PUBLIC, Route
from llmgw.control.api.table import ROUTES
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.commands import trust as trust_commands
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing import FakeGpuProbe
from llmgw.trust import ca, tls
from llmgw.trust.files import MachineFiles, write_private
from llmgw.trust.join import JoinRequest, ensure_credentials
from llmgw.trust.peer import PeerRefused, authorize
from llmgw.wire import protocol
from llmgw.wire.stream_client import open_stream
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-trust-credentials"
# Each path argument of the table's rules, filled with a plausible value (none of them exists: a write
# with an admin key is answered 400/404/409, and changes nothing the other rows depend on).
PATH_VALUES = {"name": "demo", "key": "serving.stopped", "request_id": "req_0123456789abcdef", "key_id": "key_0",
               "token_id": "tok_0", "role": "agent", "member": "127.0.0.1:1", "sha256": "0" * 64,
               "upload_id": "0" * 32}
STREAMS = {protocol.STREAM_PATH: "agent", protocol.GATEWAY_STREAM_PATH: "gateway"}
TLS = "tls"  # the TLS handshake refused the credential: no route was reached


@dataclass(frozen=True)
class Credential:
    kind: str
    key: str | None = None  # sent as `Authorization: Bearer <key>`
    cert: tuple[Path, Path] | None = None  # (certificate chain, key) offered in the TLS handshake

    def context(self, bundle: Path) -> ssl.SSLContext:
        """A client's TLS context: the cluster's bundle to verify the control plane, and this certificate."""
        return tls.client_context(bundle, *(self.cert or (None, None)))

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}


@dataclass
class Cluster:
    control: ControlHandle
    bundle: Path  # the cluster's trust bundle (the control plane's STATE_DIR/tls/ca.pem)
    credentials: list[Credential]  # the admin key last: its allowed writes come after every other row


def tls_control_config(state_dir: Path, **timeouts: float) -> ControlConfig:
    return ControlConfig(state_dir=state_dir, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                         admin_port=0, seed=Seed(admin_key=ADMIN), tls=True,
                         timeouts=dataclasses.replace(TIMEOUTS, **timeouts))


def admin_client(control: ControlHandle, bundle: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=10,
                             verify=tls.client_context(bundle))


async def join(api: httpx.AsyncClient, control: ControlHandle, bundle: Path, state_dir: Path, role: str,
               name: str) -> MachineFiles:
    """A machine joined as an operator joins it: a join token from the admin API, then the machine's own
    join (its key made here, its certificate request signed by the cluster's CA)."""
    made = await api.post("/api/v1/trust/tokens", json={"role": role, "name": name})
    assert made.status_code == 201, made.text
    return await ensure_credentials(MachineFiles.of(state_dir), [control.admin_url],
                                    JoinRequest(role, name, made.json()["token"], ca_file=bundle))


def write_cert(directory: Path, chain: str, key_pem: str) -> tuple[Path, Path]:
    write_private(directory / "cert.pem", chain)
    write_private(directory / "key.pem", key_pem)
    return directory / "cert.pem", directory / "key.pem"


def files_of(files: MachineFiles) -> tuple[Path, Path]:
    return files.cert, files.key


async def make_cluster(nursery: trio.Nursery, root: Path) -> Cluster:
    control: ControlHandle = await nursery.start(control_serve, tls_control_config(root / "control"))
    assert control.admin_url.startswith("https://") and control.context is not None
    trust = control.context.trust
    assert trust is not None
    bundle = MachineFiles.of(root / "control").ca
    async with admin_client(control, bundle) as api:
        keys = {}
        for role in ("viewer", "client"):
            made = await api.post("/api/v1/keys", json={"name": f"{role}-key", "role": role})
            assert made.status_code == 201, made.text
            keys[role] = made.json()["key"]
        agent = await join(api, control, bundle, root / "agent", "agent", "n1")
        gateway = await join(api, control, bundle, root / "gateway", "gateway", "gw1")
        revoked = await join(api, control, bundle, root / "revoked", "agent", "n-revoked")
        gone = await api.post("/api/v1/trust/machines/agent/n-revoked/revoke")
        assert gone.status_code == 200 and gone.json()["revoked"], gone.text

    # Another cluster's CA: a certificate as good as ours in every way but its issuer.
    now = time.time()
    other_root = ca.make_root("another-cluster", now)
    other_inter = ca.make_intermediate(other_root, now)
    other_key = ca.new_key_pem()
    other_cert = ca.sign_request(ca.make_request(other_key, "agent", "n1"), other_inter, role="agent", name="n1",
                                 hosts=(), now=now)
    other = write_cert(root / "other-ca", other_cert + other_inter.cert_pem, other_key)

    # Expired: signed by this cluster's own active intermediate (its key unsealed with the cluster secret) as
    # if long ago, and recorded as issued then, so that only its expiry refuses it.
    state = control.store.snapshot()
    authority_id, authority = trust.authority(state)
    assert authority.key_pem == ca.unseal(state.authorities[authority_id].key_sealed, trust.secret())
    long_ago = now - ca.MACHINE_LIFE - 86400
    expired_key = ca.new_key_pem()
    expired_cert = ca.sign_request(ca.make_request(expired_key, "agent", "n-expired"), authority, role="agent",
                                   name="n-expired", hosts=(), now=long_ago)
    expired_who = ca.identity(expired_cert)
    await control.store.submit(trust_commands.issue("agent", "n-expired", expired_who.serial, expired_who.not_after,
                                                    authority_id, long_ago), through_leader=True)
    expired = write_cert(root / "expired", expired_cert + authority.cert_pem, expired_key)
    # Refused for its expiry alone: the same certificate at a time within its life is admitted.
    der = ca.load_cert(expired_cert).public_bytes(serialization.Encoding.DER)
    state = control.store.snapshot()
    assert authorize(der, state, long_ago + 3600, role="agent").name == "n-expired"
    with pytest.raises(PeerRefused, match="expired"):
        authorize(der, state, time.time(), role="agent")

    credentials = [
        Credential("viewer key", key=keys["viewer"]),
        Credential("client key", key=keys["client"]),
        Credential("agent cert", cert=files_of(agent)),
        Credential("gateway cert", cert=files_of(gateway)),
        Credential("control cert", cert=files_of(trust.files)),
        Credential("other-CA cert", cert=other),
        Credential("expired cert", cert=expired),
        Credential("revoked cert", cert=files_of(revoked)),
        Credential("no credential"),
        Credential("admin key", key=ADMIN),
    ]
    return Cluster(control, bundle, credentials)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        yield await make_cluster(nursery, tmp_path)
        nursery.cancel_scope.cancel()


# --- the admin API ---------------------------------------------------------------------------------


def path_of(route: Route) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: PATH_VALUES[m.group(1)], route.rule)


def expected_http(route: Route, kind: str) -> set[str]:
    """The answers a credential may get on a route: "ok" (the route's own answer, whatever it is, not a
    refusal of the caller), "401", "403", or TLS (the handshake refused the certificate)."""
    if kind in ("other-CA cert", "expired cert"):
        return {TLS} | ({"ok"} if route.role == PUBLIC else {"401"})
    if route.role == PUBLIC or kind == "admin key":
        return {"ok"}
    if route.role == MACHINE and kind in ("agent cert", "gateway cert", "control cert"):
        return {"ok"}  # a release file, fetched by the cluster's machines with their certificates (ctl upgrade)
    if kind == "viewer key":
        return {"403"} if route.role in (ADMIN_ROLE, MACHINE) else {"ok"}
    if kind == "revoked cert":
        return {"403"}  # its machine is refused whatever key comes with it (route.revoked_peer)
    return {"401"}  # a client key, any certificate alone, nothing


def category(answer: int | str) -> str:
    if answer == TLS:
        return TLS
    return str(answer) if answer in (401, 403) else "ok"


async def ask(client: httpx.AsyncClient, route: Route) -> int | str:
    try:
        r = await client.request(route.method, path_of(route), json={} if route.body else None)
    except httpx.TransportError:
        return TLS
    return r.status_code


def matrix(rows: list[str], columns: list[str], cells: dict[tuple[str, str], str], wrong: set[tuple[str, str]]) -> str:
    width = max(len(c) for c in columns)
    lines = [" " * width + "  " + " ".join(f"{r[:9]:>9}" for r in rows)]
    for column in columns:
        lines.append(f"{column:<{width}}  " + " ".join(
            f"{('!' if (row, column) in wrong else '') + cells[row, column]:>9}" for row in rows))
    return "\n".join(lines)


async def test_every_admin_route_answers_each_kind_of_credential_as_its_role_allows(cluster: Cluster) -> None:
    routes = list(ROUTES)
    assert {r.role for r in routes} >= {PUBLIC, ADMIN_ROLE} and len(routes) > 30, "the whole table"
    cells: dict[tuple[str, str], str] = {}
    wrong: set[tuple[str, str]] = set()
    for credential in cluster.credentials:
        # A request whose connection the TLS handshake refused leaves its body's stream unfinished, to the
        # garbage collector (which warns): not this test's concern.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            async with httpx.AsyncClient(base_url=cluster.control.admin_url, headers=credential.headers(),
                                         timeout=10, verify=credential.context(cluster.bundle)) as client:
                for route in routes:
                    column = f"{route.method} {route.rule}"
                    answer = await ask(client, route)
                    cells[credential.kind, column] = str(answer)
                    if category(answer) not in expected_http(route, credential.kind):
                        wrong.add((credential.kind, column))
            gc.collect()
    rows = [c.kind for c in cluster.credentials]
    table = matrix(rows, [f"{r.method} {r.rule}" for r in routes], cells, wrong)
    assert not wrong, f"unexpected answers (marked !):\n{table}"
    # Every certificate alone is 401 on every route that wants a key: a machine never gets admin access; a
    # revoked one is 403 (it is refused even with a key: tests/integration/test_raft_tls.py).
    for kind in ("agent cert", "gateway cert", "control cert"):
        assert {cells[kind, f"{r.method} {r.rule}"] for r in routes if r.role not in (PUBLIC, MACHINE)} == {"401"}, \
            table
    assert {cells["revoked cert", f"{r.method} {r.rule}"] for r in routes if r.role != PUBLIC} == {"403"}, table


# --- the streams -----------------------------------------------------------------------------------


def expected_stream(role: str, kind: str) -> set[str]:
    if kind == f"{role} cert":
        return {"101"}
    if kind in ("agent cert", "gateway cert", "control cert"):
        return {"403 forbidden"}  # a certificate of this cluster, for another role
    if kind in ("other-CA cert", "expired cert"):
        return {TLS, "401 unauthorized"}
    if kind == "revoked cert":  # an agent's: on the gateway stream its role is refused first
        return {"401 revoked"} if role == "agent" else {"403 forbidden", "401 revoked"}
    return {"401 unauthorized"}  # every key (the admin key too), and nothing


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for e in error.exceptions:
            yield from _leaves(e)
    else:
        yield error


async def tls_refuses(url: str, context: ssl.SSLContext) -> bool:
    """Whether the control plane's TLS handshake refuses this context's certificate. Over TLS 1.3 the
    server's verdict on a client's certificate comes after the client's side of the handshake is done, so
    a request is sent and its answer read: an alert or a closed connection is the refusal."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    stream = trio.SSLStream(await trio.open_tcp_stream(host, parts.port or 443), context, server_hostname=host,
                            https_compatible=True)
    try:
        with trio.fail_after(5):
            await stream.do_handshake()
            await stream.send_all(b"GET /health HTTP/1.1\r\nhost: control\r\nconnection: close\r\n\r\n")
            return not await stream.receive_some()
    except (trio.BrokenResourceError, ssl.SSLError):
        return True
    finally:
        await trio.aclose_forcefully(stream)


async def open_answer(url: str, path: str, context: ssl.SSLContext, key: str | None) -> str:
    """How a control plane answers a stream's handshake: 101 (accepted), "STATUS CODE" (refused with the
    admin error's code), or TLS (the TLS handshake refused the certificate: trio-websocket would only wait
    out its timeout). A key goes in the Authorization header, where a machine inside the control plane's
    process sends its credential (`open_stream`'s `local`)."""
    if await tls_refuses(url, context):
        return TLS
    try:
        async with open_stream(url, path, context, connect_s=5, close_s=1, local=key):
            return "101"
    except BaseException as error:  # noqa: BLE001 - a nursery's group, classified below
        leaves = list(_leaves(error))
        for leaf in leaves:
            status = getattr(leaf, "status_code", None)
            if isinstance(leaf, HandshakeError) and status is not None:
                body = getattr(leaf, "body", None) or b"{}"
                code = httpx.Response(status, content=body).json().get("error", {}).get("code")
                return f"{status} {code}"
        raise


async def test_each_stream_takes_only_its_own_roles_certificate(cluster: Cluster) -> None:
    cells: dict[tuple[str, str], str] = {}
    wrong: set[tuple[str, str]] = set()
    for credential in cluster.credentials:
        for path, role in STREAMS.items():
            with trio.fail_after(10):
                answer = await open_answer(cluster.control.admin_url, path, credential.context(cluster.bundle),
                                           credential.key)
            cells[credential.kind, path] = answer.replace(" unauthorized", "").replace(" forbidden", "")
            if answer not in expected_stream(role, credential.kind):
                wrong.add((credential.kind, path))
    table = matrix([c.kind for c in cluster.credentials], list(STREAMS), cells, wrong)
    assert not wrong, f"unexpected answers (marked !; 401/403 without a code are unauthorized/forbidden):\n{table}"


# --- revocation of a connected agent ---------------------------------------------------------------


class Said(logging.Handler):
    """The agent's log lines, each setting an event for the words a test waits for."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.waits: dict[str, trio.Event] = {}

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        for words, event in self.waits.items():
            if words in line:
                event.set()

    def event(self, words: str) -> trio.Event:
        return self.waits.setdefault(words, trio.Event())


@pytest.fixture
def agent_log() -> Iterator[Said]:
    said, logger = Said(), logging.getLogger("llmgw.agent")
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.DEBUG)
    try:
        yield said
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)


async def test_revocation_ends_a_connected_agents_stream_at_once_and_its_node_is_lost(
        tmp_path: Path, agent_log: Said) -> None:
    grace = 60.0  # the node must be lost long before a grace period could run out
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, tls_control_config(
            tmp_path / "control", lost_node_grace_s=grace))
        bundle = MachineFiles.of(tmp_path / "control").ca
        async with admin_client(control, bundle) as api:
            files = await join(api, control, bundle, tmp_path / "agent", "agent", "n1")
            context = tls.client_context(files.ca, files.cert, files.key)
            probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
            with trio.fail_after(20):
                await nursery.start(agent_serve, AgentConfig(controls=[control.admin_url], tls=context,
                                                             state_dir=tmp_path / "agent", node="n1", probe=probe))
            hub = control.hub
            assert hub.node_state("n1") == "connected"
            left = agent_log.event("lost the leader")
            refused_again = agent_log.event("401 revoked")

            began = trio.current_time()
            gone = await api.post("/api/v1/trust/machines/agent/n1/revoke")
            assert gone.status_code == 200, gone.text
            with trio.fail_after(5):
                while hub.node_state("n1") != "lost":
                    await hub.change_event().wait()
            lost_after = trio.current_time() - began
            with trio.fail_after(5):
                await left.wait()
            left_after = trio.current_time() - began
            assert "n1" not in hub.links
            assert lost_after < 2.0 and left_after < 2.0, (lost_after, left_after, agent_log.lines)

            # It comes back at once (a welcomed stream that ended), and is refused as revoked, each time.
            with trio.fail_after(10):
                await refused_again.wait()
            assert hub.node_state("n1") == "lost"
            assert await open_answer(control.admin_url, protocol.STREAM_PATH, context, None) == "401 revoked"
        nursery.cancel_scope.cancel()
