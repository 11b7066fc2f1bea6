"""Judges: their status, serving a missing one from a Llama Guard file (`enable`), and asking one directly
(`ask`: a judge replica reads a text past the cache; nothing of the text is logged or kept)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import trio

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.control.ops.guard import guard_state
from llmgw.control.ops.models import weights_dirs
from llmgw.domain import commands
from llmgw.domain.guard import CATEGORIES, judges_asked
from llmgw.domain.frozen import thaw
from llmgw.domain.judges import judge_status, pick_guard_file
from llmgw.domain.mirror import SCHEME
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.state import ClusterState
from llmgw.engines.admission import definition_problems
from llmgw.errors import AdminError
from llmgw.guard.prompt import AGENT, USER, JudgeFailure, Turn, build, judge_request, parse, rule
from llmgw.guard.texts import answer_text

log = logging.getLogger("llmgw.control.admin")

ENABLE_FIELDS = ("name", "source", "replace")
ASK_FIELDS = ("text", "answer", "judge")
JUDGE_CONTEXT = "8192"  # tokens: the 14 categories' prompt (~600) and a long conversation, on CPU
SOURCE_HINT = ("pass the Llama Guard 3 1B GGUF file the nodes see: --source /models/Llama-Guard-3-1B.Q4_K_M.gguf "
               "(docs/guardrails.md says where to get it), put it in an agent's --storage directory, or add it to "
               "the mirror (`llmgw ctl mirror add Llama-Guard-3-1B.Q4_K_M.gguf`)")


def mirror_guard_file(state: ClusterState) -> str | None:
    """The mirror's Llama Guard file to serve a judge from: the one added last (by name on a tie); None: none."""
    files = [f for f in state.mirror.values() if thaw(f.metadata).get("llama_guard")
             and not thaw(f.metadata).get("lora_adapter")]
    return max(files, key=lambda f: (f.added_at, f.name)).name if files else None


def judge_model(name: str, source: str) -> ModelDef:
    """A judge as `enable` defines it: Llama Guard on CPU via llama.cpp, role guard, always one replica."""
    return ModelDef.from_doc({"name": name, "engine": "llama.cpp", "role": "guard", "source": source,
                              "mode": "always", "replicas": {"min": 1, "max": 1},
                              "args": ["--ctx-size", JUDGE_CONTEXT], "profile": {"cpu": True}})


async def list_judges(ctx: Context) -> dict[str, Any]:
    state = ctx.state()
    return {**guard_state(state), "judges": judge_status(state, ctx.observed(), ctx.views(), ctx.clock())}


async def ask(ctx: Context, doc: Any) -> dict[str, Any]:
    """What a judge says of a text (and an answer to it), read past the verdict cache."""
    text, answer, judge = _ask_fields(doc)
    state = ctx.state()
    judge = judge or _the_judge(state)
    if judge not in state.models:
        raise AdminError(404, "judge_not_found", f"no model named {judge!r} (`llmgw ctl guard judge status`)")
    plan = ctx.reconciler.last_plan
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
        async with httpx.AsyncClient(timeout=ctx.reconciler.timeouts.judge_ask_s) as client:
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
    return {
        "judge": judge, "replica": endpoint.replica_id, "checked": "response" if answer is not None else "prompt",
        "raw": raw, "parsed": parsed, "latency_ms": round((trio.current_time() - started) * 1000, 1),
        "cached": False,
    }


