"""Models: list, define (serve), show, remove, retry a parked one."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, Created
from llmgw.domain import commands, summary
from llmgw.domain.memory import estimate_for
from llmgw.domain.model import DefinitionError, ModelDef, catalog_problems
from llmgw.domain.observed import BreakerSeen, Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState
from llmgw.engines.admission import adapter_source_problem, allowed_weights_dirs, definition_problems
from llmgw.errors import AdminError

log = logging.getLogger("llmgw.control.admin")


def model_doc(name: str, state: ClusterState, observed: Observed, views: Any | None,
              now: float | None = None, breakers: Sequence[BreakerSeen] = ()) -> dict[str, Any]:
    """A model's definition and its status (`views`: the reconciler's; None, it has not run; `now`: the clock
    its activation's ETA is read on; `breakers`: the gateways' open circuit breakers, `Context.breakers`);
    404 if none."""
    m = state.models.get(name)
    if m is None:
        raise AdminError(404, "model_not_found", f"no model named {name!r}")
    view = views.get(name) if views else None
    status = summary.model_status(state, observed, name, view, now)
    status["breakers"] = [b.to_doc() for b in breakers if b.model == name]
    return {**m.to_doc(), "status": status}


def definition(doc: Any) -> ModelDef:
    """A model definition from its document; 400 `invalid_model` naming every problem."""
    try:
        return ModelDef.from_doc(doc)
    except DefinitionError as e:
        raise AdminError(400, "invalid_model", str(e)) from None


def weights_dirs(ctx: Context) -> list[str]:
    """Where a definition's local path may lie: the storage dirs of the agents connected now, and the
    setting `models.weights_dirs`."""
    reports = [report for node in ctx.observed().nodes.values() for report in node.storage]
    return allowed_weights_dirs(reports, effective(ctx.state().settings, "models.weights_dirs"))


def admitted(ctx: Context, doc: Any) -> ModelDef:
    """A definition the cluster may store: its own shape, then what its engine would refuse (args outside
    its table, a source it cannot open or a local path outside the dirs allowed for weights), then its
    fallbacks and aliases beside the other definitions (`catalog_problems`, checked again as it applies); 400
    `invalid_model` naming every problem of both at once."""
    problems: list[tuple[str, str]] = []
    model: ModelDef | None = None
    doc = with_base(ctx.state(), doc)
    if isinstance(doc, dict) and "lora" in doc:  # the reconciler's, from the adapters defined with `base`
        problems.append(("lora", "is set by llmgw from the adapters defined on this model (their `base`), not "
                                 "by a definition"))
    adapter = isinstance(doc, dict) and bool(doc.get("base"))
    try:
        model = ModelDef.from_doc(doc)
    except DefinitionError as e:
        problems += e.errors
        base = doc["base"] if adapter else None
        if isinstance(base, str) and base not in ctx.state().models:  # an engine it lacks is its base's: say that
            problems = [("base", f"{doc['base']!r} is not a defined model")] + [
                p for p in problems if p != ("engine", "is required")]
    if isinstance(doc, dict):
        judged = {f for f, _ in problems}  # a field already refused for its shape is not judged twice
        problems += [(f, m) for f, m in definition_problems(doc.get("engine"), None if adapter else doc.get("source"),
                                                            doc.get("args", []), weights_dirs(ctx))
                     if f not in judged and "engine" not in judged]
        if adapter and "source" not in judged and (problem := adapter_source_problem(doc.get("source"),
                                                                                      weights_dirs(ctx))):
            problems.append(("source", problem))
    if model is not None:
        problems += catalog_problems(model, ctx.state().models)  # its fallbacks and aliases among the others
    if problems or model is None:
        raise AdminError(400, "invalid_model", "; ".join(f"{f}: {m}" for f, m in problems))
    return model


def with_base(state: ClusterState, doc: Any) -> Any:
    """A LoRA adapter's definition (one with `base`) takes the engine and role of its base where it says
    none; any other document is returned as it is."""
    if not isinstance(doc, dict) or not isinstance(doc.get("base"), str):
        return doc
    base = state.models.get(doc["base"])
    if base is None:
        return doc
    return {"engine": base.engine, "role": base.role, **doc}


async def list_models(ctx: Context) -> dict[str, Any]:
    state, observed, views = ctx.state(), ctx.observed(), ctx.views()
    breakers = ctx.breakers()
    return {"models": [model_doc(n, state, observed, views, ctx.clock(), breakers) for n in sorted(state.models)]}


async def serve(ctx: Context, commit: Commit, doc: Any) -> dict[str, Any]:
    """Define (or replace) a model; `Created` when it is new. Refused (400, nothing stored) as `admitted` says."""
    model = admitted(ctx, doc)
    result = await commit(commands.put_model(model, ctx.clock()))
    log.info("model %s %s", model.name, "created" if result["created"] else "replaced")
    # A retry answered from the recorded result may find the model removed since: its definition, then.
    state = ctx.state()
    shown = (model_doc(model.name, state, ctx.observed(), ctx.views(), ctx.clock(), ctx.breakers())
             if model.name in state.models else model.to_doc())
    return Created(model=shown) if result["created"] else {"model": shown}


async def show(ctx: Context, name: str) -> dict[str, Any]:
    """A model with its status and the memory one replica needs, as placement counts it."""
    state, observed = ctx.state(), ctx.observed()
    doc = model_doc(name, state, observed, ctx.views(), ctx.clock(), ctx.breakers())
    return {"model": {**doc, "estimate": estimate_for(state.models[name], observed.nodes,
                                                           sources=observed.sources).to_doc()}}


async def remove(ctx: Context, commit: Commit, name: str) -> dict[str, Any]:
    await commit(commands.remove_model(name, ctx.clock()))
    log.info("model %s removed", name)
    return {"removed": name}


async def retry(ctx: Context, commit: Commit, name: str) -> dict[str, Any]:
    await commit(commands.retry_model(name, ctx.clock()))
    return {"retried": name}
