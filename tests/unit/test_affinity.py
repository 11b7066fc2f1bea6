"""Prefix affinity (llmgw/gateway/affinity.py, issue 22): the key of a request's leading text, the ring every
gateway builds alike, bounded load, and the router's pick with a key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.model import DEFAULT_ROUTING, PREFIX_CHARS, DefinitionError, ModelDef, Routing
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.settings import SettingError, validate
from llmgw.domain.state import ClusterState
from llmgw.gateway.affinity import Ring, affinity_key, load_bound
from llmgw.gateway.router import Lease, Router

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 10}


def chat(*turns: str, system: dict[str, Any] = SYSTEM) -> dict[str, Any]:
    """A conversation: the system prompt, then user and assistant turns alternating."""
    roles = ("user", "assistant")
    return {"model": "m", "messages": [system, *({"role": roles[i % 2], "content": t} for i, t in enumerate(turns))]}


# --- the key ---------------------------------------------------------------------------------


def test_the_key_ignores_later_turns_and_tells_conversations_apart() -> None:
    first = affinity_key("chat", chat("plan a trip to Lyon"), PREFIX_CHARS)
    later = affinity_key("chat", chat("plan a trip to Lyon", "Sure: day one...", "and day two?"), PREFIX_CHARS)
    other = affinity_key("chat", chat("plan a trip to Oslo"), PREFIX_CHARS)
    assert first is not None and first == later
    assert other != first
    assert affinity_key("chat", chat("plan a trip to Lyon", system={"role": "system", "content": "Be terse."}),
                        PREFIX_CHARS) != first
    # The role is part of it: the same words said by the developer are another prompt.
    assert affinity_key("chat", chat("x", system={**SYSTEM, "role": "developer"}), PREFIX_CHARS) != affinity_key(
        "chat", chat("x"), PREFIX_CHARS)


def test_the_key_reads_at_most_its_bound() -> None:
    long = {"role": "system", "content": "s" * 10_000}
    assert affinity_key("chat", chat("one", system=long), 4096) == affinity_key("chat", chat("two", system=long), 4096)
    assert affinity_key("chat", chat("one", system=long), 20_000) != affinity_key("chat", chat("two", system=long),
                                                                                  20_000)
    # Text parts count as their text; other parts (an image) do not.
    parts = {"role": "user", "content": [{"type": "text", "text": "plan a trip"}, {"type": "image_url"}]}
    assert affinity_key("chat", {"messages": [SYSTEM, parts]}, 100) == affinity_key("chat", chat("plan a trip"), 100)
    assert affinity_key("completion", {"prompt": "a" * 50 + "b"}, 50) == affinity_key("completion", {"prompt": "a" * 50},
                                                                                     50)
    assert affinity_key("completion", {"prompt": ["abc", "zzz"]}, 50) == affinity_key("completion", {"prompt": "abc"},
                                                                                     50)


def test_no_key_when_off_or_without_text() -> None:
    assert affinity_key("chat", chat("hi"), 0) is None
    assert affinity_key("chat", {"messages": [{"role": "user", "content": ""}]}, 100) is None
    assert affinity_key("chat", {"messages": "nope"}, 100) is None
    assert affinity_key("completion", {"prompt": [1, 2, 3]}, 100) is None
    assert affinity_key("embedding", {"input": ""}, 100) is None


def test_the_key_and_the_ring_are_the_same_in_another_process() -> None:
    """Gateways are separate processes with their own hash seeds: the key and the ring owe nothing to `hash()`."""
    body = chat("plan a trip to Lyon")
    ids = [f"m-r{i}" for i in range(5)]
    here = affinity_key("chat", body, PREFIX_CHARS)
    assert here is not None
    code = ("import json, sys; from llmgw.gateway.affinity import Ring, affinity_key; "
            f"k = affinity_key('chat', json.loads(sys.argv[1]), {PREFIX_CHARS}); "
            f"print(k, Ring({ids!r}).owner(k))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code, json.dumps(body)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout.split()
        assert out == [str(here), Ring(ids).owner(here)]


# --- the definition's routing and the setting --------------------------------------------------


def _model(**extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": "m", "engine": "sim", "source": "sim://m", **extra})


def test_affinity_defaults_by_role_and_can_be_set() -> None:
    assert _model().affinity_chars() == PREFIX_CHARS
    assert _model(role="guard").affinity_chars() == PREFIX_CHARS
    assert _model(role="embedding").affinity_chars() == 0
    assert _model(role="rerank").affinity_chars() == 0  # a rerank is scored whole: no prompt cache to share
    assert _model(routing={"affinity": "off"}).affinity_chars() == 0
    assert _model(role="embedding", routing={"affinity": "prefix", "prefix_chars": 512}).affinity_chars() == 512
    assert _model(routing={"prefix_chars": 100}).affinity_chars() == 100


def test_routing_is_checked_and_written_only_when_set() -> None:
    with pytest.raises(DefinitionError) as caught:
        _model(routing={"affinity": "sticky", "prefix_chars": 0, "ring": 3})
    fields = [f for f, _ in caught.value.errors]
    assert fields == ["routing.ring", "routing.affinity", "routing.prefix_chars"]
    assert "must be one of prefix, off" in str(caught.value)
    with pytest.raises(DefinitionError, match="routing: must be an object"):
        _model(routing="prefix")
    plain = _model()
    assert plain.routing is DEFAULT_ROUTING and "routing" not in plain.to_doc()
    assert _model(routing={"affinity": None}).routing is DEFAULT_ROUTING
    set_ = _model(routing={"affinity": "off"})
    assert set_.to_doc()["routing"] == {"affinity": "off", "prefix_chars": PREFIX_CHARS}
    assert ModelDef.from_doc(set_.to_doc()) == set_
    # In the replicated state: absent at its default (an older member reads it), kept when set.
    state = ClusterState(models=MappingProxyType({"a": plain, "b": replace(set_, name="b")}))
    doc = state_to_json(state)
    assert "routing" not in doc["state"]["models"]["a"] and doc["state"]["models"]["b"]["routing"]["affinity"] == "off"
    assert state_from_json(doc).models["b"].routing == Routing(affinity="off")


def test_the_load_factor_setting() -> None:
    validate("gateway.affinity_load_factor", 0.5)
    validate("gateway.affinity_load_factor", 0)
    for bad in (-1, True, "0.2", float("inf")):
        with pytest.raises(SettingError):
            validate("gateway.affinity_load_factor", bad)


# --- the ring: consistent, and bounded ----------------------------------------------------------

_ids = st.lists(st.text("abcdefgh0123456789-", min_size=1, max_size=8), min_size=1, max_size=12, unique=True)
_keys = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=200)


@settings(max_examples=60, deadline=None)
@given(ids=_ids, extra=st.text("xyz", min_size=1, max_size=4), keys=_keys)
def test_a_replica_joining_or_leaving_moves_only_its_share(ids: list[str], extra: str, keys: list[int]) -> None:
    before, after = Ring(ids), Ring([*ids, extra])
    for key in keys:
        old, new = before.owner(key), after.owner(key)
        assert new in (old, extra)  # joining: a key moves only to the newcomer
        if new != extra:
            assert old == new  # leaving (after -> before): only the leaver's keys move
    assert Ring(list(reversed(ids))).ids == before.ids  # the order the table lists them in does not matter


def test_each_replica_owns_about_its_share() -> None:
    ring = Ring([f"r{i}" for i in range(8)])
    owners: dict[str, int] = {}
    for i in range(8000):
        key = affinity_key("completion", {"prompt": f"conversation {i}"}, 100)
        assert key is not None
        owners[ring.owner(key)] = owners.get(ring.owner(key), 0) + 1
    assert len(owners) == 8 and max(owners.values()) < 1.5 * 1000 and min(owners.values()) > 0.5 * 1000


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 10), load_factor=st.sampled_from([0.0, 0.1, 0.25, 1.0]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 2**64 - 1)), max_size=100))
def test_no_replica_passes_the_load_bound(n: int, load_factor: float, ops: list[tuple[bool, int]]) -> None:
    """Requests with keys, some released on the way: each pick stays within ceil((1 + ε) × the mean), mean
    with it; while none is released, no replica is ever above the bound of the mean now."""
    async def scenario() -> None:
        router = Router()
        router.update_routes({"m": ready("m", *(f"r{i}" for i in range(n)))})
        held: list[Lease] = []
        only_picks = True
        for release, key in ops:
            if release and held:
                await held.pop(key % len(held)).__aexit__(None, None, None)
                only_picks = False
                continue
            total = sum(router.statistics().replicas.values())
            lease = router.acquire("m", deadline=far(), affinity=key, load_factor=load_factor)
            endpoint = await lease.__aenter__()
            held.append(lease)
            counts = router.statistics().replicas
            assert counts[endpoint.replica_id] <= load_bound(total, n, load_factor)
            if only_picks:
                assert max(counts.values()) <= load_bound(total, n, load_factor)
            if n > 1 and counts[endpoint.replica_id] == 1 and total == 0:
                assert endpoint.replica_id == Ring([f"r{i}" for i in range(n)]).owner(key)  # idle: its owner
        for lease in held:
            await lease.__aexit__(None, None, None)
        assert set(router.statistics().replicas.values()) == {0}

    trio.run(scenario)


def test_the_load_bound_allows_exactly_a_share() -> None:
    assert load_bound(0, 4, 0.25) == 1
    assert load_bound(7, 4, 0.25) == 3  # 1.25 * 8 / 4 = 2.5
    assert load_bound(7, 4, 0.0) == 2
    assert load_bound(3, 4, 0.0) == 1


# --- the router with a key ----------------------------------------------------------------------


def ready(model: str, *replicas: str) -> ModelRoute:
    return ModelRoute(model, "chat", "ready", tuple(Endpoint(r, f"http://{r}.test") for r in replicas))


def far() -> float:
    return trio.current_time() + 120


async def test_a_key_goes_to_its_ring_owner_until_it_is_loaded() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b", "c")})
    ring = Ring(["a", "b", "c"])
    key = 12345678901234567
    owner = ring.owner(key)
    for _ in range(4):  # sequential: always the owner, where least-outstanding would rotate
        async with router.acquire("m", deadline=far(), affinity=key) as endpoint:
            assert endpoint.replica_id == owner
    held = [router.acquire("m", deadline=far(), affinity=key, load_factor=0.0) for _ in range(6)]
    got = [(await lease.__aenter__()).replica_id for lease in held]
    assert got.count(owner) == 2 and sorted(got) == ["a", "a", "b", "b", "c", "c"]  # spilled over at its share
    for lease in held:
        await lease.__aexit__(None, None, None)
    assert router.statistics().replicas == {"a": 0, "b": 0, "c": 0}


async def test_a_replica_out_of_rotation_is_passed_over_and_a_join_moves_only_its_share(
        autojump_clock: trio.testing.MockClock) -> None:
    router = Router(probe_s=10)
    router.update_routes({"m": ready("m", "a", "b", "c")})
    keys = [affinity_key("completion", {"prompt": f"p{i}"}, 100) or 0 for i in range(60)]
    owners = {}
    for key in keys:
        async with router.acquire("m", deadline=far(), affinity=key) as endpoint:
            owners[key] = endpoint.replica_id
    # The owner of keys[0] refuses: its keys go elsewhere, the others stay.
    lease = router.acquire("m", deadline=far(), affinity=keys[0])
    first = await lease.__aenter__()
    assert first.replica_id == owners[keys[0]]
    assert lease.refused() is not None
    await lease.__aexit__(None, None, None)
    for key in keys:
        async with router.acquire("m", deadline=far(), affinity=key) as endpoint:
            assert (endpoint.replica_id == owners[key]) == (owners[key] != first.replica_id)
    await trio.sleep(11)  # its probe is due: back to it, and it answers
    lease = router.acquire("m", deadline=far(), affinity=keys[0])
    assert (await lease.__aenter__()).replica_id == first.replica_id
    lease.reached()
    await lease.__aexit__(None, None, None)
    # A fourth replica joins: a key moves only to it.
    router.update_routes({"m": ready("m", "a", "b", "c", "d")})
    moved = 0
    for key in keys:
        async with router.acquire("m", deadline=far(), affinity=key) as endpoint:
            assert endpoint.replica_id in (owners[key], "d")
            moved += endpoint.replica_id == "d"
    assert 0 < moved < len(keys)


async def test_without_a_key_the_pick_is_least_outstanding() -> None:
    router = Router()
    router.update_routes({"m": ready("m", "a", "b", "c")})
    seen = []
    for _ in range(6):
        async with router.acquire("m", deadline=far()) as endpoint:
            seen.append(endpoint.replica_id)
    assert seen == ["a", "b", "c", "a", "b", "c"]


def test_a_prompt_cache_key_names_the_key_whatever_the_text() -> None:
    one = {"messages": [{"role": "user", "content": "first turn"}], "prompt_cache_key": "conv-7"}
    other = {"messages": [{"role": "system", "content": "else"}], "prompt_cache_key": "conv-7"}
    assert affinity_key("chat", one, 64) == affinity_key("chat", other, 64) is not None
    assert affinity_key("chat", one, 64) != affinity_key("chat", {**one, "prompt_cache_key": "conv-8"}, 64)
    assert affinity_key("chat", one, 64) != affinity_key("chat", {"messages": one["messages"]}, 64)
    assert affinity_key("completion", {"prompt": "x", "prompt_cache_key": "conv-7"}, 64) == affinity_key(
        "chat", one, 64)
    assert affinity_key("chat", one, 0) is None  # affinity off: the key changes nothing
    for unnamed in ("", None, 7):
        assert affinity_key("chat", {**one, "prompt_cache_key": unnamed}, 64) == affinity_key(
            "chat", {"messages": one["messages"]}, 64)
