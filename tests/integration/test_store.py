"""The Raft store with real pysyncobj (a one-member group on loopback): commits
awaited from trio, immutable snapshots, wake-ups, a journal that survives, and a
start or stop that cannot hang (no leader, a stuck Raft thread, a busy port)."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.commands import CommandError
from llmgw.domain.model import ModelDef
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.startup import CannotStart
from llmgw.store import RaftStore, StoreNotReady
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

T = TypeVar("T")


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def demo(name: str = "demo") -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}"})


async def open_store(path: Path, port: int) -> RaftStore:
    store = RaftStore(self_addr=f"127.0.0.1:{port}", peers=[], state_dir=path)
    await store.start()
    await store.wait_ready()
    return store


async def test_commit_returns_after_apply_and_snapshots_are_immutable(tmp_path: Path) -> None:
    store = await open_store(tmp_path, free_port())
    try:
        assert store.is_leader()
        before = store.snapshot()
        result = await store.submit(commands.put_model(demo(), 1.0))
        assert result == {"created": True}
        after = store.snapshot()
        assert "demo" in after.models and after.revision == before.revision + 1
        assert "demo" not in before.models, "an old snapshot never changes"
    finally:
        store.close()


async def test_refused_command_changes_nothing(tmp_path: Path) -> None:
    store = await open_store(tmp_path, free_port())
    try:
        await store.submit(commands.put_model(demo(), 1.0))
        snap = store.snapshot()
        with pytest.raises(CommandError) as e:
            await store.submit(commands.remove_model("ghost", 2.0))
        assert e.value.code == "model_not_found"
        assert store.snapshot().models == snap.models
        with pytest.raises(CommandError):
            await store.submit(commands.put_setting("no.such.key", 1, 2.0))
    finally:
        store.close()


async def test_wait_changed_wakes_on_commit(tmp_path: Path) -> None:
    store = await open_store(tmp_path, free_port())
    try:
        rev = store.snapshot().revision
        seen: list[int] = []

        async def waiter() -> None:
            seen.append((await store.wait_changed(rev)).revision)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.05)
            assert seen == []
            await store.submit(commands.put_setting("guard.enabled", False, 1.0))
        assert seen == [rev + 1]
    finally:
        store.close()


async def test_event_loop_keeps_running_while_commits_are_in_flight(tmp_path: Path) -> None:
    """Commits come back through trio's token: another task runs while each one waits on Raft.

    The other task is woken just before the submit; if `submit` blocked the event loop
    until its commit (a thread join, a blocking wait), the commit would land first."""
    store = await open_store(tmp_path, free_port())
    try:
        for i in range(5):
            events: list[str] = []
            submitting = trio.Event()

            async def other_task() -> None:
                await submitting.wait()
                events.append("other task ran")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(other_task)
                await trio.testing.wait_all_tasks_blocked()
                events.append("submit")
                submitting.set()
                await store.submit(commands.put_setting("guard.enabled", bool(i % 2), float(i)))
                events.append("committed")
            assert events == ["submit", "other task ran", "committed"]
    finally:
        store.close()


async def test_journal_survives_restart(tmp_path: Path) -> None:
    port = free_port()
    store = await open_store(tmp_path, port)
    await store.submit(commands.put_model(demo("a"), 1.0))
    await store.submit(commands.put_model(demo("b"), 1.0))
    await store.submit(commands.remove_model("a", 2.0))
    await store.submit(commands.put_setting("notify.webhooks", ["https://x.example/h"], 3.0))
    revision = store.snapshot().revision
    store.close()
    assert (tmp_path / "raft" / "journal.bin").exists()

    again = await open_store(tmp_path, free_port())
    try:
        with trio.fail_after(10):
            while again.snapshot().revision < revision:
                await trio.sleep(0.02)
        snap = again.snapshot()
        assert set(snap.models) == {"b"}
        assert snap.settings == {"notify.webhooks": ("https://x.example/h",)}  # read-only: lists are tuples
        await again.submit(commands.put_model(demo("c"), 4.0))
        assert set(again.snapshot().models) == {"b", "c"}
    finally:
        again.close()


async def in_a_thread_that_exits(build: Callable[[], T]) -> T:
    """Run `build` in a new thread and return once that thread has exited, the way trio
    retires an idle worker thread (after ~10 s): whatever was bound to it is gone."""
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(build())
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=target)
    thread.start()
    await trio.to_thread.run_sync(thread.join)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    return box[0]


async def test_commits_continue_after_the_thread_that_built_the_store_exits(tmp_path: Path) -> None:
    """The store is built in a worker thread that trio later retires. Raft must keep ticking
    after that thread is gone: pysyncobj's own auto-tick thread would stop with it (the
    store then never elects itself, or stops committing), ours does not."""
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path,
                      run_in_thread=in_a_thread_that_exits)
    await store.start()
    try:
        await store.wait_ready(timeout=10)
        await store.submit(commands.put_setting("guard.enabled", False, 1.0), timeout=5)
        await store.submit(commands.put_setting("guard.enabled", True, 2.0), timeout=5)
        assert store.snapshot().settings["guard.enabled"] is True
    finally:
        store.close()


async def test_not_ready_is_an_error_that_says_why(tmp_path: Path, autojump: trio.testing.MockClock) -> None:
    """A two-member group whose other member never runs has no leader: wait_ready gives up
    after its deadline (virtual time here) with words, not a bare TooSlowError."""
    missing = f"127.0.0.1:{free_port()}"
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[missing], state_dir=tmp_path)
    await store.start()
    try:
        with pytest.raises(StoreNotReady) as e:
            await store.wait_ready(timeout=30)
        assert isinstance(e.value, CannotStart), "the lifecycle reports it as a failed start"
        message = str(e.value)
        assert "did not become ready within 30 s" in message
        assert "no leader" in message and missing in message
    finally:
        store.close()


async def test_close_abandons_a_stuck_raft_thread(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A tick that never returns (pysyncobj spinning on a damaged journal) must not hang
    the stop: close() gives up on the thread after store_close_s and says so."""
    hang, stuck, release, unstuck = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    built: list[Any] = []

    def build_with_a_tick_that_can_hang(build: Callable[[], Any]) -> Awaitable[Any]:
        def wrapped() -> Any:
            obj = build()
            built.append(obj)
            real_tick = obj.doTick

            def tick(timeout: float) -> None:  # stands in for pysyncobj's endless loop
                if hang.is_set():
                    stuck.set()
                    release.wait()
                    unstuck.set()  # the thread then sees close() and ends
                    return
                real_tick(timeout)

            obj.doTick = tick
            return obj

        return trio.to_thread.run_sync(wrapped)

    timeouts = dataclasses.replace(TIMEOUTS, store_close_s=0.2)
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=tmp_path, timeouts=timeouts,
                      run_in_thread=build_with_a_tick_that_can_hang)
    await store.start()
    try:
        await store.wait_ready(timeout=10)
        hang.set()
        assert await trio.to_thread.run_sync(lambda: stuck.wait(10))
        closer = threading.Thread(target=store.close, daemon=True)
        closer.start()
        await trio.to_thread.run_sync(lambda: closer.join(10))
        assert not closer.is_alive(), "close() waited on a stuck Raft thread"
        assert "raft thread did not stop within 0.2 s; abandoned" in caplog.text
    finally:
        release.set()
        ended = await trio.to_thread.run_sync(lambda: unstuck.wait(10))
        if built and ended:
            built[0].destroy()  # what close() left undone; the test process goes on


