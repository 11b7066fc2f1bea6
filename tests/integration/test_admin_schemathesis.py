"""The admin API as its OpenAPI document says: schemathesis reads the document a real control plane serves
(pysyncobj on loopback, the admin API over HTTP) and sends each operation its coverage cases (each value at
its bounds, each way to break one) and a few random ones, valid and not. Every answer: never a 5xx, never
HTML, a documented status and content type, a body of the documented schema; what the document calls invalid
is refused; a route needing the admin key refuses a request without one; an undocumented method is 405.

A small budget here (CI); `tests/bench/fuzz_admin.py` runs the same longer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings

from llmgw.control.api.openapi import document
from tests.support.admin_fuzz import (Tally, coverage_cases, fuzz_cases, live_control, load_schema, operation,
                                      send_and_check)

pytestmark = [
    pytest.mark.slow,
    # schemathesis's own strategies call `random` (its business, not ours): Hypothesis warns of it.
    pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies"),
]

EXAMPLES = 20  # random cases per operation, on top of its coverage cases
OPERATIONS = [(method.upper(), path) for path, ops in document()["paths"].items() for method in ops]


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Any, requests.Session]]:
    with live_control() as url, requests.Session() as session:
        yield load_schema(url), session


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_each_operation_answers_as_documented(live: tuple[Any, requests.Session], method: str, path: str) -> None:
    schema, session = live
    op = operation(schema, method, path)
    tally = Tally()
    for case in coverage_cases(schema, op):
        send_and_check(case, session, tally)

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(case=fuzz_cases(op))
    def fuzz(case: Any) -> None:
        send_and_check(case, session, tally)

    fuzz()
    assert tally.statuses, tally.line()  # (an operation without parameters has a handful of distinct cases)


def test_the_served_document_is_the_one_the_code_builds(live: tuple[Any, requests.Session]) -> None:
    schema, session = live
    assert schema.raw_schema == document()
    sent = {(method.upper(), path) for path, ops in schema.raw_schema["paths"].items() for method in ops}
    assert sent == set(OPERATIONS)
