"""`POST /api/v1/mirror/{name}/serve`: a model definition made from a mirror file's metadata, with its memory
estimate and placement's plan (`{"commit": false}`, the preview: nothing changes), or stored (`{"commit": true}`:
201 when new, refused as a model put is). A Llama Guard file is defined as the judge the guard policies ask for
(role guard, as `ctl guard judge enable` defines one), never as a model clients call. docs/mirror.md.
"""

from __future__ import annotations

import logging
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.control.ops.judges import judge_model
from llmgw.control.ops.models import admitted, model_doc
from llmgw.control.ops.plan import plan_doc
from llmgw.domain import commands
from llmgw.domain.guard import judges_asked
from llmgw.domain.mirror import MirrorFile
from llmgw.domain.mirror_serve import JUDGE_OVERRIDES, OVERRIDES, default_name, definition_doc, is_judge, serve_problem
from llmgw.domain.model import DefinitionError
from llmgw.domain.state import ClusterState
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")

FIELDS = ("commit", "name", *OVERRIDES)


async def serve(ctx: Context, commit: Commit, name: str, body: Any) -> dict[str, Any]:
    """The preview (definition, estimate, plan, judge, name), and with `commit` the definition stored."""
    do_commit, wanted, overrides = _fields(body)
    state = ctx.state()
    f = state.mirror.get(name)
    if f is None:
        raise AdminError(404, "mirror_file_not_found", f"no mirror file named {name!r} (`llmgw ctl mirror list`)")
    problem = serve_problem(f)
    if problem is not None:
        raise AdminError(400, "invalid_model", f"source: {problem}")
    judge = is_judge(f)
    warnings: list[str] = []
    if judge:
        refused = sorted(set(overrides) - set(JUDGE_OVERRIDES))
        if refused:
            raise AdminError(400, "invalid_model", f"{refused[0]}: a Llama Guard file is served as a judge only; "
                                                   f"a judge may set {', '.join(JUDGE_OVERRIDES)}")
        model_name = wanted or _judge_name(state, f)
        if model_name not in judges_asked(state):
            warnings.append(f"no guard policy names {model_name} as its judge yet (`llmgw ctl guard set NAME "
                            f"--judge {model_name}`)")
        old = state.models.get(model_name)
        if old is not None and old.role != "guard":
            raise AdminError(409, "model_not_a_judge", f"a model named {model_name} exists with role {old.role}, "
                                                       "not guard: name the judge otherwise (--name)")
    else:
        model_name = wanted or default_name(f)
    try:
        doc, estimate, why = definition_doc(f, model_name, ctx.observed().nodes, overrides,
                                            judge_model(model_name, "mirror://" + f.name).to_doc() if judge else None)
    except DefinitionError as e:
        raise AdminError(400, "invalid_model", "; ".join(f"{fld}: {m}" for fld, m in e.errors)) from None
    model = admitted(ctx, doc)  # the same refusals as a model put
    answer: dict[str, Any] = {
        "name": model.name, "file": f.name, "judge": judge, "definition": model.to_doc(),
        "estimate": estimate.to_doc(), "profile_reason": why, "plan": plan_doc(model, state, ctx.observed()),
        "warnings": warnings, "committed": False,
    }
    if not do_commit:
        return answer
    result = await commit(commands.put_model(model, ctx.clock()))
    log.info("model %s %s from mirror file %s%s", model.name, "created" if result["created"] else "replaced",
             f.name, " (a judge)" if judge else "")
    state = ctx.state()
    shown = (model_doc(model.name, state, ctx.observed(), ctx.views(), ctx.clock(), ctx.breakers())
             if model.name in state.models else model.to_doc())
    answer |= {"committed": True, "model": shown}
    return Created(answer) if result["created"] else answer


def _fields(body: Any) -> tuple[bool, str | None, dict[str, Any]]:
    """(commit, name, overrides) of a serve request; 400 `invalid_request` naming the field."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise AdminError(400, "invalid_request", 'send a JSON object: {"commit": false, "name": ...}')
    unknown = sorted(str(k) for k in body if k not in FIELDS)
    if unknown:
        raise AdminError(400, "invalid_request", f"{unknown[0][:40]}: unknown field; known: {', '.join(FIELDS)}")
    do_commit, name = body.get("commit", False), body.get("name")
    if not isinstance(do_commit, bool):
        raise AdminError(400, "invalid_request", "commit: true (store the definition) or false (the preview)")
    if name is not None and (not isinstance(name, str) or not name):
        raise AdminError(400, "invalid_request", "name: the model's name, a non-empty string")
    return do_commit, name, {k: v for k, v in body.items() if k in OVERRIDES}


def _judge_name(state: ClusterState, f: MirrorFile) -> str:
    """The judge's name: the one judge the policies ask for that is not defined as a judge, else the one they ask
    for, else the file's own (`default_name`); several missing: 400, name one."""
    asked = judges_asked(state)
    missing = [m for m in asked if (model := state.models.get(m)) is None or model.role != "guard"]
    if len(missing) > 1:
        raise AdminError(400, "judge_name_required", f"several judges are missing ({', '.join(missing)}): name "
                                                     "the one to serve (--name)")
    if missing:
        return missing[0]
    if len(asked) == 1:
        return next(iter(asked))
    return default_name(f)
