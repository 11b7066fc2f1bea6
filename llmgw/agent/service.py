"""`serve(config)`: one stream to the leading control plane, found among `controls`, followed
to the next leader when it goes; this node's inventory, observed again every `storage_rescan_s` and sent
when it changed (`llmgw.agent.inventory.changed`: GPU readings alone do not count), else every
`inventory_refresh_s`.

Engines keep running while the stream is down; when it comes back (to any leader) the agent
reports what it runs and control adopts it from there (level-triggered). Every message from
control is checked against its schema (`llmgw.wire.protocol_agent`): a malformed one is logged and
answered with `rejected`, and nothing running is touched. A control silent for three heartbeat
intervals (`stream_silence_s`) is taken for gone: the agent looks for the leader again.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import trio

from llmgw import __version__, release
from llmgw.agent.inventory import NvmlProbe, changed
from llmgw.agent.mirror_fetch import MirrorCache
from llmgw.agent.mirror_fetch import fetch as mirror_fetch
from llmgw.agent.storage import StorageDir, StorageScanner
from llmgw.agent.supervisor import Supervisor
from llmgw.domain.observed import NodeInfo
from llmgw.domain.reserve import Reserve
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.engines import Group
from llmgw.interfaces import GpuProbe, ReplicaRunner
from llmgw.errors import first_error
from llmgw.logs import role_var
from llmgw.trust.renewal import Renewal
from llmgw.wire import protocol
from llmgw.wire import protocol_agent as pa
from llmgw.wire.follow import Refused, Welcomed, follow_leader, receive_within
from llmgw.wire.stream_client import open_stream

log = logging.getLogger("llmgw.agent")

# Builds the runner of this agent's replicas from (the nursery they run in, the callback for each
# change, this node's latest inventory). The default runs engine processes (`Supervisor`);
# `llmgw sim-fleet` passes one that runs simulated engines in-process.
DEFAULT_MIRROR_CACHE_BYTES = 100 << 30  # the mirror cache's budget unless told (--mirror-cache-bytes)

RunnerFactory = Callable[[trio.Nursery, Callable[[], None], Callable[[], NodeInfo]], ReplicaRunner]


@dataclass
class AgentConfig:
    controls: list[str]  # admin base URLs, e.g. https://10.0.0.1:8081
    # This machine's TLS context: the cluster's bundle and its agent certificate (llmgw/trust/join.py), which
    # is its only credential: it speaks for its own node.
    tls: ssl.SSLContext | None
    state_dir: Path
    node: str = "local"
    engine_host: str = "127.0.0.1"  # where engines listen; the gateway must reach it
    probe: GpuProbe = field(default_factory=NvmlProbe)
    timeouts: Timeouts = TIMEOUTS
    storage: tuple[StorageDir, ...] = ()  # the directories whose models this node reports (--storage)
    fabric: str = ""  # the interconnect this node is on (--fabric); "" = none said, never guessed
    # Stop the engines when the agent stops (tests, `llmgw up`); False: they keep serving and the
    # next agent adopts them.
    stop_engines_on_exit: bool = True
    runner: RunnerFactory | None = None  # None: engine processes, run by the Supervisor
    # Renews the certificate in `tls` over the stream at two thirds of its life (llmgw/trust/renewal.py);
    # None: no certificate (`local_credential`, or a test's plain stream).
    renewal: Renewal | None = None
    # Instead of `tls`, a machine inside the control plane's own process (`llmgw up`): its in-memory credential
    # (`Context.local_credential`).
    local_credential: str | None = None
    # Set when control asked this agent to restart (`ctl nodes restart`): `serve` returns, engines left
    # running, and `llmgw agent` runs itself again (`restart_in_place`). The reason, as control gave it.
    restart_asked: list[str] = field(default_factory=list)
    # Set with `restart_asked` by an upgrade (`ctl upgrade`): the release file `llmgw agent` runs next.
    restart_into: list[Path] = field(default_factory=list)
    # The mirror cache: where `mirror://NAME` sources are fetched to (`--mirror-cache`; None: STATE_DIR/mirror-cache),
    # within this many bytes (`--mirror-cache-bytes`; 0: no cache, such a source fails). docs/mirror.md.
    mirror_cache: Path | None = None
    mirror_cache_bytes: int = DEFAULT_MIRROR_CACHE_BYTES
    # What this node keeps for other work (`--reserve`): reported with every inventory, never placed on.
    reserve: Reserve = field(default_factory=Reserve)

    def mirror_dir(self) -> Path:
        return self.mirror_cache if self.mirror_cache is not None else self.state_dir / "mirror-cache"


class _Link:
    """The agent's view of its stream: what it must tell, and when."""

    def __init__(self, inventory: NodeInfo) -> None:
        self.dirty = trio.Event()
        self.welcomed = trio.Event()
        self.inventory = inventory  # the latest observed; sent again when it is not the one sent
        self.outbox: list[dict[str, Any]] = []  # answers to control (rejected), sent by `_report`
        self.look = trio.Event()  # set: observe the node now, not at the next rescan (`look_again`)

    def mark(self) -> None:
        self.dirty.set()

    def look_again(self) -> None:
        """A start found its engine missing: the inventory that offered it is out of date."""
        self.look.set()

    def answer(self, message: dict[str, Any]) -> None:
        self.outbox.append(message)
        self.mark()


