"""The admin API's guard routes: policies (`GET|PUT|DELETE /api/v1/guard/policies[/NAME]`), the judges'
status (`GET /api/v1/guard/judges`) and serving a missing judge (`POST /api/v1/guard/judges/enable`).

Guards on or off is the setting `guard.enabled` (`PUT /api/v1/settings/guard.enabled`); every answer
here says which, so no listing hides that nothing is checked.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from quart import Response

from llmgw.domain import commands, guard_commands
from llmgw.domain.guard import GuardPolicy, PolicyError, enabled, judges_asked
from llmgw.domain.judges import GUARDS_OFF, judge_status, pick_guard_file
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.state import ClusterState
from llmgw.errors import AdminError

if TYPE_CHECKING:
    from llmgw.control.admin import ControlDeps

log = logging.getLogger("llmgw.control.admin")

Route = Callable[..., Callable[[Callable[..., Awaitable[Response]]], Any]]
Commit = Callable[[dict[str, Any]], Awaitable[Any]]
BodyJson = Callable[[], Awaitable[Any]]
Views = Callable[[], dict[str, Any] | None]
ENABLE_FIELDS = ("name", "source", "replace")
JUDGE_CONTEXT = "8192"  # tokens: the 14 categories' prompt (~600) and a long conversation, on CPU
SOURCE_HINT = ("pass the Llama Guard 3 1B GGUF file the nodes see: --source /models/Llama-Guard-3-1B.Q4_K_M.gguf "
               "(docs/guardrails.md says where to get it), or put it in an agent's --storage directory")


def _ok(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def guard_state(state: ClusterState) -> dict[str, Any]:
    """What every guard answer starts with: on or off, and the words when off."""
    on = enabled(state)
    return {"enabled": on, "notice": "" if on else GUARDS_OFF}


def judge_model(name: str, source: str) -> ModelDef:
    """A judge as `enable` defines it: Llama Guard on CPU via llama.cpp, role guard, always one replica."""
    return ModelDef.from_doc({"name": name, "engine": "llama.cpp", "role": "guard", "source": source,
                              "mode": "always", "replicas": {"min": 1, "max": 1},
                              "args": ["--ctx-size", JUDGE_CONTEXT], "profile": {"cpu": True}})


def register(route: Route, deps: ControlDeps, commit: Commit, body_json: BodyJson, views: Views) -> None:
    """Add the guard routes through the admin app's `route` (admin key, forwarding to the leader,
    idempotent writes, error shape); `commit` is its idempotent commit, `views` the reconciler's."""

    def judges(state: ClusterState) -> list[dict[str, Any]]:
        return judge_status(state, deps.hub.observed(), views(), deps.clock())

    @route("/api/v1/guard/policies", ["GET"])
    async def list_policies() -> Response:
        state = deps.store.snapshot()
        return _ok({**guard_state(state), "policies": [p.to_doc() for _, p in sorted(state.guard_policies.items())]})

    @route("/api/v1/guard/policies/<path:name>", ["GET"])
    async def show_policy(name: str) -> Response:
        state = deps.store.snapshot()
        policy = state.guard_policies.get(name)
        if policy is None:
            raise AdminError(404, "policy_not_found", f"no guard policy named {name!r} (`llmgw ctl guard list`)")
        return _ok({**guard_state(state), "policy": policy.to_doc()})

    @route("/api/v1/guard/policies/<path:name>", ["PUT"])
    async def put_policy(name: str) -> Response:
        try:
            policy = GuardPolicy.from_doc(await body_json(), name=name)
        except PolicyError as e:
            raise AdminError(400, "invalid_policy", str(e)) from None
        result = await commit(guard_commands.set_policy(policy, deps.clock()))
        state = deps.store.snapshot()
        judge = next((j for j in judges(state) if j["model"] == policy.judge), None)
        warnings = [judge["problem"]] if judge is not None and judge["status"] in ("missing", "not_a_judge") else []
        log.info("guard policy %s %s", name, "created" if result["created"] else "set")
        return _ok({**guard_state(state), "policy": policy.to_doc(), "created": result["created"],
                    "changed": result["changed"], "warnings": warnings}, 201 if result["created"] else 200)

    @route("/api/v1/guard/policies/<path:name>", ["DELETE"])
    async def remove_policy(name: str) -> Response:
        result = await commit(guard_commands.remove_policy(name, deps.clock()))
        if not result.get("removed"):
            raise AdminError(404, "policy_not_found", f"no guard policy named {name!r} (already removed?)")
        log.info("guard policy %s removed", name)
        return _ok({"removed": name})

    @route("/api/v1/guard/judges", ["GET"])
    async def judge_list() -> Response:
        state = deps.store.snapshot()
        return _ok({**guard_state(state), "judges": judges(state)})

    @route("/api/v1/guard/judges/enable", ["POST"])
    async def enable_judge() -> Response:
        return _ok(*await enable(deps, commit, await body_json()))


async def enable(deps: ControlDeps, commit: Commit, doc: Any) -> tuple[dict[str, Any], int]:
    """Serve the missing judge (`doc`: name, source, replace; each optional): its answer and status.
    The route and the console's Do menu both call this, so both refuse and answer alike."""
    name, source, replace = _enable_fields(doc)
    state = deps.store.snapshot()
    name = name or _missing_judge(state)
    warnings = [] if name in judges_asked(state) else [f"no guard policy names {name} as its judge yet"]
    found_on: list[str] = []
    if source is None:
        found = pick_guard_file(deps.hub.observed())
        if found is None:
            raise AdminError(400, "judge_source_required", f"no --source given, and no agent's storage report "
                                                           f"lists a Llama Guard 3 1B GGUF file: {SOURCE_HINT}")
        source, found_on = found
    try:
        model = judge_model(name, source)
    except DefinitionError as e:
        field = "source" if e.field == "source" else "name"
        raise AdminError(400, "invalid_judge", f"{field}: {e.message}") from None
    old = state.models.get(name)
    if old is not None and old.role != "guard" and not replace:
        raise AdminError(409, "model_not_a_judge", f"a model named {name} exists with role {old.role}, not "
                         f"guard: --replace replaces its definition with the judge (its clients lose "
                         f"{name}), or name another judge in the policies")
    if old == model:
        return {"model": model.to_doc(), "judge": name, "changed": False, "replaced": None,
                "found_on": found_on, "warnings": warnings}, 200
    replaced = old.role if old is not None else None
    result = await commit(commands.put_model(model, deps.clock()))
    if replaced is not None and replaced != "guard":
        log.warning("model %s (role %s) replaced by a judge (guard judge enable --replace)", name, replaced)
    log.info("judge %s served from %s", name, source)
    return {"model": model.to_doc(), "judge": name, "changed": True, "replaced": replaced,
            "found_on": found_on, "warnings": warnings}, 201 if result["created"] else 200


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
