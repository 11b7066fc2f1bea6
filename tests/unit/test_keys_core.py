"""API keys in the core and at the gateway's door: their shape, the key commands (old logs and
snapshots replay), the table a gateway follows, and `KeyCheck` (scope, expiry, per-key limits)
on a clock the test moves."""

from __future__ import annotations

import re
from typing import Any

import pytest

from llmgw.domain import commands as C
from llmgw.domain import levels
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.keys import KEY_PREFIX, hash_key, legacy_key_id, new_key, new_key_id
from llmgw.domain.model import ModelDef
from llmgw.domain.state import ApiKey, ClusterState
from llmgw.errors import OpenAIError
from llmgw.gateway.auth import KeyCheck
from llmgw.wire import protocol

CLIENT = "sk-llmgw-client-for-tests"


def state_with(*cmds: dict[str, Any]) -> ClusterState:
    state = ClusterState(store_level=levels.LEVEL)  # a group of this release
    for c in cmds:
        state, _ = C.apply(state, c)
    return state


# --- the key itself ---------------------------------------------------------------------------


def test_a_new_key_is_prefixed_base62_with_at_least_128_random_bits() -> None:
    made = {new_key() for _ in range(200)}
    assert len(made) == 200
    for key in made:
        assert re.fullmatch(KEY_PREFIX + r"[0-9A-Za-z]{32}", key)  # 32 * log2(62) = 190 bits
    # Every base62 character shows up: the alphabet is used whole, not a hex subset.
    assert len({ch for key in made for ch in key[len(KEY_PREFIX):]}) == 62
    assert re.fullmatch(r"key_[0-9A-Za-z]{12}", new_key_id())


def test_the_hash_is_what_it_was_so_old_keys_keep_working() -> None:
    # A stored hash from before stays valid: unsalted SHA-256 of the key, as it always was.
    assert hash_key("sk-secret") == "sha256:746b4ad1ca9129e1caf080bf9406d43531b8bbf97f42cc1597ee4f3d4663938e"


# --- commands -----------------------------------------------------------------------------------


def test_add_carries_scope_expiry_limits_and_a_random_id() -> None:
    h = hash_key(CLIENT)
    cmd = C.add_key(h, "ci", "client", 5.0, models=["b", "a", "a"], expires_at=100.0, requests_per_min=60,
                    tokens_per_min=1000)
    state, result = C.apply(ClusterState(), cmd)
    key = state.keys[h]
    assert result == {"added": True, "id": cmd["key_id"]} and key.id == cmd["key_id"]
    assert (key.models, key.expires_at, key.requests_per_min, key.tokens_per_min) == (("a", "b"), 100.0, 60, 1000)
    assert key.scope == frozenset({"a", "b"})
    assert C.add_key(h, "ci", "client", 5.0)["key_id"] != cmd["key_id"]


def test_a_key_add_logged_before_scopes_replays_to_an_unscoped_unlimited_key() -> None:
    old = {"v": 1, "op": "key.add", "at": 1.0, "key_hash": hash_key(CLIENT), "name": "client", "role": "client"}
    state, outcome = C.apply_entry(ClusterState(), C.encode(old))
    key = state.keys[hash_key(CLIENT)]
    assert outcome.ok and key.key_id == "" and key.id == legacy_key_id(key.key_hash)
    assert (key.models, key.scope, key.expires_at, key.requests_per_min, key.tokens_per_min) == ((), None, None, None,
                                                                                                 None)


def test_a_snapshot_written_before_scopes_reads_with_the_defaults() -> None:
    doc = state_to_json(state_with(C.add_key(hash_key(CLIENT), "client", "client", 1.0)))
    for field in ("key_id", "models", "expires_at", "requests_per_min", "tokens_per_min"):
        del doc["state"]["keys"][hash_key(CLIENT)][field]
    key = state_from_json(doc).keys[hash_key(CLIENT)]
    assert key == ApiKey(hash_key(CLIENT), "client", "client", 1.0)
    assert key.id == legacy_key_id(hash_key(CLIENT)) == ApiKey(hash_key(CLIENT), "x", "client", 9.0).id


