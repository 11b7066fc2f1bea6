"""An agent and a control plane on loopback start a sim replica whose source is `mirror://NAME` (issue 24 point 4):
the leader's start says where the file is (its own blob URL), the agent fetches it into its mirror cache, checks it,
and starts the engine from the cached file; the node then reports the file as held by name (placement prefers it).
While a slow control plane trickles the file, the leader's activation progress (what `ctl status`, the console
and a client waiting on activation are shown) says `fetching` with the bytes held; a name the mirror lacks fails
the replica saying so."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.mirror_server import MirrorServer, place_in_mirror
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-mirror-agent"
DATA = os.urandom(1_000_000)
SHA = hashlib.sha256(DATA).hexdigest()
FAST = dataclasses.replace(TIMEOUTS, storage_rescan_s=0.2, start_backoff_first_s=0.1, start_backoff_max_s=0.2)


async def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):  # a bound on a hang only: each wait ends on the condition itself
        while not predicate():
            await trio.sleep(0.02)


async def test_an_agent_fetches_a_mirror_file_shows_its_progress_and_starts_the_engine_from_it(tmp_path: Path) -> None:
    router = Router()
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=0, seed=Seed(admin_key=ADMIN), sinks=[router],
                           demand=[router], timeouts=FAST)
    slow = MirrorServer(DATA, script=["pause:300000"])
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        await nursery.start(slow.run)
        assert control.context is not None
        await place_in_mirror(control, tmp_path / "control", DATA, "guard.gguf", "slow.gguf")
        own = control.reconciler.mirror_bases
        # The slow model's file is served by the trickling server (as if the only control plane holding it).
        control.reconciler.mirror_bases = lambda: own() if not placed("slow") else [slow.base]
        agent = AgentConfig(controls=[control.admin_url], tls=None, state_dir=tmp_path / "agent", node="n1",
                            local_credential=control.context.local_credential("agent", "n1"), timeouts=FAST,
                            probe=FakeGpuProbe(NodeInfo("x", hostname="n1", cpus=2, engines=("sim",))))
        await nursery.start(agent_serve, agent)

        def placed(model: str) -> bool:
            return any(p.model == model for p in control.store.snapshot().placements.values())

        def ready(model: str) -> bool:
            route = router.route(model)
            return route is not None and route.state == "ready"

        async def serve(name: str, source: str) -> None:
            model = ModelDef.from_doc({"name": name, "engine": "sim", "source": source})
            await control.store.submit(commands.put_model(model, 0.0))

        # Fetched from the control plane's own blob dir, checked, and started from the cache.
        await serve("guard", "mirror://guard.gguf")
        await wait_for(lambda: ready("guard"))
        cached = tmp_path / "agent" / "mirror-cache" / SHA
        assert cached.read_bytes() == DATA
        await wait_for(lambda: any(m.get("name") == "guard.gguf" for s in control.hub.nodes["n1"].storage
                                   for m in s.get("models", ())))

        # Progress while the file trickles: the leader's activation says fetching, with the bytes held.
        cached.unlink()  # the same file: fetched again, from the slow server
        await serve("slow", "mirror://slow.gguf")
        await slow.paused.wait()

        def fetching() -> bool:
            route = router.route("slow")
            progress = route.activation if route is not None else None
            return progress is not None and progress.phase == "fetching" and progress.bytes_done == 300_000

        await wait_for(fetching)
        route = router.route("slow")
        assert route is not None and route.activation is not None
        doc = route.activation.to_doc(now=route.activation.since or 0.0)
        assert doc["bytes_total"] == len(DATA) and doc["bytes_done"] == 300_000
        assert "(30%)" in route.activation.words(route.activation.since or 0.0)
        assert not ready("slow")
        slow.resume.set()
        await wait_for(lambda: ready("slow"))
        assert slow.ranges == [None]

        # A name the mirror does not hold: the replica fails, saying so.
        await serve("absent", "mirror://absent.gguf")
        await wait_for(lambda: "not in the mirror" in control.store.snapshot().model_health("absent").last_error)
        nursery.cancel_scope.cancel()
