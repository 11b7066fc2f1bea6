"""Guard policies (llmgw/domain/guard.py, commands/guard.py): validation naming each field, documents
that round-trip, the commands through the store and the snapshot, and which policies apply to a model."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain import commands
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.commands import CommandError
from llmgw.domain.guard import CATEGORIES, CHECKS, GuardPolicy, PolicyError, enabled, policies_for, verdict_text
from llmgw.domain.model import ModelDef
from llmgw.domain.state import ClusterState
from llmgw.testing import MemoryStore
from llmgw.wire import protocol


def policy(**doc: Any) -> GuardPolicy:
    return GuardPolicy.from_doc({"name": "p", "judge": "lg", **doc})


def state_with(*policies: GuardPolicy, models: tuple[ModelDef, ...] = ()) -> ClusterState:
    s = ClusterState()
    for m in models:
        s, _ = commands.apply(s, commands.put_model(m, 1.0))
    for p in policies:
        s, _ = commands.apply(s, commands.set_policy(p, 2.0))
    return s


def test_the_fourteen_categories_with_llama_guard_3s_names() -> None:
    assert list(CATEGORIES) == [f"S{i}" for i in range(1, 15)]
    assert CATEGORIES["S1"] == "Violent Crimes" and CATEGORIES["S6"] == "Specialized Advice"
    assert CATEGORIES["S14"] == "Code Interpreter Abuse" and CATEGORIES["S11"] == "Suicide & Self-Harm"
    assert verdict_text(("S6",)) == "judge: S6,Specialized Advice"
    assert verdict_text(("S1", "S6")) == "judge: S1,Violent Crimes; S6,Specialized Advice"


def test_defaults_and_canonical_form() -> None:
    p = policy()
    assert (p.check, p.models, p.categories, p.on_error, p.budget_s) == ("prompt", ("*",), (), "closed", 2.0)
    q = policy(models=["b", "a", "b"], categories=["S10", "S2", "S10"], check=["prompt", "response"])
    assert q.models == ("a", "b") and q.categories == ("S2", "S10") and q.check == "both"
    assert q.checks_prompt and q.checks_response and not policy(check="response").checks_prompt
    assert p.refuses("S13") and not policy(categories=["S1"]).refuses("S6")


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        ({"judge": "lg"}, "name", "is required"),
        ({"name": "../x", "judge": "lg"}, "name", "letters, digits"),
        ({"name": "p"}, "judge", "is required"),
        ({"name": "p", "judge": "lg", "check": "answer"}, "check", "prompt, response or both"),
        ({"name": "p", "judge": "lg", "models": []}, "models", "non-empty list"),
        ({"name": "p", "judge": "lg", "models": "*"}, "models", "non-empty list"),
        ({"name": "p", "judge": "lg", "models": ["*", "demo"]}, "models", "stands alone"),
        ({"name": "p", "judge": "lg", "models": ["demo", "lg"]}, "models", "must not name the judge"),
        ({"name": "p", "judge": "lg", "categories": ["S15"]}, "categories", "not a hazard code"),
        ({"name": "p", "judge": "lg", "categories": "S1"}, "categories", "must be a list"),
        ({"name": "p", "judge": "lg", "on_error": "ignore"}, "on_error", "must be open"),
        ({"name": "p", "judge": "lg", "budget_s": 0}, "budget_s", "above 0"),
        ({"name": "p", "judge": "lg", "budget_s": 500}, "budget_s", "at most 120"),
        ({"name": "p", "judge": "lg", "budget_s": "2s"}, "budget_s", "number of seconds"),
        ({"name": "p", "judge": "lg", "budget_s": True}, "budget_s", "number of seconds"),
        ({"name": "p", "judge": "lg", "budget_s": float("nan")}, "budget_s", "above 0"),
        ({"name": "p", "judge": "lg", "colour": "red"}, "colour", "unknown key"),
    ],
)
def test_each_problem_names_its_field(doc: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(PolicyError) as e:
        GuardPolicy.from_doc(doc)
    assert e.value.field == field and words in e.value.message, e.value.errors


def test_every_problem_at_once_and_the_name_from_the_path() -> None:
    with pytest.raises(PolicyError) as e:
        GuardPolicy.from_doc({"check": "x", "on_error": "y", "budget_s": -1})
    assert [f for f, _ in e.value.errors] == ["name", "judge", "check", "on_error", "budget_s"]
    assert GuardPolicy.from_doc({"judge": "lg"}, name="from-path").name == "from-path"
    with pytest.raises(PolicyError, match="stored as 'b'"):
        GuardPolicy.from_doc({"name": "a", "judge": "lg"}, name="b")
    with pytest.raises(PolicyError, match="name: use 1-128"):
        GuardPolicy.from_doc({"judge": "lg"}, name="a b")
    with pytest.raises(PolicyError, match="policy: must be an object"):
        GuardPolicy.from_doc(["a list"])


names = st.from_regex(r"[a-z][a-z0-9._-]{0,10}", fullmatch=True)
policy_docs = st.fixed_dictionaries(
    {"name": names, "judge": names.map(lambda n: "judge-" + n)},
    optional={
        "check": st.sampled_from(CHECKS),
        "models": st.one_of(st.just(["*"]), st.lists(names.map(lambda n: "m-" + n), min_size=1, max_size=5)),
        "categories": st.lists(st.sampled_from(list(CATEGORIES)), max_size=20),
        "on_error": st.sampled_from(["open", "closed"]),
        "budget_s": st.floats(min_value=0.001, max_value=120.0) | st.integers(min_value=1, max_value=120),
    },
)


@given(policy_docs)
def test_a_policy_document_round_trips(doc: dict[str, Any]) -> None:
    """from_doc(to_doc(p)) == p, through JSON (the API, the log) and the snapshot codec alike."""
    p = GuardPolicy.from_doc(doc)
    assert GuardPolicy.from_doc(p.to_doc()) == p
    assert p.to_doc() == GuardPolicy.from_doc(p.to_doc()).to_doc()
    s, _ = commands.apply(ClusterState(), commands.set_policy(p, 1.0))
    assert state_from_json(state_to_json(s)).guard_policies == {p.name: p}
    blob = commands.encode(commands.set_policy(p, 1.0))
    assert commands.apply(ClusterState(), commands.decode(blob))[0].guard_policies[p.name] == p


def test_set_is_idempotent_and_remove_says_whether_it_removed() -> None:
    p = policy(categories=["S6"])
    s, r = commands.apply(ClusterState(), commands.set_policy(p, 1.0))
    assert r == {"created": True, "changed": True} and s.guard_policies == {"p": p}
    s2, r = commands.apply(s, commands.set_policy(p, 2.0))
    assert r == {"created": False, "changed": False} and s2.guard_policies == s.guard_policies
    s3, r = commands.apply(s2, commands.set_policy(policy(on_error="open"), 3.0))
    assert r == {"created": False, "changed": True} and s3.guard_policies["p"].on_error == "open"
    s4, r = commands.apply(s3, commands.remove_policy("p", 4.0))
    assert r == {"removed": True, "name": "p"} and not s4.guard_policies
    s5, r = commands.apply(s4, commands.remove_policy("p", 5.0))
    assert r == {"removed": False, "name": "p"} and s5.revision == s4.revision + 1
    assert pickle.loads(pickle.dumps(s3)).guard_policies == s3.guard_policies
    with pytest.raises(TypeError):
        s3.guard_policies["q"] = p  # type: ignore[index]


def test_a_bad_command_is_refused_before_the_log() -> None:
    bad = commands.make("guard.set", 1.0, policy={"name": "p", "judge": "lg", "check": "never"})
    with pytest.raises(CommandError) as e:
        commands.decode(commands.encode(bad))
    assert e.value.code == "invalid_policy" and "check:" in e.value.message
    with pytest.raises(CommandError, match="name must be"):
        commands.apply(ClusterState(), commands.make("guard.remove", 1.0, name=""))


async def test_the_commands_through_the_store() -> None:
    store = MemoryStore()
    await store.submit(commands.set_policy(policy(), 1.0))
    assert store.snapshot().guard_policies["p"] == policy()
    assert (await store.submit(commands.remove_policy("p", 2.0)))["removed"] is True
    assert not store.snapshot().guard_policies


def test_which_policies_apply_to_a_model() -> None:
    every = GuardPolicy.from_doc({"name": "every", "judge": "lg"})
    some = GuardPolicy.from_doc({"name": "some", "judge": "other-judge", "models": ["demo"]})
    guard_model = ModelDef.from_doc({"name": "named-guard", "engine": "sim", "role": "guard", "source": "sim://g"})
    s = state_with(every, some, models=(guard_model,))
    assert policies_for(s, "demo") == (every, some)
    assert policies_for(s, "chat") == (every,)
    # a judge's own requests are never checked: named by a policy, or defined with role guard
    assert policies_for(s, "lg") == () and policies_for(s, "other-judge") == ()
    assert policies_for(s, "named-guard") == ()
    assert policies_for(ClusterState(), "demo") == ()


def test_guards_are_on_unless_set_off() -> None:
    s = ClusterState()
    assert enabled(s)
    off, _ = commands.apply(s, commands.put_setting("guard.enabled", False, 1.0))
    assert not enabled(off)
    on, _ = commands.apply(off, commands.put_setting("guard.enabled", True, 2.0))
    assert enabled(on)


def test_a_remote_gateways_table_carries_the_policies() -> None:
    p = policy(models=["demo"], categories=["S1"])
    s = state_with(p)
    table = protocol.read_table(protocol.loads(protocol.dumps(protocol.table_message(1, "cp", s, None))))
    assert dict(table.state.guard_policies) == {"p": p} and not table.skipped
    message = protocol.table_message(1, "cp", s, None)
    message["guard_policies"].append({"name": "bad", "judge": "lg", "check": "never"})
    table = protocol.read_table(message)
    assert list(table.state.guard_policies) == ["p"] and "guard policy bad" in table.skipped[0]
    del message["guard_policies"]  # an older leader: no policies
    assert not protocol.read_table(message).state.guard_policies
