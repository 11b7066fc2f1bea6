"""`serve(config)`: the control role as one root nursery.

Starts the store (and waits for it to replay its journal), seeds a fresh
cluster (first keys, catalog), then runs the reconciler and the admin listener.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import trio

from llmgw import startup
from llmgw.control.api import Mount, make_app
from llmgw.control.context import Context
from llmgw.control.floating import FloatingDuty
from llmgw.control.gateway_stream import GatewayHub
from llmgw.control.hub import AgentHub
from llmgw.control.source_facts import SourceFacts
from llmgw.control.members import Members, advertised_url
from llmgw.control.mirror_starts import member_bases
from llmgw.control.ops import notify as notify_ops
from llmgw.control.reconciler import Reconciler
from llmgw.control.trust import RaftPeers, Trust
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import DemandReport, EndpointSink, FloatingAddress, WritableStore
from llmgw.logs import role_var
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.sync import MirrorSync
from llmgw.statedir import FIRST_ADMIN_FILE
from llmgw.notify.notifier import Notifier
from llmgw.notify.watch import control_conditions_beside, http_post, watch
from llmgw.store import RaftStore
from llmgw.store.journal import DEFAULT_FSYNC, FsyncPolicy
from llmgw.trust.files import MachineFiles
from llmgw.trust.join import JoinRequest, ensure_credentials
from llmgw.trust.tls import hypercorn_tls
from llmgw.wire.asgi import hypercorn_config
from llmgw.wire.gate import listener_gate
from llmgw.wire.hyper import serve_gated

log = logging.getLogger("llmgw.control")


@dataclass
class Seed:
    """What a fresh cluster starts with. Applied once: a restart keeps what the operator changed.
    `admin_key` is the clear key (LLMGW_ADMIN_KEY, `llmgw up`) or, from `llmgw init`, its hash alone
    (`FIRST_ADMIN_FILE`: the key itself was shown once and is kept nowhere)."""

    admin_key: str
    client_key: str | None = None
    models: list[ModelDef] = field(default_factory=list)
    hashed: bool = False  # admin_key is a `sha256:` hash (from FIRST_ADMIN_FILE), not the key
    from_file: Path | None = None  # FIRST_ADMIN_FILE it came from: removed once the group holds the key

    def admin_hash(self) -> str:
        return self.admin_key if self.hashed else hash_key(self.admin_key)


def first_admin_seed(state_dir: Path) -> Seed | None:
    """The seed `llmgw init` left in `state_dir`, if any (CannotStart for a damaged file)."""
    path = state_dir / FIRST_ADMIN_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise startup.CannotStart(f"{path} cannot be read ({e}): run `llmgw init` again, or remove it and give "
                                  f"LLMGW_ADMIN_KEY") from None
    key_hash = doc.get("key_hash") if isinstance(doc, dict) else None
    if not isinstance(key_hash, str) or not key_hash.startswith("sha256:"):
        raise startup.CannotStart(f"{path} holds no key_hash: run `llmgw init` again")
    return Seed(admin_key=key_hash, hashed=True, from_file=path)


@dataclass
class ControlConfig:
    state_dir: Path
    raft_addr: str
    admin_host: str
    admin_port: int
    peers: list[str] = field(default_factory=list)
    seed: Seed | None = None
    sinks: list[EndpointSink] = field(default_factory=list)
    demand: list[DemandReport] = field(default_factory=list)
    clock: Callable[[], float] = time.time
    timeouts: Timeouts = TIMEOUTS
    # Held while this member leads (`--floating-address`); None: no floating address.
    floating: FloatingAddress | None = None
    # The group's secret as the operator gave it (`--cluster-secret-file`); None: the state dir's own,
    # made on its first start. A state dir holding another one refuses to start.
    cluster_secret: str | None = None
    # When the journal is flushed to the disk: "always" (before a write is acknowledged: survives
    # a power loss) or "off" (survives a kill of the process, not a power loss). docs/operations.md.
    journal_fsync: FsyncPolicy = DEFAULT_FSYNC
    # A snapshot is taken, and the journal compacted, past this many entries (or 300 s).
    journal_compact_after: int = 5000
    # `--join`: this member joins a running group and waits, without a deadline, until a member adds
    # it (`llmgw ctl members add`); it seeds nothing.
    join: bool = False
    # The admin URL other members forward to (`--admin-url`); None: the bound address, a wildcard
    # host replaced by the Raft address's host.
    admin_url: str | None = None
    # More pages on the admin app: the CLI mounts the web console here (`llmgw.console.register`).
    mounts: tuple[Mount, ...] = ()
    # TLS on the admin listener (and so the streams, where machines authenticate with certificates of the
    # cluster's CA: control/trust.py). `llmgw control` always; `llmgw up` when bound off loopback.
    tls: bool = False
    # `--ca-root`: a dir with the operator's own root.pem and root.key (made offline), used at a new
    # group's first start instead of a root made here.
    ca_root: Path | None = None
    # More names and addresses this member's certificate carries (`--tls-name`), beyond its bound and
    # advertised hosts.
    tls_names: tuple[str, ...] = ()
    # Set when an operator asked this member to restart in place (`ctl members restart`): it stops as on
    # SIGTERM (a leader hands over first), and `llmgw control` runs itself again. None: it cannot (a
    # control plane inside `llmgw up` or a test's process).
    restart_asked: list[str] | None = None
    # Set with `restart_asked` by an upgrade (`ctl upgrade`): the release file `llmgw control` runs next.
    restart_into: list[Path] = field(default_factory=list)
    # `--join-token` (with `--join-via`, `--ca-hash`): a member joining a group that requires TLS between
    # its members gets its control certificate first, with a token for the control role.
    join_with: JoinRequest | None = None
    join_via: str | None = None


def ask_restart(config: ControlConfig, reason: str, into: Path | None = None) -> None:
    """Stop this member as SIGTERM does (the answer to the asking request still goes out within the admin
    API's shutdown grace), then let `llmgw control` run itself again (`config.restart_asked`), from the
    release file `into` when given (`ctl upgrade`)."""
    import os
    import signal

    assert config.restart_asked is not None
    config.restart_asked.append(reason)
    if into is not None:
        config.restart_into.append(into)
    log.info("restart asked (%s): stopping, then running again in place", reason)

    async def stop_soon() -> None:  # the answer to the asking request goes out first
        await trio.sleep(config.timeouts.restart_answer_s)
        os.kill(os.getpid(), signal.SIGTERM)

    trio.lowlevel.spawn_system_task(stop_soon)


@dataclass
class ControlHandle:
    """What `serve` hands back once it serves: where, and its live parts (for `up` and tests)."""

    admin_url: str
    store: RaftStore
    hub: AgentHub
    reconciler: Reconciler
    floating: FloatingDuty | None = None  # its status() is what the admin API shows
    gateways: GatewayHub | None = None  # remote gateways' streams (`llmgw gateway`)
    notifier: Notifier | None = None  # the webhooks (posts while this member leads)
    context: Context | None = None  # what its routes read; `local_credential` for machines inside this process


async def seed_cluster(store: WritableStore, seed: Seed, at: float, *, fresh: bool,
                       submit: Callable[[dict[str, Any]], Awaitable[Any]] | None = None) -> None:
    """Give a fresh cluster its first keys and catalog.

    `fresh` is the store's word that it never logged a command (`RaftStore.fresh`), never
    "revision 0": a journal that was damaged is an error, not a new cluster to seed; and a fresh
    member of a group another member already seeded (it holds keys) seeds nothing. `submit`
    (default `store.submit`) lets a fresh standby seed through the leader. On a cluster that
    has state, the seed's keys are only re-added if missing, by the leader."""
    submit = submit or store.submit
    keys = [(seed.admin_hash(), "admin")] + ([(hash_key(seed.client_key), "client")] if seed.client_key else [])
    state = store.snapshot()
    fresh = fresh and not state.keys
    for key_hash, role in keys:
        if fresh or (store.is_leader() and state.key_role(key_hash) is None):
            await submit(commands.add_key(key_hash, role, role, at))
    if fresh:
        for model in seed.models:
            await submit(commands.put_model(model, at))
        log.info("fresh cluster seeded with %d model(s)", len(seed.models))
    else:
        log.info("existing cluster (revision %d): not seeded", state.revision)


def certificate_hosts(config: ControlConfig) -> tuple[str, ...]:
    """The names and addresses a member's certificate carries: where it is bound (unless a wildcard),
    its Raft host, the host of its advertised admin URL, loopback's names when bound there, the machine's
    host name, and what the operator adds (`--tls-name`)."""
    import ipaddress
    import socket
    from urllib.parse import urlsplit

    hosts = [config.admin_host, config.raft_addr.rpartition(":")[0].strip("[]")]
    if config.admin_url:
        hosts.append(urlsplit(config.admin_url).hostname or "")
    hosts += [socket.gethostname(), *config.tls_names]
    out = []
    for host in hosts:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if not host or (ip is not None and ip.is_unspecified):
            continue
        if ip is not None and ip.is_loopback:
            out += ["127.0.0.1", "::1", "localhost"]
        out.append(host)
    return tuple(dict.fromkeys(out))


async def serve(config: ControlConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    role_var.set("control")
    timeouts = config.timeouts
    peer_tls: RaftPeers | None = None
    if config.tls:  # members speak TLS to each other with their control certificates (control/trust.py)
        files = MachineFiles.of(config.state_dir)
        if config.join_with is not None and config.join_via is not None:
            await ensure_credentials(files, [config.join_via], replace(config.join_with, hosts=certificate_hosts(config)))
        peer_tls = RaftPeers(files, state=lambda: store.snapshot(), clock=config.clock, name=config.raft_addr)
    store = RaftStore(self_addr=config.raft_addr, peers=config.peers, state_dir=config.state_dir, timeouts=timeouts,
                      cluster_secret=config.cluster_secret, fsync=config.journal_fsync,
                      compaction_min_entries=config.journal_compact_after, abstain_until_synced=config.join,
                      peer_tls=peer_tls)
    await store.start()
    try:
        if config.join:
            log.info("joining a running group: waiting until a member adds this one (llmgw ctl members add %s)",
                     config.raft_addr)
        await store.wait_ready(math.inf if config.join else None)
        log.info("state loaded at revision %d", store.snapshot().revision)
        if config.seed is not None and not config.join:
            await seed_cluster(store, config.seed, config.clock(), fresh=store.fresh,
                               submit=functools.partial(store.submit, through_leader=True))
            if config.seed.from_file is not None and store.snapshot().key_role(config.seed.admin_hash()):
                config.seed.from_file.unlink(missing_ok=True)
                log.info("the first admin key (from `llmgw init`) is in the group: %s removed",
                         config.seed.from_file.name)
        trust: Trust | None = None
        if config.tls:
            trust = Trust(config.state_dir, store, config.clock, name=config.raft_addr,
                          hosts=certificate_hosts(config), ca_root=config.ca_root, timeouts=timeouts,
                          group=lambda: [config.raft_addr, *store.status().get("partners", {})],
                          links=lambda: dict(store.status().get("links", {})))
            log.info("waiting for the cluster's CA and this member's certificate")
            await trust.ready()
        hub = AgentHub(config.clock, timeouts)
        # Remote gateways follow the table through `gateways`, the same seams `up`'s router is fed by.
        for report in config.demand:  # `llmgw up`'s router: a request that waits for an activation wakes the reconciler
            report.on_ask(hub.changed)
        gateways = GatewayHub(store, config.raft_addr, wake=hub.changed, agents=hub, clock=config.clock,
                              timeouts=timeouts)
        reconciler = Reconciler(store, hub, sinks=[*config.sinks, gateways], demand=[*config.demand, gateways],
                                clock=config.clock, timeouts=timeouts,
                                mirror_bases=lambda: member_bases(members.admin_url, {
                                    a: m.admin_url for a, m in store.snapshot().members.items()}, config.raft_addr))
        floating = (FloatingDuty(config.floating, store.is_leader, timeouts=timeouts, clock=config.clock)
                    if config.floating is not None else None)
        # Forwards to the leader and probes of the other members, over kept connections (closed by
        # the client before the other member's admin API closes them idle).
        member_client = httpx.AsyncClient(verify=trust.client_context() if trust is not None else True,
                                          follow_redirects=False,
                                          limits=httpx.Limits(keepalive_expiry=timeouts.admin_keep_alive_s / 2))
        members = Members(store, store, self_addr=config.raft_addr, timeouts=timeouts, clock=config.clock,
                          agents=hub, gateways=gateways, floating=floating, http=member_client)
        # Webhooks: posted from the leader's own task and queues, never from a reconcile pass (llmgw/notify).
        webhook_client = httpx.AsyncClient(timeout=None, follow_redirects=False)
        notifier = Notifier(http_post(webhook_client), clock=config.clock, timeouts=timeouts,
                            cluster=lambda: {"leader": config.raft_addr, "admin_url": members.admin_url})
        # How many client connections the admin API holds, from the open-files limit (llmgw/wire/gate.py).
        gate = listener_gate("admin", log_every_s=timeouts.listener_limit_log_s)
        ctx = Context(store=store, hub=hub, reconciler=reconciler, clock=config.clock, connections=gate.statistics,
                      self_id=config.raft_addr, store_status=members.status, members=members,
                      notifier=notifier, webhook_deliveries=notifier.deliveries, trust=trust,
                      restart=(functools.partial(ask_restart, config) if config.restart_asked is not None else None),
                      state_dir=config.state_dir)
        # The model mirror's pass: pull what this member lacks from the leader, delete what no name refers to.
        mirror_sync = MirrorSync(store, BlobStore(config.state_dir / "mirror", config.clock), member_client,
                                 leader_url=lambda: None if store.is_leader() else members.status().get("leader_url"),
                                 lock=ctx.mirror_lock, timeouts=timeouts)
        ctx.mirror_sync = mirror_sync
        app = make_app(ctx, config.mounts)
        # graceful_s: agents' streams close at once, not drained.
        hc = hypercorn_config(config.admin_host, config.admin_port, logger="llmgw.control.server",
                              graceful_s=timeouts.admin_shutdown_grace_s, keep_alive_s=timeouts.admin_keep_alive_s)
        if trust is not None:
            hc = hypercorn_tls(hc, trust.server_context())
        async with webhook_client, member_client, trio.open_nursery() as nursery:
            if floating is not None:  # first: a wrong interface stops the start before the API listens
                await nursery.start(floating.run)
            await nursery.start(reconciler.run)
            await nursery.start(notifier.run)
            await nursery.start(functools.partial(watch, notifier, lambda: control_conditions_beside(ctx),
                                                  lambda: store.snapshot().settings, store.is_leader,
                                                  clock=config.clock, timeouts=timeouts,
                                                  ledger=notify_ops.ledger(ctx)))
            await nursery.start(gateways.watch_leadership, store.is_leader)
            if trust is not None:
                await nursery.start(trust.run)
            binds = await nursery.start(functools.partial(serve_gated, app, hc, gate,
                                                          accept_retry_s=timeouts.admin_accept_retry_s))
            url = binds[0]
            log.info("admin API on %s", url)
            members.admin_url = config.admin_url or advertised_url(url, config.raft_addr)
            await nursery.start(store.raise_when_halted)  # an entry of a newer release: this role stops, saying so
            await nursery.start(members.announce_forever)  # so the others can forward here
            await nursery.start(members.raise_level_forever)
            await nursery.start(mirror_sync.run)
            # Header facts of the models' sources this member can open itself (pkg://, a local path): estimates.
            await nursery.start(SourceFacts(store, hub.set_sources, timeouts).run)
            task_status.started(ControlHandle(url, store, hub, reconciler, floating, gateways, notifier, ctx))
    finally:
        with trio.CancelScope(shield=True):
            await hand_over_leadership(store, timeouts)
        store.close()


async def hand_over_leadership(store: RaftStore, timeouts: Timeouts) -> None:
    """On stop, a leader asks its most caught-up member to take over first (`RaftStore.hand_over`): the
    group elects at once instead of after an election timeout of silence; said in the log either way."""
    if not store.is_leader():
        return
    started = time.monotonic()
    new = await store.hand_over(timeouts.leader_handover_s)
    if new is None and not store.status().get("partners"):
        return  # a group of one: no one to hand over to
    if new is not None:
        log.info("stopping: leadership handed over to %s in %.0f ms", new, (time.monotonic() - started) * 1000)
    else:
        log.warning("stopping: no member took leadership over within %g s (none caught up, or none reachable); "
                    "the others elect a leader after their election timeout", timeouts.leader_handover_s)
