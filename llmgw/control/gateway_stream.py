"""The leader's side of remote gateways: `GatewayHub` (the table they follow; an `EndpointSink`
and a `DemandReport` to the reconciler: uses, asks, requests in flight) and each gateway's stream
(`session`; its WebSocket route, `GATEWAY_STREAM_PATH`, is in control/api/streams.py).

Level-triggered: a gateway gets the whole table on connect and again on every change,
numbered by `version`; nothing it holds depends on a message it might have missed.
"""

from __future__ import annotations

import logging
import re
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import trio

from llmgw.control.agent_stream import Receive, Send
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.ops import trust
from llmgw.control.reconciler import Reconciler, state_or_event
from llmgw.domain.commands import CommandError, usage
from llmgw.domain.observed import BreakerSeen, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import StateReader
from llmgw.errors import AdminError
from llmgw.net import url_host
from llmgw.wire import protocol

log = logging.getLogger("llmgw.control.gateways")



@dataclass
class GatewayLink:
    """One connected gateway, as the leader knows it."""

    name: str
    address: str
    connected_at: float  # the control plane's clock (wall time)
    last_contact: float
    connected: bool = True
    outstanding: dict[str, int] = field(default_factory=dict)  # model -> requests in flight (its last word)
    query_url: str = ""  # where it answers queries of its request log (its hello)
    # From its hello: whether it can restart in place (an older gateway, or one inside another process,
    # cannot), its pid and when its program started (a restart in place keeps the pid, not the start).
    restartable: bool = False
    pid: int | None = None
    started_at: float | None = None
    # What the leader asks of it (`restart_gateway`, `upgrade_gateway`), sent down its stream by `session`.
    asks: trio.MemorySendChannel[str] | None = None
    # The sha256 of the release file it runs (its hello; None: not a zipapp, or a gateway older than ctl upgrade).
    release_sha256: str | None = None
    # Why it refused the last upgrade asked of it (its `rejected` upgrade_gateway); cleared by the next ask.
    upgrade_refused: str | None = None
    # The replicas its circuit breakers keep out of rotation (its last word; none from an older gateway).
    breakers: tuple[BreakerSeen, ...] = ()


@dataclass
class _Table:
    version: int = 0
    key: tuple[int, int, bool] | None = None  # (state revision, routes sequence, routes known) of the text
    text: str = ""


LOCAL_GATEWAY = "local (in-process)"  # the name `llmgw up`'s own gateway is listed under


