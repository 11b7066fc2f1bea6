"""`llmgw control` and `llmgw agent`: one role per process, for real clusters."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import ssl

from cyclopts import Parameter

from llmgw.cli import _collector
from llmgw.cli._log_flags import LogFlags

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from llmgw.trust.renewal import Renewal

    from llmgw.agent.storage import StorageDir
    from llmgw.domain.reserve import Reserve
    from llmgw.control.floating import IpFloatingAddress
    from llmgw.domain.timeouts import Timeouts


def _split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"error: {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _floating(address: str | None, interface: str | None) -> IpFloatingAddress | None:
    if address is None and interface is None:
        return None
    if address is None or interface is None:
        raise SystemExit("error: --floating-address and --floating-interface go together: give both or neither")
    from llmgw.control.floating import IpFloatingAddress

    try:
        return IpFloatingAddress(address, interface)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _raft_addr(addr: str) -> str:
    """The member's Raft address: its name in the group, dialled by its peers, listened on alone."""
    import ipaddress

    host, _ = _split_addr(addr)
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        wildcard = False  # a host name
    if wildcard:
        raise SystemExit(f"error: --raft-addr {addr}: give this member's address on the cluster's network "
                         f"(its peers dial it, and Raft listens there only), not {host}")
    return addr


def _admin_url(url: str | None) -> str | None:
    if url is not None and not url.startswith(("http://", "https://")):
        raise SystemExit(f"error: --admin-url {url!r}: give an http:// or https:// URL")
    return url.rstrip("/") if url is not None else None


def env_timeouts() -> Timeouts:
    """The timeouts table, with LLMGW_TIMEOUTS (`name=seconds,...`) applied: for tests of processes
    and diagnosis (docs/operations.md); unset, the defaults."""
    from llmgw.domain.timeouts import TIMEOUTS

    spec = os.environ.get("LLMGW_TIMEOUTS", "")
    try:
        return TIMEOUTS.overridden(spec) if spec else TIMEOUTS
    except ValueError as e:
        raise SystemExit(f"error: LLMGW_TIMEOUTS: {e}") from None


def _cluster_secret(path: Path | None) -> str | None:
    """The secret the operator gives: --cluster-secret-file, else LLMGW_CLUSTER_SECRET, else None."""
    from llmgw.store.secret import ENV, SecretError, parse, read_file

    try:
        if path is not None:
            return read_file(path)
        env = os.environ.get(ENV)
        return parse(env, ENV) if env is not None else None
    except SecretError as e:
        raise SystemExit(f"error: {e}") from None


_MACHINE_KEY_REFUSED = (
    "error: {flag} is not a machine's credential any more: the admin key is for people and scripts, never handed "
    "to a machine. Join this machine once with a token: `llmgw ctl nodes token create --role {role}` prints it, "
    "then `llmgw {role} ... --join-token TOKEN --ca-hash HASH`; it keeps its certificate in STATE_DIR/tls "
    "(docs/install.md, Joining a machine)")


def _machine_tls(role: str, name: str, state_dir: Path, controls: list[str], *, key: str | None,
                 join_token: str | None, ca_hash: str | None, ca_file: Path | None,
                 hosts: tuple[str, ...]) -> Renewal:
    """The machine's TLS context (in the Renewal that keeps it current) from its certificate in
    STATE_DIR/tls, joining first with the token if it has none; a refused `--key` or a failed join
    ends the process with words."""
    import logging

    import trio

    from llmgw.trust.files import MachineFiles
    from llmgw.trust.join import JoinError, JoinRequest, client_context, ensure_credentials
    from llmgw.trust.renewal import Renewal

    if key is not None:
        raise SystemExit(_MACHINE_KEY_REFUSED.format(flag="--key", role=role))
    if os.environ.get("LLMGW_KEY"):
        logging.getLogger("llmgw.trust").warning(
            "LLMGW_KEY is ignored: a %s authenticates with its certificate only (docs/security.md)", role)
    token = join_token or os.environ.get("LLMGW_JOIN_TOKEN") or None
    files = MachineFiles.of(state_dir)
    request = JoinRequest(role, name, token, ca_hash=ca_hash, ca_file=ca_file, hosts=hosts)
    try:
        trio.run(ensure_credentials, files, controls, request)
        return Renewal(files, role, name, client_context(files))
    except JoinError as e:
        raise SystemExit(f"error: {e}") from None


