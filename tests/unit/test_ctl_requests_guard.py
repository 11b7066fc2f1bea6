"""`ctl request` and `ctl requests` show each request's guard verdict (`guard_rule`), `-` when none applied, and
its priority class and wait for a slot (`priority`, `queue_ms`; `-` in a record written before them)."""

from __future__ import annotations

from ctl_fakes import FakeApi, ctl

from llmgw.cli.ctl.requests import render_request, render_requests

RECORD = {"id": "req-gw1-0123456789abcdef", "time": 1.7e9, "gateway": "gw1", "key": "key_1", "model": "demo",
          "endpoint": "/v1/chat/completions", "status": 400, "error": "guard_refused", "latency_ms": 3.2,
          "guard_rule": "judge: S6,Specialized Advice"}


def test_one_request_shows_its_guard_rule() -> None:
    shown = render_request({"request": RECORD})
    assert "guard rule:     judge: S6,Specialized Advice" in shown
    assert "guard rule:     -" in render_request({"request": {**RECORD, "guard_rule": ""}})


def test_a_request_shows_its_class_and_queue_time() -> None:
    shown = render_request({"request": {**RECORD, "priority": "bulk", "queue_ms": 812.25}})
    assert "priority:       bulk" in shown and "queue ms:       812.2" in shown
    assert "priority:       -" in render_request({"request": RECORD})  # written before classes
    head, row = render_requests({"requests": [{**RECORD, "priority": "interactive", "queue_ms": 0.0}]}).splitlines()[:2]
    assert head.split()[11:13] == ["QUEUE", "CLASS"]  # (after "TIME (UTC)", two words)
    assert row.split()[11:13] == ["0.0", "interactive"]


def test_the_request_list_has_a_guard_column() -> None:
    shown = render_requests({"requests": [RECORD, {**RECORD, "id": "req-gw1-1111111111111111", "guard_rule": ""}]})
    head, first, second = shown.splitlines()[:3]
    assert head.split()[-1] == "GUARD"
    assert first.endswith("judge: S6,Specialized Advice") and second.endswith(" -")


def test_requests_filters_by_priority_class() -> None:
    doc = {"requests": [{**RECORD, "priority": "bulk", "queue_ms": 5.0}], "next_cursor": None,
           "gateways": {"asked": ["gw1"], "answered": ["gw1"], "unavailable": [], "dropped": {"gw1": 0}}}
    api = FakeApi().on("GET", "/api/v1/requests?limit=50&model=demo&priority=bulk", json_body=doc)
    result = ctl(["requests", "--model", "demo", "--priority", "bulk"], api)
    assert result.rc == 0, result.err
    assert dict(api.requests[0].url.params) == {"limit": "50", "model": "demo", "priority": "bulk"}
    assert "bulk" in result.out.splitlines()[1]
    shown = ctl(["requests", "--help"])
    assert "--priority" in shown.out and "Only this priority class" in shown.out
