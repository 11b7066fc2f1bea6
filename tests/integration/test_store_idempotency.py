"""The Raft store (real pysyncobj, one member on loopback) applies a command with an id at
most once, says "unknown" (never "failed") for a commit it could not confirm, and records a
committed command that no longer applies as a no-op, the same after a replay of the journal."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.store import CommitUnknown, RaftStore
from tests.support.processes import free_port

pytestmark = pytest.mark.slow


def demo(name: str = "demo") -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}"})


async def open_store(path: Path) -> RaftStore:
    store = RaftStore(self_addr=f"127.0.0.1:{free_port()}", peers=[], state_dir=path)
    await store.start()
    await store.wait_ready()
    return store


async def until_revision(store: RaftStore, revision: int) -> None:
    with trio.fail_after(10):
        while store.snapshot().revision < revision:
            await store.wait_changed(store.snapshot().revision)


async def test_the_same_id_twice_applies_once(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        cmd = commands.with_cid(commands.put_model(demo(), 1.0), "k:one")
        assert await store.submit(cmd) == {"created": True}
        revision = store.snapshot().revision
        assert await store.submit({**cmd, "at": 2.0}) == {"created": True}, "a retry is never 'replaced'"
        assert store.snapshot().revision == revision
    finally:
        store.close()


async def test_the_same_id_in_flight_twice_is_logged_twice_and_applied_once(tmp_path: Path) -> None:
    """Both submits pass the check before either commits (a retry racing its original):
    the log holds both, and applying the second changes nothing."""
    store = await open_store(tmp_path)
    try:
        before = store.snapshot().revision
        cmd = commands.with_cid(commands.put_model(demo(), 1.0), "k:race")
        results: list[object] = []

        async def send(at: float) -> None:
            results.append(await store.submit({**cmd, "at": at}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 1.0)
            nursery.start_soon(send, 2.0)
        assert results == [{"created": True}, {"created": True}]
        assert store.snapshot().revision == before + 1
        assert store.status()["commit_index"] >= 2 + before, "both were logged"
    finally:
        store.close()


async def test_an_unconfirmed_commit_is_unknown_and_a_retry_with_its_id_applies_once(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        before = store.snapshot().revision
        cmd = commands.with_cid(commands.put_model(demo(), 1.0), "k:slow")
        with pytest.raises(CommitUnknown) as info:
            await store.submit(cmd, timeout=0)  # gives up at once; pysyncobj cannot take it back
        assert "may still apply" in str(info.value)
        await until_revision(store, before + 1)  # ... and it did
        assert "demo" in store.snapshot().models
        assert await store.submit({**cmd, "at": 5.0}) == {"created": True}
        assert store.snapshot().revision == before + 1, "applied once"
    finally:
        store.close()


async def test_a_committed_command_that_does_not_apply_is_a_recorded_no_op(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        await store.submit(commands.put_model(demo(), 1.0))
        start = store.snapshot().revision
        obj = store._obj
        assert obj is not None
        # Straight into the log, past submit's checks: as a stale or damaged entry would arrive.
        obj.apply(commands.encode(commands.with_cid(commands.remove_model("ghost", 2.0), "k:ghost")))
        obj.apply(b"\x80\x04not a command")
        await until_revision(store, start + 2)
        state = store.snapshot()
        assert [(r.code, r.cid) for r in state.refusals] == [("model_not_found", "k:ghost"), ("bad_command", "")]
        assert set(state.models) == {"demo"}
        with pytest.raises(commands.CommandError) as info:  # its id answers the recorded refusal
            await store.submit(commands.with_cid(commands.remove_model("ghost", 3.0), "k:ghost"))
        assert info.value.code == "model_not_found" and store.snapshot() is state
        await store.submit(commands.put_setting("serving.stopped", True, 4.0))  # the Raft thread lives on
        after = store.snapshot()
    finally:
        store.close()
    again = await open_store(tmp_path)
    try:
        await until_revision(again, after.revision)
        assert again.snapshot() == after, "the journal replays to the same state, refusals included"
    finally:
        again.close()
