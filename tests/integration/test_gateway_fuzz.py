"""Bad input never reaches a 5xx or an HTML page: Hypothesis sends hostile requests (deep nesting, huge
numbers, NaN, invalid UTF-8, wrong types, unknown and engine-private fields, hostile headers, odd
methods and paths) to every `/v1` route of a real gateway over sim engines, and to every admin route.

A small budget here (CI); `tests/bench/fuzz_gateway.py` runs the same strategies longer.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.fuzz_http import Probe, admin_probes, check_answer, live_admin, live_gateway, v1_probes

BUDGET = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def gateway() -> Iterator[httpx.Client]:
    with live_gateway() as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def admin() -> Iterator[tuple[httpx.Client, list[tuple[str, frozenset[str]]]]]:
    with live_admin() as (url, rules), httpx.Client(base_url=url, timeout=30) as client:
        yield client, rules


@BUDGET
@given(probe=v1_probes())
def test_v1_never_answers_5xx_or_html(gateway: httpx.Client, probe: Probe) -> None:
    check_answer(probe, probe.send(gateway), "openai")


def test_the_fuzzed_gateway_also_serves(gateway: httpx.Client) -> None:
    """The strategies reach the engines too (not only refusals): a fine request through the same gateway."""
    body = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}'
    probe = Probe("POST", "/v1/chat/completions", ((b"authorization", b"Bearer sk-fuzz-client"),), body)
    response = probe.send(gateway)
    assert response.status_code == 200, response.text


def test_a_hundred_thousand_brackets_are_a_400(gateway: httpx.Client,
                                               admin: tuple[httpx.Client, list[tuple[str, frozenset[str]]]]) -> None:
    body = b"[" * 100_000
    v1 = Probe("POST", "/v1/chat/completions", ((b"authorization", b"Bearer sk-fuzz-client"),), body).send(gateway)
    assert v1.status_code == 400 and v1.json()["error"]["code"] == "invalid_json"
    client, _ = admin
    api = Probe("POST", "/api/v1/models", ((b"authorization", b"Bearer sk-fuzz-admin"),), body).send(client)
    assert api.status_code == 400 and api.json()["error"]["code"] == "invalid_json"


@BUDGET
@given(data=__import__("hypothesis").strategies.data())
def test_admin_never_answers_5xx_or_html(admin: tuple[httpx.Client, list[tuple[str, frozenset[str]]]],
                                         data: object) -> None:
    client, rules = admin
    probe = data.draw(admin_probes(rules))  # type: ignore[attr-defined]
    check_answer(probe, probe.send(client), "admin")
