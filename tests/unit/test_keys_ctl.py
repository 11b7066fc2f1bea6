"""`llmgw ctl keys` (list, create, revoke): the requests it sends, what it prints (the secret once,
ids never hashes, `-` for no limit), and `--expires` read as a duration or a date."""

from __future__ import annotations

import json

import pytest

from ctl_fakes import FakeApi, columns, ctl
from llmgw.cli.ctl.errors import CtlError
from llmgw.cli.ctl.keys import parse_expiry

KEYS = {"keys": [
    {"id": "key_adm000000001", "name": "admin", "role": "admin", "created_at": 1_700_000_000.0, "models": [],
     "expires_at": None, "expired": False, "requests_per_min": None, "tokens_per_min": None},
    {"id": "key_ci0000000001", "name": "ci bot", "role": "client", "created_at": 1_700_000_100.0,
     "models": ["demo", "embed"], "expires_at": 1_700_086_400.0, "expired": True, "requests_per_min": 60,
     "tokens_per_min": 10000, "priority": "bulk"},
    {"id": "key_open00000001", "name": "open", "role": "client", "created_at": None, "models": [],
     "expires_at": None, "expired": False, "requests_per_min": None, "tokens_per_min": None},
]}


def test_list_shows_ids_scopes_expiry_and_limits() -> None:
    result = ctl(["keys"], FakeApi().on("GET", "/api/v1/keys", json_body=KEYS))
    assert result.rc == 0, result.err
    rows = columns(result.out, "ID")
    assert rows[0] == ["ID", "NAME", "ROLE", "MODELS", "EXPIRES", "REQ/MIN", "TOKENS/MIN", "PRIORITY", "CREATED"]
    assert rows[1] == ["key_adm000000001", "admin", "admin", "-", "-", "-", "-", "-", "2023-11-14 22:13 UTC"]
    assert rows[2] == ["key_ci0000000001", "ci bot", "client", "demo, embed", "2023-11-15 22:13 UTC (expired)",
                       "60", "10000", "bulk", "2023-11-14 22:15 UTC"]
    assert rows[3] == ["key_open00000001", "open", "client", "all", "-", "-", "-", "-", "-"]
    empty = ctl(["keys", "list"], FakeApi().on("GET", "/api/v1/keys", json_body={"keys": []}))
    assert "no keys" in empty.out


def test_create_sends_the_fields_and_prints_the_secret_once() -> None:
    answer = {"id": "key_new000000001", "name": "ci", "role": "client", "key": "sk-llmgw-" + "x" * 32,
              "models": ["demo"], "warnings": ["model 'later' is not in the catalog (yet)"]}
    api = FakeApi().on("POST", "/api/v1/keys", 201, json_body=answer)
    result = ctl(["keys", "create", "ci", "--model", "demo", "--model", "later", "--rpm", "60", "--tpm", "5000",
                  "--expires", "2030-01-01"], api)
    assert result.rc == 0, result.err
    assert api.bodies() == [{"name": "ci", "role": "client", "models": ["demo", "later"], "requests_per_min": 60,
                             "tokens_per_min": 5000, "expires_at": 1893456000.0}]
    assert "Idempotency-Key" in api.requests[0].headers
    assert result.out.count("sk-llmgw-" + "x" * 32) == 1 and "shown this once" in result.out
    assert "warning: model 'later' is not in the catalog (yet)" in result.out
    as_json = ctl(["--json", "keys", "create", "ci"], api)
    assert json.loads(as_json.out)["key"] == answer["key"]
    assert api.bodies()[-1] == {"name": "ci", "role": "client"}
    assert ctl(["keys", "create", "batch", "--priority", "bulk"], api).rc == 0
    assert api.bodies()[-1] == {"name": "batch", "role": "client", "priority": "bulk"}


def test_revoke_deletes_by_id_and_shows_a_refusal() -> None:
    api = FakeApi().on("DELETE", "/api/v1/keys/key_ci0000000001", json_body={"revoked": "key_ci0000000001"})
    result = ctl(["keys", "revoke", "key_ci0000000001"], api)
    assert result.rc == 0 and result.out.strip() == "revoked key_ci0000000001"
    refused = FakeApi().on("DELETE", "/api/v1/keys/key_adm000000001", 409, json_body={"error": {
        "code": "last_admin_key", "message": "key_adm000000001 is the cluster's last admin key"}})
    result = ctl(["keys", "revoke", "key_adm000000001"], refused)
    assert result.rc != 0 and "last admin key" in result.err


def test_expiry_as_a_duration_or_a_date() -> None:
    now = 1_000_000.0
    assert parse_expiry("90d", now) == now + 90 * 86400
    assert parse_expiry("1.5h", now) == now + 5400
    assert parse_expiry("2030-01-01T12:00:00Z", now) == 1893499200.0
    assert parse_expiry("2030-01-01T13:00:00+01:00", now) == 1893499200.0
    for bad in ("soon", "10y", "1970-01-01"):
        with pytest.raises(CtlError):
            parse_expiry(bad, now)
