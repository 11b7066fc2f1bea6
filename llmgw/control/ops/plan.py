"""What-if placement: where one more replica of a model would land now, or every node's verdict
grouped by reason. Changes nothing.

`plan_doc` is the answer, a pure function of the state and what agents report, by the same
`place` the reconciler calls, so the plan and the next pass agree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops.models import admitted
from llmgw.domain.memory import estimate_for
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.errors import AdminError
from llmgw.placement import NEVER, NOT_NOW, PlacementResult, Refusal, place

_BASE = ("node", "verdict", "code", "message")  # a Refusal's own fields; placement may add more
_ORDER = {NOT_NOW: 0, NEVER: 1}  # the verdicts that could change first, first


async def plan(ctx: Context, doc: Any) -> dict[str, Any]:
    """The plan for one model definition (`ctl plan`, the console's serve form)."""
    if not isinstance(doc, dict):
        raise AdminError(400, "invalid_model", "the body must be one model definition (a JSON object)")
    return plan_doc(admitted(ctx, doc), ctx.state(), ctx.observed())


def plan_doc(model: ModelDef, state: ClusterState, observed: Observed) -> dict[str, Any]:
    """Where one more replica of `model` would go against these placements and nodes: `choice`
    (node, devices, score, a multi-node replica's members and fabric) or None, and every refusal,
    whole (`refusals`) and grouped by verdict and reason (`groups`). A model of that name already
    defined keeps its replicas: the plan is for one more, spread from them as the reconciler would."""
    result = place(model, observed.nodes, state.placements.values(), sources=observed.sources,
                   pending=state.pending_nodes(observed.nodes), cordoned=state.cordoned_nodes)
    existing = state.models.get(model.name)
    return {
        "model": model.name,
        "revision": state.revision,
        "nodes": len(observed.nodes),
        "fits": result.choice is not None,
        "choice": _plain(result.choice),
        "reason": result.reason(),
        "groups": groups(result.refusals),
        "refusals": [_plain(r) for r in result.refusals],
        # Whatever else placement says of its answer (a multi-node summary, ...), as it says it.
        **{f.name: _plain(getattr(result, f.name)) for f in dataclasses.fields(PlacementResult)
           if f.name not in ("choice", "refusals")},
        "estimate": estimate_for(model, observed.nodes, sources=observed.sources).to_doc(),
        "existing": {
            "defined": existing is not None,
            "same_definition": existing is not None and existing.launch_hash() == model.launch_hash(),
            "replicas": sum(1 for p in state.placements.values() if p.model == model.name and p.serves),
        },
    }


def groups(refusals: tuple[Refusal, ...]) -> list[dict[str, Any]]:
    """Refusals by (verdict, code), the largest first within a verdict: each with its nodes and
    its distinct messages (with their nodes), so 1,000 nodes read as a handful of lines."""
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for r in refusals:
        g = by.setdefault((r.verdict, r.code), {"verdict": r.verdict, "code": r.code, "nodes": [], "messages": {}})
        g["nodes"].append(r.node)
        extra = {k: v for k, v in _plain(r).items() if k not in _BASE}
        m = g["messages"].setdefault(r.message, {"message": r.message, "nodes": [], **extra})
        m["nodes"].append(r.node)
    out = []
    for (verdict, code), g in sorted(by.items(), key=lambda kv: (_ORDER.get(kv[0][0], 2), -len(kv[1]["nodes"]),
                                                                   kv[0][1])):
        messages = sorted(g["messages"].values(), key=lambda m: (-len(m["nodes"]), m["message"]))
        out.append({**g, "count": len(g["nodes"]), "messages": messages})
    return out


def _plain(value: Any) -> Any:
    """A placement dataclass as JSON-ready values (tuples as lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
