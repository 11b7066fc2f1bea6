"""Store levels (llmgw/domain/levels.py): what a newer release writes, an older member never skips; the
group's level rises only once every announced member reads it, and never goes back.

Commands of a newer release are written here as that release writes them (plain documents with their
level marks): this release knows no command above its own level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import codec, commands, levels
from llmgw.domain.commands import members
from llmgw.domain.state import ClusterState
from llmgw.store import batching, snapshot

NEXT = levels.LEVEL + 1


def newer(op: str, **fields: Any) -> dict[str, Any]:
    """A command as a release one level up writes it."""
    return {"v": commands.VERSION, "op": op, "at": 1.0, "needs_level": NEXT, "needs_release": "9.9.9", **fields}


def announce(addr: str, reads: int) -> dict[str, Any]:
    return commands.announce_member(addr, f"https://{addr}", f"v{reads}", 1.0, level=reads)


def test_this_release_marks_none_of_its_own_commands() -> None:
    for op in commands._OPS:
        assert levels.op_level(op) <= levels.LEVEL
    assert "needs_level" not in commands.put_setting("guard.enabled", False, 1.0)


@pytest.mark.parametrize("op", ["setting.brand_new", "setting.put"])
def test_a_newer_release_s_command_stops_the_member_instead_of_a_no_op(op: str) -> None:
    state = ClusterState()
    command = newer(op, key="guard.enabled", value=False)
    with pytest.raises(levels.NewerThanThisRelease, match=r"run llmgw 9\.9\.9 or newer"):
        commands.apply_entry(state, commands.encode(command))
    # In a batch, after a command this member reads: nothing of the batch applies (the state is the caller's).
    batch = batching.pack([commands.encode(commands.put_setting("guard.enabled", False, 1.0)), commands.encode(command)])
    with pytest.raises(levels.NewerThanThisRelease):
        batching.apply_blob(state, batch)
    assert state == ClusterState()


def test_an_unknown_command_without_marks_is_still_a_recorded_refusal() -> None:
    state, outcome = commands.apply_entry(ClusterState(), commands.encode({"v": 1, "op": "no.such", "at": 1.0}))
    assert not outcome.ok and outcome.code == "bad_command" and state.revision == 1


def test_the_group_level_rises_only_once_every_announced_member_reads_it() -> None:
    state = ClusterState()
    for addr, reads in (("10.0.0.1:7000", NEXT), ("10.0.0.2:7000", levels.LEVEL)):
        state, _ = commands.apply(state, announce(addr, reads))
    with pytest.raises(commands.CommandError) as refused:
        commands.apply(state, commands.raise_level(NEXT, 2.0))
    assert refused.value.code == "upgrade_pending"
    assert f"10.0.0.2:7000 (v{levels.LEVEL})" in refused.value.message and "10.0.0.1" not in refused.value.message
    state, _ = commands.apply(state, announce("10.0.0.2:7000", NEXT))
    # Every member announced the next level; this member, of the level before, cannot follow the group there.
    with pytest.raises(levels.NewerThanThisRelease, match=f"store level {NEXT}"):
        commands.apply(state, commands.raise_level(NEXT, 3.0))
    assert commands.apply(state, commands.raise_level(levels.LEVEL, 3.0))[1] == {"level": levels.LEVEL,
                                                                                 "raised": levels.LEVEL > 1}


def test_an_announcement_logged_before_store_levels_counts_as_level_one() -> None:
    old = {"v": 1, "op": "member.announce", "at": 1.0, "raft_addr": "10.0.0.1:7000",
           "admin_url": "https://10.0.0.1:8000", "version": "0.0.9"}
    state, _ = commands.apply(ClusterState(), old)
    assert state.members["10.0.0.1:7000"].level == 0
    assert levels.group_level(m.level for m in state.members.values()) == 1


def test_a_snapshot_of_a_higher_level_is_refused_saying_what_to_run(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.json"
    snapshot.write(path, snapshot.Snapshot(ClusterState(store_level=NEXT), (b"", 5, 2), (b"", 4, 2), ("10.0.0.1:7000",)))
    with pytest.raises(levels.NewerThanThisRelease, match=f"the snapshot was written by a newer llmgw "
                                                          f"\\(store level {NEXT}\\)"):
        snapshot.read(path)
    # At this release's level the document carries no marks, and reads back.
    assert "needs_level" not in codec.state_to_json(ClusterState())
    snapshot.write(path, snapshot.Snapshot(ClusterState(), (b"", 5, 2), (b"", 4, 2), ()))
    assert snapshot.read(path).state == ClusterState()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("announce"), st.sampled_from(["a:1", "b:1", "c:1"]), st.integers(0, NEXT + 1)),
    st.tuples(st.just("raise"), st.just(""), st.integers(1, NEXT + 1))), max_size=30))
def test_the_group_level_never_falls_and_never_passes_an_announced_member(steps: list[tuple[str, str, int]]) -> None:
    state = ClusterState()
    for kind, addr, level in steps:
        command = announce(addr, level) if kind == "announce" else commands.raise_level(level, 1.0)
        before = state
        try:
            state, outcome = commands.apply_entry(state, commands.encode(command))
        except levels.NewerThanThisRelease:
            assert kind == "raise" and level > levels.LEVEL
            break  # this member stops there
        assert state.store_level >= before.store_level
        if state.store_level > before.store_level:
            assert all(max(m.level, 1) >= state.store_level for m in state.members.values())
        assert outcome.ok or outcome.code in ("upgrade_pending",)
    assert state.store_level <= levels.LEVEL


def test_member_level_field_is_checked() -> None:
    with pytest.raises(commands.CommandError):
        members.check_announce({**announce("a:1", 1), "reads": -1})
    with pytest.raises(commands.CommandError):
        members.check_level({"to": 0})


def test_a_definition_setting_a_field_of_level_two_needs_level_two_and_one_without_stays_level_one() -> None:
    """0.2.0 brought fields, not operations (a model's fallbacks and aliases): a `model.put` that sets one
    is of level 2, so a group with a 0.1.0 member refuses it before it is logged (`upgrade_pending`), and
    a 0.1.0 member that still meets it stops (instead of refusing an unknown field as a no-op while the
    others apply it: their states would differ). One that sets none is the level-1 command it was."""
    from llmgw.domain.model import ModelDef

    plain = ModelDef.from_doc({"name": "a", "engine": "sim", "source": "sim://a"})
    newer_def = ModelDef.from_doc({"name": "b", "engine": "sim", "source": "sim://b", "fallbacks": ["a"]})
    assert "needs_level" not in commands.put_model(plain, 1.0)
    marked = commands.put_model(newer_def, 2.0)
    assert marked["needs_level"] == 2 and marked["needs_release"] == "0.2.0"
    at_one = ClusterState()
    state, _ = commands.apply(at_one, commands.put_model(plain, 1.0))
    with pytest.raises(commands.CommandError) as refused:
        commands.apply(state, marked)
    assert refused.value.code == "upgrade_pending" and "b" not in state.models
    state, _ = commands.apply(state, announce("10.0.0.1:7000", 2))
    state, _ = commands.apply(state, commands.raise_level(2, 3.0))
    assert commands.apply(state, marked)[0].models["b"].fallbacks == ("a",)


def test_a_key_with_a_priority_class_or_a_model_with_slots_needs_level_two() -> None:
    """A key's `priority` and a model's `limits.concurrency_per_replica` came with 0.2.0 too: an older member
    would drop the one and refuse the other, so each is a level-2 write; a plain key stays level 1."""
    from llmgw.domain.keys import hash_key
    from llmgw.domain.model import ModelDef

    assert "needs_level" not in commands.add_key(hash_key("sk-a"), "a", "client", 1.0)
    bulk = commands.add_key(hash_key("sk-b"), "b", "client", 1.0, priority="bulk")
    slots = commands.put_model(ModelDef.from_doc({"name": "m", "engine": "sim", "source": "sim://m",
                                                  "limits": {"concurrency_per_replica": 4}}), 1.0)
    for command in (bulk, slots):
        assert command["needs_level"] == 2
        with pytest.raises(commands.CommandError) as refused:
            commands.apply(ClusterState(), command)
        assert refused.value.code == "upgrade_pending"
    state, _ = commands.apply(ClusterState(store_level=2), bulk)
    assert next(iter(state.keys.values())).priority == "bulk"


def test_a_value_or_field_of_level_three_needs_level_three_whatever_else_it_sets() -> None:
    """0.3.0 brought the rerank role (a new value of a field every release reads: an earlier one would take the
    definition and fail to serve it) and adapters' fields: the command carries the highest level it uses."""
    from dataclasses import replace

    from llmgw.domain.codec import later_level
    from llmgw.domain.model import ModelDef

    plain = ModelDef.from_doc({"name": "a", "engine": "sim", "source": "sim://a"})
    assert later_level(plain) == 1
    assert later_level(replace(plain, fallbacks=("b",))) == 2
    reranker = replace(plain, role="rerank", fallbacks=("b",))
    assert later_level(reranker) == 3
    marked = commands.put_model(reranker, 1.0)
    assert marked["needs_level"] == 3 and marked["needs_release"] == "0.3.0"
