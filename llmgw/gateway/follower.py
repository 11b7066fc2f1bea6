"""`llmgw gateway` on any machine: the `/v1` API fed by one stream that follows the leader.
Owns `FollowedState` (the `StateReader` built from the leader's pushed table) and the stream.

The stream carries the same seams `llmgw up` wires in-process: the table arrives as
routes for the `Router` (`EndpointSink`) plus keys, models and settings for the app,
and the router's `DemandReport` goes back up. While no leader answers, the gateway
serves from the last table it had and says how old it is (log and `GET /health`).
"""

from __future__ import annotations

import logging
import os
import ssl
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from trio_websocket import WebSocketConnection

from llmgw import __version__, release
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import OpenAIError
from llmgw.gateway import app as gateway_app
from llmgw.gateway.guard import GuardStats
from llmgw.gateway.requestlog import RequestLog
from llmgw.gateway.router import Router
from llmgw.logs import role_var
from llmgw.net import url_host
from llmgw.trust.renewal import Renewal
from llmgw.wire import protocol
from llmgw.wire.follow import Refused, Welcomed, follow_leader, receive_within
from llmgw.wire.stream_client import open_stream

log = logging.getLogger("llmgw.gateway.follower")


@dataclass
class GatewayConfig:
    controls: list[str]  # admin base URLs of the control planes, e.g. https://10.0.0.1:8081
    # This machine's TLS context: the cluster's bundle and its gateway certificate (llmgw/trust/join.py), its
    # only credential toward control: it follows the table and reports usage, nothing more.
    tls: ssl.SSLContext | None
    # Renews the certificate in `tls` over the stream at two thirds of its life (llmgw/trust/renewal.py).
    renewal: Renewal | None = None
    # The /v1 listener's (and the request log's) TLS: an operator's certificate (`--tls-cert`) or the
    # gateway's own; None: plain HTTP (bound to loopback).
    server_tls: ssl.SSLContext | None = None
    # The request log's listener (`query_listen`) when it is not /v1's: the gateway's own certificate, which
    # control planes verify and which verifies theirs; True: as /v1.
    query_tls: ssl.SSLContext | None | bool = True
    # Instead, a machine inside the control plane's own process (`llmgw up`): its in-memory credential
    # (`Context.local_credential`).
    local_credential: str | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    name: str = field(default_factory=socket.gethostname)  # how the leader lists this gateway
    state_dir: Path | None = None  # its request log goes to STATE_DIR/requests; None: no log kept
    timeouts: Timeouts = TIMEOUTS
    # A worker of `llmgw gateway --workers N` (llmgw/gateway/workers.py) shares the /v1 port with its
    # siblings, so its request log answers control on a port of its own (host, 0: any free one).
    reuse_port: bool = False
    query_listen: tuple[str, int] | None = None
    role: str = "gateway"  # how its log lines name it ("gateway-w1" for a worker)
    # It can restart in place when the leader asks (`llmgw ctl gateways restart`): it drains, leaves its /v1
    # listening socket open (`handover.fd`) and `llmgw gateway` runs itself again, which adopts it. None: it
    # cannot (a gateway inside another process: a test's).
    handover: gateway_app.Handover | None = None
    started_at: float = field(default_factory=time.time)  # this program's start (a restart in place: a new one)
    # Set by an upgrade (the leader's `upgrade_gateway`, `ctl upgrade`) with `handover.asked`: the release file
    # `llmgw gateway` runs next, in place.
    restart_into: list[Path] = field(default_factory=list)


@dataclass
class GatewayHandle:
    """What `serve` hands back once it listens (for the command line and tests)."""

    url: str  # http://host:port (the API is under /v1)
    state: FollowedState
    router: Router
    requestlog: RequestLog


