"""LoRA adapters in the pure core: the definition (`base`, an adapter file's path), its place in the catalog,
the stored form (a later field), the agent protocol's `load_adapters`, and the plan: every ready replica of the
base asked to load its adapters, an adapter routable only on the replicas whose engine lists it, its demand the
base's. By example and Hypothesis."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain import commands
from llmgw.domain.codec import later_level, state_from_json, state_to_json
from llmgw.domain.model import DefinitionError, ModelDef, catalog_problems
from llmgw.domain.observed import ReplicaObs
from llmgw.engines.sim.lora import LOAD_PATH, UNLOAD_PATH, SimAdapters
from llmgw.errors import OpenAIError
from llmgw.reconcile import decide
from llmgw.reconcile.adapters import adapters_by_base, with_launch_lora
from llmgw.testing.builders import ReconcileLoop, cpu_node, model, observed, placed, store_with
from llmgw.wire import protocol_agent as pa
from llmgw.wire.protocol import ProtocolError, route_doc, route_from_doc

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)


def adapter(name: str = "pirate", base: str = "base", source: str = "/models/lora/pirate.safetensors",
            **extra: object) -> ModelDef:
    return ModelDef.from_doc({"name": name, "base": base, "engine": "sim", "source": source, **extra})


def llama_world(adapters: dict[str, str]) -> tuple[object, str]:
    """A llama.cpp base placed on n1, with these adapters (name -> file)."""
    models = [model("tiny").llamacpp().cpu().memory(0.5), *(adapter(n, "tiny", f, engine="llama.cpp") for n, f in adapters.items())]
    store = store_with(models, [placed("tiny", "n1")])
    [rid] = store.snapshot().placements
    return store.snapshot(), rid


# --- the definition --------------------------------------------------------------------------------


def test_an_adapter_names_its_base_and_its_file_and_reads_back_from_its_document() -> None:
    a = adapter()
    assert a.is_adapter and a.base == "base" and a.source == "/models/lora/pirate.safetensors"
    assert a.to_doc()["base"] == "base" and ModelDef.from_doc(a.to_doc()) == a
    assert "base" not in model("plain").build().to_doc()  # absent on a model of its own: older members read it


@pytest.mark.parametrize(("source", "words"), [
    ("sim://pirate", "absolute path of its file"),
    ("hf://org/lora", "absolute path of its file"),
    ("mirror://pirate", "from the mirror is not supported yet"),
    ("/models/../etc/passwd", "'..'"),
])
def test_an_adapters_source_is_an_absolute_path_for_now(source: str, words: str) -> None:
    with pytest.raises(DefinitionError) as e:
        adapter(source=source)
    assert e.value.field == "source" and words in e.value.message


def test_an_adapter_is_not_its_own_base() -> None:
    with pytest.raises(DefinitionError, match="base: must not name the model itself"):
        adapter(name="x", base="x")


@given(name=NAMES, base=NAMES, file=NAMES)
def test_any_adapter_definition_reads_back_and_is_stored_as_a_later_field(name: str, base: str, file: str) -> None:
    if name == base:
        return
    a = adapter(name, base, f"/lora/{file}.gguf")
    assert ModelDef.from_doc(a.to_doc()) == a
    assert later_level(a) == 3  # an older member could not read it: the command carries the store level
    assert commands.put_model(a, 0.0)["needs_level"] >= 2  # its command says so (the store level set at merge)
    state = store_with([model(base).build(), a]).snapshot()
    assert state_from_json(state_to_json(state)).models[name] == a


def test_the_catalog_refuses_an_adapter_of_nothing_of_an_adapter_or_of_another_engine() -> None:
    base, other = model("base").build(), model("llama").llamacpp().build()
    a = adapter()
    assert catalog_problems(a, {"base": base}) == []
    assert catalog_problems(a, {}) == [("base", "'base' is not a defined model")]
    assert catalog_problems(adapter(base="pirate2"), {"pirate2": a})[0][1].startswith("'pirate2' is itself an adapter")
    vllm = model("big").vllm().build()
    assert catalog_problems(adapter(base="big"), {"big": vllm})[0] == ("engine", "must be its base's engine (vllm), "
                                                                                 "not sim")
    assert catalog_problems(adapter(base="llama", engine="llama.cpp"), {"llama": other}) == []
    # A base that would change engine under its adapters is refused too; an adapter that is a base, also.
    changed = model("base").vllm().build()
    assert catalog_problems(changed, {"base": base, "pirate": a})[0][0] == "engine"
    assert catalog_problems(adapter(name="base", base="x"), {"x": other, "pirate": a})[-1][1].startswith(
        "model 'base' is the base of adapter 'pirate'")


# --- the protocol ------------------------------------------------------------------------------------


def test_load_adapters_reads_back_and_an_unsafe_source_is_refused() -> None:
    message = {"type": "load_adapters", "replica_id": "base-r1",
               "adapters": [{"name": "pirate", "source": "/lora/pirate.gguf"}]}
    assert pa.read_down(message) == pa.LoadAdapters("base-r1", (("pirate", "/lora/pirate.gguf"),))
    with pytest.raises(ProtocolError, match=r"adapters\[0\].source"):
        pa.read_down({**message, "adapters": [{"name": "pirate", "source": "relative/x"}]})
    obs = ReplicaObs("base-r1", "base", "n1", "ready", "http://x", adapters={"pirate": "loaded"})
    assert ReplicaObs.from_doc(obs.to_doc(), "n1") == obs
    assert ReplicaObs.from_doc({**obs.to_doc(), "adapters": None}, "n1").adapters == {}  # an older agent


# --- the plan ----------------------------------------------------------------------------------------


def world(states: dict[str, str] | None, *, ready: bool = True, lie: bool = False) -> tuple[object, ...]:
    store = store_with([model("base"), adapter()], [placed("base", "n1")])
    state = store.snapshot()
    [rid] = state.placements
    replica = ReplicaObs(rid, "base", "n1", "ready" if ready else "starting", "http://n1:1" if ready else "",
                         adapters=states or {})
    return state, observed([cpu_node("n1")], [replica]), rid


def test_a_ready_replica_of_the_base_is_asked_to_load_its_adapters_and_the_adapter_waits_meanwhile() -> None:
    state, obs, rid = world(None)
    plan = decide(state, obs, 10.0)  # type: ignore[arg-type]
    [load] = [a for a in plan.actions if a.kind == "adapters"]
    assert load.message() == {"type": "load_adapters", "replica_id": rid,
                              "adapters": [{"name": "pirate", "source": "/models/lora/pirate.safetensors"}]}
    route = plan.routes["pirate"]
    assert (route.state, route.endpoints, route.base) == ("starting", (), "base")
    assert plan.views["pirate"].desired == 0 and not any(c["op"].startswith("placement") for c in plan.commands)


def test_loading_is_asked_once_the_agent_says_it_is_on_it() -> None:
    state, obs, _ = world({"pirate": "loading"})
    plan = decide(state, obs, 10.0)  # type: ignore[arg-type]
    assert [a for a in plan.actions if a.kind == "adapters"] == []
    assert plan.routes["pirate"].state == "starting"


def test_an_adapter_routes_only_to_replicas_that_list_it() -> None:
    state, obs, rid = world({"pirate": "loaded"})
    plan = decide(state, obs, 10.0)  # type: ignore[arg-type]
    route = plan.routes["pirate"]
    assert route.state == "ready" and [e.replica_id for e in route.endpoints] == [rid]
    assert route_from_doc(route_doc(route)) == route  # a remote gateway gets `base` too


def test_an_adapter_that_failed_everywhere_is_refused_with_the_engines_words() -> None:
    state, obs, rid = world({"pirate": "failed: the engine answered the load with success but does not list it"})
    route = decide(state, obs, 10.0).routes["pirate"]  # type: ignore[arg-type]
    assert route.state == "unplaceable" and route.endpoints == ()
    assert f"{rid}: the engine answered the load with success but does not list it" in route.reason


def test_while_the_base_has_no_ready_replica_the_adapter_says_the_bases_state() -> None:
    state, obs, _ = world(None, ready=False)
    route = decide(state, obs, 10.0).routes["pirate"]  # type: ignore[arg-type]
    assert route.state == "starting" and route.reason.startswith("base model 'base': ")


def test_a_request_for_an_adapter_starts_its_on_demand_base() -> None:
    loop = ReconcileLoop(store_with([model("base").on_demand(), adapter()]), [cpu_node("n1")], now=1000.0, since=0.0)
    assert loop.settle().routes["pirate"].state == "absent"
    loop.demand["pirate"] = loop.now  # the gateway asked for the adapter
    plan = loop.settle()
    assert plan.routes["base"].state == "ready"
    assert plan.routes["pirate"].state == "ready" and plan.routes["pirate"].endpoints == plan.routes["base"].endpoints


def test_an_adapter_whose_base_its_schedule_holds_at_0_is_refused_at_once_too() -> None:
    # Its requests would start the base: the rule forbids that, so the adapter's route says until when, as the base's.
    base = model("base").on_demand().schedule("0 22 * * *", 0, 0, duration_s=8 * 3600).build()
    night = 1_796_684_400.0  # 2026-12-07 23:00 UTC
    plan = ReconcileLoop(store_with([base, adapter()]), [cpu_node("n1")], now=night, since=0.0).settle()
    assert plan.routes["base"].off_until == night + 7 * 3600
    assert plan.routes["pirate"].state == "absent" and plan.routes["pirate"].off_until == night + 7 * 3600
    assert plan.routes["pirate"].reason.startswith("base model 'base': schedule rule 1 allows no replica until")


def test_a_removed_adapter_is_dropped_from_the_replicas_set() -> None:
    state, obs, rid = world({"pirate": "loaded"})
    state = replace(state, models={k: v for k, v in state.models.items() if k != "pirate"})  # type: ignore[arg-type]
    [load] = [a for a in decide(state, obs, 10.0).actions if a.kind == "adapters"]  # type: ignore[arg-type]
    assert (load.replica_id, load.adapters) == (rid, {})


@given(st.dictionaries(NAMES, st.sampled_from(["base", "other"]), max_size=6))
def test_adapters_are_grouped_under_their_base(bases: dict[str, str]) -> None:
    models = {"base": model("base").build(), "other": model("other").build()}
    models |= {n: adapter(n, b) for n, b in bases.items() if n not in models}
    grouped = adapters_by_base(models)
    assert {n for names in grouped.values() for n in names} == {n for n, m in models.items() if m.base}
    assert all(models[n].base == b for b, names in grouped.items() for n in names)


# --- the sim engine's adapters ----------------------------------------------------------------------


def test_the_sim_loads_an_existing_file_lists_it_and_answers_as_it(tmp_path: object) -> None:
    import pathlib

    file = pathlib.Path(str(tmp_path)) / "a.safetensors"
    file.write_bytes(b"x")
    sim = SimAdapters("base")
    sim.answer(LOAD_PATH, {"lora_name": "a", "lora_path": str(file)})
    assert [m["id"] for m in sim.models()] == ["a"] and sim.models()[0]["parent"] == "base"
    assert sim.speaker("a") == "sim[a]" and sim.speaker("base") == "sim"
    with pytest.raises(OpenAIError, match="already been loaded"):
        sim.answer(LOAD_PATH, {"lora_name": "a", "lora_path": str(file)})
    with pytest.raises(OpenAIError, match="No adapter found"):
        sim.answer(LOAD_PATH, {"lora_name": "b", "lora_path": str(file) + ".missing"})
    sim.answer(UNLOAD_PATH, {"lora_name": "a"})
    assert sim.models() == []
    liar = SimAdapters("base", lie=True)
    assert liar.answer(LOAD_PATH, {"lora_name": "a", "lora_path": "/nowhere"}).startswith("Success")
    assert liar.models() == []  # said loaded, lists nothing


def test_an_adapter_takes_its_bases_slots_on_the_replicas_they_share() -> None:
    from llmgw.gateway.app import replica_slots

    state = store_with([ModelDef.from_doc({"name": "base", "engine": "sim", "source": "sim://base",
                                           "limits": {"concurrency_per_replica": 4}}), adapter()]).snapshot()
    assert replica_slots(state, state.models["pirate"]) == 4 == replica_slots(state, state.models["base"])


# --- llama.cpp: adapters at launch -------------------------------------------------------------------


def test_a_llamacpp_base_starts_with_its_adapters_and_a_new_adapter_rolls_its_replicas() -> None:
    state, rid = llama_world({})
    plain_launch = state.placements[rid].launch_hash  # type: ignore[attr-defined]
    state, rid = llama_world({"b-lora": "/m/b.gguf", "a-lora": "/m/a.gguf"})
    launched = with_launch_lora(state)  # type: ignore[arg-type]
    assert launched.models["tiny"].lora == ("/m/a.gguf", "/m/b.gguf")  # by adapter name: ids 0, 1
    assert launched.models["tiny"].launch_hash() != plain_launch
    plain = store_with([model("x"), adapter("y", "x")]).snapshot()
    assert with_launch_lora(plain) is plain  # no llama.cpp base with adapters: the same state, no copy
    # Placed before the adapters were defined, the replica is replaced by one started with them (new first).
    ready = ReplicaObs(rid, "tiny", "n1", "ready", "http://n1:1")
    plan = decide(state, observed([cpu_node("n1")], [ready]), 10.0)  # type: ignore[arg-type]
    [add] = [c for c in plan.commands if c["op"] == "placement.add"]
    assert add["launch_hash"] == launched.models["tiny"].launch_hash()
    # The definition sent to the agent carries the files, not the stored one.
    assert "lora" not in state.models["tiny"].to_doc()  # type: ignore[attr-defined]


def test_a_llamacpp_adapter_routes_by_id_to_replicas_that_agree() -> None:
    state, rid = llama_world({"a-lora": "/m/a.gguf"})
    state = with_launch_lora(state)  # type: ignore[arg-type]
    obs = ReplicaObs(rid, "tiny", "n1", "ready", "http://n1:1", adapters={"a-lora": "loaded"},
                     adapter_ids={"a-lora": 0}, loras=1)
    plan = decide(state, observed([cpu_node("n1")], [obs]), 10.0)
    route = plan.routes["a-lora"]
    assert route.state == "ready" and route.lora_id == 0 and [e.loras for e in route.endpoints] == [1]
    assert plan.routes["tiny"].endpoints[0].loras == 1  # base requests set the adapter's scale to 0
    assert route_from_doc(route_doc(route)) == route
    assert ReplicaObs.from_doc(obs.to_doc(), "n1") == obs


def test_the_definition_api_does_not_take_lora() -> None:
    assert ModelDef.from_doc({"name": "t", "engine": "llama.cpp", "source": "/m/t.gguf", "lora": ["/m/a.gguf"]}).lora
    with pytest.raises(DefinitionError, match="lora"):
        ModelDef.from_doc({"name": "t", "engine": "llama.cpp", "source": "/m/t.gguf", "lora": ["rel.gguf"]})


STATES = st.sampled_from(["", "loading", "loaded", "failed: no such file"])


@given(st.lists(STATES, min_size=1, max_size=4))
def test_an_adapter_is_routed_exactly_to_the_ready_replicas_that_list_it(states: list[str]) -> None:
    store = store_with([model("base").replicas(len(states)), adapter()],
                       [placed("base", f"n{i}") for i in range(len(states))])
    state = store.snapshot()
    reps = [ReplicaObs(rid, "base", p.node, "ready", f"http://{p.node}:1", adapters={"pirate": s} if s else {})
            for (rid, p), s in zip(sorted(state.placements.items()), states)]
    plan = decide(state, observed([cpu_node(f"n{i}") for i in range(len(states))], reps), 10.0)
    route = plan.routes["pirate"]
    assert {e.replica_id for e in route.endpoints} == {r.replica_id for r in reps if r.adapter("pirate") == "loaded"}
    expected = ("ready" if "loaded" in states else "unplaceable" if all(s.startswith("failed") for s in states)
                else "starting")
    assert route.state == expected
    # Each replica not yet asked (or asked for another set) is asked for the adapter, and only those.
    asked = {a.replica_id for a in plan.actions if a.kind == "adapters"}
    assert asked == {r.replica_id for r in reps if not r.adapter("pirate")}


def test_a_catalog_defines_an_adapter_after_its_base() -> None:
    from llmgw.catalog import parse

    text = '''
[[models]]
name = "pirate"
base = "base"
engine = "sim"
source = "/models/lora/pirate.safetensors"

[[models]]
name = "base"
engine = "sim"
source = "sim://base"
'''
    assert [m.name for m in parse(text, "catalog.toml")] == ["base", "pirate"]


def test_an_adapter_loaded_nowhere_is_a_condition_saying_so_not_a_placement_problem() -> None:
    from test_conditions import model_row, summary_with

    from llmgw.domain.conditions import conditions

    row = model_row(name="pirate", base="base", state="unplaceable", unplaceable=True, desired=0, ready=0,
                    reason="adapter 'pirate' did not load on any ready replica of 'base': base-r1: No adapter found")
    [found] = conditions(summary_with(models=(row,)), 0.0)
    assert (found.kind, found.subject) == ("model_unplaceable", "pirate")
    assert found.words.startswith("LoRA adapter pirate of model base is loaded on no replica: ")
    assert "No adapter found" in found.words and "ctl plan" not in found.words
