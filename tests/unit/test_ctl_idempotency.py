"""`llmgw ctl` sends every write with an Idempotency-Key, retries a write whose outcome is
unknown once with the same key, and says plainly when the outcome is still unknown."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

from ctl_fakes import URL, FakeApi, ctl

COMMIT_UNKNOWN = {"error": {"code": "commit_unknown", "message": "the write may or may not have been applied"}}

WRITES = [
    (["model", "remove", "demo"], "DELETE", "/api/v1/models/demo", {"removed": "demo"}),
    (["model", "retry", "demo"], "POST", "/api/v1/models/demo/retry", {"retried": "demo"}),
    (["settings", "serving.stopped", "true"], "PUT", "/api/v1/settings/serving.stopped",
     {"key": "serving.stopped", "value": True}),
    (["model", "serve", "--name", "demo", "--engine", "sim", "--source", "sim://demo"], "POST", "/api/v1/models",
     {"model": {"name": "demo"}}),
]


def answers(*responses: Callable[[httpx.Request], httpx.Response]) -> tuple[list[httpx.Request], httpx.MockTransport]:
    """A transport that answers with each of `responses` in turn, recording the requests."""
    seen: list[httpx.Request] = []
    queue = list(responses)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)(request)

    return seen, httpx.MockTransport(handle)


def status(code: int, doc: object) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(code, json=doc)


def read_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


@pytest.mark.parametrize(("argv", "method", "path", "answer"), WRITES, ids=[w[1] + " " + w[2] for w in WRITES])
def test_every_write_carries_a_fresh_idempotency_key(argv: list[str], method: str, path: str, answer: object) -> None:
    api = FakeApi().on(method, path, json_body=answer)
    assert ctl(argv, api).rc == 0
    assert ctl(argv, api).rc == 0
    keys = [r.headers["idempotency-key"] for r in api.requests]
    assert [r.method for r in api.requests] == [method, method]
    assert all(uuid.UUID(k).version == 4 for k in keys) and keys[0] != keys[1], "one key per write, not per retry"


def test_reads_carry_no_key() -> None:
    api = FakeApi().on("GET", "/api/v1/models", json_body={"models": []})
    assert ctl(["models"], api).rc == 0
    assert "idempotency-key" not in api.requests[0].headers


@pytest.mark.parametrize("first", [read_timeout, status(503, COMMIT_UNKNOWN)], ids=["timeout", "commit-unknown"])
def test_an_unknown_outcome_is_retried_once_with_the_same_key(first: Callable[[httpx.Request], httpx.Response]) -> None:
    seen, transport = answers(first, status(200, {"removed": "demo"}))
    r = ctl(["model", "remove", "demo"], transport=transport)
    assert (r.rc, r.out) == (0, "removed model demo\n"), r.err
    assert len(seen) == 2 and seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]
    assert "sending the same DELETE again" in r.err


def test_the_retry_resends_the_same_body() -> None:
    seen, transport = answers(read_timeout, status(201, {"model": {"name": "demo"}}))
    r = ctl(["model", "serve", "--name", "demo", "--engine", "sim", "--source", "sim://demo"], transport=transport)
    assert r.rc == 0, r.err
    assert seen[0].content == seen[1].content and seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (read_timeout, "no answer within"),
        (status(503, COMMIT_UNKNOWN), "commit_unknown"),
        (status(503, {"error": {"code": "not_leader", "message": "no leader is known"}}), "status 503 (not_leader)"),
        (lambda request: (_ for _ in ()).throw(httpx.ConnectError("refused", request=request)), "not reachable"),
    ],
    ids=["timeout", "commit-unknown", "not-leader", "refused"],
)
def test_a_second_failure_says_the_outcome_is_unknown(
    second: Callable[[httpx.Request], httpx.Response], why: str
) -> None:
    seen, transport = answers(status(503, COMMIT_UNKNOWN), second)
    r = ctl(["model", "remove", "demo"], transport=transport)
    assert r.rc == 1 and r.out == ""
    last = r.err.strip().splitlines()[-1]
    assert last.startswith(f"error: the outcome of DELETE {URL}/api/v1/models/demo is unknown: "), last
    assert why in last and "may or may not have been applied" in last
    assert seen[0].headers["idempotency-key"] in last, "the key is named, to look the write up"
    assert len(seen) == 2, "retried once, not more"


def test_a_refusal_is_not_retried() -> None:
    seen, transport = answers(status(404, {"error": {"code": "model_not_found", "message": "no model named 'x'"}}))
    r = ctl(["model", "remove", "x"], transport=transport)
    assert (r.rc, r.err) == (1, "error: model_not_found: no model named 'x'\n") and len(seen) == 1


def test_a_write_that_never_connected_is_not_retried_and_says_so() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    seen, transport = answers(refused)
    r = ctl(["model", "remove", "demo"], transport=transport)
    assert r.rc == 1 and len(seen) == 1
    assert r.err == f"error: the server at {URL} (from LLMGW_URL) is not reachable: connection refused\n"


NO_LEADER = {"error": {"code": "no_leader", "message": "no leader is elected now, and this member (m2) is a standby"}}


def test_during_an_election_the_same_request_is_asked_again_until_a_leader_answers() -> None:
    # A standby that knows no leader forwards nothing: asking again is safe for a write too (same key, same body).
    # The README's three-machine quickstart met one while its members switched to TLS, and failed there.
    seen, transport = answers(status(503, NO_LEADER), status(503, NO_LEADER), status(200, {"removed": "demo"}))
    r = ctl(["model", "remove", "demo"], transport=transport)
    assert r.rc == 0, r.err
    assert len(seen) == 3 and len({req.headers["idempotency-key"] for req in seen}) == 1
    assert "no leader is elected now; asking again" in r.err
    seen, transport = answers(status(503, NO_LEADER), status(200, {"nodes": []}))
    assert ctl(["nodes"], transport=transport).rc == 0 and len(seen) == 2  # a read alike


def test_an_election_that_outlasts_the_wait_is_the_error_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from llmgw.cli.ctl import session
    from llmgw.domain import timeouts

    monkeypatch.setattr(session, "TIMEOUTS", dataclasses.replace(timeouts.TIMEOUTS, ctl_election_wait_s=0.5))
    seen, transport = answers(*[status(503, NO_LEADER)] * 50)
    r = ctl(["model", "remove", "demo"], transport=transport)
    assert r.rc == 1 and "error: no_leader: no leader is elected now" in r.err
    assert 2 <= len(seen) <= 5, "asked again every ctl_poll_s for ctl_election_wait_s, then the refusal"
