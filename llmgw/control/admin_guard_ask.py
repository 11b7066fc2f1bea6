"""`POST /api/v1/guard/judges/ask` (`ctl guard judge ask`): a judge replica reads an operator's text, past the
verdict cache, and its raw answer comes back with how it was parsed.

Nothing of the text is kept: it is sent to the judge and forgotten. No log line, audit or refusal here
quotes it (nor the judge's answer, which may echo it), and no command is committed. The judge replica is
one of the reconciler's routes for that model, called directly over HTTP with `judge_ask_s`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import httpx
import trio
from quart import Response

from llmgw.domain.guard import CATEGORIES, judges_asked
from llmgw.domain.state import ClusterState
from llmgw.errors import AdminError
from llmgw.guard.prompt import AGENT, USER, JudgeFailure, Turn, build, judge_request, parse, rule
from llmgw.guard.texts import answer_text

if TYPE_CHECKING:
    from llmgw.control.admin import ControlDeps

log = logging.getLogger("llmgw.control.admin")

Route = Callable[..., Callable[[Callable[..., Awaitable[Response]]], Any]]
BodyJson = Callable[[], Awaitable[Any]]
FIELDS = ("text", "answer", "judge")
PATH = "/api/v1/guard/judges/ask"


def register(route: Route, deps: ControlDeps, body_json: BodyJson) -> None:
    """Add the ask route through the admin app's `route` (admin key, forwarding to the leader)."""

    @route(PATH, ["POST"])
    async def ask_judge() -> Response:
        text, answer, judge = _fields(await body_json())
        state = deps.store.snapshot()
        judge = judge or _the_judge(state)
        if judge not in state.models:
            raise AdminError(404, "judge_not_found", f"no model named {judge!r} (`llmgw ctl guard judge status`)")
        plan = deps.reconciler.last_plan
        known = plan.routes.get(judge) if plan is not None else None
        if known is None or not known.endpoints:
            why = f" ({known.state}{': ' + known.reason if known.reason else ''})" if known is not None else ""
            raise AdminError(409, "judge_unavailable", f"judge {judge!r} has no ready replica{why}; "
                                                       "`llmgw ctl guard judge status` says what is wrong")
        endpoint = known.endpoints[0]
        turns: list[Turn] = [(USER, text)] + ([(AGENT, answer)] if answer is not None else [])
        prompt = build(turns, AGENT if answer is not None else USER)
        started = trio.current_time()
        url = endpoint.url.rstrip("/") + "/v1/completions"
        try:
            async with httpx.AsyncClient(timeout=deps.reconciler.timeouts.judge_ask_s) as client:
                got = await client.post(url, content=judge_request(judge, prompt),
                                        headers={"content-type": "application/json"})
        except httpx.HTTPError as e:
            # The exception's words name the URL at most, never the body sent.
            raise AdminError(502, "judge_failed", f"judge {judge!r} (replica {endpoint.replica_id}) did not "
                                                  f"answer: {type(e).__name__}") from None
        if got.status_code >= 400:
            raise AdminError(502, "judge_failed", f"judge {judge!r} (replica {endpoint.replica_id}) answered "
                                                  f"HTTP {got.status_code}")
        raw = answer_text(got.content)
        try:
            verdict = parse(raw)
            parsed: dict[str, Any] = {"ok": True, "safe": verdict.safe, "categories": [
                {"code": c, "name": CATEGORIES[c]} for c in verdict.categories], "rule": rule(verdict)}
        except JudgeFailure as failure:
            parsed = {"ok": False, "error": str(failure), "rule": rule(failure)}
        return Response(json.dumps({
            "judge": judge, "replica": endpoint.replica_id, "checked": "response" if answer is not None else "prompt",
            "raw": raw, "parsed": parsed, "latency_ms": round((trio.current_time() - started) * 1000, 1),
            "cached": False,
        }), status=200, content_type="application/json")


def _fields(doc: Any) -> tuple[str, str | None, str | None]:
    """(text, answer, judge); 400 `invalid_ask` naming the field (never quoting a value)."""
    if not isinstance(doc, dict):
        raise AdminError(400, "invalid_ask", 'send a JSON object: {"text": ..., "judge": ..., "answer": ...}')
    unknown = sorted(str(k) for k in doc if k not in FIELDS)
    if unknown:
        raise AdminError(400, "invalid_ask", f"{unknown[0][:40]}: unknown field; known: {', '.join(FIELDS)}")
    text = doc.get("text")
    if not isinstance(text, str) or not text:
        raise AdminError(400, "invalid_ask", "text: the text for the judge to read, a non-empty string")
    answer, judge = doc.get("answer"), doc.get("judge")
    if answer is not None and not isinstance(answer, str):
        raise AdminError(400, "invalid_ask", "answer: a model's answer to the text, to judge as a response: a string")
    if judge is not None and (not isinstance(judge, str) or not judge):
        raise AdminError(400, "invalid_ask", "judge: a judge model's name")
    return text, answer, judge


def _the_judge(state: ClusterState) -> str:
    """The judge when none is named: the one the policies ask for, else the one model of role guard."""
    asked = list(judges_asked(state)) or sorted(n for n, m in state.models.items() if m.role == "guard")
    if len(asked) == 1:
        return asked[0]
    if not asked:
        raise AdminError(409, "no_judge", "no guard policy names a judge and no model has role guard: name the "
                                          "judge to ask (--judge MODEL)")
    raise AdminError(400, "judge_name_required", f"several judges ({', '.join(asked)}): name the one to ask (--judge)")