@pytest.mark.parametrize(("fields", "words"), [
    ({"role": "root"}, "role must be one of admin, client"),
    ({"models": "demo"}, "models must be a list"),
    ({"models": [""]}, "models must be a list"),
    ({"expires_at": "tomorrow"}, "expires_at must be a unix time"),
    ({"requests_per_min": 0}, "requests_per_min must be a whole number"),
    ({"tokens_per_min": 1.5}, "tokens_per_min must be a whole number"),
    ({"requests_per_min": True}, "requests_per_min must be a whole number"),
    ({"role": "admin", "requests_per_min": 5}, "only client keys take a scope"),
    ({"key_id": "nope"}, "key_id must be key_"),
    ({"priority": "urgent"}, "priority must be one of system, interactive, default, bulk"),
    ({"role": "admin", "priority": "system"}, "only client keys take a scope, an expiry, limits or a priority"),
])
def test_a_bad_key_command_is_refused_with_words(fields: dict[str, Any], words: str) -> None:
    cmd = {**C.add_key(hash_key(CLIENT), "n", "client", 1.0), **fields}
    with pytest.raises(C.CommandError) as e:
        C.apply(ClusterState(), cmd)
    assert e.value.code == "invalid_key" and words in e.value.message


def test_revoke_by_id_and_never_the_last_admin_key() -> None:
    add_admin = C.add_key(hash_key("adm"), "ops", "admin", 1.0)
    add_client = C.add_key(hash_key(CLIENT), "ci", "client", 1.0)
    state = state_with(add_admin, add_client)
    after, result = C.apply(state, C.revoke_key(add_client["key_id"], 2.0))
    assert result == {"revoked": True, "id": add_client["key_id"]} and set(after.keys) == {hash_key("adm")}
    again, result = C.apply(after, C.revoke_key(add_client["key_id"], 3.0))
    assert result == {"revoked": False, "id": add_client["key_id"]} and again.keys == after.keys
    with pytest.raises(C.CommandError) as e:
        C.apply(state, C.revoke_key(add_admin["key_id"], 2.0))
    assert e.value.code == "last_admin_key"
    second = state_with(add_admin, add_client, C.add_key(hash_key("adm2"), "ops2", "admin", 1.0))
    assert hash_key("adm") not in C.apply(second, C.revoke_key(add_admin["key_id"], 2.0))[0].keys
    legacy = state_with({"v": 1, "op": "key.add", "at": 1.0, "key_hash": hash_key(CLIENT), "name": "c",
                         "role": "client"}, add_admin)
    assert C.apply(legacy, C.revoke_key(legacy_key_id(hash_key(CLIENT)), 2.0))[1]["revoked"] is True


def test_a_taken_id_is_refused() -> None:
    add = C.add_key(hash_key("a"), "a", "client", 1.0)
    with pytest.raises(C.CommandError) as e:
        C.apply(state_with(add), C.add_key(hash_key("b"), "b", "client", 1.0, key_id=add["key_id"]))
    assert e.value.code == "key_id_taken"


def test_a_retried_create_is_the_same_request_though_its_secret_and_id_are_new() -> None:
    first = C.with_cid(C.add_key(hash_key("one"), "ci", "client", 1.0, requests_per_min=5), "c1")
    retry = C.with_cid(C.add_key(hash_key("two"), "ci", "client", 2.0, requests_per_min=5), "c1")
    other = C.with_cid(C.add_key(hash_key("two"), "ci", "client", 2.0, requests_per_min=6), "c1")
    assert C.digest(first) == C.digest(retry) != C.digest(other)
    state, outcome = C.apply_entry(ClusterState(), first)
    again, replayed = C.apply_entry(state, retry)
    assert again is state and replayed.plain_result()["id"] == first["key_id"], "the first key's id comes back"


# --- the table a gateway follows ----------------------------------------------------------------


