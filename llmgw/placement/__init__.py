"""Placement (S2): filter nodes with a named reason, score the rest, pick one.

Pure: it reads a model, the nodes' inventories and the current placements and
returns a choice or every refusal. Time and randomness never enter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from llmgw.domain.model import ModelDef, is_mig_class
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import Placement

NOT_NOW = "not_now"  # could fit once something changes (a GPU frees, an engine installs)
NEVER = "never"  # this node cannot run it as defined

ENGINE_HINTS = {
    "llama.cpp": ("install the engine on the node: pip install 'llmgw[llamacpp]' "
                  "(a zipapp node: rebuild it with python build.py --with-llamacpp)"),
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
    # The best score; ties go to the alphabetically first node, for reproducible plans.
    return PlacementResult(min(choices, key=lambda c: (-c.score, c.node)), tuple(refusals))


def _fit(model: ModelDef, node: NodeInfo, used: set[int], same_model: int) -> Choice | Refusal:
    prof = model.profile
    # Replicas of one model prefer nodes that hold none yet: losing a node must not
    # take a whole model down. Worth 50 of 100, so it always outranks bin-packing.
    spread = 50.0 if same_model == 0 else 0.0
    if prof.cpu:
        return _engine_refusal(model, node) or Choice(node.node, (), 50.0 + spread / (1 + same_model))
    # Hardware first: a node that can never run the model says so, whatever is installed.
    if prof.nodes > 1:
        return Refusal(node.node, NEVER, "multi_node", "replicas spanning several nodes are not supported yet")
    if not node.gpus:
        return Refusal(node.node, NEVER, "no_gpu", "node has no GPU and the model's profile does not allow CPU")
    candidates = list(node.gpus)
    if prof.gpus > 1:
        # One process opens one MIG device and instances share no NVLink: one instance or none (S6).
        candidates = [g for g in candidates if not is_mig_class(g.gpu_class)]
        if not candidates:
            return Refusal(node.node, NEVER, "mig_single", "a replica on MIG runs on exactly one instance")
    if prof.classes:
        candidates = [g for g in candidates if g.gpu_class in prof.classes]
        if not candidates:
            return Refusal(node.node, NEVER, "class", f"no GPU of class {', '.join(prof.classes)}")
    if prof.memory_gib > 0:
        need = int(prof.memory_gib * (1 << 30) / prof.gpus)
        candidates = [g for g in candidates if g.memory_total >= need]
        if not candidates:
            return Refusal(node.node, NEVER, "memory", f"no GPU has {prof.memory_gib / prof.gpus:g} GiB")
    if len(candidates) < prof.gpus:
        return Refusal(node.node, NEVER, "gpu_count", f"needs {prof.gpus} GPUs, node has {len(candidates)} that fit")
    healthy = [g for g in candidates if g.healthy]
    if len(healthy) < prof.gpus:
        # Unhealthy GPUs count as neither used nor free; they may come back.
        return Refusal(node.node, NOT_NOW, "gpus_unhealthy",
                       f"needs {prof.gpus} healthy GPUs, {len(healthy)} healthy now")
    missing = _engine_refusal(model, node)
    if missing is not None:
        return missing
    free = [g for g in healthy if g.index not in used]
    if len(free) < prof.gpus:
        return Refusal(node.node, NOT_NOW, "gpus_busy", f"needs {prof.gpus} free GPUs, {len(free)} free")
    chosen = tuple(sorted(g.index for g in free)[: prof.gpus])
    # Bin-pack: the fuller the node's healthy GPUs after this replica, the better (whole nodes stay free).
    usable = {g.index for g in node.gpus if g.healthy}
    packed = 50.0 * (len(used & usable) + prof.gpus) / max(len(usable), 1)
    return Choice(node.node, chosen, packed + spread)


def _engine_refusal(model: ModelDef, node: NodeInfo) -> Refusal | None:
    if model.engine in node.engines:
        return None
    hint = ENGINE_HINTS.get(model.engine, "")
    msg = f"engine {model.engine} is not installed" + (f" ({hint})" if hint else "")
    return Refusal(node.node, NOT_NOW, "engine_missing", msg)
