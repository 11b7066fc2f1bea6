"""Fast wake (docs/models.md, "Fast wake"): how long a client's request waits for an on-demand model that was
stopped (a cold start) against one that was put to sleep (a wake), through the whole system: a real control
plane, an agent running sim engine processes, the gateway's /v1 API, in one trio run on loopback.

Run: `.venv/bin/python tests/bench/wake.py [--cold-s 3] [--wake-s 0.1] [--rounds 3] [--idle-s 1]`.
Two sim models alike but for `sleep_level`: `cold` (0: stopped when idle) and `slept` (1: asleep when idle).
The sim's `--startup-delay` (a cold start: a real engine's process start and weights load) and `--wake-delay`
(vLLM's `/wake_up`) are set from --cold-s and --wake-s; the figures add what the system costs on top of them
(the gateway's wait, the activation ask, the reconcile pass, the agent's start or wake, the readiness probes).
Each round waits until both models idled (`cold` stopped, `slept` asleep), then asks each once; the first
round warms `slept` (its first start is cold too) and is not counted. The table gives each path's median and
the ratio. The ratio follows the flags (on the sim a cold start is what --cold-s says); vLLM's own figures for
real checkpoints are in docs/models.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.agent import AgentConfig  # noqa: E402
from llmgw.agent import serve as agent_serve  # noqa: E402
from llmgw.control.service import ControlConfig, ControlHandle, Seed  # noqa: E402
from llmgw.control.service import serve as control_serve  # noqa: E402
from llmgw.domain.model import ModelDef  # noqa: E402
from llmgw.domain.observed import NodeInfo  # noqa: E402
from llmgw.domain.timeouts import TIMEOUTS  # noqa: E402
from llmgw.gateway.app import GatewayDeps  # noqa: E402
from llmgw.gateway.app import serve as gateway_serve  # noqa: E402
from llmgw.gateway.router import Router  # noqa: E402
from llmgw.net import free_port  # noqa: E402
from llmgw.testing import FakeGpuProbe  # noqa: E402
from tests.support.figures import print_table  # noqa: E402

ADMIN, CLIENT = "sk-admin-wake-bench", "sk-client-wake-bench"


def _model(name: str, cold_s: float, wake_s: float, idle_s: float, sleep_level: int) -> dict[str, Any]:
    return {"name": name, "engine": "sim", "source": f"sim://{name}", "mode": "on-demand", "idle_timeout_s": idle_s,
            "args": ["--startup-delay", str(cold_s), "--wake-delay", str(wake_s)], "sleep_level": sleep_level}


async def _until(predicate: Any, timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.02)


async def measure(cold_s: float = 3.0, wake_s: float = 0.1, rounds: int = 3, idle_s: float = 1.0) -> dict[str, list[float]]:
    """Seconds each counted round's request waited: {"cold": [...], "slept": [...]}."""
    out: dict[str, list[float]] = {"cold": [], "slept": []}
    router = Router()
    with tempfile.TemporaryDirectory(prefix="llmgw-wake-bench-") as tmp:
        config = ControlConfig(state_dir=Path(tmp) / "control", raft_addr=f"127.0.0.1:{free_port('127.0.0.1')}",
                               admin_host="127.0.0.1", admin_port=free_port("127.0.0.1"),
                               seed=Seed(admin_key=ADMIN, client_key=CLIENT), sinks=[router], demand=[router],
                               timeouts=dataclasses.replace(TIMEOUTS, reconcile_tick_s=0.1))
        probe = FakeGpuProbe(NodeInfo("x", hostname="bench-node", cpus=2, engines=("sim",)))
        async with trio.open_nursery() as nursery:
            control: ControlHandle = await nursery.start(control_serve, config)
            assert control.context is not None
            await nursery.start(agent_serve, AgentConfig(
                controls=[control.admin_url], tls=None, state_dir=Path(tmp) / "agent", node="n1", probe=probe,
                local_credential=control.context.local_credential("agent", "n1")))
            host, port = await nursery.start(partial(gateway_serve, "127.0.0.1", 0,
                                                     GatewayDeps(router=router, state=control.store)))
            await _until(lambda: control.store.snapshot().store_level >= 3, 30)  # sleep_level: store level 3
            async with httpx.AsyncClient(base_url=control.admin_url,
                                         headers={"authorization": f"Bearer {ADMIN}"}) as admin:
                for name, level in (("cold", 0), ("slept", 1)):
                    doc = _model(name, cold_s, wake_s, idle_s, level)
                    ModelDef.from_doc(doc)
                    r = await admin.post("/api/v1/models", json=doc)
                    assert r.status_code == 201, r.text

            def idle(name: str) -> bool:
                placed = [p for p in control.store.snapshot().placements.values() if p.model == name]
                reported = control.hub.observed().replicas
                if name == "cold":
                    return not placed and not any(o.model == name for o in reported.values())
                return bool(placed) and all(p.asleep and (o := reported.get(p.replica_id)) is not None
                                            and o.state == "sleeping" for p in placed)

            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=cold_s * 10 + 60,
                                         headers={"authorization": f"Bearer {CLIENT}"}) as client:
                for n in range(rounds + 1):
                    for name in ("cold", "slept"):
                        if n:  # the first round: both start cold; `slept` sleeps from then on
                            await _until(lambda: idle(name), idle_s * 10 + cold_s + 30)
                        started = trio.current_time()
                        r = await client.post("/v1/chat/completions",
                                              json={"model": name, "messages": [{"role": "user", "content": "hi"}]})
                        waited = trio.current_time() - started
                        assert r.status_code == 200, r.text
                        if n:
                            out[name].append(waited)
            nursery.cancel_scope.cancel()
    return out


def table(found: dict[str, list[float]], cold_s: float, wake_s: float) -> list[list[str]]:
    cold, slept = statistics.median(found["cold"]), statistics.median(found["slept"])
    return [["path", "engine's own time (s)", "request waited, median (s)", "runs", "vs cold"],
            ["cold start (stopped when idle)", f"{cold_s:g}", f"{cold:.3f}", str(len(found["cold"])), "1.0x"],
            ["wake (asleep when idle, sleep_level 1)", f"{wake_s:g}", f"{slept:.3f}", str(len(found["slept"])),
             f"{cold / slept:.1f}x faster"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--cold-s", type=float, default=3.0, help="the sim's cold start (--startup-delay), seconds")
    ap.add_argument("--wake-s", type=float, default=0.1, help="the sim's wake (--wake-delay), seconds")
    ap.add_argument("--rounds", type=int, default=3, help="counted rounds (after one warm-up round)")
    ap.add_argument("--idle-s", type=float, default=1.0, help="the models' idle_timeout_s")
    opts = ap.parse_args()
    found = trio.run(partial(measure, opts.cold_s, opts.wake_s, opts.rounds, opts.idle_s))
    print_table(table(found, opts.cold_s, opts.wake_s))


if __name__ == "__main__":
    main()
