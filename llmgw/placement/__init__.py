"""Placement (S2): filter nodes with a named reason, score the rest, pick one.

Pure: it reads a model, the nodes' inventories and the current placements and
returns a choice or every refusal. Time and randomness never enter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement

NOT_NOW = "not_now"  # could fit once something changes (a GPU frees, an engine installs)
NEVER = "never"  # this node cannot run it as defined

ENGINE_HINTS = {
    "llama.cpp": "install the engine on the node: pip install 'llmgw[llamacpp]'",
    "vllm": "vLLM needs a GPU node with the vllm engine installed",
}


@dataclass(frozen=True)
class Refusal:
    node: str
    verdict: str  # NOT_NOW | NEVER
    code: str
    message: str


@dataclass(frozen=True)
class Choice:
    node: str
    gpus: tuple[int, ...]  # () = runs on CPU
    score: float  # 0..100, higher is better


@dataclass(frozen=True)
class PlacementResult:
    choice: Choice | None
    refusals: tuple[Refusal, ...]

    def reason(self) -> str:
        """One line for the operator and the client: why nothing fits."""
        if self.choice is not None:
            return ""
        if not self.refusals:
            return "no agent is connected"
        groups: dict[str, list[str]] = {}
        for r in self.refusals:
            groups.setdefault(r.message, []).append(r.node)
        parts = [f"{', '.join(sorted(nodes))}: {msg}" for msg, nodes in sorted(groups.items())]
        return "no node fits — " + "; ".join(parts)


def place(
    model: ModelDef,
    nodes: Mapping[str, NodeInfo],
    placements: Iterable[Placement],
) -> PlacementResult:
    """Choose a node (and devices) for one more replica of `model`."""
    placements = list(placements)
    used: dict[str, set[int]] = {}
    same_model: dict[str, int] = {}
    for p in placements:
        used.setdefault(p.node, set()).update(p.gpus)
        if p.model == model.name:
            same_model[p.node] = same_model.get(p.node, 0) + 1
    refusals: list[Refusal] = []
    choices: list[Choice] = []
    for name in sorted(nodes):
        outcome = _fit(model, nodes[name], used.get(name, set()), same_model.get(name, 0))
        if isinstance(outcome, Refusal):
            refusals.append(outcome)
        else:
            choices.append(outcome)
    if not choices:
        return PlacementResult(None, tuple(refusals))
    best = max(choices, key=lambda c: (c.score, -len(c.gpus), c.node))
    # Ties go to the alphabetically first node, for reproducible plans.
    top = [c for c in choices if c.score == best.score]
    return PlacementResult(min(top, key=lambda c: c.node), tuple(refusals))


def _fit(model: ModelDef, node: NodeInfo, used: set[int], same_model: int) -> Choice | Refusal:
    prof = model.profile
    if model.engine not in node.engines:
        hint = ENGINE_HINTS.get(model.engine, "")
        msg = f"engine {model.engine} is not installed" + (f" ({hint})" if hint else "")
        return Refusal(node.node, NOT_NOW, "engine_missing", msg)
    spread = 100.0 / (1 + same_model)  # replicas of one model prefer different nodes
    if prof.cpu:
        return Choice(node.node, (), spread)
    if prof.nodes > 1:
        return Refusal(node.node, NEVER, "multi_node", "replicas spanning several nodes are not supported yet")
    healthy = [g for g in node.gpus if g.healthy]
    if not node.gpus:
        return Refusal(node.node, NEVER, "no_gpu", "node has no GPU and the model's profile does not allow CPU")
    if prof.classes:
        healthy = [g for g in healthy if g.gpu_class in prof.classes]
        if not any(g.gpu_class in prof.classes for g in node.gpus):
            return Refusal(node.node, NEVER, "class", f"no GPU of class {', '.join(prof.classes)}")
    if prof.memory_gib > 0:
        need = int(prof.memory_gib * (1 << 30) / prof.gpus)
        big = [g for g in healthy if g.memory_total >= need]
        if not big and healthy:
            return Refusal(node.node, NEVER, "memory", f"no GPU has {prof.memory_gib / prof.gpus:g} GiB")
        healthy = big
    if len(healthy) < prof.gpus:
        return Refusal(node.node, NEVER, "gpu_count", f"needs {prof.gpus} healthy GPUs, node has {len(healthy)}")
    free = [g for g in healthy if g.index not in used]
    if len(free) < prof.gpus:
        return Refusal(node.node, NOT_NOW, "gpus_busy", f"needs {prof.gpus} free GPUs, {len(free)} free")
    chosen = tuple(sorted(g.index for g in free)[: prof.gpus])
    # Bin-pack: the fuller the node after this replica, the better (whole nodes stay free).
    usable = len([g for g in node.gpus if g.healthy])
    packed = 100.0 * (len(used) + prof.gpus) / max(usable, 1)
    return Choice(node.node, chosen, 0.7 * packed + 0.3 * spread)
