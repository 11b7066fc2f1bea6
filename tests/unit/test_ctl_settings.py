"""`llmgw ctl settings`: list, show one, set one; VALUE is JSON, else a plain string."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctl_fakes import FakeApi, columns, ctl
from llmgw.cli.ctl.settings import parse_setting_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("false", False),
        ("5", 5),
        ("2.5", 2.5),
        ("-1", -1),
        ('["https://hooks.example/a"]', ["https://hooks.example/a"]),
        ('{"a": 1}', {"a": 1}),
        ('"quoted"', "quoted"),
        ("null", None),
        ("plain words", "plain words"),
        ("https://hooks.example/a", "https://hooks.example/a"),
        ("NaN", "NaN"),
        ("", ""),
    ],
)
def test_setting_value_is_json_else_a_plain_string(text: str, value: Any) -> None:
    assert parse_setting_value(text) == value
    api = FakeApi().on("PUT", "/api/v1/settings/some.key", json_body={"key": "some.key", "value": value})
    r = ctl(["settings", "some.key", text], api)
    assert r.rc == 0, r.err
    assert json.loads(api.requests[0].content) == value
    assert r.out == f"some.key = {json.dumps(value, ensure_ascii=False)}\n"


def test_settings_list_and_get() -> None:
    settings = {
        "serving.stopped": {"value": False, "default": False, "help": "stop serving", "set": False},
        "notify.webhooks": {"value": ["https://h.example/x"], "default": [], "help": "hooks", "set": True},
    }
    api = (
        FakeApi()
        .on("GET", "/api/v1/settings", json_body={"settings": settings})
        .on(
            "GET",
            "/api/v1/settings/notify.webhooks",
            json_body={"key": "notify.webhooks", "value": ["https://h.example/x"], "default": [], "set": True},
        )
    )
    r = ctl(["settings"], api)
    assert r.rc == 0, r.err
    rows = columns(r.out, "KEY ")
    assert rows[0] == ["KEY", "VALUE", "SET", "DEFAULT", "HELP"]
    assert rows[1] == ["notify.webhooks", '["https://h.example/x"]', "yes", "[]", "hooks"]
    assert rows[2] == ["serving.stopped", "false", "no", "false", "stop serving"]
    r = ctl(["settings", "notify.webhooks"], api)
    assert r.out == 'notify.webhooks = ["https://h.example/x"]   (default []; set)\n'