def control(
    *,
    state_dir: Path,
    raft_addr: str,
    admin_addr: str,
    peer: list[str] | None = None,
    join: bool = False,
    rejoin: bool = False,
    admin_url: str | None = None,
    cluster_secret_file: Path | None = None,
    floating_address: str | None = None,
    floating_interface: str | None = None,
    journal_fsync: Literal["always", "off"] = "always",
    journal_compact_after: int = 5000,
    ca_root: Path | None = None,
    tls_name: list[str] | None = None,
    join_token: str | None = None,
    join_via: str | None = None,
    ca_hash: str | None = None,
    log: LogFlags = LogFlags(),
) -> None:
    """Run a control plane: Raft member, reconciler, admin API (TLS) and the machines' streams.

    At the first start of a fresh group, LLMGW_ADMIN_KEY (required then) becomes its first admin
    key and LLMGW_CLIENT_KEY (optional) its first client key, as in `llmgw up`.

    Parameters
    ----------
    state_dir
        Raft journal and snapshots, logs; one process per dir.
    raft_addr
        HOST:PORT this member's Raft listens on.
    admin_addr
        HOST:PORT of the admin API.
    peer
        The other members' Raft HOST:PORT (repeat the flag).
    join
        Join a running group: wait, without a deadline, until a member adds this one
        (`llmgw ctl members add RAFT_ADDR`); give every current member as --peer. Seeds nothing.
    rejoin
        After this member's journal was damaged and it was removed from the group (`llmgw ctl
        members remove RAFT_ADDR`): move STATE_DIR/raft aside (to raft.damaged-TIME) and start as
        with --join; then add it again, and it gets the group's state from the leader
        (docs/ha.md, "A damaged journal").
    admin_url
        The URL other members and clients reach this admin API at (default: from --admin-addr,
        a wildcard host replaced by the --raft-addr host).
    cluster_secret_file
        The group's secret (default: LLMGW_CLUSTER_SECRET); a copy of the first member's
        STATE_DIR/cluster.secret. Without it, a fresh state dir makes a new group's secret.
    floating_address
        ADDR/PREFIX held by whichever member leads (needs root or CAP_NET_ADMIN, and arping).
    floating_interface
        The interface the floating address goes on (with --floating-address).
    journal_fsync
        always: each Raft entry is on disk before it counts (survives power loss); off: survives
        a process kill only, faster (docs/operations.md, Durability).
    journal_compact_after
        Take a snapshot and compact the journal past this many entries (and every 300 s); fewer
        makes restarts shorter and snapshots sent to lagging members more frequent.
    ca_root
        A directory holding root.pem and root.key, a root CA made offline: at a new group's first
        start the cluster's CA is made under it (default: a root made here, kept in STATE_DIR/ca).
    tls_name
        Another DNS name or address this member's certificate carries (repeat the flag), beyond
        its bound, Raft and advertised hosts and its host name.
    join_token
        With --join: a one-time token for the control role (default: LLMGW_JOIN_TOKEN), from `llmgw
        ctl nodes token create --role control --name RAFT_ADDR`: this member gets its certificate
        with it, through --join-via, before its first Raft contact (a group whose members all hold
        certificates takes none without one).
    join_via
        With --join-token: the https:// admin URL of a member of the group.
    ca_hash
        With --join-token: the hash of the cluster's CA the token creation printed; the CA fetched
        from --join-via must match it (default: the system's trust store verifies it).
    """
    import logging

    import trio

    from llmgw import console, release, statedir
    from llmgw.cli import _ports
    from llmgw.cli._lifecycle import serve_until_signal
    from llmgw import startup
    from llmgw.control.service import ControlConfig, Seed, first_admin_seed, serve

    admin_host, admin_port = _split_addr(admin_addr)
    raft_addr = _raft_addr(raft_addr)
    cluster_secret = _cluster_secret(cluster_secret_file)
    floating = _floating(floating_address, floating_interface)
    if journal_compact_after < 10:
        raise SystemExit(f"error: --journal-compact-after {journal_compact_after}: give 10 entries or more")
    key = os.environ.get("LLMGW_ADMIN_KEY")
    client_key = os.environ.get("LLMGW_CLIENT_KEY") or None
    token = join_token or os.environ.get("LLMGW_JOIN_TOKEN") or None
    if token and not (join or rejoin):
        raise SystemExit("error: --join-token is for a member that joins a running group: add --join")
    if token and not (join_via or "").startswith("https://"):
        raise SystemExit("error: --join-token needs --join-via https://MEMBER:PORT, the admin URL of a member of the "
                         "group (the certificate is asked of it)")
    from llmgw.trust.join import JoinRequest

    join_with = JoinRequest("control", raft_addr, token, ca_hash=ca_hash) if token else None
    with statedir.acquire_or_exit(state_dir, "llmgw control") as lock:  # before anything in the dir is touched
        log.setup(state_dir / "logs" / "control.log")
        release.running()  # the file this process started from, hashed once (`ctl upgrade` judges by it)
        lock.warn_tightened()
        seed = Seed(admin_key=key, client_key=client_key) if key else None
        if seed is None and not join:
            try:
                seed = first_admin_seed(state_dir)  # left by `llmgw init`: the key's hash, never the key
            except startup.CannotStart as e:
                raise SystemExit(f"error: {e}") from None
        if rejoin:
            from llmgw.store.durable import move_raft_aside

            aside = move_raft_aside(state_dir)
            logging.getLogger("llmgw.control").warning(
                "rejoining: %s; starting as --join: add this member again (llmgw ctl members add %s), and it gets "
                "the group's state from the leader", f"moved {state_dir / 'raft'} aside to {aside}" if aside
                else f"no {state_dir / 'raft'} to move aside", raft_addr)
            join = True
        if client_key and not key:
            logging.getLogger("llmgw.control").warning(
                "LLMGW_CLIENT_KEY is ignored: the first keys are given together, with LLMGW_ADMIN_KEY, at the first "
                "start of a fresh group")
        cfg = ControlConfig(state_dir=state_dir, raft_addr=raft_addr, admin_host=admin_host, admin_port=admin_port,
                            peers=list(peer or []), seed=seed,
                            floating=floating, cluster_secret=cluster_secret, join=join,
                            admin_url=_admin_url(admin_url), journal_fsync=journal_fsync,
                            journal_compact_after=journal_compact_after, timeouts=env_timeouts(),
                            mounts=(console.register,), tls=True, ca_root=ca_root, tls_names=tuple(tls_name or ()),
                            restart_asked=[], join_with=join_with, join_via=join_via)

        async def serve_naming_ports(*, task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED) -> None:
            async with trio.open_nursery() as nursery:
                with _ports.naming("admin API", admin_host, admin_port, "--admin-addr"):
                    handle = await nursery.start(serve, cfg)
                task_status.started(handle)

        _collector.settle()
        status = trio.run(serve_until_signal, serve_naming_ports)
    if cfg.restart_asked:  # out of the state dir's lock: the program that runs next takes it again
        restart_in_place(cfg.restart_into[-1] if cfg.restart_into else None)
    sys.exit(status)


