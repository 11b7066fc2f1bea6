"""Webhooks across a leader change, with three real control planes (`serve`: Raft store, reconciler, admin API,
notifier) in this process and a webhook receiver on loopback. The conditions posted as started live in the
replicated state (`condition.update`, committed before the post):

- the leader that posted a condition's "started" stops while it is still true; the new leader posts no
  "started" for it, and when it ends posts its "resolved", once, with the first leader's start as its since;
- a leader cut off from its majority, which still believes it leads (here for 30 s: `raft_leader_fallback_s`),
  finds the others missing and posts nothing: it cannot commit.
"""

from __future__ import annotations

import dataclasses
import gc
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain import commands
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.store import NotLeader, StoreUnavailable
from llmgw.store import secret as cluster_secret
from llmgw.testing.builders import model
from llmgw.testing.webhooks import WebhookReceiver
from tests.support.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(
    "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning")]

FAST = dataclasses.replace(TIMEOUTS, notify_check_s=0.1, notify_resolve_hold_s=0.3, notify_election_settle_s=0.5,
                           agent_report_grace_s=0.5)
PATIENCE_S = 30.0


@dataclasses.dataclass
class Group:
    handles: list[ControlHandle]
    scopes: list[trio.CancelScope]
    stopped: list[trio.Event]
    receiver: WebhookReceiver

    def running(self) -> list[ControlHandle]:
        return [h for h, done in zip(self.handles, self.stopped) if not done.is_set()]

    def leader(self) -> ControlHandle | None:
        leaders = [h for h in self.running() if h.store.is_leader()]
        return leaders[0] if len(leaders) == 1 else None

    async def stop(self, handle: ControlHandle) -> None:
        i = self.handles.index(handle)
        self.scopes[i].cancel()
        await self.stopped[i].wait()

    async def commit(self, command: dict[str, Any]) -> ControlHandle:
        """`command` committed through whichever member leads; that member."""
        while True:
            leader = await until("a leader", self.leader)
            try:
                await leader.store.submit(command)
                return leader
            except (StoreUnavailable, NotLeader):
                await trio.sleep(0.1)

    def posted(self, kind: str) -> list[tuple[str, str, float]]:
        """Each event of `kind`: started or resolved, by which leader, since when."""
        return [(e["event"], e["cluster"]["leader"], e["since"]) for e in self.receiver.events()
                if e["condition"]["kind"] == kind]


async def until(what: str, check: Callable[[], Any], timeout: float = PATIENCE_S) -> Any:
    with trio.move_on_after(timeout):
        while True:
            got = check()
            if got:
                return got
            await trio.sleep(0.05)
    raise AssertionError(f"never: {what}")


@asynccontextmanager
async def group(root: Path, timeouts: Timeouts) -> AsyncIterator[Group]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    secret = cluster_secret.make()
    configs = [ControlConfig(state_dir=root / f"m{i}", raft_addr=addr, admin_host="127.0.0.1", admin_port=0,
                             peers=[a for a in addrs if a != addr],
                             seed=Seed(admin_key="sk-failover") if i == 0 else None,
                             cluster_secret=secret, timeouts=timeouts)
               for i, addr in enumerate(addrs)]
    receiver = WebhookReceiver()
    scopes = [trio.CancelScope() for _ in configs]
    stopped = [trio.Event() for _ in configs]
    handles: list[ControlHandle | None] = [None] * 3
    async with trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)

        async def run(i: int, task_status: trio.TaskStatus[ControlHandle] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scopes[i]:
                    await control_serve(configs[i], task_status=task_status)
            finally:
                stopped[i].set()

        async def start(i: int) -> None:
            handles[i] = await nursery.start(run, i)

        async with trio.open_nursery() as starting:  # each starts at once: one serves once the others answer
            for i in range(3):
                starting.start_soon(start, i)
        g = Group([h for h in handles if h is not None], scopes, stopped, receiver)
        # Every member reads store level 3, so the group records the conditions it posts.
        await until("store level 3", lambda: all(h.store.snapshot().store_level >= 3 for h in g.handles))
        await g.commit(commands.put_setting("notify.webhooks", [url + "/pager"], 0.0))
        await g.commit(commands.put_model(model("m").sim().on_demand().build(), 0.0))
        yield g
        nursery.cancel_scope.cancel()
    # Members cancelled mid-connection leave a socket to the collector: collected here, not in the next test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def test_a_new_leader_posts_the_resolved_of_what_its_predecessor_posted_and_no_started_again(
        tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with group(tmp_path, FAST) as g:
            for i in range(5):  # health.park_after_failures: the model parks (a condition of the replicated state)
                first = await g.commit(commands.start_failed("m", f"m-r{i}", "engine exited 1", float(i)))
            await g.receiver.wait_for(1)
            [(event, by, started_at)] = g.posted("model_parked")
            assert (event, by) == ("started", first.store.self_addr)

            await g.stop(first)  # the leader goes while the model is still parked
            second = await until("a new leader", g.leader)
            await until("its first checks", lambda: second.notifier.checked_at is not None)
            await trio.sleep(20 * FAST.notify_check_s)
            assert g.posted("model_parked") == [("started", first.store.self_addr, started_at)]
            assert second.notifier.status()["recorded"]

            await g.commit(commands.retry_model("m", 10.0))  # fixed: the condition ends
            await until("its resolved", lambda: len(g.posted("model_parked")) == 2)
            await trio.sleep(FAST.notify_resolve_hold_s + 10 * FAST.notify_check_s)
            assert g.posted("model_parked") == [("started", first.store.self_addr, started_at),
                                                ("resolved", second.store.self_addr, started_at)]
            assert all(h.store.snapshot().active_conditions.get("model_parked:m") is None for h in g.running())


async def test_a_leader_cut_off_from_its_majority_posts_nothing(tmp_path: Path) -> None:
    timeouts = dataclasses.replace(FAST, raft_leader_fallback_s=30.0, store_commit_s=1.0)
    with trio.fail_after(90):
        async with group(tmp_path, timeouts) as g:
            leader = await until("a leader", g.leader)
            await trio.sleep(10 * FAST.notify_check_s)
            assert g.receiver.events() == []  # a healthy group: nothing to post
            for other in [h for h in g.handles if h is not leader]:
                await g.stop(other)
            # The leader finds both others missing; it still believes it leads (raft_leader_fallback_s).
            await until("both missing, seen", lambda: len(leader.notifier.conditions) == 2)
            assert {c.kind for c in leader.notifier.conditions} == {"member_missing"}
            await trio.sleep(3 * timeouts.store_commit_s)
            assert leader.store.is_leader()
            assert g.receiver.attempts == [], g.receiver.events()
            assert leader.notifier.status()["record_error"].startswith("commit not confirmed")
            assert leader.notifier.status()["active"] == []
