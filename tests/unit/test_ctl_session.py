"""`llmgw ctl` on every answer that is not the admin API's 2xx JSON: the API's refusal,
HTML pages, empty and invalid bodies, unreachable servers, timeouts and usage errors."""

from __future__ import annotations

import io

import httpx
import pytest

from ctl_fakes import URL, FakeApi, closed_port, ctl
from llmgw.cli.ctl import run_ctl


def test_error_json_is_printed_as_code_and_message() -> None:
    api = FakeApi().on(
        "GET",
        "/api/v1/models/nope",
        404,
        json_body={"error": {"code": "model_not_found", "message": "no model named 'nope'"}},
    )
    r = ctl(["model", "show", "nope"], api)
    assert (r.rc, r.out) == (1, "")
    assert r.err == "error: model_not_found: no model named 'nope'\n"


def test_error_text_from_the_server_cannot_drive_the_terminal() -> None:
    api = FakeApi().on(
        "GET", "/api/v1/status", 500, json_body={"error": {"code": "boom", "message": "bad\x1b[2J\nthing"}}
    )
    r = ctl(["status"], api)
    assert r.rc == 1
    assert "\x1b" not in r.err
    assert r.err == "error: boom: bad [2J thing\n"


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        (200, {"content-type": "text/html; charset=utf-8"}, "<!doctype html><title>Grafana</title>"),
        (502, {"content-type": "text/plain"}, "  <html><body>Bad Gateway</body></html>"),
        (401, {"content-type": "text/html"}, "Unauthorized"),
    ],
)
def test_an_html_page_is_named_as_such(status: int, headers: dict[str, str], body: str) -> None:
    api = FakeApi().on("GET", "/api/v1/status", status, headers=headers, text=body)
    r = ctl(["status"], api)
    assert (r.rc, r.out) == (1, "")
    assert r.err == (
        f"error: {URL}/api/v1/status answered with an HTML page, not the llmgw admin API (status {status})"
        " — is --url pointing at the right service?\n"
    )


def test_an_empty_body_is_said_to_be_nothing() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 200, content=b"")
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.err.startswith(f"error: {URL}/api/v1/status answered nothing (status 200, empty body)")


def test_invalid_json_is_said_to_be_invalid() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 200, headers={"content-type": "application/json"}, text='{"cluster": ')
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.err.startswith(f"error: {URL}/api/v1/status answered with invalid JSON (status 200)")


def test_a_non_2xx_answer_without_the_error_shape_shows_status_and_excerpt() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 503, json_body={"detail": "overloaded"})
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.err == f'error: {URL}/api/v1/status answered status 503: {{"detail":"overloaded"}}\n'


def test_connection_refused_says_the_server_is_not_reachable() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    out, err = io.StringIO(), io.StringIO()
    rc = run_ctl(["--url", url, "--key", "k", "status"], env={}, stdout=out, stderr=err)  # the real transport
    assert (rc, out.getvalue()) == (1, "")
    assert err.getvalue() == f"error: the server at {url} (from --url) is not reachable: connection refused\n"


def test_a_timeout_says_the_server_is_not_reachable() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    r = ctl(["status"], transport=httpx.MockTransport(hang))
    assert r.rc == 1
    assert r.err.startswith(f"error: the server at {URL} (from LLMGW_URL) is not reachable: no answer within")


def test_a_cyclopts_usage_error_exits_2() -> None:
    api = FakeApi()
    r = ctl(["status", "--bogus"], api)
    assert r.rc == 2
    assert "--bogus" in r.err
    r = ctl(["no-such-command"], api)
    assert r.rc == 2
    assert api.requests == []
