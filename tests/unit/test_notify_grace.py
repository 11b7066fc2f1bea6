"""The leader's notifier after it takes office, on a MockClock: a real reconciler, hub and notifier watch (the
same roles `llmgw control` runs), a webhook receiver on loopback. Its agent reports its running replica a
few seconds after the leader started (a restart of `llmgw up`, a leader change): nothing is posted for the
model that comes back ready; one that truly fits nowhere is posted once the agents' grace is over."""

from __future__ import annotations

import functools
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
from llmgw.notify.notifier import Notifier
from llmgw.notify.watch import control_conditions, http_post, watch
from llmgw.testing.builders import model, placed, store_with
from llmgw.testing.webhooks import WebhookReceiver

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
