"""The leader's notifier after it takes office, on a MockClock: a real reconciler, hub and notifier watch (the
same roles `llmgw control` runs), a webhook receiver on loopback. Its agent reports its running replica a
few seconds after the leader started (a restart of `llmgw up`, a leader change): nothing is posted for the
model that comes back ready; one that truly fits nowhere is posted once the agents' grace is over. And an
eviction by policy posts nothing for the evicted model."""

from __future__ import annotations

import functools
import json
from typing import Any

import httpx
import trio
import trio.testing

from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.observed import NodeInfo, ReplicaObs
from llmgw.domain.settings import effective
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.notify.hooks import Webhook
from llmgw.notify.notifier import Notifier
from llmgw.notify.watch import control_conditions, http_post, watch
from llmgw.testing.builders import model, node, placed, replica, store_with
from llmgw.testing.webhooks import WebhookReceiver
from test_eviction import MIN, NOW, gpu_model

GRACE = TIMEOUTS.agent_report_grace_s


async def test_a_new_leader_posts_nothing_for_a_model_its_agent_reports_ready_within_the_grace(
        autojump_clock: trio.testing.MockClock) -> None:
    # The state a leader inherits: `chat` placed on n1 (running there all along), `big` fits on no node.
    store = store_with([model("chat").sim().always(), model("big").sim().always().gpus(4)], [placed("chat", "n1")])
    hub = AgentHub(clock=trio.current_time)
    receiver = WebhookReceiver()
    async with httpx.AsyncClient(timeout=None) as out, trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)
        store.submit_nowait(commands.put_setting("notify.webhooks", [url + "/pager"], 0.0))
        notifier = Notifier(http_post(out), clock=trio.current_time)
        await nursery.start(notifier.run)
        reconciler = Reconciler(store, hub, clock=trio.current_time)
        ctx = Context(store=store, hub=hub, reconciler=reconciler, clock=trio.current_time, notifier=notifier)
        took_office = trio.current_time()
        await nursery.start(reconciler.run)
        await nursery.start(functools.partial(watch, notifier, lambda: control_conditions(ctx),
                                              lambda: store.snapshot().settings, lambda: True,
                                              clock=trio.current_time))
        warnings = (await _status(ctx))["warnings"]
        assert warnings[0].startswith(f"waiting for agents to report (grace {GRACE:g} s")  # words, no alarm

        await trio.sleep(3)  # the agent comes back: its engine ran on, it reports it ready
        send, _receive = trio.open_memory_channel[dict[str, Any]](100)
        link = hub.connect("n1", send)
        hub.report_inventory(link, NodeInfo("n1", cpus=4, engines=("sim",)))
        [rid] = store.snapshot().placements
        hub.report_replicas(link, [ReplicaObs(rid, "chat", "n1", "ready", url="http://10.0.0.1:1")])

        await trio.sleep(GRACE * 3)
        posted = [(e["event"], e["condition"]["kind"], e["condition"]["subject"], e["at"] - took_office)
                  for e in receiver.events()]
        # Nothing for `chat`; `big` (4 GPUs, a CPU node) is posted once the grace is over, not before.
        assert [p[:3] for p in posted] == [("started", "model_unplaceable", "big")]
        assert GRACE <= posted[0][3] < GRACE + 2 * TIMEOUTS.notify_check_s
        assert not any(w.startswith("waiting for agents to report") for w in (await _status(ctx))["warnings"])
        assert effective(store.snapshot().settings, "notify.webhooks") == [url + "/pager"]
        nursery.cancel_scope.cancel()


async def _status(ctx: Context) -> dict[str, Any]:
    return ctx.look(ctx.local_cluster()).summary.to_doc()


async def test_an_eviction_posts_nothing_for_the_evicted_model() -> None:
    """`older` (idle 42 min) is evicted to make room for `need`: before, the pass that evicted it showed it
    "waiting for a placement" (down, critical). Each pass's conditions go to the notifier: nothing is posted."""
    t = [0.0]
    store = store_with([gpu_model("old"), gpu_model("older"), gpu_model("need")],
                       [placed("old", "g1", [0]), placed("older", "g1", [1])])
    hub = AgentHub(clock=lambda: t[0])  # in office since 0: its agents' grace is long over
    send, _receive = trio.open_memory_channel[dict[str, Any]](100)
    link = hub.connect("g1", send)
    hub.report_inventory(link, node("g1").gpus(2).engines("vllm").build())
    hub.report_replicas(link, [replica("old-r1", "g1"), replica("older-r2", "g1")])
    for model_name, at in (("older", NOW - 42 * MIN), ("old", NOW - 10 * MIN), ("need", NOW)):
        t[0] = at
        hub.note_demand(model_name)
    posted: list[dict[str, Any]] = []

    async def post(url: str, data: bytes) -> int:
        posted.append(json.loads(data))
        return 200

    async with trio.open_nursery() as nursery:
        notifier = Notifier(post, clock=lambda: t[0])
        await nursery.start(notifier.run)
        notifier.configure([Webhook("http://pager.test/hook", "json")])
        reconciler = Reconciler(store, hub, clock=lambda: t[0])
        ctx = Context(store=store, hub=hub, reconciler=reconciler, clock=lambda: t[0], notifier=notifier)
        said = []
        for step in range(3):
            t[0] = NOW + step
            plan = await reconciler.run_once()
            if step == 0:
                assert [e.model for e in plan.evictions] == ["older"]
            notifier.observe(control_conditions(ctx), t[0])
            [older] = [m for m in ctx.look(ctx.local_cluster()).summary.models if m.name == "older"]
            said.append((older.state, older.reason))
        await trio.testing.wait_all_tasks_blocked()
        assert [(p["condition"]["kind"], p["condition"]["subject"]) for p in posted
                if p["condition"]["subject"] == "older"] == []
        assert said == [("absent", "evicted: idle 42 min, made room for need; a request starts it again")] * 3
        nursery.cancel_scope.cancel()
