"""One view of the cluster: `ctl status`, the console's Overview, `/metrics` and the notifier read the same
look (`Context.look`), so a condition true now reads the same in each. The case: a webhook that fails
(it answers 500), which the Overview did not show when each reader built the summary itself."""

from __future__ import annotations

import functools
import html
import re
from typing import Any

import httpx
import pytest
import trio

from llmgw import console
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.settings import effective
from llmgw.notify.hooks import hook_id
from llmgw.notify.notifier import Notifier
from llmgw.notify.watch import control_conditions, http_post, watch
from llmgw.testing import MemoryStore
from llmgw.testing.webhooks import WebhookReceiver

from console_world import sign_in
from ctl_fakes import FakeApi, ctl

ADMIN = "sk-one-view-admin-0123456789"


def _words(text: str) -> str:
    return " ".join(text.split())


# The webhook's delivery cut by its timeout leaves httpx's request body iterator unfinished; trio's
# finalizer warns when it is collected (on a loaded machine, during this test): nothing of ours is held.
@pytest.mark.filterwarnings("ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning")
async def test_a_failing_webhook_reads_the_same_in_ctl_status_the_overview_the_metrics_and_the_webhooks() -> None:
    store, hub = MemoryStore(), AgentHub(clock=trio.current_time)
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
    receiver = WebhookReceiver()
    async with httpx.AsyncClient(timeout=None) as out, trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)
        receiver.answers["/down"] = 500
        notifier = Notifier(http_post(out), clock=trio.current_time, cluster=lambda: {"leader": "local"})
        await nursery.start(notifier.run)
        ctx = Context(store=store, hub=hub, reconciler=Reconciler(store, hub, clock=trio.current_time),
                      clock=trio.current_time, notifier=notifier, webhook_deliveries=notifier.deliveries)
        app: Any = make_app(ctx, (console.register,))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp.test",
                                     headers={"Authorization": f"Bearer {ADMIN}"}) as api:
            assert (await api.put("/api/v1/settings/notify.webhooks", json=[url + "/up", url + "/down"])).is_success
            for _ in range(3):  # three failed deliveries in a row: the webhook is failing
                assert (await api.post("/api/v1/notify/test")).json()["delivered"] == 1
            bad = hook_id(url + "/down")

            doc = (await api.get("/api/v1/status")).json()
            [failing] = [c for c in doc["conditions"] if c["kind"] == "webhook_failing"]
            assert failing["subject"] == bad and "failed 3 deliveries in a row" in failing["words"]
            assert failing["words"] in doc["warnings"]

            # ctl status prints what the status route answered: the same words among its warnings (cut to
            # the terminal's line).
            shown = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=doc))
            assert shown.rc == 0 and f"! {failing['words'][:100]}" in shown.out

            # The Overview reads the same look.
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp.test") as browser:
                await sign_in(browser, ADMIN)
                page = (await browser.get("/")).text
            assert _words(failing["words"]) in _words(html.unescape(re.sub(r"<[^>]+>", " ", page)))

            # /metrics: the condition's gauge, by the same kind and subject.
            metrics = (await api.get("/metrics")).text
            assert re.search(r'llmgw_condition\{[^}]*kind="webhook_failing"[^}]*subject="%s"[^}]*\} 1\.0' % bad,
                             metrics), metrics

        # The notifier's check: the same condition, word for word, posted to the webhook that works.
        assert [c.to_doc() for c in control_conditions(ctx)] == doc["conditions"]
        await nursery.start(functools.partial(watch, notifier, lambda: control_conditions(ctx),
                                              lambda: store.snapshot().settings, lambda: True,
                                              clock=trio.current_time, timeouts=ctx.timeouts))
        got = await receiver.wait_for(4, "/up")  # three test events, then the condition's
        posted = got[-1].json()
        assert posted["event"] == "started" and posted["condition"]["kind"] == "webhook_failing"
        assert posted["condition"]["subject"] == bad and posted["condition"]["words"] == failing["words"]
        assert effective(store.snapshot().settings, "notify.webhooks") == [url + "/up", url + "/down"]
        nursery.cancel_scope.cancel()
