"""`llmgw ctl nodes token create|list|remove`, `ctl nodes certs`, `ctl nodes revoke` and `ctl ca show|rotate`:
the requests they send, and what they print (a token once, with the command that uses it; each machine's
certificate; unknown as `-`)."""

from __future__ import annotations

from ctl_fakes import FakeApi, columns, ctl

MADE = {"id": "tok_8HfQ2aaaaaaa", "token": "llmgw-join-" + "Z" * 32, "role": "agent", "name": "gpu-07",
        "expires_at": 1_800_003_600.0, "ca_hash": "sha256:" + "ab" * 32}


def test_token_create_asks_for_the_role_name_and_life_and_prints_the_token_once_with_its_join_command() -> None:
    api = FakeApi().on("POST", "/api/v1/trust/tokens", 201, json_body=MADE)
    r = ctl(["nodes", "token", "create", "--role", "agent", "--name", "gpu-07", "--ttl", "30m"], api)
    assert r.rc == 0, r.err
    [body] = api.bodies()
    assert body["role"] == "agent" and body["name"] == "gpu-07" and abs(body["ttl_s"] - 1800) < 2
    assert r.out.count(MADE["token"]) == 2  # the token, then the command line that uses it
    assert f"--join-token {MADE['token']} --ca-hash {MADE['ca_hash']} --node gpu-07" in r.out
    assert "shown this once" in r.out


def test_token_list_and_remove() -> None:
    api = FakeApi().on("GET", "/api/v1/trust/tokens", json_body={"tokens": [
        {"id": "tok_a", "role": "gateway", "name": None, "expires_at": 1_800_000_000.0, "used_by": None}]})
    r = ctl(["nodes", "token", "list"], api)
    assert r.rc == 0, r.err
    assert columns(r.out, "ID ")[1] == ["tok_a", "gateway", "-", "2027-01-15 08:00 UTC", "-"]
    api = FakeApi().on("DELETE", "/api/v1/trust/tokens/tok_a", json_body={"id": "tok_a", "removed": True})
    assert ctl(["nodes", "token", "remove", "tok_a"], api).out.strip() == "removed join token tok_a"


def test_certs_show_each_machine_and_revoke_names_what_it_revoked() -> None:
    api = FakeApi().on("GET", "/api/v1/trust/machines", json_body={"machines": [
        {"role": "agent", "name": "gpu-07", "serial": "1f4849346cb348c710cf", "not_after": 1_800_000_000.0,
         "revoked": False},
        {"role": "gateway", "name": "gw1", "serial": "77aa", "not_after": 1_800_000_000.0, "revoked": True}]})
    rows = columns(ctl(["nodes", "certs"], api).out, "ROLE ")
    assert rows[1][:3] == ["agent", "gpu-07", "1f4849346cb348c7"] and rows[1][-1] == "no"
    assert rows[2][-1] == "revoked"
    api = FakeApi().on("POST", "/api/v1/trust/machines/gateway/gw1/revoke",
                       json_body={"role": "gateway", "name": "gw1", "revoked": ["77aa", "77ab"]})
    r = ctl(["nodes", "revoke", "gw1", "--role", "gateway"], api)
    assert r.rc == 0 and r.out.strip() == "revoked gateway gw1: certificates 77aa, 77ab"


def test_a_refused_revoke_says_why() -> None:
    api = FakeApi().on("POST", "/api/v1/trust/machines/agent/nope/revoke", 404, json_body={
        "error": {"code": "machine_not_found", "message": "no agent named 'nope' holds a certificate"}})
    r = ctl(["nodes", "revoke", "nope"], api)
    assert r.rc != 0 and "no agent named 'nope'" in r.err


def test_ca_show_and_rotate() -> None:
    doc = {"ca_hash": "sha256:" + "cd" * 32, "root_held_here": True, "bundle": "-----BEGIN CERTIFICATE-----...",
           "authorities": [{"id": "1c7448fa5963acf954fd", "active": True, "not_after": 1_860_000_000.0,
                            "added_at": 1.0, "subject": "CN=llmgw intermediate CA 1,O=llmgw"}]}
    r = ctl(["ca"], FakeApi().on("GET", "/api/v1/trust/ca", json_body=doc))
    assert r.rc == 0 and "sha256:" + "cd" * 32 in r.out and "signs" in r.out
    r = ctl(["ca", "rotate"], FakeApi().on("POST", "/api/v1/trust/ca/rotate", 201, json_body=doc))
    assert r.rc == 0 and "1c7448fa5963acf9" in r.out
