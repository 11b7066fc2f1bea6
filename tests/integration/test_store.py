"""The Raft store with real pysyncobj (a one-member group on loopback): commits
awaited from trio, immutable snapshots, wake-ups, and a journal that survives."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.commands import CommandError
from llmgw.domain.model import ModelDef
from llmgw.store import RaftStore
from llmgw.testing.processes import free_port

pytestmark = pytest.mark.slow


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
    """Commits come back through trio's token: other tasks run while one waits on Raft."""
    store = await open_store(tmp_path, free_port())
    ticks = 0
    try:
        async with trio.open_nursery() as nursery:
            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await trio.sleep(0.001)

            nursery.start_soon(ticker)
            for i in range(20):
                await store.submit(commands.put_setting("guard.enabled", bool(i % 2), float(i)))
            nursery.cancel_scope.cancel()
        assert ticks > 20
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
        assert snap.settings == {"notify.webhooks": ["https://x.example/h"]}
        await again.submit(commands.put_model(demo("c"), 4.0))
        assert set(again.snapshot().models) == {"b", "c"}
    finally:
        again.close()


async def test_commits_continue_after_trio_retires_its_worker_threads(tmp_path: Path) -> None:
    """The store is built in a trio worker thread; Raft must keep ticking after that
    thread is retired (pysyncobj's own auto-tick thread would stop with it)."""
    from trio._core._thread_cache import IDLE_TIMEOUT

    store = await open_store(tmp_path, free_port())
    try:
        await store.submit(commands.put_setting("guard.enabled", False, 1.0))
        await trio.sleep(IDLE_TIMEOUT + 1.5)
        with trio.fail_after(3):
            await store.submit(commands.put_setting("guard.enabled", True, 2.0))
        assert store.snapshot().settings["guard.enabled"] is True
    finally:
        store.close()