def agent(
    *,
    control: list[str],
    state_dir: Path,
    node: str | None = None,
    join_token: str | None = None,
    ca_hash: str | None = None,
    ca_file: Path | None = None,
    key: Annotated[str | None, Parameter(show=False)] = None,
    engine_host: str = "127.0.0.1",
    storage: list[str] | None = None,
    fabric: str | None = None,
    stop_engines_on_exit: bool = False,
    mirror_cache: Path | None = None,
    mirror_cache_gib: float = 100.0,
    reserve: list[str] | None = None,
    log: LogFlags = LogFlags(),
) -> None:
    """Run an agent: report this node, start and stop engines as the leading control plane says.

    Parameters
    ----------
    control
        Admin URL of a control plane (repeat the flag for each).
    state_dir
        Engine logs and the agent's log; one process per dir.
    node
        This node's name (default: the host name); its certificate names it.
    join_token
        A one-time join token (default: LLMGW_JOIN_TOKEN), from `llmgw ctl nodes token create
        --role agent`: used once, at the first start, for this machine's certificate (STATE_DIR/tls).
    ca_hash
        The cluster CA's hash the token was printed with: the CA is trusted only if it matches.
    ca_file
        The cluster's CA bundle, instead of --ca-hash.
    key
        Refused: an admin key is never a machine's credential.
    engine_host
        Address engines listen on; gateways must reach it (the node's address in `ctl nodes`).
    storage
        PATH:FABRIC[:shared]: a directory whose models this node reports, on storage fabric
        FABRIC; `shared` when other nodes see the same files (repeat the flag). Told nothing,
        the agent reports no models.
    fabric
        The interconnect this node is on (multi-node replicas run within one fabric); never guessed.
    stop_engines_on_exit
        Stop the engines when the agent stops. By default they keep serving, and the next agent
        on this state dir adopts them (an agent restart or upgrade does not interrupt serving).
    mirror_cache
        Where model files fetched from the cluster's mirror (`mirror://NAME` sources) are kept
        (default: STATE_DIR/mirror-cache); docs/mirror.md.
    mirror_cache_gib
        The mirror cache's budget in GiB: the least recently used files are removed to make room,
        never one a replica uses; 0: no cache (a mirror:// model cannot start here).
    reserve
        KEY=VALUE, kept for other work: placement never uses it (repeat the flag). gpu=0,1: these
        devices (indexes, labels such as 0/mig1, or UUIDs); memory_gib=16: this much of the node's
        memory; vram_gib=8: this much of every GPU's memory. Checked at start against what the node has.
    """
    import socket

    import trio

    from llmgw import release, statedir
    from llmgw.agent import AgentConfig, serve
    from llmgw.cli._lifecycle import serve_until_signal

    if key is not None:
        raise SystemExit(_MACHINE_KEY_REFUSED.format(flag="--key", role="agent"))
    dirs = _storage(storage or [])
    kept = _reserve(reserve or [])
    if not mirror_cache_gib >= 0:
        raise SystemExit(f"--mirror-cache-gib must be 0 or more, not {mirror_cache_gib}")
    timeouts = env_timeouts()
    node = node or socket.gethostname()
    with statedir.acquire_or_exit(state_dir, "llmgw agent") as lock:  # before anything in the dir is touched
        log.setup(state_dir / "logs" / "agent.log")
        release.running()  # the file this process started from, hashed once (`ctl upgrade` judges by it)
        lock.warn_tightened()
        renewal = _machine_tls("agent", node, state_dir, control, key=key, join_token=join_token, ca_hash=ca_hash,
                               ca_file=ca_file, hosts=(engine_host, node))
        cfg = AgentConfig(controls=control, tls=renewal.context, renewal=renewal, state_dir=state_dir, node=node,
                          engine_host=engine_host, storage=dirs, fabric=fabric or "", timeouts=timeouts,
                          stop_engines_on_exit=stop_engines_on_exit, mirror_cache=mirror_cache,
                          mirror_cache_bytes=int(mirror_cache_gib * 2**30), reserve=kept)
        _collector.settle()
        status = trio.run(serve_until_signal, serve, cfg)
    if cfg.restart_asked:  # out of the state dir's lock: the program that runs next takes it again
        restart_in_place(cfg.restart_into[-1] if cfg.restart_into else None)
    sys.exit(status)


