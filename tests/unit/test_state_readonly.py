"""`ClusterState` is read-only all the way down: a careless reader of a snapshot cannot make
this member's state diverge from the others'; it still pickles (pysyncobj's snapshot file)."""

from __future__ import annotations

import dataclasses

import copyreg
import io
import json
import pickle
from dataclasses import FrozenInstanceError
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import commands as C
from llmgw.domain.frozen import freeze, thaw
from llmgw.domain.keys import hash_key
from llmgw.domain.settings import SETTINGS, effective
from llmgw.domain.state import ClusterState, ModelHealth
from llmgw.testing.builders import model, placed, state_with

HOOKS = ["https://hooks.example/a", "https://hooks.example/b"]
MAPPINGS = ("models", "settings", "keys", "placements", "health")


def full_state() -> ClusterState:
    """One of everything: models, a list-valued setting, a key, placements and health."""
    s = state_with([model("demo"), model("other")], [placed("demo", "n1"), placed("other", "n1")],
                   {"notify.webhooks": HOOKS, "serving.stopped": False})
    s, _ = C.apply(s, C.add_key(hash_key("sk-x"), "ops", "admin", 1.0))
    s, _ = C.apply(s, C.start_failed("demo", "demo-r1", "boom", 2.0))
    assert all(getattr(s, name) for name in MAPPINGS), "a field is empty: its test would pass vacuously"
    return s


def assert_read_only(value: Any) -> None:
    """No mutable container anywhere inside a state's field."""
    if isinstance(value, (dict, list, set)):
        raise AssertionError(f"mutable {type(value).__name__} inside the state: {value!r:.80}")
    if isinstance(value, MappingProxyType):
        for v in value.values():
            assert_read_only(v)
    elif isinstance(value, tuple):
        for v in value:
            assert_read_only(v)


def assert_state_read_only(s: ClusterState) -> None:
    for name in MAPPINGS:
        assert type(getattr(s, name)) is MappingProxyType, name
        assert_read_only(getattr(s, name))


# --- mutating a snapshot fails ------------------------------------------------------------------------------------


def test_mutating_a_snapshot_fails_and_changes_nothing():
    s = full_state()
    before = pickle.dumps(s)
    rid = next(iter(s.placements))
    with pytest.raises(TypeError):
        s.models["x"] = s.models["demo"]
    with pytest.raises(TypeError):
        del s.placements[rid]
    with pytest.raises(AttributeError):
        s.settings["notify.webhooks"].append("https://evil.example")
    with pytest.raises(AttributeError):
        s.health.clear()
    with pytest.raises(AttributeError):
        s.keys.pop(hash_key("sk-x"))
    with pytest.raises(FrozenInstanceError):
        s.models = {}
    assert pickle.dumps(s) == before


def test_a_dict_given_to_the_state_is_copied_not_shared():
    models = {"demo": model("demo").build()}
    settings_ = {"notify.webhooks": list(HOOKS)}
    s = ClusterState(models=models, settings=settings_)
    models["other"] = model("other").build()
    settings_["notify.webhooks"].append("https://late.example")
    assert list(s.models) == ["demo"] and s.settings["notify.webhooks"] == tuple(HOOKS)
    assert_state_read_only(s)


def test_effective_hands_out_a_plain_copy():
    s = full_state()
    hooks = effective(s.settings, "notify.webhooks")
    assert hooks == HOOKS and type(hooks) is list, "the API serializes it as it is"
    hooks.append("https://evil.example")
    assert s.settings["notify.webhooks"] == tuple(HOOKS)
    default = effective({}, "notify.webhooks")
    default.append("https://evil.example")
    assert effective({}, "notify.webhooks") == [] and SETTINGS["notify.webhooks"].default == []


def test_the_settings_table_is_read_only():
    with pytest.raises(TypeError):
        SETTINGS["made.up"] = SETTINGS["serving.stopped"]


def test_freeze_goes_all_the_way_down_and_thaw_comes_back():
    value = {"a": [1, {"b": [2, 3], "c": None}], "d": "text"}
    frozen = freeze(value)
    assert_read_only(frozen)
    with pytest.raises(TypeError):
        frozen["a"][1]["b"] = ()
    assert thaw(frozen) == value
    assert json.dumps(thaw(frozen), sort_keys=True) == json.dumps(value, sort_keys=True)