async def enable(ctx: Context, commit: Commit, doc: Any) -> dict[str, Any]:
    """Serve the missing judge (`doc`: name, source, replace; each optional); `Created` when newly defined.
    The route and the console's Do menu both call this, so both refuse and answer alike."""
    name, source, replace = _enable_fields(doc)
    state = ctx.state()
    name = name or _missing_judge(state)
    warnings = [] if name in judges_asked(state) else [f"no guard policy names {name} as its judge yet"]
    found_on: list[str] = []
    mirror_file: str | None = None
    if source is None:
        found = pick_guard_file(ctx.observed())
        mirror_file = mirror_guard_file(state) if found is None else None
        if found is not None:
            source, found_on = found
        elif mirror_file is not None:  # an air-gapped site's judge: the mirror's Llama Guard file (docs/mirror.md)
            source = SCHEME + mirror_file
        else:
            raise AdminError(400, "judge_source_required", f"no --source given, no agent's storage report lists a "
                                                           f"Llama Guard 3 1B GGUF file and the mirror holds none: "
                                                           f"{SOURCE_HINT}")
    elif source.startswith(SCHEME):
        mirror_file = source[len(SCHEME):]
    try:
        model = judge_model(name, source)
    except DefinitionError as e:
        field = "source" if e.field == "source" else "name"
        raise AdminError(400, "invalid_judge", f"{field}: {e.message}") from None
    outside = definition_problems(model.engine, model.source, list(model.args), weights_dirs(ctx))
    if outside:  # a path outside the dirs allowed for weights, as for any definition
        raise AdminError(400, "invalid_judge", "; ".join(f"{f}: {m}" for f, m in outside))
    old = state.models.get(name)
    if old is not None and old.role != "guard" and not replace:
        raise AdminError(409, "model_not_a_judge", f"a model named {name} exists with role {old.role}, not "
                         f"guard: --replace replaces its definition with the judge (its clients lose "
                         f"{name}), or name another judge in the policies")
    if old == model:
        return {"model": model.to_doc(), "judge": name, "changed": False, "replaced": None,
                "found_on": found_on, "mirror_file": mirror_file, "warnings": warnings}
    replaced = old.role if old is not None else None
    result = await commit(commands.put_model(model, ctx.clock()))
    if replaced is not None and replaced != "guard":
        log.warning("model %s (role %s) replaced by a judge (guard judge enable --replace)", name, replaced)
    log.info("judge %s served from %s", name, source)
    answer = {"model": model.to_doc(), "judge": name, "changed": True, "replaced": replaced,
              "found_on": found_on, "mirror_file": mirror_file, "warnings": warnings}
    return Created(answer) if result["created"] else answer


def _enable_fields(doc: Any) -> tuple[str | None, str | None, bool]:
    """(name, source, replace) of an enable request; 400 `invalid_judge` naming the field."""
    if not isinstance(doc, dict):
        raise AdminError(400, "invalid_judge", 'send a JSON object: {"name": ..., "source": ..., "replace": false}')
    unknown = sorted(set(doc) - set(ENABLE_FIELDS))
    if unknown:
        raise AdminError(400, "invalid_judge", f"{unknown[0]}: unknown field; known: {', '.join(ENABLE_FIELDS)}")
    name, source, replace = doc.get("name"), doc.get("source"), doc.get("replace", False)
    for field, value in (("name", name), ("source", source)):
        if value is not None and (not isinstance(value, str) or not value):
            raise AdminError(400, "invalid_judge", f"{field}: must be a non-empty string")
    if not isinstance(replace, bool):
        raise AdminError(400, "invalid_judge", "replace: must be true or false")
    return name, source, replace


def _missing_judge(state: ClusterState) -> str:
    """The one judge the policies ask for that is not defined as a judge; 409 when none or several are."""
    asked = judges_asked(state)
    if not asked:
        raise AdminError(409, "no_judge_asked", "no guard policy names a judge yet: add one (`llmgw ctl guard set "
                                                "NAME --judge MODEL`), or name the judge to serve")
    missing = [m for m in asked if (model := state.models.get(m)) is None or model.role != "guard"]
    if not missing:
        raise AdminError(409, "no_judge_missing", f"every judge the policies ask for is defined as a judge "
                                                  f"({', '.join(asked)}): name one to serve it again from another file")
    if len(missing) > 1:
        raise AdminError(400, "judge_name_required", f"several judges are missing ({', '.join(missing)}): name "
                                                     "the one to serve")
    return missing[0]


def _ask_fields(doc: Any) -> tuple[str, str | None, str | None]:
    """(text, answer, judge); 400 `invalid_ask` naming the field (never quoting a value)."""
    if not isinstance(doc, dict):
        raise AdminError(400, "invalid_ask", 'send a JSON object: {"text": ..., "judge": ..., "answer": ...}')
    unknown = sorted(str(k) for k in doc if k not in ASK_FIELDS)
    if unknown:
        raise AdminError(400, "invalid_ask", f"{unknown[0][:40]}: unknown field; known: {', '.join(ASK_FIELDS)}")
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