async def test_a_busy_raft_port_fails_the_start_with_the_address(tmp_path: Path) -> None:
    """pysyncobj retries a busy port forever (at 100% CPU); the store fails at once instead."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        store = RaftStore(self_addr=addr, peers=[], state_dir=tmp_path)
        with trio.fail_after(10), pytest.raises(CannotStart) as e:
            await store.start()
    assert str(e.value) == f"Raft cannot listen on {addr}: Address already in use"
    assert list(tmp_path.iterdir()) == [], "found before the journal is opened"


async def test_a_newer_definition_waits_for_the_level_every_member_announced_not_refused(tmp_path: Path) -> None:
    """A group starts at store level 1 and its leader raises it once every member announced this release's
    level: a write of a field that level brought (a model's fallbacks), made in between, waits for the
    raise instead of a 409 `upgrade_pending`. A member that has not announced this level keeps it refused."""
    from llmgw.domain import levels

    assert levels.LEVEL >= 2
    newer = commands.put_model(ModelDef.from_doc({"name": "main", "engine": "sim", "source": "sim://main",
                                                  "aliases": ["chat"]}), 1.0)
    assert newer["needs_level"] == 2
    port = free_port()
    store = await open_store(tmp_path, port)
    try:
        assert store.snapshot().store_level == 1
        await store.submit(commands.announce_member(f"127.0.0.1:{port}", "http://127.0.0.1:1", "old", 1.0,
                                                    level=1))
        with pytest.raises(CommandError) as refused:  # an older member announced: refused at once
            await store.submit(newer)
        assert refused.value.code == "upgrade_pending" and "main" not in store.snapshot().models
        await store.submit(commands.announce_member(f"127.0.0.1:{port}", "http://127.0.0.1:1", "new", 2.0))
        result: list[Any] = []

        async def write() -> None:
            result.append(await store.submit(newer))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await trio.testing.wait_all_tasks_blocked()
            assert not result, "it waits for the level"
            await store.submit(commands.raise_level(levels.LEVEL, 3.0))  # what the leader's members task does
        assert result == [{"created": True}] and store.snapshot().models["main"].aliases == ("chat",)
    finally:
        store.close()
