"""What each simulated node reports: whole cards of one class, or every card carved into the same
MIG instances; its fabric; a storage report claiming the models it was told to hold. Pure.

The GPUs go through the same rule real discovery uses (`agent.gpus.facts.to_gpus`), so a
simulated node's inventory has the shape of a real one: MIG cards listed unplaceable with their
instances at `mig_index(card, n)`, classes as `card_class` names them.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from llmgw import __version__
from llmgw.agent.gpus.classes import card_class
from llmgw.agent.gpus.facts import CardFacts, MachineFacts, MigFacts, to_gpus
from llmgw.agent.storage import ModelSeen, StorageReport
from llmgw.domain.observed import NodeInfo

GIB = 1 << 30
# A card reports a little less memory than it is sold with (the driver keeps some); the class
# rule reads this back as the marketed size, as it does an H100's 79.6 GiB.
REPORTED_SHARE = 0.995
MIG_REPORTED_SHARE = 0.98  # a MIG instance's share of its profile's size (3g.40gb: 39.25 GiB)
MIG_SLICES = 7  # compute slices of a MIG-capable card (A100, H100): a carving uses at most these
NODE_CPUS = 64
NODE_MEMORY_GIB = 1024
STORAGE_PATH = "/sim/models"  # where a node's held models are said to lie (local to the node)
SHARED_STORAGE_PATH = "/sim/shared/models"  # the same, on storage every node of the fabric sees
HELD_MODEL_GIB = 8  # the size a held model's files are said to have when `--storage-holds` gives none
_CLASS = re.compile(r"^(?P<model>[a-z0-9][a-z0-9.-]*?)-(?P<gib>\d+)g$")
_PROFILE = re.compile(r"^(?P<slices>[1-7])g\.(?P<gib>\d+)gb$")
_NAMESPACE = uuid.UUID("5f0c3a52-1e8e-4c55-9d2b-6a1c0e1f5a10")  # device UUIDs: stable per node and index


@dataclass(frozen=True)
class HeldModel:
    """A model a node's storage claims: its name (as storage reports name models) and its files' size."""

    name: str
    size: int  # bytes

    @classmethod
    def parse(cls, text: str) -> HeldModel:
        """`MODEL` or `MODEL=GIB` (a model name may hold ':', never '=')."""
        name, eq, gib = text.partition("=")
        if not name:
            raise ValueError(f"--storage-holds {text!r}: name a model")
        if not eq:
            return cls(name, HELD_MODEL_GIB * GIB)
        try:
            size = float(gib)
        except ValueError:
            size = -1.0
        if not size > 0:
            raise ValueError(f"--storage-holds {text!r}: the size after '=' is in GiB, a number above 0")
        return cls(name, int(size * GIB))


@dataclass(frozen=True)
class NodeShape:
    """Every node of a fleet alike: `gpus` cards of `gpu_class`, each carved into `mig` instances
    when given; nodes spread over `fabrics` in equal consecutive blocks; storage holding `holds`."""

    gpus: int = 8
    gpu_class: str = "h100-80g"
    fabrics: tuple[str, ...] = ("ib-a",)
    mig: tuple[str, ...] = ()  # MIG profiles of each card ("3g.40gb", "3g.40gb"); () = whole cards
    holds: tuple[HeldModel, ...] = ()
    shared_storage: bool = False  # the held models lie on storage the whole fabric sees

    def check(self) -> None:
        """ValueError saying what is wrong with this shape."""
        if self.gpus < 0:
            raise ValueError(f"--gpus-per-node must be 0 or more, not {self.gpus}")
        _, memory = card(self.gpu_class)
        if self.mig:
            slices = sum(int(_profile(p)[0]) for p in self.mig)
            gib = sum(_profile(p)[1] for p in self.mig)
            if slices > MIG_SLICES or gib * GIB * MIG_REPORTED_SHARE > memory:
                raise ValueError(f"--mig {' '.join(self.mig)}: {slices} compute slices and {gib} GiB do not fit "
                                 f"one {self.gpu_class} card ({MIG_SLICES} slices, {memory / GIB:.1f} GiB)")
        if not self.fabrics or any(not f for f in self.fabrics):
            raise ValueError("give each --fabric a name")

    def fabric_of(self, position: int, count: int) -> str:
        """The fabric of the node at `position` (0-based) among `count`: equal blocks, in order."""
        per = -(-count // len(self.fabrics))
        return self.fabrics[min(position // per, len(self.fabrics) - 1)]


def card(gpu_class: str) -> tuple[str, int]:
    """A product name and the memory a card of `gpu_class` reports, read back as that class by
    the class rule: `h100-80g` -> ("NVIDIA H100 80GB", 79.6 GiB)."""
    m = _CLASS.match(gpu_class)
    if m is None:
        raise ValueError(f"--class {gpu_class!r}: a GPU class is MODEL-<GiB>g, like h100-80g or rtx-4090-24g")
    gib = int(m.group("gib"))
    name = f"NVIDIA {m.group('model').replace('-', ' ').upper()} {gib}GB"
    memory = int(gib * GIB * REPORTED_SHARE)
    if gib < 1 or card_class(name, memory) != gpu_class:
        raise ValueError(f"--class {gpu_class!r}: no card discovery would name so (it reads "
                         f"{card_class(name, memory)!r}); use a class like h100-80g")
    return name, memory


def _profile(profile: str) -> tuple[str, int]:
    """`3g.40gb` -> ("3", 40): compute slices and GiB; ValueError for anything else."""
    m = _PROFILE.match(profile)
    if m is None:
        raise ValueError(f"--mig {profile!r}: a MIG profile is <slices>g.<GiB>gb, like 3g.40gb or 1g.10gb")
    return m.group("slices"), int(m.group("gib"))


def node_names(count: int, prefix: str = "sim", first: int = 1) -> list[str]:
    """`sim-0001`, `sim-0002`, …: sorted as numbered."""
    width = max(4, len(str(first + count - 1)))
    return [f"{prefix}-{i:0{width}d}" for i in range(first, first + count)]


def node_info(shape: NodeShape, name: str, fabric: str) -> NodeInfo:
    """The inventory node `name` reports (its agent adds the address it was told)."""
    product, memory = card(shape.gpu_class)
    cards = []
    for i in range(shape.gpus):
        instances = tuple(
            MigFacts(uuid=f"MIG-{uuid.uuid5(_NAMESPACE, f'{name}/{i}/{n}')}", profile=p,
                     memory_total=int(_profile(p)[1] * GIB * MIG_REPORTED_SHARE), memory_used=0,
                     gpu_instance_id=n + 1, compute_instance_id=0)
            for n, p in enumerate(shape.mig))
        cards.append(CardFacts(name=product, uuid=f"GPU-{uuid.uuid5(_NAMESPACE, f'{name}/{i}')}", memory_total=memory,
                               memory_used=0, mig_current=bool(shape.mig), mig_pending=bool(shape.mig),
                               instances=instances, utilization=0.0))
    storage: tuple[dict[str, Any], ...] = ()
    if shape.holds:
        where = SHARED_STORAGE_PATH if shape.shared_storage else STORAGE_PATH
        models = tuple(ModelSeen(m.name, f"{where}/{m.name}", "gguf", m.size) for m in shape.holds)
        storage = (StorageReport(where, fabric, shape.shared_storage, models).to_doc(),)
    return NodeInfo(node=name, hostname=name, cpus=NODE_CPUS, memory_total=NODE_MEMORY_GIB * GIB,
                    gpus=to_gpus(MachineFacts("sim", cards=tuple(cards))), engines=("sim",), fabric=fabric,
                    version=__version__, engine_versions={"sim": __version__}, probe="sim", storage=storage)


class SimProbe:
    """A `GpuProbe` reporting one simulated node's inventory (the same every time)."""

    def __init__(self, info: NodeInfo) -> None:
        self.info = info

    def inventory(self, node: str) -> NodeInfo:
        return replace(self.info, node=node)
