"""The conditions posted as started live in the replicated state (`ClusterState.active_conditions`,
`condition.update`), committed before the post: the roles `llmgw control` runs (a context, the notifier and its
watch, `ops.notify.ledger`) for two members over one replicated state, on a MockClock, with a webhook receiver on
loopback. A new leader posts the "resolved" of what its predecessor posted as "started" and never the "started"
again; a leader that cannot commit (cut off from its majority) posts nothing, and a commit whose answer was lost
is posted once; a group reaching store level 3 does not post again what it posted before."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import trio
import trio.testing

from llmgw.cli.ctl.notify import render_notify_status
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.ops import notify as notify_ops
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.conditions import CRITICAL, Condition
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.notify.hooks import Webhook
from llmgw.notify.notifier import UPDATE_BATCH, Notifier
from llmgw.notify.watch import control_conditions, http_post, watch
from llmgw.store import CommitUnknown
from llmgw.store.wire import MAX_COMMAND_BYTES
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model
from llmgw.testing.webhooks import WebhookReceiver

HOLD = TIMEOUTS.notify_resolve_hold_s
PARK_AFTER = 5  # health.park_after_failures' default


class CutOff(MemoryStore):
    """The replicated state, as a leader cut off from its majority writes to it: while `cut`, a write is
    handed to Raft and its commit never confirmed (`CommitUnknown`); with `applies`, the majority applied it
    all the same and only the answer was lost."""

    cut = False
    applies = False

    async def submit(self, command: dict[str, Any], *, through_leader: bool = False) -> Any:
        if self.cut:
            if self.applies:
                self.submit_nowait(command)
            raise CommitUnknown("no commit confirmed within 10 s (no quorum?); the command may still apply")
        return await super().submit(command)


@dataclass
class Member:
    name: str
    notifier: Notifier
    leads: bool = False


def parked_model(state: ClusterState | None = None) -> CutOff:
    store = CutOff(state)
    store.submit_nowait(commands.put_model(model("m").sim().on_demand().build(), 0.0))
    return store


def park(store: MemoryStore) -> None:
    for i in range(PARK_AFTER):
        store.submit_nowait(commands.start_failed("m", f"m-r{i}", "engine exited 1", trio.current_time()))
    assert store.snapshot().model_health("m").parked


@asynccontextmanager
async def group(store: MemoryStore, names: tuple[str, ...] = ("cp1", "cp2"), recorded: bool = True,
                timeouts: Timeouts = TIMEOUTS) -> AsyncIterator[tuple[WebhookReceiver, list[Member]]]:
    """Members over one replicated state, each with its context, notifier and watch; none leads yet."""
    receiver = WebhookReceiver()
    async with httpx.AsyncClient(timeout=None) as out, trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)
        store.submit_nowait(commands.put_setting("notify.webhooks", [url + "/pager"], 0.0))
        members = []
        for name in names:
            notifier = Notifier(http_post(out), clock=trio.current_time, cluster=lambda name=name: {"leader": name},
                                timeouts=timeouts)
            await nursery.start(notifier.run)
            hub = AgentHub(clock=trio.current_time)
            ctx = Context(store=store, hub=hub, reconciler=Reconciler(store, hub, clock=trio.current_time),
                          clock=trio.current_time, notifier=notifier)
            member = Member(name, notifier)
            members.append(member)
            await nursery.start(functools.partial(
                watch, notifier, functools.partial(control_conditions, ctx), lambda: store.snapshot().settings,
                lambda member=member: member.leads, clock=trio.current_time, timeouts=timeouts,
                ledger=notify_ops.ledger(ctx) if recorded else None))
        yield receiver, members
        nursery.cancel_scope.cancel()


def posted(receiver: WebhookReceiver) -> list[tuple[str, str, str]]:
    return [(e["event"], f"{e['condition']['kind']} {e['condition']['subject']}", e["cluster"]["leader"])
            for e in receiver.events()]


async def test_a_new_leader_posts_its_predecessors_resolved_and_never_its_started_again(
        autojump_clock: trio.testing.MockClock) -> None:
    store = parked_model()
    async with group(store) as (receiver, (a, b)):
        a.leads = True
        park(store)
        await receiver.wait_for(1)
        assert posted(receiver) == [("started", "model_parked m", "cp1")]
        started_at = receiver.events()[0]["at"]
        assert store.snapshot().active_conditions["model_parked:m"].since == started_at

        a.leads, b.leads = False, True  # a leader change while the model is still parked
        await trio.sleep(20)
        assert posted(receiver) == [("started", "model_parked m", "cp1")]  # cp2 knows it was posted
        assert b.notifier.status()["recorded"] and [c["since"] for c in b.notifier.status()["active"]] == [started_at]

        store.submit_nowait(commands.retry_model("m", trio.current_time()))  # fixed: the condition goes
        await receiver.wait_for(2)
        await trio.sleep(HOLD + 5)
        assert posted(receiver) == [("started", "model_parked m", "cp1"), ("resolved", "model_parked m", "cp2")]
        assert receiver.events()[1]["since"] == started_at  # the predecessor's start: how long it truly lasted
        assert store.snapshot().active_conditions == {}


async def test_a_leader_that_cannot_commit_posts_nothing_and_a_commit_whose_answer_was_lost_posts_once(
        autojump_clock: trio.testing.MockClock) -> None:
    store = parked_model()
    async with group(store, ("cp1",)) as (receiver, (a,)):
        a.leads = True
        store.cut = True  # cut off from its majority, though it still believes it leads
        park(store)
        await trio.sleep(30)
        assert receiver.attempts == [] and store.snapshot().active_conditions == {}
        assert a.notifier.status()["record_error"].startswith("commit not confirmed")
        assert "NOT POSTING: the conditions' update was not committed (commit not confirmed" in render_notify_status(
            {"configured": 1, "running": True, **a.notifier.status()})
        assert [c.kind for c in a.notifier.conditions] == ["model_parked"]  # seen, not posted

        store.applies = True  # the majority is back and applies its write, whose answer is lost
        await trio.sleep(5)
        assert receiver.attempts == [] and list(store.snapshot().active_conditions) == ["model_parked:m"]
        store.cut = False  # its answers come back: the same command (same id) answers what it did
        await receiver.wait_for(1)
        await trio.sleep(10)
        assert posted(receiver) == [("started", "model_parked m", "cp1")]
        assert a.notifier.status()["record_error"] == ""
        ids = [c.get("cid") for c in store.log if c["op"] == "condition.update"]
        assert len(ids) == 1, ids  # one command, applied once, whatever the number of tries


async def test_a_group_that_reaches_level_3_keeps_what_it_posted_before_and_posts_it_once(
        autojump_clock: trio.testing.MockClock) -> None:
    store = parked_model(ClusterState(store_level=2))  # a rolling upgrade: some member reads level 2 only
    async with group(store) as (receiver, (a, b)):
        a.leads = True
        park(store)
        await receiver.wait_for(1)  # posted from its memory (the group cannot record it)
        assert not a.notifier.status()["recorded"] and store.snapshot().active_conditions == {}
        store.submit_nowait(commands.raise_level(3, trio.current_time()))  # the last member upgraded
        await trio.sleep(5)
        assert a.notifier.status()["recorded"] and list(store.snapshot().active_conditions) == ["model_parked:m"]
        a.leads, b.leads = False, True
        await trio.sleep(5)
        store.submit_nowait(commands.retry_model("m", trio.current_time()))
        await trio.sleep(HOLD + 5)
        assert posted(receiver) == [("started", "model_parked m", "cp1"), ("resolved", "model_parked m", "cp2")]


async def test_a_new_leader_resolves_nothing_of_its_predecessors_before_its_graces_are_over(
        autojump_clock: trio.testing.MockClock) -> None:
    """What the predecessor posted may only be unseen yet by the new leader (its agents not reported, its
    links connecting): with a hold shorter than the graces, its resolved still waits for them."""
    timeouts = replace(TIMEOUTS, notify_resolve_hold_s=1.0)
    grace = max(timeouts.agent_report_grace_s, timeouts.notify_election_settle_s)
    store = parked_model()
    async with group(store, timeouts=timeouts) as (receiver, (a, b)):
        a.leads = True
        park(store)
        await receiver.wait_for(1)
        store.submit_nowait(commands.retry_model("m", trio.current_time()))
        a.leads, b.leads = False, True
        took_office = trio.current_time()
        await receiver.wait_for(2)
        assert trio.current_time() - took_office >= grace
        assert posted(receiver) == [("started", "model_parked m", "cp1"), ("resolved", "model_parked m", "cp2")]


async def test_a_whole_fleet_lost_at_once_is_recorded_in_commands_raft_carries(
        autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    hub = AgentHub(clock=trio.current_time)
    ctx = Context(store=store, hub=hub, reconciler=Reconciler(store, hub, clock=trio.current_time),
                  clock=trio.current_time)
    lost = [Condition("node_lost", f"gpu-{i:04}", CRITICAL, "w" * 5000) for i in range(1200)]
    async with httpx.AsyncClient() as out, trio.open_nursery() as nursery:
        notifier = Notifier(http_post(out), clock=trio.current_time)
        await nursery.start(notifier.run)
        notifier.configure([Webhook("http://127.0.0.1:9/pager")])  # refused at once: each event is tried, fails
        for _ in range(3):
            await notifier.check(lost, trio.current_time(), notify_ops.ledger(ctx))
        nursery.cancel_scope.cancel()
    updates = [c for c in store.log if c["op"] == "condition.update"]
    assert [len(c["start"]) for c in updates] == [UPDATE_BATCH, UPDATE_BATCH, 1200 - 2 * UPDATE_BATCH]
    assert max(len(commands.encode(c)) for c in updates) < MAX_COMMAND_BYTES
    assert len(store.snapshot().active_conditions) == 1200


async def test_with_no_webhook_nothing_is_recorded_and_a_webhook_set_later_hears_what_is_active(
        autojump_clock: trio.testing.MockClock) -> None:
    store = parked_model()
    async with group(store, ("cp1",)) as (receiver, (a,)):
        url = store.snapshot().settings["notify.webhooks"][0]
        store.submit_nowait(commands.put_setting("notify.webhooks", [], 0.0))
        a.leads = True
        park(store)
        await trio.sleep(10)
        assert [c.kind for c in a.notifier.conditions] == ["model_parked"]
        assert store.snapshot().active_conditions == {} and not [c for c in store.log if c["op"] == "condition.update"]
        store.submit_nowait(commands.put_setting("notify.webhooks", [url], trio.current_time()))
        await receiver.wait_for(1)
        assert posted(receiver) == [("started", "model_parked m", "cp1")]