class FollowedState:
    """The leader's last table as a `StateReader`. Before the first table the state is
    unknown, and a request is refused as such (503), never answered from an empty cluster."""

    def __init__(self, controls: list[str]) -> None:
        self.controls = controls
        self.leader: str | None = None  # the control URL followed now; None while looking
        self.version: int | None = None  # the table's number at its leader
        self._state: ClusterState | None = None
        self._confirmed_at: float | None = None  # trio time the leader last said the table is current
        self._changed = trio.Event()
        self.routed = trio.Event()  # set by the first table that carries routes (a leader that knows them)

    # --- StateReader ----------------------------------------------------------------------

    def snapshot(self) -> ClusterState:
        if self._state is None:
            raise OpenAIError(503, "gateway_not_synced",
                              "this gateway has not received its table from a control plane yet "
                              f"(it tries {', '.join(self.controls)}); retry later")
        return self._state

    async def wait_changed(self, revision: int) -> ClusterState:
        while self._state is None or self._state.revision <= revision:
            await self._changed.wait()
        return self._state

    # --- what the stream does ------------------------------------------------------------

    def apply(self, table: protocol.GatewayTable, now: float) -> None:
        self._state = table.state
        self.version = table.version
        self._confirmed_at = now
        self._changed.set()
        self._changed = trio.Event()

    def confirm(self, now: float) -> None:
        """A heartbeat from the leader: the table held is still its table."""
        if self._state is not None:
            self._confirmed_at = now

    def table_age(self, now: float) -> float | None:
        """Seconds since a leader last vouched for the table; None when there never was one."""
        return None if self._confirmed_at is None else max(0.0, now - self._confirmed_at)

    def health(self) -> dict[str, Any]:
        """What `GET /health` adds to `{"status": "ok"}`: unknown is null, never 0."""
        age = self.table_age(trio.current_time())
        return {"table_age_s": None if age is None else round(age, 3), "leader": self.leader}


class JudgeFailures:
    """The judges' failures this gateway saw, waiting to go to the leader: the latest words per judge,
    each judge reported at most once per `judge_failure_report_s` (a judge down fails every check)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.pending: dict[str, str] = {}
        self._sent_at: dict[str, float] = {}

    def add(self, model: str, words: str) -> None:
        self.pending[model] = words

    def due(self, now: float) -> list[tuple[str, str]]:
        out = []
        for model, words in list(self.pending.items()):
            if now - self._sent_at.get(model, float("-inf")) >= self.every_s:
                out.append((model, words))
                self._sent_at[model] = now
                del self.pending[model]
        return out


@dataclass
class _Feeds:
    """What the stream to the leader carries up besides demand: usage rollups, judges' failures."""

    rlog: RequestLog
    judges: JudgeFailures
    # Drained for a restart in place: the usage left is sent at once (not every `usage_report_s`), and the
    # program runs again once the leader has acknowledged it all (`acked` is set, then replaced, per ack).
    flushing: trio.Event = field(default_factory=trio.Event)
    acked: trio.Event = field(default_factory=trio.Event)

    def ack(self, boot: str, seq: int) -> None:
        if self.rlog.rollups.acked(boot, seq):
            self.acked.set()
            self.acked = trio.Event()

    async def flush(self, within_s: float) -> None:
        """Until the leader has acknowledged every usage row of this program, or `within_s`."""
        self.flushing.set()
        with trio.move_on_after(within_s):
            while self.rlog.rollups.unsent():
                await self.acked.wait()
        if self.rlog.rollups.unsent():
            log.warning("restarting with %d usage row(s) the leader has not acknowledged in %g s: they are not "
                        "counted", self.rlog.rollups.unsent(), within_s)