@dataclass
class GatewayHub:
    """What the leader tells its gateways, and what they told it back. Rebuilt by each leader:
    gateways re-attach and report again, so nothing here goes through Raft."""

    store: StateReader
    leader: str  # this member's id, named in every table
    wake: Callable[[], None] = lambda: None  # wakes the reconciler (an activation ask waits on it)
    agents: AgentHub | None = None  # whose reports make this leader's routes worth sending (see `_routes_known`)
    clock: Callable[[], float] = time.time
    timeouts: Timeouts = TIMEOUTS
    links: dict[str, GatewayLink] = field(default_factory=dict)  # by name; gone ones stay, connected=False
    # Gateways inside this process (`llmgw up`'s): fed by the reconciler directly, never over a stream,
    # listed with the others (`in_process`) so that status does not say none serves. Name -> its doc.
    local: dict[str, dict[str, Any]] = field(default_factory=dict)
    _routes: Mapping[str, ModelRoute] | None = None  # None until the reconciler has published once
    _routes_seq: int = 0
    _first_routes_at: float | None = None
    _known: bool = False
    _table: _Table = field(default_factory=_Table)
    _last_used: dict[str, float] = field(default_factory=dict)  # replica id -> trio time of its last use
    _asks: dict[str, float] = field(default_factory=dict)  # model -> trio time of the newest ask
    _changed: trio.Event = field(default_factory=trio.Event)

    # --- EndpointSink (the reconciler pushes routes in) --------------------------------

    def update_routes(self, routes: Mapping[str, ModelRoute]) -> None:
        if self._first_routes_at is None:
            self._first_routes_at = self.clock()
        self._routes = dict(routes)
        self._routes_seq += 1
        live = {e.replica_id for route in routes.values() for e in route.endpoints}
        self._last_used = {rid: t for rid, t in self._last_used.items() if rid in live}  # replicas come and go
        self._changed.set()
        self._changed = trio.Event()

    # --- DemandReport (the reconciler reads what gateways asked for) --------------------

    def on_ask(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def last_used(self) -> Mapping[str, float]:
        return dict(self._last_used)

    def take_activation_asks(self) -> Mapping[str, float]:
        asks, self._asks = self._asks, {}
        return asks

    def open_breakers_seen(self) -> list[BreakerSeen]:
        """BreakerReport: the open circuit breakers of every connected gateway."""
        return [b for link in self.links.values() if link.connected for b in link.breakers]

    def outstanding(self) -> Mapping[str, int]:
        """Model -> requests in flight or waiting, summed over the connected gateways."""
        load: dict[str, int] = {}
        for link in self.links.values():
            if link.connected:
                for model, n in link.outstanding.items():
                    load[model] = load.get(model, 0) + n
        return load

    # --- the table ------------------------------------------------------------------------

    def table(self) -> tuple[int, str]:
        """(version, encoded "table" message) of the table now; built once per change, shared by all streams."""
        state = self.store.snapshot()
        known = self._routes_known()
        key = (state.revision, self._routes_seq, known)
        if key != self._table.key:
            version = self._table.version + 1
            routes = self._routes if known else None
            text = protocol.dumps(protocol.table_message(version, self.leader, state, routes))
            self._table = _Table(version, key, text)
        return self._table.version, self._table.text

    def change_event(self) -> trio.Event:
        """Set by the next route update: take it before reading the table, wait on it after."""
        return self._changed

    def _routes_known(self) -> bool:
        """Whether this leader's routes say more than the gateways' own. A new leader knows no
        replica until agents report again: its first routes have no endpoints, and sending them
        would stall every gateway (while the engines serve on). So routes are sent (None until
        then: keep yours) once every node that holds a placement has reported its replicas, or
        `reconcile_startup_quiet_s` after this leader's first routes, whichever comes first."""
        if self._known or self._routes is None or self._first_routes_at is None:
            return self._known
        if self.agents is None:
            self._known = True
            return True
        nodes = {p.node for p in self.store.snapshot().placements.values()}
        missing = sorted(n for n in nodes if n not in self.agents.replicas)
        waited = self.clock() - self._first_routes_at
        if not missing or waited >= self.timeouts.reconcile_startup_quiet_s:
            self._known = True
            log.info("gateways get this leader's routes now%s",
                     f" (after {waited:.0f} s; not reported: {', '.join(missing)})" if missing else "")
        return self._known

    # --- the streams ------------------------------------------------------------------------

    def connect(self, name: str, address: str) -> GatewayLink:
        now = self.clock()
        old = self.links.get(name)
        if old is not None and old.connected:
            log.warning("gateway %s connected again (from %s); its previous stream is replaced", name, address)
        link = GatewayLink(name, address, now, now)
        self.links[name] = link
        log.info("gateway %s (%s) follows this leader", name, address)
        return link

    def ask(self, name: str, message: Mapping[str, Any]) -> bool:
        """Send `message` down a connected gateway's stream; False when it is not connected or its stream
        does not take it now."""
        link = self.links.get(name)
        if link is None or not link.connected or link.asks is None:
            return False
        try:
            link.asks.send_nowait(protocol.dumps(dict(message)))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def disconnect(self, link: GatewayLink) -> None:
        link.connected = False
        link.outstanding = {}
        link.breakers = ()
        if self.links.get(link.name) is link:
            log.info("gateway %s disconnected", link.name)

    def report_demand(self, link: GatewayLink, message: Mapping[str, Any]) -> None:
        """A gateway's report: ages in seconds (its clock is not ours), for the replicas used and
        the models asked for since its previous report on this stream; and, when it changed, its
        requests in flight per model (the whole map: what it leaves out has none)."""
        now = trio.current_time()
        asked = False
        for rid, age in _ages(message.get("last_used_age")):
            used = now - age
            if used > self._last_used.get(rid, -math.inf):
                self._last_used[rid] = used
        for model, age in _ages(message.get("asks_age")):
            self._asks[model] = max(self._asks.get(model, -math.inf), now - age)
            asked = True
        load = message.get("outstanding")
        if isinstance(load, dict):
            link.outstanding = {str(m): int(n) for m, n in load.items()
                                if isinstance(n, int) and not isinstance(n, bool) and n > 0}
        breakers = message.get("breakers")
        if isinstance(breakers, dict):
            link.breakers = tuple(_breakers(link.name, breakers, self.clock()))
        link.last_contact = self.clock()
        if asked:
            self.wake()  # a request waits for this activation: plan now, not on the next tick

    async def watch_leadership(self, is_leader: Callable[[], bool], *,
                               task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Forget this term's routes and demand when this member stops leading: if it leads again,
        its routes are withheld again until its agents have reported (see `_routes_known`)."""
        task_status.started()
        leading = is_leader()
        while True:
            await trio.sleep(self.timeouts.gateway_heartbeat_s)
            now_leading = is_leader()
            if leading and not now_leading:
                self._routes, self._first_routes_at, self._known = None, None, False
                self._routes_seq += 1
                self._last_used.clear()
                self._asks.clear()
            leading = now_leading

    def add_local(self, address: str, name: str = LOCAL_GATEWAY, *, pid: int | None = None) -> None:
        """Name a gateway that runs inside this process and follows this member's table in memory
        (`llmgw up`): listed as connected while this member leads, with `in_process` true; it cannot
        be restarted or upgraded in place (its process is the control plane's)."""
        now = self.clock()
        self.local[name] = {"name": name, "address": address, "connected": True, "connected_at": now,
                            "query_url": None, "restartable": False, "pid": pid, "started_at": now,
                            "release_sha256": None, "upgrade_refused": None, "in_process": True}

    def gateways(self) -> list[dict[str, Any]]:
        """Every gateway this leader has seen: connected or not, with its last contact; then those
        inside this process (`add_local`), in contact now."""
        now = self.clock()
        return [*({"name": g.name, "address": g.address, "connected": g.connected,
                   "connected_at": g.connected_at, "last_contact": g.last_contact, "query_url": g.query_url,
                   "restartable": g.restartable, "pid": g.pid, "started_at": g.started_at,
                   "release_sha256": g.release_sha256, "upgrade_refused": g.upgrade_refused, "in_process": False}
                  for _, g in sorted(self.links.items())),
                *({**doc, "last_contact": now} for _, doc in sorted(self.local.items()))]


def _ages(value: Any) -> list[tuple[str, float]]:
    if not isinstance(value, dict):
        return []
    out = []
    for name, age in value.items():
        if isinstance(age, (int, float)) and not isinstance(age, bool) and math.isfinite(age):
            out.append((str(name), max(0.0, float(age))))
    return out


def _breakers(gateway: str, value: Mapping[str, Any], now: float) -> list[BreakerSeen]:
    """A gateway's open breakers (replica id -> {"model", "reason", "open_s", "half_open"}); what is malformed
    is passed over."""
    out = []
    for rid, doc in value.items():
        if not isinstance(doc, dict):
            continue
        age = doc.get("open_s")
        if not isinstance(age, (int, float)) or isinstance(age, bool) or not math.isfinite(age):
            continue
        out.append(BreakerSeen(str(doc.get("model", "")), str(rid), gateway, str(doc.get("reason", ""))[:500],
                               now - max(0.0, float(age)), doc.get("half_open") is True))
    return out


def hub_of(reconciler: Reconciler) -> GatewayHub | None:
    """The hub the reconciler publishes to (`control.service` wires one in), or None."""
    for sink in reconciler.sinks:
        if isinstance(sink, GatewayHub):
            return sink
    return None


def _refusal(ctx: Context, reason: str) -> str:
    status = ctx.store_status()
    return protocol.dumps({"type": "refused", "reason": reason, "leader": status.get("leader"),
                           "leader_url": status.get("leader_url")})


def _speaks_for(machine: str, name: str) -> bool:
    """A gateway's name is its certificate's, or one of its workers' (`NAME-w0`, `NAME-w1`, ...)."""
    worker, _, index = name.rpartition("-w")
    return name == machine or (worker == machine and index.isdigit())


async def session(ctx: Context, receive: Receive, send: Send, remote: str, *, machine: str | None = None) -> None:
    """One gateway's stream (`remote`: the address it connected from): hello, then tables and heartbeats
    down, demand reports and usage up. `machine`: the gateway its certificate names; it speaks as that
    name, or as one of its workers (`NAME-wI`), never as another gateway (None: in-process)."""
    hub = hub_of(ctx.reconciler)
    try:
        hello = protocol.loads(await receive())
    except protocol.ProtocolError as e:
        await send(_refusal(ctx, f"a bad hello: {e}"))
        return
    if hello.get("type") != "hello" or hello.get("protocol") != protocol.GATEWAY_PROTOCOL_VERSION:
        await send(_refusal(ctx, f"unsupported gateway protocol (this control speaks "
                                 f"{protocol.GATEWAY_PROTOCOL_VERSION})"))
        return
    if hub is None:
        await send(_refusal(ctx, "this control plane publishes no table to gateways"))
        return
    if not ctx.store.is_leader():
        await send(_refusal(ctx, "not the leader"))
        return
    name = str(hello.get("gateway") or "") or "unnamed"
    if machine is not None and not _speaks_for(machine, name):
        log.warning("refused the stream of gateway %s: it says it is gateway %s", machine, name)
        await send(_refusal(ctx, f"this machine's certificate is for gateway {machine!r}: it cannot speak as {name!r}"))
        return
    link = hub.connect(name, remote or "?")
    link.query_url = reachable_url(hello.get("query_url"), link.address)
    link.restartable = hello.get("restartable") is True
    link.pid = _number(hello.get("pid"), int)
    link.started_at = _number(hello.get("started_at"), float)
    asks, asked = trio.open_memory_channel[str](_ASKS_QUEUED)
    link.asks = asks
    sha = hello.get("release_sha256")
    link.release_sha256 = sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) else None
    timeouts = hub.timeouts
    try:
        await send(protocol.dumps({"type": "welcome", "leader": hub.leader}))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_push, ctx, hub, send, nursery.cancel_scope)
            nursery.start_soon(_pass_asks, asked, send)
            while True:
                raw: str | bytes = ""
                with trio.move_on_after(timeouts.gateway_silence_s) as quiet:
                    raw = await receive()
                if quiet.cancelled_caught:
                    log.warning("gateway %s said nothing for %g s: closing its stream", name, timeouts.gateway_silence_s)
                    break
                link.last_contact = hub.clock()
                try:
                    message = protocol.loads(raw)
                except protocol.ProtocolError as e:  # answered, and the stream goes on
                    log.warning("gateway %s sent a malformed message, rejected: %s", name, e)
                    await send(protocol.dumps({"type": "rejected", "message_type": "?", "reason": str(e)}))
                    continue
                if message["type"] == "demand":
                    hub.report_demand(link, message)
                elif message["type"] == "usage":
                    nursery.start_soon(_commit_usage, ctx, link, send, message)
                elif message["type"] == "renew":  # its certificate, at two thirds of its life
                    nursery.start_soon(_renew, ctx, send, machine, message)
                elif message["type"] == "rejected" and message.get("message_type") == "upgrade_gateway":
                    link.upgrade_refused = str(message.get("reason") or "no reason given")[:1000]
                    log.warning("gateway %s refused to upgrade: %s", name, link.upgrade_refused)
                elif message["type"] == "judge_failure":  # `ctl guard judge status` shows it
                    try:
                        ctx.hub.record_judge_failure(*protocol.read_judge_failure(message))
                    except protocol.ProtocolError as e:
                        log.warning("gateway %s: %s", name, e)
                # A "heartbeat" records only the contact: it keeps traffic on the stream, so a dead one shows.
            nursery.cancel_scope.cancel()
    finally:
        asks.close()
        hub.disconnect(link)


# What the leader asks of one gateway (a restart, an upgrade) waits in a queue this long; beyond, refused.
_ASKS_QUEUED = 4


async def _pass_asks(asked: trio.MemoryReceiveChannel[str], send: Send) -> None:
    async for text in asked:
        await send(text)


def _number(value: Any, kind: type[int] | type[float]) -> Any:
    """A number from a hello, or None (a missing or odd one is unknown, not 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return kind(value)


def reachable_url(url: Any, address: str) -> str:
    """A gateway's announced URL (http or https), its wildcard host (0.0.0.0, ::) replaced by the address
    it connected from."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 300:
        return ""
    scheme, _, rest = url.partition("://")
    host, _, port = rest.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", "") and address not in ("", "?"):
        return f"{scheme}://{url_host(address)}:{port}"
    return url


async def _renew(ctx: Context, send: Send, machine: str | None, message: Mapping[str, Any]) -> None:
    """A new certificate for the gateway this stream's certificate names, or `rejected` with why."""
    csr = message.get("csr")
    try:
        if machine is None or not isinstance(csr, str):
            raise AdminError(400, "invalid_request", "a renew carries a csr, on a stream authenticated by a "
                             "gateway's certificate")
        answer = await trust.renew(ctx, "gateway", machine, csr)
    except AdminError as e:
        log.warning("gateway %s asked to renew its certificate, refused: %s", machine, e.message)
        await send(protocol.dumps({"type": "rejected", "message_type": "renew", "reason": e.message}))
        return
    await send(protocol.dumps({"type": "certificate", "certificate": answer["certificate"], "ca": answer["ca"]}))


async def _commit_usage(ctx: Context, link: GatewayLink, send: Send, message: Mapping[str, Any]) -> None:
    """Commit one batch of a gateway's usage rollups, then acknowledge it (a refused batch too: sending
    it again cannot help). Not committed: no answer; the gateway sends the same batch again."""
    boot, seq = message.get("boot"), message.get("seq")
    command = usage.add_usage(link.name, str(boot), seq if isinstance(seq, int) else 0,
                              message.get("rows") or [], link.query_url, ctx.clock())
    try:
        await ctx.store.submit(command)
    except CommandError as e:
        log.warning("gateway %s: usage batch %s refused: %s", link.name, seq, e.message)
    except Exception as e:  # not committed now (no leader, store busy): the gateway sends it again
        log.info("gateway %s: usage batch %s not committed: %s", link.name, seq, e)
        return
    await send(protocol.dumps({"type": "usage_ack", "boot": boot, "seq": seq}))


async def _push(ctx: Context, hub: GatewayHub, send: Send, scope: trio.CancelScope) -> None:
    """The table whenever it changes, a heartbeat when quiet; a member that stops leading
    says so and closes the stream (its gateway looks for the new leader)."""
    sent: int | None = None
    while True:
        if not ctx.store.is_leader():
            log.info("no longer the leader: letting gateways go")
            await send(_refusal(ctx, "this member no longer leads"))
            scope.cancel()
            return
        routes_changed = hub.change_event()
        revision = ctx.store.snapshot().revision
        version, text = hub.table()
        await send(text if version != sent else protocol.dumps({"type": "heartbeat"}))
        sent = version
        with trio.move_on_after(hub.timeouts.gateway_heartbeat_s):
            await state_or_event(ctx.store, revision, routes_changed)
