"""Fallbacks and aliases: the definition's fields and their checks (alone and beside the catalog), the store
refusing what does not fit, the codec writing them only when set, the catalog file's order, and the
gateway's pure resolution of a public name to the models tried (gateway/names.py)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from llmgw import catalog
from llmgw.cli.ctl.requests import render_request, render_requests
from llmgw.domain import commands
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.commands import CommandError
from llmgw.domain.model import DefinitionError, ModelDef, catalog_problems
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.names import Names, alias_groups, candidates, visible_names
from llmgw.gateway.router import Router
from llmgw.reconcile import decide
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node, observed, placed, state_with


def doc(name: str, role: str = "chat", **extra: Any) -> dict[str, Any]:
    return {"name": name, "engine": "sim", "source": f"sim://{name}", "role": role, **extra}


def define(name: str, role: str = "chat", **extra: Any) -> ModelDef:
    return ModelDef.from_doc(doc(name, role, **extra))


# --- the definition alone ------------------------------------------------------------------------


def test_fallbacks_and_aliases_read_and_are_written_only_when_set() -> None:
    plain = define("a")
    assert (plain.fallbacks, plain.aliases) == ((), ())
    assert "fallbacks" not in plain.to_doc() and "aliases" not in plain.to_doc()  # an older member reads it
    full = define("a", fallbacks=["b", "c"], aliases=["x"])
    assert (full.fallbacks, full.aliases) == (("b", "c"), ("x",))
    assert ModelDef.from_doc(full.to_doc()) == full
    assert full.launch_hash() == plain.launch_hash()  # a new fallback or alias restarts no replica


@pytest.mark.parametrize(("extra", "field", "words"), [
    ({"fallbacks": "b"}, "fallbacks", "must be a list of model names"),
    ({"fallbacks": ["a"]}, "fallbacks", "must not name the model itself"),
    ({"fallbacks": ["b", "b"]}, "fallbacks", "names a model twice"),
    ({"fallbacks": ["../x"]}, "fallbacks", "is not a model name"),
    ({"fallbacks": [f"m{i}" for i in range(9)]}, "fallbacks", "at most 8"),
    ({"aliases": ["a"]}, "aliases", "must not name the model itself"),
    ({"aliases": [7]}, "aliases", "must be a list of model names"),
])
def test_a_bad_list_is_refused_naming_its_field(extra: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(DefinitionError) as refused:
        ModelDef.from_doc(doc("a", **extra))
    assert refused.value.field == field and words in refused.value.message


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(DefinitionError) as refused:
        ModelDef.from_doc(doc("a", fallbacks=["a"], aliases="x", mode="sometimes"))
    assert [f for f, _ in refused.value.errors] == ["mode", "fallbacks", "aliases"]


# --- beside the catalog --------------------------------------------------------------------------

CATALOG = {m.name: m for m in (define("b"), define("e", "embedding"), define("c", aliases=["group", "solo"]),
                               define("d", aliases=["group"]))}


@pytest.mark.parametrize(("model", "found"), [
    (define("a", fallbacks=["b"], aliases=["group", "x"]), []),
    (define("a", fallbacks=["nope", "e"]), [("fallbacks", "'nope' is not a defined model"),
                                            ("fallbacks", "'e' has role embedding; a fallback must have this model's"
                                                          " role (chat)")]),
    (define("a", aliases=["b"]), [("aliases", "'b' is the name of a model")]),
    (define("solo"), [("name", "'solo' is an alias of model 'c'")]),
    (define("a", "embedding", aliases=["group"]), [
        ("aliases", "'group' is also an alias of model 'c' (role chat); the models sharing an alias must have the"
                    " same role"),
        ("aliases", "'group' is also an alias of model 'd' (role chat); the models sharing an alias must have the"
                    " same role")]),
    (define("c", fallbacks=["b"], aliases=["group", "solo"]), []),  # its own older definition is passed over
])
def test_catalog_problems(model: ModelDef, found: list[tuple[str, str]]) -> None:
    assert catalog_problems(model, CATALOG) == found


def test_the_store_refuses_what_does_not_fit_the_catalog_and_changes_nothing() -> None:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(define("b"), at=0.0))
    before = store.snapshot()
    with pytest.raises(CommandError) as refused:
        store.submit_nowait(commands.put_model(define("a", fallbacks=["z"], aliases=["b"]), at=0.0))
    assert refused.value.code == "invalid_model"
    assert refused.value.message == "fallbacks: 'z' is not a defined model; aliases: 'b' is the name of a model"
    assert store.snapshot() is before
    store.submit_nowait(commands.put_model(define("a", fallbacks=["b"], aliases=["x"]), at=0.0))
    assert store.snapshot().models["a"].fallbacks == ("b",)


def test_the_snapshot_writes_the_fields_only_when_set_and_reads_them_back() -> None:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(define("b"), at=0.0))
    store.submit_nowait(commands.put_model(define("a", fallbacks=["b"], aliases=["x"]), at=0.0))
    written = state_to_json(store.snapshot())
    assert "fallbacks" not in written["state"]["models"]["b"] and "aliases" not in written["state"]["models"]["b"]
    assert written["state"]["models"]["a"]["fallbacks"] == ["b"]
    assert state_from_json(written).models == store.snapshot().models


def test_a_catalog_file_is_checked_whole_and_ordered_fallbacks_first() -> None:
    text = """
