"""What placement decides with: refusals and choices, and the per-node device filters shared by
one-node and multi-node replicas (MIG rules, classes, memory, usable devices, engines).

Pure, like the rest of `placement`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.domain.model import ModelDef, is_mig_class
from llmgw.domain.observed import Gpu, NodeInfo

NOT_NOW = "not_now"  # could fit once something changes (a GPU frees, an engine installs)
NEVER = "never"  # this node cannot run it as defined

ENGINE_HINTS = {
    "llama.cpp": ("install the engine on the node: pip install 'llmgw[llamacpp]' "
                  "(a zipapp node: rebuild it with python build.py --with-llamacpp)"),
    "vllm": "vLLM needs a GPU node with the vllm engine installed",
}
_UNSET_HOSTS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class Refusal:
    node: str
    verdict: str  # NOT_NOW | NEVER
    code: str
    message: str


@dataclass(frozen=True)
class Member:
    """One member of a multi-node replica: its node, devices, and the host its engine is reached at."""

    node: str
    gpus: tuple[int, ...]
    host: str


@dataclass(frozen=True)
class Choice:
    node: str  # a multi-node replica: rank 0's
    gpus: tuple[int, ...]  # () = runs on CPU
    score: float  # 0..100, higher is better
    members: tuple[Member, ...] = ()  # a multi-node replica's, in rank order; () for one node
    fabric: str = ""


@dataclass(frozen=True)
class PlacementResult:
    choice: Choice | None
    refusals: tuple[Refusal, ...]
    summary: str = ""  # why no set of nodes fits, beyond each node's refusal (multi-node replicas)

    def reason(self) -> str:
        """One line for the operator and the client: why nothing fits."""
        if self.choice is not None:
            return ""
        if not self.refusals and not self.summary:
            return "no agent is connected"
        groups: dict[str, list[str]] = {}
        for r in self.refusals:
            groups.setdefault(r.message, []).append(r.node)
        parts = [f"{', '.join(sorted(nodes))}: {msg}" for msg, nodes in sorted(groups.items())]
        if self.summary:
            return self.summary + (" — " + "; ".join(parts) if parts else "")
        return "no node fits — " + "; ".join(parts)


def mig_refusal(model: ModelDef, node: str) -> Refusal | None:
    """A replica on a MIG class runs on one instance: one process opens one MIG device, and
    instances share no NVLink. Validation refuses such definitions too; this holds for any."""
    prof = model.profile
    if any(is_mig_class(c) for c in prof.classes) and max(prof.gpus, prof.tp, prof.pp, prof.nodes) > 1:
        return Refusal(node, NEVER, "mig_single",
                       "a replica on MIG runs on exactly one instance (gpus, tp, pp and nodes must be 1)")
    return None


def devices(model: ModelDef, node: NodeInfo) -> list[Gpu] | Refusal:
    """The node's usable devices that meet the profile (class, memory, MIG rules), at least
    `profile.gpus` of them, or why not. Hardware first (NEVER), then usability (NOT_NOW)."""
    prof = model.profile
    if not node.gpus:
        return Refusal(node.node, NEVER, "no_gpu", "node has no GPU and the model's profile does not allow CPU")
    candidates = list(node.gpus)
    if prof.gpus > 1 or prof.nodes > 1:
        # One process opens one MIG device and instances share no NVLink: one instance or none.
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
    usable = [g for g in candidates if g.usable]
    if len(usable) < prof.gpus:
        # Unhealthy or unplaceable devices count as neither used nor free; they may come back
        # (a reset, MIG instances carved), so not NEVER. Each says why, in the probe's words.
        out = [g for g in candidates if not g.usable]
        why = "; ".join(f"{g.label}: {g.reason or 'unhealthy'}" for g in out)
        if all(g.placeable for g in out):
            return Refusal(node.node, NOT_NOW, "gpus_unhealthy",
                           f"needs {prof.gpus} healthy GPUs, {len(usable)} healthy now ({why})")
        return Refusal(node.node, NOT_NOW, "gpus_unusable",
                       f"needs {prof.gpus} usable GPUs, {len(usable)} usable now ({why})")
    return usable


def engine_refusal(model: ModelDef, node: NodeInfo) -> Refusal | None:
    if model.engine in node.engines:
        return None
    hint = ENGINE_HINTS.get(model.engine, "")
    msg = f"engine {model.engine} is not installed" + (f" ({hint})" if hint else "")
    return Refusal(node.node, NOT_NOW, "engine_missing", msg)


def engine_host(node: NodeInfo) -> str:
    """Where other nodes reach this node's engines: its reported address, else its hostname,
    else its name (an agent bound to every address reports none worth dialling)."""
    for host in (node.address, node.hostname):
        if host not in _UNSET_HOSTS:
            return host
    return node.node