async def serve(config: AgentConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the agent until cancelled; `task_status.started()` once control has welcomed it."""
    role_var.set("agent")
    scanner = StorageScanner(config.storage)
    supervisors: list[Supervisor] = []
    cache = (MirrorCache(config.mirror_dir(), config.mirror_cache_bytes,
                         in_use=lambda: set().union(*(s.mirror_in_use() for s in supervisors)))
             if config.mirror_cache_bytes > 0 else None)
    first = await _observe_once(config, scanner, cache)
    try:
        config.reserve.check(first)  # a reserve naming a GPU this node lacks is a mistake to say now
    except ValueError as e:
        from llmgw.startup import CannotStart

        raise CannotStart(str(e)) from None
    link = _Link(first)
    timeouts = config.timeouts
    if config.runner is not None:
        async with trio.open_nursery() as engines:
            await _run(config, scanner, link, config.runner(engines, link.mark, lambda: link.inventory), task_status,
                       cache)
        return
    # The client only probes engines' /health.
    async with httpx.AsyncClient(timeout=timeouts.engine_health_request_s) as http, trio.open_nursery() as engines:
        fetcher = None
        if cache is not None:
            def fetcher(source: pa.MirrorSource, on_bytes: Callable[[int], None]) -> Awaitable[Path]:
                return mirror_fetch(source, cache, tls=config.tls, local=config.local_credential, on_bytes=on_bytes,
                                    timeouts=timeouts)
        supervisor = Supervisor(engines, node=config.node, host=config.engine_host,
                                engine_dir=config.state_dir / "engines", on_change=link.mark, http=http,
                                timeouts=timeouts, stop_on_exit=config.stop_engines_on_exit,
                                inventory=lambda: link.inventory, roots=[str(d.path) for d in config.storage],
                                fetcher=fetcher, on_engine_missing=link.look_again)
        supervisors.append(supervisor)
        await _run(config, scanner, link, supervisor, task_status, cache)
        if config.restart_asked:  # the engines' watchers end; the engines, left running, are adopted next
            engines.cancel_scope.cancel()


class _RestartAsked(Exception):
    """Control's `restart_agent`: ends the agent's run (not an error), engines left running."""


async def _run(config: AgentConfig, scanner: StorageScanner, link: _Link, supervisor: ReplicaRunner,
               task_status: Any, cache: MirrorCache | None) -> None:
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_observe, config, scanner, link, cache)
            nursery.start_soon(_follow, config, supervisor, link)
            await link.welcomed.wait()
            task_status.started()
    except* _RestartAsked as asked:
        reason = str(first_error(asked))
        log.info("restarting, as control asked (%s): the engines keep running and are adopted", reason)
        config.restart_asked.append(reason)
        supervisor.leave_running()
    finally:
        supervisor.close()  # engines stop as `engines` unwinds, or keep running for the next agent


async def _follow(config: AgentConfig, supervisor: ReplicaRunner, link: _Link) -> None:
    """Find the leader among `controls` (or where a refusal points) and stay with it; again when it goes."""
    t = config.timeouts

    async def stream(control: str, welcomed: Welcomed) -> None:
        async with open_stream(control, protocol.STREAM_PATH, config.tls, local=config.local_credential,
                               connect_s=t.agent_connect_s,
                               close_s=t.agent_stream_close_s) as ws:
            await _session(ws.get_message, ws.send_message, control, config, supervisor, link, welcomed)

    await follow_leader(config.controls, stream, role="agent", reconnect=t.agent_reconnect,
                        lost=lambda: "engines keep running")


Receive = Callable[[], Awaitable[str | bytes]]
Send = Callable[[str], Awaitable[None]]


async def _session(receive: Receive, send: Send, control: str, config: AgentConfig, supervisor: ReplicaRunner,
                   link: _Link, welcomed: Welcomed) -> None:
    """One stream: hello and inventory, welcome, then commands in and reports out until it ends.
    Raises `Refused`, `Silent` or `ProtocolError` (a bad opening) to `follow_leader`;
    never for a bad command once welcomed."""
    silence = config.timeouts.stream_silence_s
    runs = release.running()
    await send(protocol.dumps({
        "type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": config.node, "version": __version__,
        "release_sha256": runs.sha256, "release_reason": runs.reason,
    }))
    sent = link.inventory
    await send(protocol.dumps({"type": "inventory", "inventory": sent.to_doc()}))
    first = pa.read_down(protocol.loads(await receive_within(receive, control, silence)))
    if isinstance(first, pa.Refused):
        raise Refused(control, first.reason, first.leader, first.leader_url)
    if not isinstance(first, pa.Welcome):
        raise protocol.ProtocolError(f"expected welcome, got {type(first).__name__.lower()}")
    welcomed(first.leader, f"as node {config.node}")
    link.welcomed.set()
    link.outbox.clear()  # answers meant for an earlier stream
    link.mark()  # the first report says what runs here: the leader adopts it
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report, send, supervisor, link, sent, config.timeouts.stream_heartbeat_s)
        if config.renewal is not None:
            nursery.start_soon(_renew, config.renewal, link, config.timeouts.stream_heartbeat_s)
        while True:
            message = _read(await receive_within(receive, control, silence), link)
            if isinstance(message, pa.Refused):  # the leader stepped down: find the next one
                raise Refused(control, message.reason, message.leader, message.leader_url)
            if isinstance(message, pa.RestartAgent):
                if config.runner is not None or config.local_credential is not None:
                    # Inside another process (`llmgw up`, sim-fleet): no process of its own to restart.
                    raise Refused(control, f"asked to restart ({message.reason}): this agent runs inside "
                                           f"another process, so it reconnects", None, None)
                raise _RestartAsked(message.reason)
            if isinstance(message, pa.UpgradeAgent):
                nursery.start_soon(_upgrade, control, config, message, link)
                continue
            if isinstance(message, pa.Certificate):
                _renewed(config.renewal, message, link)
            elif message is not None:
                _act(message, supervisor, link)


async def _upgrade(control: str, config: AgentConfig, message: pa.UpgradeAgent, link: _Link) -> None:
    """Control's `upgrade_agent` (`ctl upgrade`): the release fetched and written beside the running file, then the
    agent ends its run as for `restart_agent` and `llmgw agent` runs that file (engines adopted); a refusal is
    answered with `rejected` and the reason, and the agent goes on as it was."""
    from llmgw import release_fetch

    what = "the release it ran before" if message.rollback else f"release {str(message.sha256)[:12]}"
    try:
        if config.runner is not None or config.local_credential is not None:
            raise release.ReleaseError("cannot_upgrade", "this agent runs inside another process (llmgw up, "
                                                         "sim-fleet): upgrade that process instead")
        path, sha = await release_fetch.prepare(control, config.tls, config.state_dir, message.sha256,
                                                message.rollback, config.timeouts.upgrade_transfer_s)
    except release.ReleaseError as e:
        log.warning("asked to upgrade to %s, refused: %s", what, e.message)
        link.answer(pa.Rejected("upgrade_agent", f"{e.code}: {e.message}").to_doc())
        return
    config.restart_into.append(path)
    raise _RestartAsked(f"upgrading to {path.name} (sha256 {sha[:12]}), as control asked")


async def _renew(renewal: Renewal, link: _Link, every_s: float) -> None:
    """Ask for a new certificate once this one is two thirds through its life (checked every heartbeat)."""
    while True:
        if renewal.due():
            link.answer(renewal.request())
        await trio.sleep(every_s)


def _renewed(renewal: Renewal | None, message: pa.Certificate, link: _Link) -> None:
    try:
        if renewal is None:
            raise ValueError("this agent holds no certificate to renew")
        renewal.accept(message.certificate, message.ca)
    except (ValueError, OSError, ssl.SSLError) as e:
        log.warning("control's renewed certificate was not taken: %s", e)
        link.answer(pa.Rejected("certificate", str(e)).to_doc())


def _read(raw: str | bytes, link: _Link) -> pa.DownMessage | None:
    """The message, checked; None (logged, and answered with `rejected`) when it is malformed."""
    kind = "?"
    decoded: dict[str, Any] = {}
    try:
        decoded = protocol.loads(raw)
        kind = str(decoded.get("type"))
        return pa.read_down(decoded)
    except protocol.ProtocolError as e:
        log.warning("control sent a malformed %s message, refused (nothing running is touched): %s", kind, e)
        link.answer(pa.Rejected(kind, str(e), pa.replica_id_of(decoded)).to_doc())
        return None


def _act(message: pa.DownMessage, supervisor: ReplicaRunner, link: _Link) -> None:
    """Do what a checked message says. The supervisor failing on one replica must not end the
    stream (and with it every engine's report): the failure is logged and answered."""
    try:
        if isinstance(message, pa.StartReplica):
            _start(supervisor, message)
        elif isinstance(message, pa.StopReplica):
            supervisor.stop(message.replica_id)
        elif isinstance(message, pa.SleepReplica):
            supervisor.sleep(message.replica_id, message.level)
        elif isinstance(message, pa.WakeReplica):
            supervisor.wake(message.replica_id)
        elif isinstance(message, pa.LoadAdapters):
            supervisor.load_adapters(message.replica_id, dict(message.adapters))
        elif isinstance(message, pa.Rejected):
            log.warning("control refused this agent's %s message%s: %s", message.message_type,
                        f" for {message.replica_id}" if message.replica_id else "", message.reason)
        elif isinstance(message, pa.Unknown):
            log.debug("ignoring a message of a type this agent does not know: %r", message.type)
    except Exception as e:  # a bug below must not take every engine's stream down with it
        rid = getattr(message, "replica_id", None)
        log.exception("the agent failed on a %s message", type(message).__name__)
        link.answer(pa.Rejected(type(message).__name__.lower(), f"the agent failed on it: {type(e).__name__}: {e}",
                                rid).to_doc())


def _start(supervisor: ReplicaRunner, message: pa.StartReplica) -> None:
    if message.group is None:
        supervisor.start(message.replica_id, message.model, list(message.gpus), mirror=message.mirror)
        return
    spec = message.group
    group = Group(rank=spec.rank, size=spec.size, leader=spec.leader, members=spec.members, address=spec.address or "")
    supervisor.start(message.replica_id, message.model, list(message.gpus), group=group, mirror=message.mirror)


async def _report(send: Send, supervisor: ReplicaRunner, link: _Link, sent: NodeInfo, heartbeat_s: float) -> None:
    """Send the inventory when it changed, answers, and the full replica list on every change;
    a heartbeat when quiet."""
    while True:
        with trio.move_on_after(heartbeat_s):
            await link.dirty.wait()
        if not link.dirty.is_set():
            await send(protocol.dumps({"type": "heartbeat"}))
            continue
        link.dirty = trio.Event()
        if link.inventory is not sent:
            sent = link.inventory
            await send(protocol.dumps({"type": "inventory", "inventory": sent.to_doc()}))
        while link.outbox:
            await send(protocol.dumps(link.outbox.pop(0)))
        replicas = [r.to_doc() for r in supervisor.replicas()]
        await send(protocol.dumps({"type": "replicas", "replicas": replicas}))


# --- what this node is: probed and scanned, again every storage_rescan_s ---------------------------


async def _observe_once(config: AgentConfig, scanner: StorageScanner, cache: MirrorCache | None = None) -> NodeInfo:
    """The inventory: the GPU probe's and the storage scan's (both blocking I/O: in a thread),
    with what the agent was told (address, fabric), and the mirror cache's verified files (held by name)."""

    def observe() -> NodeInfo:
        info = config.probe.inventory(config.node)
        # Told no --storage directory, the probe's own word on storage stands (sim-fleet's nodes).
        storage = scanner.scan() if config.storage else info.storage
        if cache is not None and cache.dir.is_dir():
            storage = (*storage, cache.storage_report())
        info = dataclasses.replace(info, address=config.engine_host, fabric=config.fabric or info.fabric,
                                   storage=storage)
        return config.reserve.apply(info) if config.reserve else info

    return await trio.to_thread.run_sync(observe)


async def _observe(config: AgentConfig, scanner: StorageScanner, link: _Link, cache: MirrorCache | None = None) -> None:
    """Observe the node every `storage_rescan_s`, and at once when a start found its engine missing (the
    engines it offers are detected again, so placement stops choosing it for that engine rather than see
    its starts fail in a row); hand on (to be sent) an inventory that `changed` from the one last handed
    on, or any once that one is `inventory_refresh_s` old: a GPU node's readings move at every look, and
    a fleet's worth of inventories every 30 s, each waking the reconciler, is no news."""
    handed = trio.current_time()
    while True:
        with trio.move_on_after(config.timeouts.storage_rescan_s):
            await link.look.wait()  # or sooner: a start found its engine missing (`_Link.look_again`)
        link.look = trio.Event()
        try:
            info = await _observe_once(config, scanner, cache)
        except Exception:  # a probe or scan that fails once: report the last known, try again
            log.exception("observing this node failed; the inventory last reported stands")
            continue
        now = trio.current_time()
        if changed(link.inventory, info) or (now - handed >= config.timeouts.inventory_refresh_s
                                             and info != link.inventory):
            link.inventory, handed = info, now
            link.mark()
