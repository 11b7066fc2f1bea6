"""`llmgw ctl gateways` against a fake admin API: the list (unknown is `-`), and `gateways restart`, which waits
until the gateway follows the leader again as a new program (same pid, a new start), restarts a --workers
machine one worker at a time, and says the leader's refusal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from ctl_fakes import FakeApi, ctl

GATEWAY = {"name": "gw-a", "address": "10.0.0.5", "connected": True, "connected_at": 100.0, "last_contact": 101.0,
           "query_url": "https://10.0.0.5:8080", "restartable": True, "pid": 4242, "started_at": 90.0}


def listing(*docs: list[dict[str, Any]]) -> Callable[[httpx.Request], httpx.Response]:
    """GET /api/v1/gateways answering each of `docs` in turn, then the last one again."""
    answers = list(docs)

    def answer(request: httpx.Request) -> httpx.Response:
        doc = answers.pop(0) if len(answers) > 1 else answers[0]
        return httpx.Response(200, json={"gateways": doc})

    return answer


def test_the_list_shows_each_gateway_and_unknown_as_a_dash() -> None:
    api = FakeApi().on("GET", "/api/v1/gateways", json_body={"gateways": [
        GATEWAY, {"name": "old-gw", "connected": False, "restartable": False, "pid": None, "started_at": None}]})
    r = ctl(["gateways"], api)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["GATEWAY", "STATE", "ADDRESS", "PID", "STARTED", "RESTART"]
    [new] = [line for line in lines if line.startswith("gw-a")]
    [old] = [line for line in lines if line.startswith("old-gw")]
    assert "4242" in new and "in place" in new and "UTC" in new
    assert old.split()[:5] == ["old-gw", "not", "connected", "-", "-"] and "on its machine" in old


def test_restart_waits_for_the_new_program_on_a_new_stream() -> None:
    back = {**GATEWAY, "connected_at": 130.0, "started_at": 129.0}
    api = FakeApi()
    api.routes[("GET", "/api/v1/gateways")] = listing([GATEWAY], [{**GATEWAY, "connected": False}], [back])
    api.on("POST", "/api/v1/gateways/gw-a/restart", json_body={"restarting": "gw-a", "connected_at": 100.0,
                                                                "started_at": 90.0, "pid": 4242})
    r = ctl(["gateways", "restart", "gw-a"], api)
    assert r.rc == 0, r.err
    assert "gateway gw-a: restarted (pid 4242), following the leader again" in r.out
    asked = [q.url.path for q in api.requests if q.method == "POST"]
    assert asked == ["/api/v1/gateways/gw-a/restart"]


def test_a_workers_machine_restarts_one_worker_at_a_time() -> None:
    workers = [{**GATEWAY, "name": f"edge-w{i}", "pid": 10 + i} for i in (2, 1)]
    order: list[str] = []
    api = FakeApi()

    def gateways(request: httpx.Request) -> httpx.Response:  # each asked worker is back at the next look
        doc = [{**w, "started_at": 200.0, "connected_at": 201.0} if w["name"] in order else w for w in workers]
        return httpx.Response(200, json={"gateways": doc})

    def restart(name: str) -> Callable[[httpx.Request], httpx.Response]:
        def answer(request: httpx.Request) -> httpx.Response:
            assert all(n != name for n in order)
            order.append(name)
            return httpx.Response(200, json={"restarting": name, "connected_at": 100.0, "started_at": 90.0})
        return answer

    api.routes[("GET", "/api/v1/gateways")] = gateways
    for w in workers:
        api.routes[("POST", f"/api/v1/gateways/{w['name']}/restart")] = restart(str(w["name"]))
    r = ctl(["gateways", "restart", "edge"], api)
    assert r.rc == 0, r.err
    assert order == ["edge-w1", "edge-w2"]


def test_a_refusal_is_said_with_its_reason() -> None:
    api = FakeApi().on("GET", "/api/v1/gateways", json_body={"gateways": [{**GATEWAY, "restartable": False}]})
    api.on("POST", "/api/v1/gateways/gw-a/restart", 409, json_body={"error": {
        "code": "cannot_restart", "message": "gateway gw-a cannot restart in place (an older version)"}})
    r = ctl(["gateways", "restart", "gw-a"], api)
    assert r.rc != 0 and "cannot restart in place" in r.err, (r.out, r.err)