def test_the_table_carries_ids_scopes_and_limits_never_a_key() -> None:
    add = C.add_key(hash_key(CLIENT), "ci", "client", 1.0, models=["demo"], expires_at=50.0, tokens_per_min=9)
    state = state_with(add)
    message = protocol.table_message(1, "me", state, None)
    assert message["keys"] == [{"hash": hash_key(CLIENT), "id": add["key_id"], "name": "ci", "role": "client",
                                "models": ["demo"], "expires_at": 50.0, "requests_per_min": None,
                                "tokens_per_min": 9, "priority": "default"}]
    assert CLIENT not in protocol.dumps(message)
    read = protocol.read_table(protocol.loads(protocol.dumps(message))).state.keys[hash_key(CLIENT)]
    assert (read.id, read.models, read.expires_at, read.tokens_per_min) == (add["key_id"], ("demo",), 50.0, 9)
    # An older leader sends hash, name and role only: an unscoped, unlimited key.
    older = {**message, "keys": [{"hash": hash_key(CLIENT), "name": "ci", "role": "client"}]}
    key = protocol.read_table(older).state.keys[hash_key(CLIENT)]
    assert key.scope is None and key.requests_per_min is None and key.id == legacy_key_id(hash_key(CLIENT))


def test_a_key_carries_its_priority_class_to_the_state_the_snapshot_and_the_gateway() -> None:
    """`priority` is written in the command, the snapshot and the table only when it is not the default, so a
    plain key is what an older member or gateway reads; an older leader's table (no priority) reads default."""
    plain = C.add_key(hash_key(CLIENT), "ci", "client", 1.0)
    assert "priority" not in plain
    assert "priority" not in state_to_json(state_with(plain))["state"]["keys"][hash_key(CLIENT)]
    bulk = C.add_key(hash_key(CLIENT), "ci", "client", 1.0, priority="bulk")
    state = state_with(bulk)
    assert state.keys[hash_key(CLIENT)].priority == "bulk"
    assert state_from_json(state_to_json(state)) == state
    message = protocol.read_table(protocol.loads(protocol.dumps(protocol.table_message(1, "me", state, None))))
    assert message.state.keys[hash_key(CLIENT)].priority == "bulk"
    older = {"hash": hash_key(CLIENT), "name": "ci", "role": "client"}
    assert protocol.key_from_doc(older).priority == "default"
    assert protocol.key_from_doc({**older, "priority": "urgent"}).priority == "default"  # a newer leader's class


def test_the_priority_header_lowers_or_keeps_the_class_never_raises_it() -> None:
    check, snap = KeyCheck(), snap_with(priority="interactive")
    key = check.admit(headers(), snap)
    rank = {name: i for i, name in enumerate(("system", "interactive", "default", "bulk"))}
    assert check.priority(key, headers()) == rank["interactive"]
    assert check.priority(key, [(b"x-llmgw-priority", b" Bulk ")]) == rank["bulk"]
    for asked in ("interactive", "default", "bulk"):
        assert check.priority(key, [*headers(), (b"x-llmgw-priority", asked.encode())]) == rank[asked]
    with pytest.raises(OpenAIError) as e:
        check.priority(key, [(b"x-llmgw-priority", b"system")])
    assert (e.value.status, e.value.code) == (403, "priority_not_allowed")
    assert "'interactive'" in e.value.message and "'system'" in e.value.message
    with pytest.raises(OpenAIError) as e:
        check.priority(key, [(b"x-llmgw-priority", b"urgent")])
    assert (e.value.status, e.value.code) == (400, "invalid_priority") and "system, interactive" in e.value.message


# --- KeyCheck: the gateway's door, on a clock the test moves --------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def snap_with(**fields: Any) -> ClusterState:
    model = ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"})
    other = ModelDef.from_doc({"name": "other", "engine": "sim", "source": "sim://other"})
    return state_with(C.put_model(model, 0.0), C.put_model(other, 0.0),
                      C.add_key(hash_key(CLIENT), "ci", "client", 0.0, key_id="key_client", **fields),
                      C.add_key(hash_key("adm"), "ops", "admin", 0.0))