async def serve(config: GatewayConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Listen at once (so /health says what the gateway knows), then follow the leader until cancelled."""
    role_var.set(config.role)
    if not config.controls:
        raise ValueError("a gateway needs at least one control URL")
    # The hash of the file this program started from, taken now (its hello says it; `ctl upgrade` judges by it):
    # a sibling worker's upgrade may replace the file at this path while this program runs on.
    await trio.to_thread.run_sync(release.running)
    state = FollowedState(config.controls)
    router = Router()
    rlog = RequestLog(config.state_dir / "requests" if config.state_dir is not None else None, config.name,
                      settings=lambda: state.snapshot().settings, timeouts=config.timeouts)
    judges = JudgeFailures(config.timeouts.judge_failure_report_s)
    deps = gateway_app.GatewayDeps(router=router, state=state, timeouts=config.timeouts, health=state.health,
                                   requestlog=rlog, guard_stats=GuardStats(on_failure=judges.add))
    async with trio.open_nursery() as nursery:
        # It follows the leader as soon as its request log answers (the hello names where): a worker takes
        # clients only once it has a table, which the leader sends on that stream.
        listening = trio.Event()
        feeds = _Feeds(rlog, judges)

        async def follow() -> None:
            await listening.wait()
            await _follow(config, state, router, feeds)

        nursery.start_soon(follow)
        # A worker shares its port: it takes clients once it has a table (not to answer its share of them 503
        # gateway_not_synced while its siblings could serve them). A program restarted in place took over a
        # listening socket whose queued clients wait: it takes them once it has routes too (not to hold them
        # waiting for an activation while the leader it found has not heard from the agents yet).
        open_when: Callable[[], Awaitable[object]] | None = None
        if config.handover is not None and config.handover.inherited is not None:
            open_when = state.routed.wait
        elif config.reuse_port:
            open_when = partial(state.wait_changed, -1)

        async def run_app(*, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
            await gateway_app.serve(config.listen_host, config.listen_port, deps, reuse_port=config.reuse_port,
                                    query_listen=config.query_listen, open_when=open_when,
                                    tls=config.server_tls, query_tls=config.query_tls, listening=listening,
                                    handover=config.handover, task_status=task_status)
            # Drained for a restart in place (its request log written): the usage goes to the leader, then the
            # role ends and the program runs again.
            await feeds.flush(config.timeouts.gateway_restart_usage_s)
            nursery.cancel_scope.cancel()

        host, port = await nursery.start(run_app)
        nursery.start_soon(_warn_while_stale, config, state)
        scheme = "https" if config.server_tls is not None else "http"
        task_status.started(GatewayHandle(f"{scheme}://{url_host(host)}:{port}", state, router, rlog))


async def _follow(config: GatewayConfig, state: FollowedState, router: Router, feeds: _Feeds) -> None:
    """Find the leader among `controls` (or where a refusal points) and follow it; again when it goes."""
    t = config.timeouts

    async def stream(control: str, welcomed: Welcomed) -> None:
        async with open_stream(control, protocol.GATEWAY_STREAM_PATH, config.tls, local=config.local_credential,
                               connect_s=t.gateway_silence_s,
                               close_s=t.gateway_stream_close_s) as ws:
            await _session(ws, control, config, state, router, feeds, welcomed)

    def lost() -> str:
        state.leader = None
        age = state.table_age(trio.current_time())
        return (f"serving from table version {state.version}, {'?' if age is None else f'{age:.1f}'} s old, "
                f"until a leader answers")

    await follow_leader(config.controls, stream, role="gateway", reconnect=t.gateway_reconnect, lost=lost)


async def _receive(ws: WebSocketConnection, control: str, silence_s: float) -> dict[str, Any]:
    return protocol.loads(await receive_within(ws.get_message, control, silence_s))


async def _session(ws: WebSocketConnection, control: str, config: GatewayConfig, state: FollowedState,
                   router: Router, feeds: _Feeds, welcomed: Welcomed) -> None:
    """One stream: hello, welcome, then tables in and demand, usage and judges' failures out until it ends.
    Raises `Refused`, `Silent` or `ProtocolError` (a bad opening) to `follow_leader`."""
    t = config.timeouts
    await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.GATEWAY_PROTOCOL_VERSION,
                                          "gateway": config.name, "version": __version__,
                                          "query_url": feeds.rlog.query_url,  # where control asks its log
                                          "restartable": config.handover is not None, "pid": os.getpid(),
                                          "started_at": config.started_at,
                                          "release_sha256": release.running().sha256}))
    first = await _receive(ws, control, t.gateway_silence_s)
    if first["type"] == "refused":
        raise Refused.of(control, first)
    if first["type"] != "welcome":
        raise protocol.ProtocolError(f"expected welcome, got {first['type']!r}")
    old = state.table_age(trio.current_time())
    state.leader = control
    welcomed(str(first.get("leader", "?")), "" if old is None else f"the table held was {old:.1f} s old")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report, ws, router, t, feeds.judges)
        nursery.start_soon(_send_usage, ws, feeds, t)
        if config.renewal is not None:
            nursery.start_soon(_renew, ws, config.renewal, t.gateway_heartbeat_s)
        while True:
            message = await _receive(ws, control, t.gateway_silence_s)
            kind = message["type"]
            now = trio.current_time()
            if kind == "table":
                table = protocol.read_table(message)
                for why in table.skipped:
                    log.warning("table version %d: model skipped (this gateway cannot read it): %s", table.version, why)
                state.apply(table, now)
                if table.routes is not None:  # None: that leader has not planned yet; keep the routes held
                    router.update_routes(table.routes)
                    state.routed.set()
                log.debug("table version %d (revision %d) from %s", table.version, table.state.revision, control)
            elif kind == "heartbeat":
                state.confirm(now)
            elif kind == "certificate":
                _renewed(config.renewal, message)
            elif kind == "restart_gateway":
                _restart_asked(config, str(message.get("reason") or "asked by control")[:200])
            elif kind == "upgrade_gateway":
                nursery.start_soon(_upgrade, ws, control, config, message)
            elif kind == "usage_ack":
                if isinstance(message.get("seq"), int):
                    feeds.ack(str(message.get("boot")), message["seq"])
            elif kind == "refused":
                raise Refused.of(control, message)
            elif kind == "rejected":  # the leader could not read what this gateway sent; the stream goes on
                log.warning("control %s rejected a message of this gateway: %s", control, str(message.get("reason"))[:500])
            else:
                log.debug("ignoring message %r", kind)


def _restart_asked(config: GatewayConfig, reason: str) -> None:
    """The leader's `restart_gateway`: drain, then run again in place (the stream goes on while it drains:
    requests on kept-alive connections are still routed)."""
    if config.handover is None:
        log.warning("asked to restart (%s), but this gateway runs inside another process: it cannot", reason)
        return
    if not config.handover.asked.is_set():
        log.info("restarting in place, as control asked (%s): draining (no new connection is taken; they wait "
                 "for the next program)", reason)
        config.handover.asked.set()


async def _upgrade(ws: WebSocketConnection, control: str, config: GatewayConfig, message: dict[str, Any]) -> None:
    """The leader's `upgrade_gateway` (`ctl upgrade`): the release fetched from `control` over this gateway's own
    connection and written in place of the running file (`release.prepare`), then a restart in place into it
    (drained, the listening socket handed over). A refusal goes back as `rejected` with the reason (the leader
    lists it as the gateway's `upgrade_refused`), and the gateway goes on as it was."""
    from llmgw import release_fetch

    rollback = message.get("rollback") is True
    what = "the release it ran before" if rollback else f"release {str(message.get('sha256'))[:12]}"
    try:
        if config.handover is None:
            raise release.ReleaseError("cannot_restart", "this gateway runs inside another process: upgrade that "
                                                         "process instead")
        if config.state_dir is None:
            raise release.ReleaseError("cannot_upgrade", "this gateway has no state dir to record its releases in")
        if config.handover.asked.is_set():
            raise release.ReleaseError("restarting", "this gateway is already draining for a restart: ask again "
                                                     "once it follows the leader again")
        sha = None if rollback else release.checked_sha256(message.get("sha256"))
        path, sha = await release_fetch.prepare(control, config.tls, config.state_dir, sha, rollback,
                                                config.timeouts.upgrade_transfer_s)
    except release.ReleaseError as e:
        log.warning("asked to upgrade to %s, refused: %s", what, e.message)
        await ws.send_message(protocol.dumps({"type": "rejected", "message_type": "upgrade_gateway",
                                              "reason": f"{e.code}: {e.message}"}))
        return
    config.restart_into.append(path)
    _restart_asked(config, f"upgrading to {path.name} (sha256 {sha[:12]}), as control asked")


async def _renew(ws: WebSocketConnection, renewal: Renewal, every_s: float) -> None:
    """Ask for a new certificate once this one is two thirds through its life."""
    while True:
        if renewal.due():
            await ws.send_message(protocol.dumps(renewal.request()))
        renewal.refresh()  # a sibling worker renewed the files
        await trio.sleep(every_s)


def _renewed(renewal: Renewal | None, message: dict[str, Any]) -> None:
    cert, bundle = message.get("certificate"), message.get("ca")
    try:
        if renewal is None or not isinstance(cert, str) or not isinstance(bundle, str):
            raise ValueError("a certificate this gateway did not ask for, or one without its bundle")
        renewal.accept(cert, bundle)
    except (ValueError, OSError, ssl.SSLError) as e:
        log.warning("control's renewed certificate was not taken: %s", e)


async def _report(ws: WebSocketConnection, router: Router, t: Timeouts, judges: JudgeFailures) -> None:
    """The router's demand, as ages (the leader's clock is not ours): the replicas used since the
    last report (all of them in the first), the models asked for, and, every time, the models
    that have requests waiting (a new leader must learn of them too), the requests in flight
    per model when they changed (all of them in the first), and its open circuit breakers when they
    changed (`breakers`: a key an older leader passes over). A heartbeat when quiet. Every
    `gateway_demand_report_s`, and at once when a request starts waiting for an activation (the router's `wake`)."""
    sent: dict[str, float] = {}
    sent_load: dict[str, int] | None = None
    sent_breakers: dict[str, tuple[object, object, object]] | None = None
    last_sent = trio.current_time()
    asked = trio.Event()

    def wake() -> None:  # a request waits for an activation: report it now, not at the next round
        asked.set()

    router.on_ask(wake)
    while True:
        now = trio.current_time()
        used = router.last_used()
        fresh = {rid: u for rid, u in used.items() if sent.get(rid) != u}
        asks = dict(router.take_activation_asks())
        for model in router.statistics().waiting:
            asks[model] = now
        load = router.outstanding()
        breakers = router.breaker_report()
        breakers_key = {rid: (b["model"], b["reason"], b["half_open"]) for rid, b in breakers.items()}
        if fresh or asks or load != sent_load or breakers_key != sent_breakers:
            report: dict[str, object] = {
                "type": "demand",
                "last_used_age": {rid: round(now - u, 3) for rid, u in fresh.items()},
                "asks_age": {m: round(now - a, 3) for m, a in asks.items()},
            }
            if load != sent_load:
                report["outstanding"] = load
            if breakers_key != sent_breakers:
                report["breakers"] = breakers
            await ws.send_message(protocol.dumps(report))
            sent.update(fresh)
            sent_load = load
            sent_breakers = breakers_key
            last_sent = now
        elif now - last_sent >= t.gateway_heartbeat_s:
            await ws.send_message(protocol.dumps({"type": "heartbeat"}))
            last_sent = now
        for model, words in judges.due(now):  # for `ctl guard judge status` at the leader
            await ws.send_message(protocol.dumps(protocol.judge_failure_message(model, words)))
        with trio.move_on_after(t.gateway_demand_report_s):
            await asked.wait()
        asked = trio.Event()


async def _send_usage(ws: WebSocketConnection, feeds: _Feeds, t: Timeouts) -> None:
    """The usage rollups, one batch at a time: the unacknowledged batch is sent again (same seq) on
    each new stream and after `gateway_silence_s` without its `usage_ack`; the leader counts it once.
    Flushing (drained for a restart in place), each batch goes as soon as the previous one is acknowledged."""
    sent: tuple[int, float] | None = None  # (seq, when) of the batch last sent on this stream
    while True:
        if not feeds.flushing.is_set():
            with trio.move_on_after(t.usage_report_s):
                await feeds.flushing.wait()
        batch = feeds.rlog.rollups.batch()
        now = trio.current_time()
        if batch is not None and (sent is None or sent[0] != batch["seq"] or now - sent[1] >= t.gateway_silence_s):
            await ws.send_message(protocol.dumps({"type": "usage", **batch}))
            sent = (batch["seq"], now)
        elif feeds.flushing.is_set():  # all of it sent: wait for its ack, or the time to send it again
            if batch is None or sent is None:
                await trio.sleep_forever()  # (nothing more comes: the request log was written last)
                return
            with trio.move_on_at(sent[1] + t.gateway_silence_s):
                await feeds.acked.wait()


async def _warn_while_stale(config: GatewayConfig, state: FollowedState) -> None:
    """While no leader is followed and the table is older than `gateway_table_warn_s`, say so
    every `gateway_table_warn_s`."""
    every = config.timeouts.gateway_table_warn_s
    while True:
        await trio.sleep(every)
        if state.leader is not None:
            continue
        age = state.table_age(trio.current_time())
        if age is None:
            log.warning("no table yet: no control plane has led this gateway (tried %s); /v1 answers 503",
                        ", ".join(config.controls))
        elif age >= every:
            log.warning("no leader for this gateway: serving from table version %s, %.0f s old", state.version, age)
