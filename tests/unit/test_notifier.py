"""The notifier (llmgw/notify) against a real webhook server on loopback (llmgw/testing/webhooks.py), on a
MockClock: each start and resolution posted once, flapping within the hold as one event, retries with backoff,
a hanging endpoint delaying neither the other webhooks nor the reconciler, deliveries kept, Slack's format."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import trio
import trio.testing

from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.conditions import CRITICAL, WARNING, Condition, conditions
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.summary import summarize
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.notify.hooks import Webhook, hook_id, webhooks_of
from llmgw.notify.notifier import ATTEMPTS, KEPT_DELIVERIES, Notifier, retry_wait
from llmgw.notify.watch import http_post, watch
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model
from llmgw.testing.webhooks import HANG, WebhookReceiver

LOST = Condition("node_lost", "n1", CRITICAL, "node n1 has been unreachable for 31 s")
PARKED = Condition("model_parked", "m", CRITICAL, "model m is parked")
HOLD = TIMEOUTS.notify_resolve_hold_s
NOTHING = summarize(ClusterState(), Observed(), None, {})  # no node, no model: the webhooks alone make conditions


@dataclass
class Rig:
    notifier: Notifier
    receiver: WebhookReceiver
    url: str

    def hook(self, path: str = "/h", fmt: str = "json") -> Webhook:
        return Webhook(self.url + path, "slack" if fmt == "slack" else "json")


@asynccontextmanager
async def rig(queue_max: int = 100) -> AsyncIterator[Rig]:
    receiver = WebhookReceiver()
    async with httpx.AsyncClient(timeout=None) as client, trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)
        notifier = Notifier(http_post(client), clock=trio.current_time, cluster=lambda: {"leader": "cp1:7000"},
                            queue_max=queue_max)
        await nursery.start(notifier.run)
        yield Rig(notifier, receiver, url)
        nursery.cancel_scope.cancel()


async def settle() -> None:
    await trio.sleep(0.01)  # lets queued deliveries go out (the loopback answers at once)


async def test_a_condition_is_posted_when_it_starts_and_once_when_it_resolves(
        autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.notifier.configure([r.hook()])
        t0 = trio.current_time()
        for _ in range(5):  # seen at every check: posted once
            r.notifier.observe([LOST], trio.current_time())
            await trio.sleep(1)
        assert [e["event"] for e in r.receiver.events()] == ["started"]
        started = r.receiver.events()[0]
        assert started["condition"] == {"kind": "node_lost", "subject": "n1", "severity": "critical",
                                        "words": LOST.words}
        assert started["at"] == t0 and started["cluster"] == {"leader": "cp1:7000"}
        cleared = trio.current_time()
        while trio.current_time() - cleared < HOLD:  # gone, but not yet for the whole hold: nothing
            r.notifier.observe([], trio.current_time())
            await trio.sleep(1)
            assert len(r.receiver.received) == 1
        r.notifier.observe([], trio.current_time())
        await settle()
        resolved = r.receiver.events()[1]
        assert resolved["event"] == "resolved" and resolved["since"] == t0
        assert resolved["duration_s"] >= 5 + HOLD
        assert r.notifier.status()["active"] == []


async def test_flapping_within_the_hold_is_one_event(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.notifier.configure([r.hook()])
        for i in range(40):  # on one second, off the next, for 40 s
            r.notifier.observe([LOST] if i % 2 == 0 else [], trio.current_time())
            await trio.sleep(1)
        assert [e["event"] for e in r.receiver.events()] == ["started"]
        for _ in range(int(HOLD) + 2):
            r.notifier.observe([], trio.current_time())
            await trio.sleep(1)
        assert [e["event"] for e in r.receiver.events()] == ["started", "resolved"]


async def test_a_severity_rising_to_critical_is_posted_again(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.notifier.configure([r.hook()])
        down = Condition("model_down", "m", WARNING, "1 starting")
        r.notifier.observe([down], trio.current_time())
        r.notifier.observe([down], trio.current_time())
        r.notifier.observe([Condition("model_down", "m", CRITICAL, "failed")], trio.current_time())
        await settle()
        assert [(e["event"], e["condition"]["severity"]) for e in r.receiver.events()] == [
            ("started", "warning"), ("started", "critical")]


async def test_a_failing_endpoint_is_retried_with_backoff_then_delivered(
        autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.receiver.answers["/h"] = 503
        r.notifier.configure([r.hook()])
        r.notifier.observe([LOST], trio.current_time())
        await trio.sleep(retry_wait(1) + retry_wait(2) + 0.5)  # three tries, all 503
        assert len(r.receiver.attempts) == 3 and r.receiver.received == []
        times = [t for _, t in r.receiver.attempts]
        assert [round(b - a, 3) for a, b in zip(times, times[1:])] == [retry_wait(1), retry_wait(2)]
        health = r.notifier.health()[0]
        assert health["failing"] and health["failures_in_row"] == 3 and health["last_error"] == "answered HTTP 503"
        assert [c.kind for c in conditions(NOTHING, webhooks=r.notifier.health())] == ["webhook_failing"]
        r.receiver.answers["/h"] = 200  # it comes back: the 4th try delivers
        await trio.sleep(retry_wait(3) + 0.5)
        assert [e["event"] for e in r.receiver.events()] == ["started"]
        delivery = r.notifier.status()["webhooks"][0]["deliveries"][0]
        assert (delivery["outcome"], delivery["attempts"], delivery["status"]) == ("delivered", 4, 200)
        assert not r.notifier.health()[0]["failing"]
        assert conditions(NOTHING, webhooks=r.notifier.health()) == []


async def test_an_event_no_try_delivers_is_failed_and_counted(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.receiver.answers["/h"] = 500
        r.notifier.configure([r.hook()])
        r.notifier.observe([LOST], trio.current_time())
        await trio.sleep(sum(retry_wait(a) for a in range(1, ATTEMPTS)) + 1)
        hook = r.notifier.status()["webhooks"][0]
        assert len(r.receiver.attempts) == ATTEMPTS
        assert (hook["failed"], hook["delivered"], hook["queued"]) == (1, 0, 0)
        assert hook["deliveries"][0]["outcome"] == "failed" and hook["deliveries"][0]["error"] == "answered HTTP 500"
        assert r.notifier.deliveries() == {"delivered": 0, "failed": 1, "dropped": 0}


async def test_a_hanging_endpoint_delays_no_other_webhook(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.receiver.answers["/hang"] = HANG
        r.notifier.configure([r.hook("/hang"), r.hook("/ok")])
        t0 = trio.current_time()
        r.notifier.observe([LOST], t0)  # returns at once: posting is the webhooks' own tasks
        assert trio.current_time() == t0
        await r.receiver.wait_for(1, "/ok")
        assert trio.current_time() - t0 < 0.01  # the good one got it at once
        await trio.sleep(TIMEOUTS.notify_post_s + 0.1)
        stuck = next(h for h in r.notifier.status()["webhooks"] if h["id"] == hook_id(r.url + "/hang"))
        assert stuck["last_error"] == f"no answer within {TIMEOUTS.notify_post_s:g} s (notify_post_s)"
        assert stuck["queued"] == 1  # still trying


async def test_a_hanging_webhook_never_delays_a_reconcile_pass(autojump_clock: trio.testing.MockClock) -> None:
    """The leader's check and the reconciler side by side: with the only webhook hanging, each change is
    still planned within a tick."""
    store, hub = MemoryStore(), AgentHub(clock=trio.current_time)
    store.submit_nowait(commands.put_setting("notify.webhooks", [], 0.0))
    reconciler = Reconciler(store, hub, clock=trio.current_time)
    receiver = WebhookReceiver(answers={"/hang": HANG})
    async with httpx.AsyncClient(timeout=None) as client, trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)
        store.submit_nowait(commands.put_setting("notify.webhooks", [url + "/hang"], 0.0))
        notifier = Notifier(http_post(client), clock=trio.current_time)
        await nursery.start(notifier.run)
        flip = [LOST]

        def evaluate() -> list[Condition]:
            flip[0] = PARKED if flip[0] is LOST else LOST  # a new condition at every check: always posting
            return [flip[0]]

        await nursery.start(reconciler.run)
        await nursery.start(lambda task_status: watch(notifier, evaluate, lambda: store.snapshot().settings,
                                                      lambda: True, clock=trio.current_time, task_status=task_status))
        for i in range(10):
            store.submit_nowait(commands.put_model(model(f"m{i}").sim().always().build(), trio.current_time()))
            await trio.sleep(TIMEOUTS.reconcile_tick_s)
            assert reconciler.last_plan is not None and f"m{i}" in reconciler.last_plan.views
        assert receiver.attempts and receiver.received == []  # it was being posted to, and hung
        nursery.cancel_scope.cancel()


async def test_a_full_queue_drops_the_oldest_event_and_says_so(autojump_clock: trio.testing.MockClock) -> None:
    async with rig(queue_max=2) as r:
        r.receiver.answers["/hang"] = HANG
        r.notifier.configure([r.hook("/hang")])
        for i in range(5):
            r.notifier.observe([Condition("node_lost", f"n{i}", CRITICAL, "gone")], trio.current_time())
            await settle()
        hook = r.notifier.status()["webhooks"][0]
        assert hook["dropped"] == 2 and hook["queued"] == 3  # one in flight, two waiting
        dropped = [d for d in hook["deliveries"] if d["outcome"] == "dropped"]
        assert [d["subject"] for d in dropped] == ["n2", "n1"] and "more than 2 events" in dropped[0]["error"]


async def test_deliveries_are_kept_newest_first_and_bounded(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.notifier.configure([r.hook()])
        for i in range(KEPT_DELIVERIES + 5):
            r.notifier.observe([Condition("node_lost", f"n{i}", CRITICAL, "gone")], trio.current_time())
            await settle()
        kept = r.notifier.status()["webhooks"][0]["deliveries"]
        assert len(kept) == KEPT_DELIVERIES and kept[0]["subject"] == f"n{KEPT_DELIVERIES + 4}"
        assert {d["outcome"] for d in kept} == {"delivered"}
        assert r.notifier.deliveries()["delivered"] == KEPT_DELIVERIES + 5


async def test_slack_gets_one_text_line(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.notifier.configure([r.hook("/slack", "slack")])
        r.notifier.observe([LOST], trio.current_time())
        await settle()
        (doc,) = r.receiver.events()
        assert list(doc) == ["text"]
        assert doc["text"].startswith("llmgw [CRITICAL] node_lost n1 (leader cp1:7000): node n1 has been")


async def test_a_test_event_reaches_each_webhook_and_says_which_failed(
        autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.receiver.answers["/bad"] = 404
        r.notifier.configure([r.hook("/ok"), r.hook("/bad", "slack")])
        results = await r.notifier.test()
        assert [(x["id"], x["outcome"], x["status"]) for x in results] == [
            (hook_id(r.url + "/ok"), "delivered", 200), (hook_id(r.url + "/bad"), "failed", 404)]
        assert results[1]["error"] == "answered HTTP 404" and results[1]["format"] == "slack"
        assert r.receiver.events("/ok")[0]["event"] == "test"


async def test_a_removed_webhook_stops_and_a_new_one_gets_the_next_events(
        autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.receiver.answers["/old"] = HANG
        r.notifier.configure([r.hook("/old")])
        r.notifier.observe([LOST], trio.current_time())
        await settle()
        r.notifier.configure([r.hook("/new")])
        r.notifier.observe([LOST, PARKED], trio.current_time())
        await settle()
        assert [e["condition"]["kind"] for e in r.receiver.events("/new")] == ["model_parked"]
        assert [h["id"] for h in r.notifier.status()["webhooks"]] == [hook_id(r.url + "/new")]


async def test_stepping_down_forgets_the_conditions(autojump_clock: trio.testing.MockClock) -> None:
    async with rig() as r:
        r.notifier.configure([r.hook()])
        r.notifier.observe([LOST], trio.current_time())
        r.notifier.step_down()
        assert r.notifier.status()["active"] == [] and r.notifier.conditions == []
        r.notifier.observe([LOST], trio.current_time())  # leading again: what it finds is posted
        await settle()
        assert [e["event"] for e in r.receiver.events()] == ["started", "started"]


async def test_a_new_leader_holds_the_groups_own_conditions_while_its_links_connect(
        autojump_clock: trio.testing.MockClock) -> None:
    """A member missing at an election or a start is no alarm when its link comes up within
    notify_election_settle_s; one still missing after it is posted then. Other conditions go at once."""
    settle_s = TIMEOUTS.notify_election_settle_s
    starting = Condition("member_missing", "cp2:7000", "warning", "its Raft link is down")
    gone = Condition("member_missing", "cp3:7000", "warning", "its Raft link is down")
    async with rig() as r:
        r.notifier.configure([r.hook()])
        elected = trio.current_time()
        while trio.current_time() - elected < settle_s / 2:  # cp2 still connecting; cp3 and n1 down
            r.notifier.observe([starting, gone, LOST], trio.current_time())
            await trio.sleep(1)
        assert [e["condition"]["kind"] for e in r.receiver.events()] == ["node_lost"]
        assert r.notifier.status()["settling_until"] == elected + settle_s
        while trio.current_time() - elected < settle_s + 1:  # cp2's link came up within the hold
            r.notifier.observe([gone, LOST], trio.current_time())
            await trio.sleep(1)
        await settle()
        assert [(e["condition"]["kind"], e["condition"]["subject"]) for e in r.receiver.events()] == [
            ("node_lost", "n1"), ("member_missing", "cp3:7000")]
        r.notifier.step_down()  # a later term holds them again
        assert r.notifier.status()["settling_until"] is None
        r.notifier.observe([starting], trio.current_time())
        await settle()
        assert len(r.receiver.events()) == 2


async def test_the_check_runs_only_while_leading_with_the_webhooks_of_the_setting(
        autojump_clock: trio.testing.MockClock) -> None:
    leads = [False]
    seen: list[int] = []
    async with rig() as r:
        settings = {"notify.webhooks": [{"url": r.url + "/w", "format": "slack"}]}

        def evaluate() -> list[Condition]:
            seen.append(1)
            return [LOST]

        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: watch(r.notifier, evaluate, lambda: settings, lambda: leads[0],
                                                          clock=trio.current_time, task_status=task_status))
            await trio.sleep(2.5)  # between checks (one a second): no race with the flag
            assert seen == [] and r.receiver.received == []
            leads[0] = True
            await trio.sleep(3)
            assert len(seen) == 3 and [list(e) for e in r.receiver.events("/w")] == [["text"]]
            leads[0] = False
            await trio.sleep(TIMEOUTS.notify_check_s)
            assert r.notifier.status()["active"] == []
            nursery.cancel_scope.cancel()


def test_a_webhooks_id_never_shows_its_path_query_or_password() -> None:
    url = "https://user:pw@hooks.slack.com/services/T000/B000/SECRET?token=x"
    shown = hook_id(url)
    assert shown.startswith("https://hooks.slack.com/…#") and "SECRET" not in shown and "pw" not in shown
    assert hook_id(url) != hook_id(url + "2")
    assert webhooks_of(["http://a/x", {"url": "http://b/y", "format": "slack"}, {"url": "http://c/z"}]) == [
        Webhook("http://a/x"), Webhook("http://b/y", "slack"), Webhook("http://c/z")]


async def test_an_error_naming_the_url_is_told_by_id(autojump_clock: trio.testing.MockClock) -> None:
    async def post(url: str, data: bytes) -> int:
        raise OSError(f"cannot reach {url}")

    async with trio.open_nursery() as nursery:
        notifier = Notifier(post, clock=trio.current_time)
        await nursery.start(notifier.run)
        secret = "http://hooks.test/services/SECRET"
        notifier.configure([Webhook(secret)])
        (result,) = await notifier.test()
        assert "SECRET" not in json.dumps(notifier.status()) and "SECRET" not in json.dumps(result)
        assert result["error"] == f"OSError: cannot reach {hook_id(secret)}"
        nursery.cancel_scope.cancel()


def test_event_bodies() -> None:
    from llmgw.notify.hooks import Event, body

    doc: Any = json.loads(body(Event("resolved", LOST, 1000.0, since=900.0, cluster={"leader": "a"}), "json"))
    assert doc == {"event": "resolved", "condition": LOST.to_doc(), "at": 1000.0, "at_utc": "1970-01-01T00:16:40Z",
                   "cluster": {"leader": "a"}, "since": 900.0, "duration_s": 100.0}
    text = json.loads(body(Event("resolved", LOST, 1000.0, since=900.0, cluster={"leader": "a"}), "slack"))["text"]
    assert text.startswith("llmgw [RESOLVED] node_lost n1 (after 100 s) (leader a):")


async def test_no_webhook_deliverable_is_posted_once_one_answers_again_then_resolved(
        autojump_clock: trio.testing.MockClock) -> None:
    """The only webhook fails: `webhook_failing` turns critical ("no webhook is deliverable") and its event waits
    in the queue; once the endpoint answers (within the tries) the receiver hears it, then its resolution."""
    async with rig() as r:
        r.receiver.answers["/h"] = 503
        r.notifier.configure([r.hook()])

        def check() -> list[Condition]:  # the leader's check: the conditions with the webhooks' health
            return [LOST, *conditions(NOTHING, webhooks=r.notifier.health())]

        r.notifier.observe(check(), trio.current_time())
        await trio.sleep(retry_wait(1) + retry_wait(2) + 0.5)  # three failed tries: failing
        (failing,) = [c for c in check() if c.kind == "webhook_failing"]
        assert failing.severity == CRITICAL and "No webhook is deliverable" in failing.words
        r.notifier.observe(check(), trio.current_time())
        r.receiver.answers["/h"] = 200
        await trio.sleep(retry_wait(3) + 0.5)  # the 4th try of the first event delivers; the queued one follows
        assert [(e["event"], e["condition"]["kind"], e["condition"]["severity"]) for e in r.receiver.events()] == [
            ("started", "node_lost", "critical"), ("started", "webhook_failing", "critical")]
        for _ in range(int(HOLD) + 2):
            r.notifier.observe(check(), trio.current_time())
            await trio.sleep(1)
        assert [(e["event"], e["condition"]["kind"]) for e in r.receiver.events()][2:] == [
            ("resolved", "webhook_failing")]


def test_the_documented_payloads_are_what_is_posted() -> None:
    """docs/observability.md's example bodies have the fields, and the Slack lines the shape, of what is posted."""
    import re
    from pathlib import Path

    from llmgw.notify.hooks import Event, EventKind, body

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text(encoding="utf-8")
    examples = [json.loads(b) for b in re.findall(r"```json\n(\{.*?\})\n```", doc, re.DOTALL) if '"event"' in b]
    cluster = {"leader": "10.0.0.1:7000", "admin_url": "http://10.0.0.1:8081"}  # what the control plane passes
    assert [e["event"] for e in examples] == ["started", "resolved"]
    for example in examples:
        kind: EventKind = "started" if example["event"] == "started" else "resolved"
        posted = json.loads(body(Event(kind, LOST, 1000.0, since=900.0, cluster=cluster), "json"))
        assert set(example) == set(posted) and set(example["condition"]) == set(posted["condition"]), example
        assert set(example["cluster"]) == set(cluster)
    shape = re.compile(r"llmgw \[(CRITICAL|WARNING|RESOLVED)\] [a-z_]+ \S+ (\(after \d+ s\) )?\(leader \S+\): ")
    lines = [json.loads(line)["text"] for line in re.findall(r'^\{"text": .*\}$', doc, re.MULTILINE)]
    assert len(lines) == 2 and all(shape.match(t) for t in lines), lines
    for event in (Event("started", LOST, 1000.0, since=1000.0, cluster=cluster),
                  Event("resolved", LOST, 1000.0, since=900.0, cluster=cluster)):
        text = json.loads(body(event, "slack"))["text"]
        assert shape.match(text), text
