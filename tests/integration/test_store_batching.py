"""Group commit (`llmgw.store.batching`): the submits of one scheduler pass go to Raft as one
entry, applied in order, each with its own result; a command refused at apply is a no-op for it
alone; a batch survives a restart; the entry format and the journal's failed-append mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from llmgw.domain import commands
from llmgw.domain.commands import CommandError
from llmgw.domain.model import ModelDef
from llmgw.domain.state import ClusterState
from tests.support.processes import free_port
from llmgw.store import RaftStore
from llmgw.store.batching import MAGIC, apply_blob, failed_appends, pack, unpack


def model(name: str) -> dict[str, Any]:
    return commands.put_model(ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}"}), 1.0)


async def open_store(path: Path, port: int) -> RaftStore:
    store = RaftStore(self_addr=f"127.0.0.1:{port}", peers=[], state_dir=path)
    await store.start()
    await store.wait_ready()
    return store


async def submit_together(store: RaftStore, cmds: list[dict[str, Any]]) -> list[Any]:
    """Submit every command from its own task, all started in one scheduler pass; each result
    or the CommandError it raised, in order."""
    results: list[Any] = [None] * len(cmds)

    async def one(n: int) -> None:
        try:
            results[n] = await store.submit(cmds[n])
        except CommandError as e:
            results[n] = e

    async with trio.open_nursery() as nursery:
        for n in range(len(cmds)):
            nursery.start_soon(one, n)
    return results


def entries(store: RaftStore) -> int:
    return int(store.status()["commit_index"])


@pytest.mark.slow
async def test_submits_of_one_pass_go_as_one_entry_each_with_its_own_result(tmp_path: Path) -> None:
    store = await open_store(tmp_path, free_port())
    try:
        before, revision = entries(store), store.snapshot().revision
        results = await submit_together(store, [model(f"m{i}") for i in range(50)])
        assert results == [{"created": True}] * 50
        assert entries(store) - before == 1, "one Raft entry for the 50 commands"
        state = store.snapshot()
        assert state.revision == revision + 50 and all(f"m{i}" in state.models for i in range(50))
        # Without group commit, the same load is one entry per command.
        store.group.max_commands = 1
        before = entries(store)
        await submit_together(store, [model(f"n{i}") for i in range(20)])
        assert entries(store) - before == 20
    finally:
        store.close()


@pytest.mark.slow
async def test_a_command_refused_at_apply_is_a_no_op_for_it_alone_and_the_batch_survives_a_restart(
    tmp_path: Path,
) -> None:
    port = free_port()
    store = await open_store(tmp_path, port)
    try:
        await store.submit(model("a"))
        revision = store.snapshot().revision
        # Both removals pass the check on the state before the batch; in the batch, the second
        # finds the model gone and is recorded as a refusal; the model after them is created.
        # (trio runs the tasks of one pass in an order of its own: either removal may come first.)
        first, second, third = await submit_together(
            store, [commands.remove_model("a", 2.0), commands.remove_model("a", 2.0), model("b")])
        removed, refused = sorted([first, second], key=lambda r: isinstance(r, CommandError))
        assert removed == {"removed": "a"}
        assert isinstance(refused, CommandError) and refused.code == "model_not_found"
        assert third == {"created": True}
        state = store.snapshot()
        assert state.revision == revision + 3 and set(state.models) == {"b"}
        assert state.refusals[-1].code == "model_not_found"
    finally:
        store.close()
    again = await open_store(tmp_path, port)
    try:
        assert again.snapshot().revision == state.revision and set(again.snapshot().models) == {"b"}
    finally:
        again.close()


def test_a_batch_is_its_commands_and_a_cut_one_is_not_read() -> None:
    blobs = [commands.encode(model("x")), commands.encode(commands.remove_model("x", 3.0))]
    entry = pack(blobs)
    assert entry.startswith(MAGIC) and unpack(entry) == blobs
    assert unpack(entry[:-1]) is None and unpack(blobs[0]) is None
    state, outcomes = apply_blob(ClusterState(), entry)
    assert isinstance(outcomes, tuple) and [o.ok for o in outcomes] == [True, True] and not state.models
    # A damaged command inside a batch is a recorded no-op; the others apply.
    state, outcomes = apply_blob(ClusterState(), pack([b"{not json", blobs[0]]))
    assert isinstance(outcomes, tuple) and [o.ok for o in outcomes] == [False, True] and "x" in state.models


def test_a_failed_append_answers_every_waiting_submit_of_its_entry() -> None:
    a, b, c = b'{"a":1}', b'{"b":2}', b'{"c":3}'
    failed: list[str] = []
    waiting = [(blob, lambda e, n=n: failed.append(n)) for n, blob in (("a", a), ("b", b), ("c", c), ("a2", a))]
    record = b"pickle-of-the-call" + pack([a, c, a]) + b"."
    for fail in failed_appends(record, waiting):
        fail(None)
    assert failed == ["a", "c", "a2"]
    failed.clear()
    for fail in failed_appends(b"pickle" + b + b".", waiting):  # a plain entry: its earliest submit
        fail(None)
    assert failed == ["b"]
