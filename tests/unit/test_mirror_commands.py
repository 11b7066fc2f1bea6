"""The model mirror's commands (domain/commands/mirror.py) and catalog (domain/mirror.py): pure, by example and by
Hypothesis. A name is unique, names may share a blob, a file in use is never removed, and the catalog round-trips
through the snapshot codec at store level 3 only."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain import codec, commands, levels
from llmgw.domain.commands import CommandError
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.mirror import MirrorFile, referenced_blobs, used_by
from llmgw.domain.model import ModelDef
from llmgw.domain.state import ClusterState

SHA_A, SHA_B = "a" * 64, "b" * 64
BASE = ClusterState(store_level=3)


def put(state: ClusterState, name: str, sha: str = SHA_A, size: int = 100) -> ClusterState:
    return commands.apply(state, commands.put_file(name, sha, size, "gguf", {"architecture": "llama"}, 5.0))[0]


def test_put_adds_a_file_and_the_same_put_again_changes_nothing() -> None:
    state, result = commands.apply(BASE, commands.put_file("tiny", SHA_A, 100, "gguf", {"tensors": 3}, 5.0))
    assert result == {"added": True, "name": "tiny", "sha256": SHA_A}
    assert state.mirror["tiny"] == MirrorFile("tiny", SHA_A, 100, "gguf", {"tensors": 3}, 5.0)
    again, result = commands.apply(state, commands.put_file("tiny", SHA_A, 100, "gguf", {}, 6.0))
    assert result["added"] is False and again.mirror == state.mirror


def test_a_name_is_unique_and_two_names_may_share_a_blob() -> None:
    state = put(put(BASE, "one"), "two")
    assert referenced_blobs(state) == {SHA_A}
    with pytest.raises(CommandError) as e:
        commands.apply(state, commands.put_file("one", SHA_B, 100, "gguf", {}, 6.0))
    assert e.value.code == "mirror_name_taken"


def test_a_file_in_use_by_a_model_an_adapter_or_a_judge_is_not_removed() -> None:
    model = ModelDef.from_doc({"name": "m", "engine": "llama.cpp", "source": "mirror://tiny", "role": "guard"})
    state = commands.apply(put(BASE, "tiny"), commands.put_model(model, 6.0))[0]
    policy = GuardPolicy.from_doc({"judge": "m"}, name="p")
    state = commands.apply(state, commands.set_policy(policy, 7.0))[0]
    assert used_by(state, "tiny") == ["judge of policy p", "model m"]
    with pytest.raises(CommandError) as e:
        commands.apply(state, commands.remove_file("tiny", 8.0))
    assert e.value.code == "mirror_file_in_use" and "model m" in e.value.message
    state = commands.apply(state, commands.remove_model("m", 9.0))[0]
    state, result = commands.apply(state, commands.remove_file("tiny", 10.0))
    assert result == {"removed": True, "name": "tiny"} and state.mirror == {}
    assert commands.apply(state, commands.remove_file("tiny", 11.0))[1] == {"removed": False, "name": "tiny"}


def test_pin() -> None:
    state, result = commands.apply(put(BASE, "tiny"), commands.pin_file("tiny", True, 6.0))
    assert result == {"name": "tiny", "pinned": True, "changed": True} and state.mirror["tiny"].pinned
    with pytest.raises(CommandError) as e:
        commands.apply(BASE, commands.pin_file("nothing", True, 6.0))
    assert e.value.code == "mirror_file_not_found"


@pytest.mark.parametrize("file", [
    {"name": "../x", "sha256": SHA_A, "size": 1, "kind": "gguf"},
    {"name": "x", "sha256": "A" * 64, "size": 1, "kind": "gguf"},
    {"name": "x", "sha256": SHA_A, "size": -1, "kind": "gguf"},
    {"name": "x", "sha256": SHA_A, "size": True, "kind": "gguf"},
    {"name": "x", "sha256": SHA_A, "size": 1, "kind": "onnx"},
    {"name": "x", "sha256": SHA_A, "size": 1, "kind": "gguf", "metadata": []},
    {"name": "x", "sha256": SHA_A, "size": 1, "kind": "gguf", "extra": 1},
    "not an object",
])
def test_a_malformed_file_is_refused_before_it_is_logged(file: object) -> None:
    with pytest.raises(CommandError) as e:
        commands.check({"v": 1, "op": "mirror.put", "at": 1.0, "file": file, **levels.stamped("mirror.put")})
    assert e.value.code == "invalid_mirror_file"


def test_the_ops_need_store_level_3() -> None:
    for command in (commands.put_file("x", SHA_A, 1, "gguf", {}, 1.0), commands.remove_file("x", 1.0),
                    commands.pin_file("x", True, 1.0)):
        assert levels.command_level(command) == 3
        with pytest.raises(CommandError) as e:
            commands.apply(ClusterState(store_level=2), command)
        assert e.value.code == "upgrade_pending"


def test_the_catalog_is_written_only_once_used_and_round_trips() -> None:
    assert "mirror" not in codec.state_to_json(BASE)["state"]  # an older member reads a state without files
    state = put(BASE, "tiny")
    doc = codec.state_to_json(state)
    assert doc["state"]["mirror"]["tiny"]["metadata"] == {"architecture": "llama"}
    assert codec.state_from_json(doc) == state
    assert pickle.loads(pickle.dumps(state)) == state


_names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
_ops = st.lists(st.tuples(st.sampled_from(["put", "remove", "pin", "use", "unuse"]), _names,
                          st.sampled_from([SHA_A, SHA_B])), max_size=30)


@given(_ops)
def test_no_sequence_removes_a_file_in_use_or_breaks_the_catalog(ops: list[tuple[str, str, str]]) -> None:
    state = BASE
    for op, name, sha in ops:
        if op == "put":
            command = commands.put_file(name, sha, 10, "gguf", {}, 1.0)
        elif op == "remove":
            command = commands.remove_file(name, 1.0)
        elif op == "pin":
            command = commands.pin_file(name, True, 1.0)
        elif op == "use":
            command = commands.put_model(ModelDef.from_doc({"name": f"m-{name}", "engine": "llama.cpp",
                                                            "source": f"mirror://{name}"}), 1.0)
        else:
            command = commands.remove_model(f"m-{name}", 1.0)
        before = state
        state = commands.apply_entry(state, command)[0]
        if op == "remove" and used_by(before, name):
            assert state.mirror == before.mirror  # refused: kept
    for name, file in state.mirror.items():
        assert file.name == name
    assert codec.state_from_json(codec.state_to_json(state)) == state