def restart_in_place(into: Path | None = None) -> None:
    """Run this very program again as this same process (`ctl nodes restart`, `ctl members restart`): same
    pid (an agent's engines see their parent live on, and the agent that runs next adopts them), same flags
    and environment. `into`: another release file to run instead, with the same flags (`ctl upgrade`)."""
    import logging

    from llmgw.engines.base import self_command

    argv = [*(self_command() if into is None else self_command(str(into))), *sys.argv[1:]]
    logging.getLogger("llmgw.lifecycle").info("restarting in place (pid %d, the same flags%s)", os.getpid(),
                                              f", into {into}" if into is not None else "")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def _gateway_tls(host: str, cert: Path | None, key: Path | None, renewal: Renewal) -> ssl.SSLContext | None:
    """What /v1 serves: the operator's certificate; else, bound off loopback, the gateway's own (kept
    current by its renewal); else plain HTTP. Clients' certificates are asked for and checked against
    the cluster's bundle either way: a control plane reads the request log with its own."""
    from llmgw.net import off_loopback
    from llmgw.trust import tls

    if (cert is None) != (key is None):
        raise SystemExit("error: --tls-cert and --tls-key go together: give both or neither")
    try:
        if cert is not None and key is not None:
            return tls.server_context(cert, key, renewal.files.ca)
    except (OSError, ssl.SSLError) as e:
        raise SystemExit(f"error: cannot use --tls-cert {cert} / --tls-key {key}: {e}") from None
    return own_tls(renewal) if off_loopback(host) else None


def own_tls(renewal: Renewal) -> ssl.SSLContext:
    """A listener's context with the machine's own certificate, kept current by its renewal."""
    from llmgw.trust import tls

    context = tls.server_context(renewal.files.cert, renewal.files.key, renewal.files.ca)
    renewal.also.append(context)
    return context


