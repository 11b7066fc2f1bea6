"""The body of `llmgw up`, kept apart so `llmgw --help` never imports the servers."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from llmgw import catalog as catalog_mod
from llmgw.cli import _collector, _ports
from llmgw.cli._lifecycle import serve_until_signal
from llmgw import console, logs, statedir
from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.members import advertised_url
from llmgw.control.service import ControlConfig, Seed
from llmgw.control.service import serve as control_serve
from llmgw.gateway.app import GatewayDeps
from llmgw.gateway.app import serve as gateway_serve
from llmgw.gateway.guard import GuardStats
from llmgw.gateway.requestlog import RequestLog, push_usage
from llmgw.gateway.router import Router
from llmgw.net import free_port, off_loopback, url_host
from llmgw.trust.tls import client_context as tls_client

log = logging.getLogger("llmgw.up")


@dataclass
class UpOptions:
    state_dir: Path
    host: str = "127.0.0.1"
    gateway_port: int = 8080
    admin_port: int = 8081
    raft_port: int = 0
    catalog: Path | None = None
    log_json: bool = False
    log_level: str = "info"
    env_client_key: str | None = None
    env_admin_key: str | None = None
    tls: bool | None = None  # None: on unless `host` is a loopback address


def raft_host(host: str) -> str:
    """Where up's one-member Raft group listens: `--host`, or loopback when that is 0.0.0.0 / ::
    (a Raft address is the member's name, never a wildcard, and no peer needs to reach it)."""
    try:
        return "127.0.0.1" if ipaddress.ip_address(host).is_unspecified else host
    except ValueError:
        return host  # a host name


def new_key(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(32)}"


def load_or_make_keys(path: Path, opts: UpOptions) -> dict[str, str]:
    """Keys from credentials.json when it exists, else from the environment, else fresh."""
    if path.exists():
        doc = json.loads(path.read_text())
        return {"client_key": doc["client_key"], "admin_key": doc["admin_key"]}
    return {
        "client_key": opts.env_client_key or new_key("sk-llmgw"),
        "admin_key": opts.env_admin_key or new_key("sk-llmgw-admin"),
    }


def write_credentials(path: Path, doc: dict[str, str]) -> None:
    """Write atomically with mode 0600 from the first byte (never world-readable, even briefly)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


async def main(opts: UpOptions) -> int:
    """Everything after the state dir is locked: keys, catalog, then the roles."""
    logs.role_var.set("up")
    state_dir = opts.state_dir.resolve()
    cred_path = state_dir / "credentials.json"
    keys = load_or_make_keys(cred_path, opts)
    try:
        models = catalog_mod.load(opts.catalog)
    except catalog_mod.CatalogError as e:
        log.error("%s", e)
        return 2
    try:
        raft_port = opts.raft_port or free_port(raft_host(opts.host))
    except OSError as e:  # a --host that no interface has
        log.error("cannot start: %s", _ports.why("Raft", opts.host, 0, "--raft-port", e))
        return 1
    router = Router()
    control_cfg = ControlConfig(
        state_dir=state_dir,
        raft_addr=f"{url_host(raft_host(opts.host))}:{raft_port}",
        admin_host=opts.host,
        admin_port=opts.admin_port,
        seed=Seed(admin_key=keys["admin_key"], client_key=keys["client_key"], models=models),
        sinks=[router],
        demand=[router],
        mounts=(console.register,),
        tls=opts.tls if opts.tls is not None else off_loopback(opts.host),
    )
    return await serve_until_signal(_serve_all, opts, router, control_cfg, keys, cred_path)


async def _serve_all(opts: UpOptions, router: Router, control_cfg: ControlConfig,
                     keys: dict[str, str], cred_path: Path, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Control, then the gateway, then the agent, each in its own root nursery; until cancelled."""
    state_dir = control_cfg.state_dir
    async with trio.open_nursery() as nursery:
        # A port that cannot be bound is named, with the flag that picks another.
        if opts.raft_port:
            _ports.check_free("Raft", raft_host(opts.host), opts.raft_port, "--raft-port")
        with _ports.naming("admin API", opts.host, opts.admin_port, "--admin-port"):
            control = await nursery.start(control_serve, control_cfg)
        trust = control.context.trust if control.context is not None else None
        # Bound off loopback, /v1 serves TLS too, with this control plane's certificate (the cluster's CA).
        gateway_tls = trust.server_context() if trust is not None and off_loopback(opts.host) else None
        with _ports.naming("gateway", opts.host, opts.gateway_port, "--gateway-port"):
            rlog = RequestLog(state_dir / "requests", "local", settings=lambda: control.store.snapshot().settings,
                              timeouts=control_cfg.timeouts)
            _, gw_port = await nursery.start(partial(gateway_serve, tls=gateway_tls), opts.host, opts.gateway_port,
                                             GatewayDeps(router=router, state=control.store, requestlog=rlog,
                                                         # a judge's failure: straight to the hub
                                                         guard_stats=GuardStats(
                                                             on_failure=control.hub.record_judge_failure)))
        nursery.start_soon(push_usage, rlog, control.store.submit)  # rollups straight to the store
        # Where clients reach it: a wildcard host is this machine's Raft host (its certificate names it).
        gateway_url = f"{'https' if gateway_tls is not None else 'http'}://{url_host(raft_host(opts.host))}:{gw_port}/v1"
        if control.gateways is not None:  # listed with the gateways that follow the leader, as in-process
            control.gateways.add_local(gateway_url.removesuffix("/v1"), pid=os.getpid())
        admin_url = advertised_url(control.admin_url, control_cfg.raft_addr)
        ca_file = {"ca_file": str(trust.files.ca)} if trust is not None else {}
        write_credentials(cred_path, {"gateway_url": gateway_url, "admin_url": admin_url, **keys, **ca_file})
        # Its own agent speaks over loopback with a credential held in this process's memory only.
        assert control.context is not None
        local = control.context.local_credential("agent", "local")
        await nursery.start(agent_serve, AgentConfig(controls=[admin_url],
                                                     tls=tls_client(trust.files.ca) if trust is not None else None,
                                                     local_credential=local, state_dir=state_dir,
                                                     engine_host=opts.host, stop_engines_on_exit=True))
        logs.role_var.set("up")
        print(f"llmgw ready gateway={gateway_url} admin={admin_url} state={state_dir} "
              f"credentials={cred_path}", flush=True)
        log.info("ready: %d model(s) in the catalog", len(control.store.snapshot().models))
        task_status.started()


def run(opts: UpOptions) -> int:
    """Lock the state dir first: nothing in it is read or written by a process that does not hold it."""
    state_dir = opts.state_dir.resolve()
    with statedir.acquire_or_exit(state_dir, "llmgw up") as lock:
        logs.setup(json_lines=opts.log_json, level=opts.log_level, log_file=state_dir / "logs" / "llmgw.log")
        lock.warn_tightened()
        _collector.settle()
        try:
            return trio.run(main, opts)
        except KeyboardInterrupt:
            return 130


