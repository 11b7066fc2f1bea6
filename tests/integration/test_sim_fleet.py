"""`llmgw sim-fleet` at 200 nodes, as a process, against a real control plane (TLS, its CA under the
session's test root) and a remote gateway in one trio run: every node joins with a token of its own
(made with the operator's admin key, LLMGW_KEY), connects over its own stream with its own
certificate and reports what it is, a sim
model with a GPU profile is placed on GPUs and answers through the gateway, and a `--fail-start`
model fails on the simulated engines and is parked with the engine's words. A second, small fleet of
MIG nodes takes a model of a MIG class on one instance."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Awaitable, Callable

import httpx
import pytest
import trio

from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import MIG_INDEX_BASE
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.follower import GatewayConfig, GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.simfleet.nodes import node_names
from llmgw.trust.tls import client_context
from tests.support.processes import free_port, stop_all
from tests.support.trust import test_ca_root

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-admin-fleet-test", "sk-client-fleet-test"
NODES = 200
MIG_NODES = 4
# The failing model's five starts wait 0.1, 0.2, 0.4, 0.4 s between them, not 1, 2, 4, 8 s.
FAST = dataclasses.replace(TIMEOUTS, start_backoff_first_s=0.1, start_backoff_max_s=0.4)
GPU_MODEL = {"name": "gpu-sim", "engine": "sim", "source": "sim://gpu-sim",
             "profile": {"gpus": 2, "tp": 2, "classes": ["h100-80g"]}}
MIG_MODEL = {"name": "mig-sim", "engine": "sim", "source": "sim://mig-sim",
             "profile": {"classes": ["a100-80g-mig-3g.40gb"]}}
BROKEN = {"name": "broken", "engine": "sim", "source": "sim://broken", "args": ["--fail-start"],
          "profile": {"gpus": 1}}


async def until(what: str, check: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float) -> None:
    with trio.fail_after(timeout):
        while True:
            done = check()
            if not isinstance(done, bool):
                done = await done
            if done:
                return
            await trio.sleep(0.05)
    raise AssertionError(what)


def fleet_process(control: str, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    """A fleet as an operator runs it: LLMGW_KEY is the operator's admin key (it makes each node's join
    token); the fleet trusts control through the system's store (SSL_CERT_FILE: the test root)."""
    argv = [sys.executable, "-m", "llmgw", "sim-fleet", "--control", control, *flags]
    with log.open("ab") as out:
        return subprocess.Popen(argv, env={**os.environ, "LLMGW_KEY": ADMIN}, stdout=out, stderr=subprocess.STDOUT)


async def ca_hash_of(admin_url: str) -> str:
    async with httpx.AsyncClient() as http:
        r = await http.get(admin_url + "/api/v1/trust/ca")
    assert r.status_code == 200, r.text
    found: str = r.json()["ca_hash"]
    return found