async def _reload_on_hangup(context: ssl.SSLContext | None, cert: Path, key: Path | None, handle: object) -> None:
    """SIGHUP: read --tls-cert/--tls-key again into the live context (new connections get the new
    certificate, open ones go on); a parent of --workers passes it on to each worker."""
    import logging
    import signal

    import trio

    log_ = logging.getLogger("llmgw.gateway")
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            for worker in getattr(handle, "workers", ()):
                os.kill(worker.pid, signal.SIGHUP)
            if context is None:
                continue
            try:
                context.load_cert_chain(str(cert), str(key))
                log_.info("SIGHUP: serving the certificate in %s again, as it is now", cert)
            except (OSError, ssl.SSLError) as e:
                log_.error("SIGHUP: could not load %s / %s, still serving the one loaded before: %s", cert, key, e)


def _reserve(flags: list[str]) -> Reserve:
    from llmgw.domain.reserve import parse_reserve

    try:
        return parse_reserve(flags)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _storage(flags: list[str]) -> tuple[StorageDir, ...]:
    from llmgw.agent.storage import parse_storage_flags

    try:
        return parse_storage_flags(flags)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def gateway(
    *,
    control: list[str],
    listen: str,
    state_dir: Path | None = None,
    name: str | None = None,
    join_token: str | None = None,
    ca_hash: str | None = None,
    ca_file: Path | None = None,
    key: Annotated[str | None, Parameter(show=False)] = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    workers: int = 1,
    worker_of: Annotated[int | None, Parameter(show=False)] = None,
    log: LogFlags = LogFlags(),
) -> None:
    """Run a gateway: the OpenAI-compatible /v1 API, following the leading control plane's table.

    Parameters
    ----------
    control
        Admin URL of a control plane (repeat the flag for each); the gateway finds the leader.
    listen
        HOST:PORT the /v1 API listens on.
    state_dir
        Where the gateway's log and its request log go (locked: one process per dir); without it,
        stderr only and no request log (usage is still counted).
    name
        How control lists this gateway (default: the host name); its certificate names it.
    join_token
        A one-time join token (default: LLMGW_JOIN_TOKEN), from `llmgw ctl nodes token create
        --role gateway`: used once, at the first start, for this machine's certificate (STATE_DIR/tls;
        a gateway that joins needs --state-dir).
    ca_hash
        The cluster CA's hash the token was printed with: the CA is trusted only if it matches.
    ca_file
        The cluster's CA bundle, instead of --ca-hash.
    key
        Refused: an admin key is never a machine's credential.
    tls_cert
        The certificate chain (PEM) /v1 serves, with --tls-key: an operator's own (its clients trust
        its CA). Reloaded on SIGHUP, without dropping a connection. Without it, a gateway bound off
        loopback serves its own certificate from the cluster's CA; on loopback, plain HTTP.
    tls_key
        The private key (PEM) of --tls-cert.
    workers
        Gateway processes sharing the --listen port (SO_REUSEPORT), up to one per core: each
        follows the leader itself, is listed as NAME-wI and keeps its request log in
        STATE_DIR/workers/wI; one that dies is started again.
    worker_of
        Internal: this process is a worker of that parent gateway's pid.
    """
    import socket

    import trio

    from llmgw import statedir
    from llmgw.cli import _ports
    from llmgw.cli._lifecycle import serve_until_signal
    from llmgw.gateway import app as gateway_app
    from llmgw.gateway import workers as gateway_workers
    from llmgw.gateway.follower import GatewayConfig, serve

    host, port = _split_addr(listen)
    if not control:
        raise SystemExit("error: give the admin URL of each control plane with --control")
    for url in control:
        if not url.startswith("https://"):
            raise SystemExit(f"error: --control {url!r}: a gateway follows control over TLS; give its https:// admin URL")
    if workers < 1 or (worker_of is not None and workers != 1):
        raise SystemExit(f"error: --workers {workers}: give a number of processes, 1 (the default) or more")
    if key is not None:
        raise SystemExit(_MACHINE_KEY_REFUSED.format(flag="--key", role="gateway"))
    if state_dir is None:
        raise SystemExit("error: give --state-dir: a gateway keeps its certificate there (STATE_DIR/tls)")
    name = name or socket.gethostname()
    timeouts = env_timeouts()
    # A gateway that serves /v1 itself can restart in place; a parent of --workers serves nothing (its
    # workers restart, each in turn).
    handover = gateway_app.Handover(inherited=_inherited_listener()) if workers == 1 else None
    with statedir.acquire_or_exit(state_dir, "llmgw gateway") as lock:  # before anything in the dir is touched
        log.setup(state_dir / "logs" / "gateway.log")
        lock.warn_tightened()
        # A worker (STATE_DIR/workers/wI, named NAME-wI) uses the certificate its parent joined with.
        machine, credentials = ((name, state_dir) if worker_of is None else
                                (name.rpartition("-w")[0], state_dir.parent.parent))
        renewal = _machine_tls("gateway", machine, credentials, control, key=key, join_token=join_token,
                               ca_hash=ca_hash, ca_file=ca_file, hosts=(host, machine))
        renewal.renews = worker_of is None or name.endswith("-w0")  # one process of the machine renews
        server_tls = _gateway_tls(host, tls_cert, tls_key, renewal)
        cfg = GatewayConfig(controls=control, tls=renewal.context, renewal=renewal, server_tls=server_tls,
                            listen_host=host, listen_port=port, name=name, timeouts=timeouts, state_dir=state_dir,
                            handover=handover)
        if tls_cert is not None:  # control planes ask the request log on a listener of the gateway's own certificate
            cfg.query_listen = (host, 0)
            cfg.query_tls = own_tls(renewal)
        role: Callable[..., Awaitable[object]] = partial(serve, cfg)
        if worker_of is not None:  # one of --workers N: shares the port, answers control on a port of its own
            cfg.reuse_port, cfg.query_listen, cfg.role = True, (host, 0), gateway_workers.worker_role(name)
            role = partial(gateway_workers.serve_worker, cfg, worker_of)
        elif workers > 1:
            role = partial(gateway_workers.serve, gateway_workers.WorkersConfig(
                count=workers, listen_host=host, listen_port=port, state_dir=state_dir, timeouts=timeouts,
                command=gateway_workers.gateway_command(control, name, state_dir, log_json=log.log_json,
                                                        log_level=log.log_level, tls_cert=tls_cert, tls_key=tls_key),
                env=dict(os.environ)))

        returned: list[bool] = []

        async def _until_done(role: Callable[..., Awaitable[object]], scope: trio.CancelScope, *,
                              task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED) -> None:
            await role(task_status=task_status)
            returned.append(True)  # by itself, drained for a restart in place (a stop signal cancels it instead)
            scope.cancel()  # so does what runs beside it

        async def serve_naming_port(*, task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED) -> None:
            async with trio.open_nursery() as nursery:
                with _ports.naming("gateway", host, port, "--listen"):
                    if workers > 1 and port != 0:  # bound without SO_REUSEPORT by another process?
                        _ports.check_free("gateway", host, port, "--listen")
                    handle = await nursery.start(_until_done, role, nursery.cancel_scope)
                if tls_cert is not None:
                    nursery.start_soon(_reload_on_hangup, server_tls, tls_cert, tls_key, handle)
                pids = ",".join(str(w.pid) for w in getattr(handle, "workers", ()))  # --workers: which to watch
                print(f"llmgw gateway ready url={handle.url}/v1{f' workers={pids}' if pids else ''}", flush=True)
                task_status.started(handle)

        _collector.settle()
        status = trio.run(serve_until_signal, serve_naming_port)
    if handover is not None and handover.fd is not None and returned:  # drained: out of the state dir's lock
        os.set_inheritable(handover.fd, True)  # the one descriptor the next program keeps: /v1's listener
        os.environ[gateway_app.LISTEN_FD_ENV] = str(handover.fd)
        restart_in_place(cfg.restart_into[-1] if cfg.restart_into else None)  # `ctl upgrade`: into its file
    sys.exit(status)


def _inherited_listener() -> int | None:
    """The /v1 listening socket a previous program of this process left open (a restart in place), by its
    descriptor in LLMGW_GATEWAY_LISTEN_FD, taken out of the environment (no worker or engine sees it)."""
    from llmgw.gateway.app import LISTEN_FD_ENV

    raw = os.environ.pop(LISTEN_FD_ENV, None)
    if raw is None:
        return None
    if not raw.isdigit():
        raise SystemExit(f"error: {LISTEN_FD_ENV}={raw!r}: not a descriptor (it is set by a gateway restarting "
                         f"in place, for itself)")
    return int(raw)