def headers(key: str | None = CLIENT) -> list[tuple[bytes, bytes]]:
    return [] if key is None else [(b"authorization", f"Bearer {key}".encode())]


def refusal(check: KeyCheck, snap: ClusterState, key: str | None = CLIENT) -> OpenAIError:
    with pytest.raises(OpenAIError) as e:
        check.admit(headers(key), snap)
    return e.value


def test_no_key_an_unknown_key_and_an_admin_key_are_refused_alike() -> None:
    check, snap = KeyCheck(), snap_with()
    assert check.admit(headers(), snap).id == "key_client"
    for key in (None, "sk-unknown", "adm"):
        error = refusal(check, snap, key)
        assert (error.status, error.code) == (401, "invalid_api_key")
        assert (b"www-authenticate", b"Bearer") in error.headers
    assert refusal(check, snap, "adm").message == refusal(check, snap, "sk-unknown").message


def test_an_expired_key_is_refused_as_such() -> None:
    wall = Clock()
    check, snap = KeyCheck(wall=wall), snap_with(expires_at=1500.0)
    assert check.admit(headers(), snap)
    wall.t = 1500.0
    error = refusal(check, snap)
    assert (error.status, error.code) == (401, "key_expired") and "key_client" in error.message
    assert "1970-01-01 00:25:00 UTC" in error.message


def test_a_scope_answers_out_of_scope_as_missing_and_lists_only_its_models() -> None:
    check = KeyCheck()
    scoped = snap_with(models=["demo", "gone"])
    key = check.admit(headers(), scoped)
    assert check.model(key, scoped, "demo").name == "demo"
    out, missing = (pytest.raises(OpenAIError), pytest.raises(OpenAIError))
    with out as a:
        check.model(key, scoped, "other")
    with missing as b:
        check.model(key, scoped, "gone")
    # Out of scope and absent read the same: a scoped key cannot learn the catalog's names.
    assert (a.value.status, a.value.code) == (b.value.status, b.value.code) == (404, "model_not_found")
    assert a.value.message.replace("other", "X") == b.value.message.replace("gone", "X")
    assert check.visible(key, scoped.models) == ["demo"]
    open_key = check.admit(headers(), snap_with())
    assert check.visible(open_key, ["other", "demo"]) == ["demo", "other"]


def test_requests_per_minute_with_retry_after() -> None:
    now = Clock()
    check, snap = KeyCheck(now=now), snap_with(requests_per_min=3)
    for _ in range(3):  # a full minute's allowance may come at once
        check.admit(headers(), snap)
    error = refusal(check, snap)
    assert (error.status, error.code) == (429, "rate_limited") and "3 requests per minute" in error.message
    assert dict(error.headers) == {b"retry-after": b"20", b"retry-after-ms": b"20000"}
    now.t += 19.0
    assert dict(refusal(check, snap).headers)[b"retry-after"] == b"1"
    now.t += 1.0
    check.admit(headers(), snap)
    refusal(check, snap)


def test_tokens_per_minute_are_charged_after_the_answer() -> None:
    now = Clock()
    check, snap = KeyCheck(now=now), snap_with(tokens_per_min=600)
    key = check.admit(headers(), snap)
    check.admit(headers(), snap)  # nothing charged yet: requests are not refused on a guess
    check.charge(key, 500, 400)  # 900 of 600: 300 in debt
    error = refusal(check, snap)
    assert error.code == "rate_limited" and "600 tokens per minute" in error.message
    assert dict(error.headers)[b"retry-after"] == b"31"  # 300 tokens at 10/s, then one more
    check.charge(key, None, None)  # unknown usage charges nothing
    now.t += 31.0
    check.admit(headers(), snap)


def test_keys_without_limits_keep_no_counters() -> None:
    check, snap = KeyCheck(), snap_with()
    key = check.admit(headers(), snap)
    check.charge(key, 10**9, 10**9)
    check.admit(headers(), snap)
    assert not check._requests and not check._tokens