# --- pickle: pysyncobj writes the state into its snapshot file ----------------------------------------------------


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])  # 2: the one pysyncobj uses
def test_pickle_round_trip_keeps_everything_and_stays_read_only(protocol: int):
    s = full_state()
    loaded = pickle.loads(pickle.dumps(s, protocol=protocol))
    assert loaded == s and loaded.revision == s.revision and loaded.next_replica == s.next_replica
    assert loaded.settings["notify.webhooks"] == tuple(HOOKS)
    assert loaded.model_health("demo") == s.model_health("demo") != ModelHealth()
    assert_state_read_only(loaded)
    with pytest.raises(TypeError):
        loaded.models["x"] = loaded.models["demo"]


def test_the_pickled_form_is_plain_dicts_so_files_from_before_still_load():
    s = dataclasses.replace(full_state(), store_level=1)  # files from before store levels: the first level
    plain = {
        "revision": s.revision, "next_replica": s.next_replica, "models": dict(s.models), "keys": dict(s.keys),
        "placements": dict(s.placements), "health": dict(s.health), "settings": thaw(s.settings),
    }

    class OldPickler(pickle.Pickler):
        """Writes a ClusterState as the code before read-only states did: its plain `__dict__`."""

        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is ClusterState:
                return copyreg.__newobj__, (ClusterState,), plain
            return NotImplemented

    old = io.BytesIO()
    OldPickler(old, protocol=2).dump(s)
    loaded = pickle.loads(old.getvalue())
    assert loaded == s
    assert_state_read_only(loaded)
    # And the other way: what is written now is that same plain form, which older code loads
    # (it ignores the fields it does not know: the idempotency outcomes and refusals, here empty).
    written = pickle.loads(pickle.dumps(s, protocol=2)).__getstate__()
    assert written == {**plain, "outcomes": [], "refusals": (), "members": {}, "usage": {}, "usage_marks": {},
                       "guard_policies": {}, "authorities": {}, "join_tokens": {}, "machines": {}, "revoked": {},
                       "raft_tls_since": 0.0, "store_level": 1, "mirror": {}, "approved_nodes": {},
                       "active_conditions": {}, "cordoned_nodes": {}}


# --- property: whatever the commands, every state is read-only and earlier states never change --------------------

NAMES = ["a", "b"]
commands_ = st.one_of(
    st.builds(lambda n: C.put_model(model(n).build(), 1.0), st.sampled_from(NAMES)),
    st.builds(lambda n: C.remove_model(n, 1.0), st.sampled_from(NAMES)),
    st.builds(lambda n: C.retry_model(n, 1.0), st.sampled_from(NAMES)),
    st.builds(lambda v: C.put_setting("notify.webhooks", v, 1.0),
              st.lists(st.sampled_from(HOOKS), max_size=3) | st.just(["ftp://refused"])),
    st.builds(lambda v: C.put_setting("serving.stopped", v, 1.0), st.booleans()),
    st.builds(lambda v: C.put_setting("health.park_after_failures", v, 1.0), st.integers(0, 3)),
    st.builds(lambda k: C.add_key(hash_key(k), k, "client", 1.0), st.sampled_from(["k1", "k2"])),
    st.builds(lambda n, g: C.add_placement(n, "n1", (g,), "h", 1.0), st.sampled_from(NAMES), st.integers(0, 2)),
    st.builds(lambda n, i: C.remove_placement(f"{n}-r{i}", 1.0), st.sampled_from(NAMES), st.integers(1, 6)),
    st.builds(lambda n: C.start_failed(n, f"{n}-r1", "boom", 1.0), st.sampled_from(NAMES)),
    st.builds(lambda n: C.became_ready(n, 1.0), st.sampled_from(NAMES)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(commands_, max_size=25))
def test_any_command_sequence_yields_read_only_states(history):
    s = ClusterState()
    seen: list[tuple[ClusterState, bytes]] = [(s, pickle.dumps(s))]
    for command in history:
        try:
            s, _ = C.apply(s, command)
        except C.CommandError:
            continue
        assert_state_read_only(s)
        seen.append((s, pickle.dumps(s)))
    for state, blob in seen:
        assert pickle.dumps(state) == blob, "a later command changed an earlier state"
