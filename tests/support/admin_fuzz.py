"""The admin API fuzzed by schemathesis over its own OpenAPI document: a real control plane (real Raft,
real HTTP) served from a thread, the cases schemathesis draws from the document it serves, and the checks.

Used by tests/integration/test_admin_schemathesis.py (a small budget) and tests/bench/fuzz_admin.py (longer).
"""

from __future__ import annotations

import collections
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import requests
import schemathesis
import trio
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, ignored_auth, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance,
                                               unsupported_method)

from llmgw.control.members import member_addr
from llmgw.control.api.openapi import PATH
from llmgw.control.api.route import IDEMPOTENCY_KEY_MAX_CHARS
from llmgw.domain.model import ModelDef
from llmgw.errors import AdminError
from tests.support.fuzz_http import in_thread
from tests.support.processes import free_port

__all__ = ["ADMIN_KEY", "CHECKS", "REQUEST_TIMEOUT_S", "Tally", "coverage_cases", "fuzz_cases", "live_control",
           "load_schema", "operation", "send_and_check"]

ADMIN_KEY = "sk-schema-fuzz-admin"
NOTHING_LISTENS = 1  # tcpmux: no service on any machine here, so a dial there is refused at once
# A request that takes longer is a hang (the slowest honest answer is a commit, well under a second here):
# it fails the run instead of stalling it.
REQUEST_TIMEOUT_S = 20.0
# Never a 5xx; answers as documented (status, content type, body schema); what the document says is invalid
# is refused; a route that needs the admin key refuses a request without it; undocumented methods are 405.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection, ignored_auth, unsupported_method]

# `/api/v1/models/{name}` takes any path as the name (`<path:name>`, so a standby forwards escaped names as
# sent): GET or DELETE `.../NAME/retry` is a model named `NAME/retry`, answered 404 model_not_found, not 405.
_EXCLUDED = {"/api/v1/models/{name}/retry": [unsupported_method]}


async def _control(state_dir: Path, *, task_status: trio.TaskStatus[str]) -> None:
    from llmgw.control.service import ControlConfig, Seed, serve

    seed = Seed(admin_key=ADMIN_KEY, models=[ModelDef.from_doc({"name": "demo", "engine": "sim",
                                                                 "source": "sim://demo"})])
    config = ControlConfig(state_dir=state_dir, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                           admin_port=0, seed=seed, journal_fsync="off")
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve, config)
        task_status.started(handle.admin_url)


@contextmanager
def live_control() -> Iterator[str]:
    """A one-member control plane (pysyncobj on loopback, the admin API over hypercorn) in a throwaway
    state dir, served from a thread; yields its admin URL. Destructive routes may be hit: it is thrown away."""
    with tempfile.TemporaryDirectory(prefix="llmgw-schema-fuzz-") as state_dir:
        with in_thread(partial(_control, Path(state_dir))) as url:
            yield url


def load_schema(url: str) -> Any:
    """The document as the running server serves it (an `OpenApiSchema`), aimed at that server.

    Cases carry no `Authorization` of their own (`send_and_check` sends the admin key with each): a negative
    case that only broke the key would be refused 401 and test nothing else, and `ignored_auth` already sends
    every operation without it."""
    config = SchemathesisConfig.from_dict({"generation": {"with-security-parameters": False}})
    return schemathesis.openapi.from_url(url + PATH, config=config, timeout=REQUEST_TIMEOUT_S)


def operation(schema: Any, method: str, path: str) -> Any:
    """One operation of the loaded document (an `APIOperation`)."""
    return schema[path][method.upper()]


def coverage_cases(schema: Any, op: Any) -> list[Any]:
    """schemathesis's coverage phase for `op`, deterministic: each documented value at its bounds, and
    each way to break one (a wrong type, out of range, missing, an unknown property, an unexpected method)."""
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    config = schema.config.generation_for(operation=op, phase="coverage")
    return list(schema.iter_coverage_cases(op, generation_modes=modes, generation_config=config))


def fuzz_cases(op: Any) -> st.SearchStrategy[Any]:
    """Random cases for `op`: valid by the document (positive) and not (negative: wrong types, values out
    of range, missing fields, unknown properties, odd path parameters and headers)."""
    return st.one_of(op.as_strategy(schemathesis.GenerationMode.POSITIVE),
                     op.as_strategy(schemathesis.GenerationMode.NEGATIVE))


@dataclass
class Tally:
    """What a run sent and got: answers by status, and cases the client itself could not send."""

    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    unsendable: int = 0

    def line(self) -> str:
        by = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return f"{sum(self.statuses.values())} requests ({by}); {self.unsendable} cases the client could not send"


def _prepare(case: Any) -> None:
    """Two changes to a drawn case, so that it tests what it was drawn for.

    A valid Idempotency-Key is made fresh: drawn keys repeat ("0", "00"), and a write under a key already
    used for another is refused 422 before anything else is read. A member to add is aimed where nothing
    listens: whatever answers at a drawn HOST:PORT (0:80 is this machine) would be added, and the group, now
    of two with one that never answers Raft, would lose its quorum and answer 503 to everything after."""
    headers = case.headers or {}
    key = headers.get("Idempotency-Key")
    if isinstance(key, str) and 0 < len(key) <= IDEMPOTENCY_KEY_MAX_CHARS and all(" " <= c <= "~" for c in key):
        case.headers = {**headers, "Idempotency-Key": uuid.uuid4().hex}
    body = case.body
    if case.method.upper() == "POST" and case.path == "/api/v1/cluster/members" and isinstance(body, dict):
        try:
            member_addr(body.get("raft_addr"))
        except AdminError:
            return  # refused before any dial: fuzz it as drawn
        case.body = {**body, "raft_addr": f"127.0.0.1:{NOTHING_LISTENS}"}


def send_and_check(case: Any, session: requests.Session, tally: Tally) -> None:
    """Send one case with the admin key and run `CHECKS` on the answer (raises on the first broken);
    then the rule schemathesis has no check for: never an HTML page."""
    _prepare(case)
    try:
        response = case.call(session=session, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                             timeout=REQUEST_TIMEOUT_S)
    except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, UnicodeEncodeError):
        tally.unsendable += 1  # refused by the client before it was sent: says nothing of the server
        return
    tally.statuses[response.status_code] += 1
    text = response.text.lstrip().lower()
    assert "html" not in response.headers.get("content-type", "") and not text.startswith("<"), (
        f"an HTML page for {case.method} {case.formatted_path}: {response.text[:300]}")
    case.validate_response(response, checks=CHECKS, excluded_checks=_EXCLUDED.get(case.operation.path, []))