async def test_a_200_node_sim_fleet_through_the_real_control_plane_and_gateway(tmp_path: Path) -> None:
    raft_port, admin_port = free_port(), free_port()
    seed = Seed(admin_key=ADMIN, client_key=CLIENT, models=[ModelDef.from_doc(d) for d in (GPU_MODEL, MIG_MODEL, BROKEN)])
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{raft_port}", admin_host="127.0.0.1",
                           admin_port=admin_port, seed=seed, timeouts=FAST, tls=True, ca_root=test_ca_root())
    fleet_log = tmp_path / "fleet.log"
    fleets: list[subprocess.Popen[bytes]] = []
    try:
        async with trio.open_nursery() as nursery:
            control: ControlHandle = await nursery.start(control_serve, config)
            fleets.append(fleet_process(control.admin_url, fleet_log, "--nodes", str(NODES), "--gpus-per-node", "8",
                                        "--class", "h100-80g", "--fabric", "ib-a", "--storage-holds", "gpu-sim"))
            # This one pins the CA by its hash, as `ctl nodes token create` prints it, and keeps its nodes'
            # certificates in a state dir of its own.
            ca_hash = await ca_hash_of(control.admin_url)
            fleets.append(fleet_process(control.admin_url, fleet_log, "--nodes", str(MIG_NODES), "--prefix", "mig",
                                        "--gpus-per-node", "2", "--class", "a100-80g", "--mig", "3g.40gb",
                                        "--mig", "3g.40gb", "--fabric", "ib-b", "--ca-hash", ca_hash,
                                        "--state-dir", str(tmp_path / "mig-fleet")))
            # The gateway is inside this process: the control's in-memory credential, over its TLS.
            assert control.context is not None
            gw: GatewayHandle = await nursery.start(gateway_serve, GatewayConfig(
                controls=[control.admin_url], tls=client_context(None), listen_port=0, name="gw-fleet", timeouts=FAST,
                local_credential=control.context.local_credential("gateway", "gw-fleet")))

            # Every node on its own stream, each reporting the inventory it was given.
            await until("every node connected", lambda: len(control.hub.nodes) == NODES + MIG_NODES, 60)
            # ... each with a certificate of its own, made at its join.
            machines = control.store.snapshot().machines
            assert len([m for m in machines.values() if m.role == "agent"]) == NODES + MIG_NODES
            kept = sorted(p.parent.parent.name for p in (tmp_path / "mig-fleet" / "nodes").glob("*/tls/cert.pem"))
            assert kept == node_names(MIG_NODES, "mig")
            assert sorted(control.hub.nodes) == node_names(MIG_NODES, "mig") + node_names(NODES)
            first = control.hub.nodes["sim-0001"]
            assert [g.gpu_class for g in first.gpus] == ["h100-80g"] * 8 and first.fabric == "ib-a"
            assert [m["name"] for m in first.storage[0]["models"]] == ["gpu-sim"]

            async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"}) as http:
                async def answers() -> bool:
                    r = await http.post("/v1/chat/completions",
                                        json={"model": "gpu-sim", "messages": [{"role": "user", "content": "hello"}]})
                    return r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "sim says: hello"
                await until("gpu-sim answers through the gateway", answers, 30)
                r = await http.post("/v1/chat/completions",
                                    json={"model": "mig-sim", "messages": [{"role": "user", "content": "mig"}]})
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "sim says: mig", r.text

            # Placed like a real model: two GPUs of one simulated node.
            (placement,) = control.store.snapshot().placements_of("gpu-sim")
            assert placement.node.startswith("sim-") and len(placement.gpus) == 2, placement
            (on_mig,) = control.store.snapshot().placements_of("mig-sim")
            assert on_mig.node.startswith("mig-") and len(on_mig.gpus) == 1 and on_mig.gpus[0] >= MIG_INDEX_BASE

            # The failing model fails on the simulated engines and is parked with their words.
            await until("broken parked", lambda: control.store.snapshot().model_health("broken").parked, 30)
            health = control.store.snapshot().model_health("broken")
            assert "--fail-start" in health.last_error and "status 3" in health.last_error, health

            async with httpx.AsyncClient(base_url=control.admin_url,
                                         headers={"Authorization": f"Bearer {ADMIN}"}) as api:
                status = await api.get("/api/v1/status")
                assert status.status_code == 200, status.text
            assert all(f.poll() is None for f in fleets), fleet_log.read_text()[-3000:]
            nursery.cancel_scope.cancel()
    finally:
        stop_all(fleets, grace=15)
    assert [f.returncode for f in fleets] == [0, 0], fleet_log.read_text()[-3000:]


async def test_a_fleet_started_again_on_its_state_dir_joins_no_node_and_needs_no_key(tmp_path: Path) -> None:
    """Each node keeps its certificate in --state-dir: a second start joins none (no token, no LLMGW_KEY),
    and is welcomed with the certificates of the first. Without a key and without certificates, and
    with an http:// control, the fleet does not start and says why."""
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                           admin_port=0, seed=Seed(admin_key=ADMIN), timeouts=FAST, tls=True, ca_root=test_ca_root())
    state, log = tmp_path / "fleet", tmp_path / "fleet.log"
    flags = ("--nodes", "3", "--gpus-per-node", "1", "--state-dir", str(state), "--log-level", "info")

    def said() -> str:
        return log.read_text() if log.exists() else ""

    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        for run, env in ((1, {"LLMGW_KEY": ADMIN}), (2, {"LLMGW_KEY": ""})):
            with log.open("ab") as out:
                fleet = subprocess.Popen([sys.executable, "-m", "llmgw", "sim-fleet", "--control", control.admin_url,
                                          *flags], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
            try:
                await until(f"start {run}: every node connected", lambda: len(control.hub.nodes) == 3
                            and said().count("nodes connected") == run, 60)
            finally:
                fleet.terminate()
                await trio.to_thread.run_sync(fleet.wait, 15)
            assert fleet.returncode == 0, said()
            await until("the nodes gone", lambda: not control.hub.links, 30)
        # The fleet's line once all are in names how many joined: all three at the first start, none after.
        lines = [line for line in said().splitlines() if "nodes connected" in line]
        assert ["(3 joined now" in lines[0], "(0 joined now" in lines[1]] == [True, True], lines
        assert sorted(p.parent.parent.name for p in (state / "nodes").glob("*/tls/cert.pem")) == node_names(3)
        machines = control.store.snapshot().machines
        assert sorted(m.name for m in machines.values() if m.role == "agent") == node_names(3)
        assert all(len(m.serials) == 1 for m in machines.values() if m.role == "agent"), "a node joined twice"
        nursery.cancel_scope.cancel()

    env = {k: v for k, v in os.environ.items() if k != "LLMGW_KEY"}
    no_key = subprocess.run([sys.executable, "-m", "llmgw", "sim-fleet", "--control", "https://127.0.0.1:9",
                             "--nodes", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert no_key.returncode == 1 and "set LLMGW_KEY (the operator's admin key)" in no_key.stderr, no_key.stderr
    plain = subprocess.run([sys.executable, "-m", "llmgw", "sim-fleet", "--control", "http://127.0.0.1:9",
                            "--nodes", "1"], env={**env, "LLMGW_KEY": ADMIN}, capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 1 and "give its https:// admin URL" in plain.stderr, plain.stderr