[[models]]
name = "a"
engine = "sim"
source = "sim://a"
fallbacks = ["b"]
[[models]]
name = "b"
engine = "sim"
source = "sim://b"
"""
    assert [m.name for m in catalog.parse(text, "t")] == ["b", "a"]
    with pytest.raises(catalog.CatalogError, match="name each other"):
        catalog.parse(text.replace('source = "sim://b"', 'source = "sim://b"\nfallbacks = ["a"]'), "t")
    with pytest.raises(catalog.CatalogError, match="'c' is not a defined model"):
        catalog.parse(text.replace('["b"]', '["c"]'), "t")


# --- resolution (gateway/names.py) -----------------------------------------------------------------

MODELS = {m.name: m for m in (
    define("main", fallbacks=["backup", "gone"], aliases=["friendly"]), define("backup", fallbacks=["third"]),
    define("third"), define("g1", aliases=["pool"], fallbacks=["backup"]), define("g2", aliases=["pool"], fallbacks=["main"]),
)}  # "gone": removed since it was named
GROUPS = alias_groups(MODELS)


def names(found: list[ModelDef]) -> list[str]:
    return [m.name for m in found]


def test_alias_groups() -> None:
    assert GROUPS == {"friendly": ("main",), "pool": ("g1", "g2")}


@pytest.mark.parametrize(("name", "scope", "tried"), [
    ("main", None, ["main", "backup"]),  # one level: backup's own fallback is not followed; "gone" passed over
    ("friendly", None, ["main", "backup"]),
    ("pool", None, ["g1", "g2", "backup", "main"]),
    ("nope", None, []),
    ("main", frozenset({"main"}), ["main"]),  # no fallback the key may not use
    ("main", frozenset({"main", "backup"}), ["main", "backup"]),
    ("friendly", frozenset({"main"}), ["main"]),  # scoped to the model: its alias too
    ("friendly", frozenset({"friendly"}), ["main"]),  # scoped to the alias: its model through it
    ("main", frozenset({"friendly"}), []),  # but not the model's own name
    ("pool", frozenset({"g2"}), ["g2"]),  # the part of a group the key may use
    ("pool", frozenset({"third"}), []),
])
def test_candidates(name: str, scope: frozenset[str] | None, tried: list[str]) -> None:
    assert names(candidates(MODELS, GROUPS, name, scope)) == tried


def test_a_group_is_tried_in_the_order_given() -> None:
    assert names(candidates(MODELS, GROUPS, "pool", None, lambda g: g[::-1])) == ["g2", "g1", "main", "backup"]


def test_visible_names() -> None:
    assert visible_names(MODELS, GROUPS, None) == ["backup", "friendly", "g1", "g2", "main", "pool", "third"]
    assert visible_names(MODELS, GROUPS, frozenset({"g1", "friendly"})) == ["friendly", "g1", "pool"]


def test_names_builds_its_table_once_per_catalog() -> None:
    table = Names()
    first = table.groups(MODELS)
    assert table.groups(MODELS) is first
    assert table.groups({}) == {}


scopes = st.none() | st.frozensets(st.sampled_from(sorted([*MODELS, *GROUPS, "gone"])))


@given(name=st.sampled_from(sorted([*MODELS, *GROUPS, "nope"])), scope=scopes)
def test_candidates_properties(name: str, scope: frozenset[str] | None) -> None:
    tried = names(candidates(MODELS, GROUPS, name, scope))
    assert len(tried) == len(set(tried))  # each model once
    assert all(m in MODELS for m in tried)  # never a name no longer defined
    if tried:  # the first is what was asked for: the model, or one of the alias's
        assert tried[0] == name or tried[0] in GROUPS[name]
        # every model reached is one the key may use: by its name, or through an alias its scope names
        assert scope is None or all(m in scope or (name in scope and m in GROUPS.get(name, ())) for m in tried)


async def test_least_loaded_puts_ready_and_idle_models_first_in_turn(autojump_clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"g1": ModelRoute("g1", "chat", "ready", (Endpoint("g1-r1", "http://127.0.0.1:1"),)),
                          "g2": ModelRoute("g2", "chat", "ready", (Endpoint("g2-r1", "http://127.0.0.1:2"),)),
                          "g3": ModelRoute("g3", "chat", "starting")})
    firsts = {router.least_loaded(("g1", "g2", "g3"))[0] for _ in range(4)}
    assert firsts == {"g1", "g2"}  # ties in turn; the one with no replica never first
    async with router.acquire("g1", deadline=1.0):
        assert [router.least_loaded(("g1", "g2", "g3")) for _ in range(3)] == [["g2", "g1", "g3"]] * 3


def test_ctl_requests_shows_the_model_that_served_when_another_did() -> None:
    record = {"id": "req-gw1-0123456789abcdef", "time": 1.7e9, "gateway": "gw1", "key": "key_1", "model": "main",
              "served_model": "backup", "endpoint": "/v1/chat/completions", "status": 200}
    assert "served by:      backup" in render_request({"request": record})
    rows = render_requests({"requests": [record, {**record, "served_model": "main"}, {**record, "served_model": ""},
                                         {k: v for k, v in record.items() if k != "served_model"}]})
    assert [line.split()[4] for line in rows.splitlines()[1:]] == ["main->backup", "main", "main", "main"]


def test_an_agent_is_sent_the_definition_without_the_gateways_fields() -> None:
    """An agent of an older release refuses a key it does not know; it has no use for fallbacks or aliases."""
    s = state_with([define("b"), define("a", fallbacks=["b"], aliases=["x"])], [placed("a", "local")])
    plan = decide(s, observed([cpu_node("local")]), 1000.0)
    sent = [a.model for a in plan.actions if a.kind == "start"]
    assert len(sent) == 1 and "fallbacks" not in sent[0] and "aliases" not in sent[0]
    assert ModelDef.from_doc(sent[0]).launch_hash() == s.models["a"].launch_hash()
