"""What placement decides with: refusals and choices, what one replica needs (`Need`), and the
per-node filters shared by one-node and multi-node replicas (MIG, classes, memory, devices, engines).

Pure, like the rest of `placement`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from llmgw.domain.memory import MemoryEstimate
from llmgw.domain.model import ModelDef, is_mig_class
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.placement.scores import Score

FITS = "fits"  # a verdict (`FleetView.verdicts`): the node can take the replica now
NOT_NOW = "not_now"  # could fit once something changes (a GPU frees, an engine installs)
NEVER = "never"  # this node cannot run it as defined
GIB = 1 << 30

ENGINE_HINTS = {
    "llama.cpp": ("install the engine on the node: pip install 'llmgw[llamacpp]' "
                  "(a zipapp node: rebuild it with python build.py --with-llamacpp)"),
    "vllm": "vLLM needs a GPU node with the vllm engine installed",
}
_UNSET_HOSTS = ("", "0.0.0.0", "::")

# Every refusal code, its verdict and what it means (docs/placement.md has the same table;
# a test keeps them equal).
REASONS: dict[str, tuple[str, str]] = {
    "mig_single": (NEVER, "a MIG class with gpus, tp, pp or nodes above 1, or a multi-GPU replica on a node of MIG instances only"),
    "no_gpu": (NEVER, "a GPU profile on a node with no GPU"),
    "node_not_ready": (NOT_NOW, "GPU discovery failed on the node: GPU replicas wait, CPU replicas run"),
    "class": (NEVER, "no GPU of an allowed class"),
    "memory": (NEVER, "no GPU of an allowed class has the memory per GPU the estimate says"),
    "gpu_count": (NEVER, "fewer GPUs that meet the profile than it takes"),
    "gpus_unhealthy": (NOT_NOW, "enough GPUs, but some are unhealthy now"),
    "gpus_unusable": (NOT_NOW, "enough GPUs, but some are not placeable now (MIG mode pending, nothing carved)"),
    "engine_missing": (NOT_NOW, "the model's engine is not installed on the node, or not in the form the replica needs"),
    "gpus_busy": (NOT_NOW, "not enough free GPUs on the node now"),
    "cpu_memory": (NEVER, "a CPU replica needs more memory than the node has"),
    "cpu_memory_busy": (NOT_NOW, "the node's CPU replicas leave too little memory now"),
    "no_fabric": (NEVER, "a multi-node replica on a node with no fabric configured"),
    "node_busy": (NOT_NOW, "a multi-node replica needs a whole free node"),
    "reserved": (NEVER, "it would fit only in what the node reserves for other work (`llmgw agent --reserve`)"),
    "awaiting_approval": (NOT_NOW, "the node is waiting for approval (`nodes.require_approval`): `ctl nodes approve`"),
    "cordoned": (NOT_NOW, "the node is cordoned or draining for maintenance: `ctl nodes uncordon` ends it"),
}


@dataclass(frozen=True)
class Verdict:
    """One node's verdict on one more replica: FITS (with its score and devices), NOT_NOW or NEVER."""

    node: str
    verdict: str  # FITS | NOT_NOW | NEVER
    code: str = ""
    message: str = ""
    numbers: Mapping[str, float] | None = None
    score: Score | None = None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why one node cannot take the replica: a verdict, a code (docs/placement.md lists them),
    words for the operator, and the figures behind the words (bytes, counts) for programs."""

    node: str
    verdict: str  # NOT_NOW | NEVER
    code: str
    message: str
    numbers: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Need:
    """What one replica of a model asks of a node: the model's profile and engine, with the
    memory estimate resolved (None = unknown: no memory check, never a guess of 0).

    Compared and hashed by identity: a `FleetView` makes one object per equal need (`Need.fields`, then
    `FleetView._intern`), and its caches look needs up on every placement, where hashing the fields (in
    Python) cost more than the lookup."""

    engine: str
    cpu: bool
    gpus: int  # per node
    nodes: int
    classes: tuple[str, ...]
    per_device: int | None  # bytes each GPU must have (GPU profiles)
    total: int | None  # bytes the whole replica needs (CPU profiles: the node's memory)
    mig_single: bool  # a MIG class with gpus/tp/pp/nodes > 1: refused everywhere
    share: float | None = None  # the engine takes this share of each GPU (vLLM); None: all of it

    @staticmethod
    def fields(model: ModelDef, estimate: MemoryEstimate) -> tuple[Any, ...]:
        """The need of `model` with its estimate, as the fields in order (`Need(*fields)`): a caller that
        keeps one object per equal need looks them up before it makes one."""
        prof = model.profile
        mig = max(prof.gpus, prof.tp, prof.pp, prof.nodes) > 1 and any(is_mig_class(c) for c in prof.classes)
        return (model.engine, prof.cpu, prof.gpus, prof.nodes, prof.classes,
                estimate.per_device(prof.gpus * prof.nodes), estimate.total_bytes, mig,
                None if prof.cpu else estimate.device_share)

    def family(self) -> tuple[Any, ...]:
        """The fields (as `fields` gives them) of this GPU profile without its memory figures and share: a need
        that fits every node this one fits, with every device this one may use there, and maybe more."""
        return (self.engine, self.cpu, self.gpus, self.nodes, self.classes, None, None, self.mig_single, None)

    def room(self, gpu: Gpu, reserved: int = 0) -> int:
        """What of a GPU's memory the engine will use: all of it, or its share (vLLM); with `reserved` bytes
        of it kept for other work, the rest, and none where the share (taken whatever the need) would reach
        into the reserve."""
        room = gpu.memory_total if self.share is None else int(gpu.memory_total * self.share)
        if not reserved:
            return room
        if self.share is not None:
            return room if room <= gpu.memory_total - reserved else 0
        return min(room, gpu.memory_total - reserved)


def gib(n: float) -> str:
    """Bytes as GiB for messages: "90", "79.6"."""
    return f"{n / GIB:.1f}".removesuffix(".0")


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
    short_by: str = ""  # nothing can ever fit for want of memory: by how much (`fleet.short_by`)

    def reason(self) -> str:
        """One line for the operator and the client: why nothing fits."""
        if self.choice is not None:
            return ""
        if not self.refusals and not self.summary:
            return "no agent is connected"
        groups: dict[str, list[str]] = {}
        for r in self.refusals:
            groups.setdefault(r.message, []).append(r.node)
        parts = [f"{_names(nodes)}: {msg}" for msg, nodes in sorted(groups.items())]
        if self.summary:
            return self.summary + (" — " + "; ".join(parts) if parts else "")
        return (self.short_by or "no node fits") + " — " + "; ".join(parts)


NAMES_SHOWN = 6  # per reason: a fleet of 1,000 nodes refused alike reads as six names and a count


def _names(nodes: list[str]) -> str:
    names = sorted(nodes)
    if len(names) <= NAMES_SHOWN:
        return ", ".join(names)
    return f"{', '.join(names[:NAMES_SHOWN])} and {len(names) - NAMES_SHOWN} more"


def mig_refusal(need: Need, node: str) -> Refusal | None:
    """A replica on a MIG class runs on one instance: one process opens one MIG device, and
    instances share no NVLink. Validation refuses such definitions too; this holds for any."""
    if need.mig_single:
        return Refusal(node, NEVER, "mig_single",
                       "a replica on MIG runs on exactly one instance (gpus, tp, pp and nodes must be 1)")
    return None


def not_ready(node: NodeInfo) -> Refusal | None:
    """A node whose GPU discovery failed lists no GPU but is not a CPU node: GPU replicas wait
    for it (NOT_NOW, with the probe's words); CPU replicas run there as usual."""
    if node.gpus or node.probe != "none" or not node.warnings:
        return None
    return Refusal(node.node, NOT_NOW, "node_not_ready", "GPU discovery failed: " + "; ".join(node.warnings))


def devices(need: Need, node: NodeInfo) -> list[Gpu] | Refusal:
    """The node's usable devices that meet the profile (class, memory, MIG rules), at least
    `need.gpus` of them, or why not. Hardware first (NEVER), then usability (NOT_NOW)."""
    prof = need  # the profile, as resolved
    if not node.gpus:
        return not_ready(node) or Refusal(node.node, NEVER, "no_gpu",
                                          "node has no GPU and the model's profile does not allow CPU")
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
    if prof.per_device is not None:
        per_device = prof.per_device
        rooms = [prof.room(g) for g in candidates]
        largest = max(rooms)
        candidates = [g for g, room in zip(candidates, rooms) if room >= per_device]
        if not candidates:
            of = f" (the {prof.share:.0%} of a GPU {prof.engine} takes)" if prof.share is not None else ""
            return Refusal(node.node, NEVER, "memory",
                           f"needs {gib(per_device)} GiB per GPU, the largest here has {gib(largest)} GiB{of}",
                           {"need_bytes": per_device, "largest_bytes": largest})
    if len(candidates) < prof.gpus:
        return Refusal(node.node, NEVER, "gpu_count", f"needs {prof.gpus} GPUs, node has {len(candidates)} that fit",
                       {"need": prof.gpus, "fit": len(candidates)})
    if node.reserved_gpus or node.reserved_vram:
        kept = _unreserved(prof, node, candidates)
        if isinstance(kept, Refusal):
            return kept
        candidates = kept
    usable = [g for g in candidates if g.usable]
    if len(usable) < prof.gpus:
        # Unhealthy or unplaceable devices count as neither used nor free; they may come back
        # (a reset, MIG instances carved), so not NEVER. Each says why, in the probe's words.
        out = [g for g in candidates if not g.usable]
        why = "; ".join(f"{g.label}: {g.reason or 'unhealthy'}" for g in out)
        numbers = {"need": prof.gpus, "usable": len(usable)}
        if all(g.placeable for g in out):
            return Refusal(node.node, NOT_NOW, "gpus_unhealthy",
                           f"needs {prof.gpus} healthy GPUs, {len(usable)} healthy now ({why})", numbers)
        return Refusal(node.node, NOT_NOW, "gpus_unusable",
                       f"needs {prof.gpus} usable GPUs, {len(usable)} usable now ({why})", numbers)
    return usable


def _unreserved(need: Need, node: NodeInfo, candidates: list[Gpu]) -> list[Gpu] | Refusal:
    """The candidates less what the node reserves (its devices; each GPU's reserved memory), or `reserved`
    when the hardware fits the profile only with the reserve."""
    least = 1 if need.per_device is None else need.per_device
    kept = [g for g in candidates if not node.reserved(g) and need.room(g, node.reserved_vram) >= least]
    if len(kept) >= need.gpus:
        return kept
    said = []
    if node.reserved_gpus:
        labels = [g.label for g in node.gpus if node.reserved(g)]
        said.append(f"GPU{'s' if len(labels) > 1 else ''} {', '.join(labels)}")
    if node.reserved_vram:
        said.append(f"{gib(node.reserved_vram)} GiB of each GPU")
        if need.share is not None:  # vLLM takes its share of the card whatever the model needs
            said[-1] += f"; {need.engine} takes {need.share:.0%} of a GPU, lower its --gpu-memory-utilization"
    of = f" of {gib(need.per_device)} GiB" if need.per_device is not None else ""
    return Refusal(node.node, NEVER, "reserved",
                   f"needs {need.gpus} GPU{'s' if need.gpus > 1 else ''}{of}: {len(kept)} fit outside what is "
                   f"reserved for other work ({' and '.join(said)})",
                   {"need": need.gpus, "fit": len(kept), "reserved_gpus": len(node.reserved_gpus),
                    "reserved_vram_bytes": node.reserved_vram})


def approval_refusal(node: str) -> Refusal:
    """A node waiting for an operator's approval takes nothing (`ClusterState.pending_nodes`)."""
    return Refusal(node, NOT_NOW, "awaiting_approval",
                   f"waiting for approval: nodes.require_approval is on and no operator approved this node yet "
                   f"(llmgw ctl nodes approve {node})")


def cordon_refusal(node: str) -> Refusal:
    """A cordoned or draining node takes nothing new (`ClusterState.cordoned_nodes`)."""
    return Refusal(node, NOT_NOW, "cordoned",
                   f"cordoned for maintenance: nothing new is placed here (llmgw ctl nodes uncordon {node})")


def engine_refusal(model: ModelDef | Need, node: NodeInfo) -> Refusal | None:
    """The node cannot start the model's engine: not installed (not among the engines its agent detected), or
    not in the form the replica needs (llama.cpp on GPUs or across nodes runs the llama-server binary; a node
    with only the in-process binding says `xllamacpp`). NOT_NOW: it fits once someone installs it, and the
    agent detects its engines again at every look. llmgw installs no engine itself. The words name no node
    (`PlacementResult.reason` puts the names of the nodes refused alike before them: "gpu-3, gpu-7: engine …").
    """
    if model.engine not in node.engines:
        hint = ENGINE_HINTS.get(model.engine, "")
        return Refusal(node.node, NOT_NOW, "engine_missing",
                       f"engine {model.engine} is not installed" + (f" ({hint})" if hint else ""))
    forms = node.engine_versions.get(model.engine)
    if (model.engine == "llama.cpp" and isinstance(model, Need) and (not model.cpu or model.nodes > 1)
            and forms is not None and "llama-server" not in forms):
        where = "across nodes" if model.nodes > 1 else "on GPUs"
        return Refusal(node.node, NOT_NOW, "engine_missing",
                       f"engine llama.cpp is not installed in the form a replica {where} runs: the node has only "
                       f"the in-process binding (xllamacpp), not the llama-server binary (put llama-server on the "
                       f"agent's PATH, or set LLMGW_LLAMA_SERVER)")
    return None


def engine_host(node: NodeInfo) -> str:
    """Where other nodes reach this node's engines: its reported address, else its hostname,
    else its name (an agent bound to every address reports none worth dialling)."""
    for host in (node.address, node.hostname):
        if host not in _UNSET_HOSTS:
            return host
    return node.node
