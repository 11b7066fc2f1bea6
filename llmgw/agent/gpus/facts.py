"""Card facts, the one shape both discovery paths produce, and the one rule that turns them
into the inventory's `Gpu` entries (indexes, classes, MIG expansion, health, placeability).

Pure: no I/O. A fact nobody could read is None (unknown), never 0 or "healthy".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmgw.agent.gpus.classes import card_class, mig_class
from llmgw.domain.observed import Gpu, mig_index

MIB = 1 << 20

NO_INSTANCES = "MIG mode is on but no instances are carved (create them with nvidia-smi mig -cgi ... -C)"
MIG_PARENT = "MIG mode is on: its instances are placed, not the card"


@dataclass(frozen=True)
class MigFacts:
    """One MIG device (a compute instance) as found under its card, in output order."""

    uuid: str  # MIG-… ("" = not found)
    profile: str  # "3g.40gb" ("" = not found)
    memory_total: int | None  # bytes
    memory_used: int | None
    processes: tuple[int, ...] = ()
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class CardFacts:
    """One physical card, at its position in the discovery's output."""

    name: str
    uuid: str
    memory_total: int | None  # bytes
    memory_used: int | None
    mig_current: bool | None = None  # None: not MIG-capable, or unknown
    mig_pending: bool | None = None
    instances: tuple[MigFacts, ...] = ()
    utilization: float | None = None  # percent
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[int, ...] = ()
    ecc_uncorrectable: int | None = None  # volatile (since the driver loaded)
    retired_pages_pending: bool | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    error: str = ""  # why the card could not be read (fell off the bus, lost); "" when it answered


@dataclass(frozen=True)
class MachineFacts:
    """What one discovery path read: the cards in its order, the driver, and what went wrong
    without stopping it (a card it could not read is a card with an `error`)."""

    source: str  # "nvml" | "nvidia-smi"
    driver: str = ""
    cards: tuple[CardFacts, ...] = ()
    notes: tuple[str, ...] = ()  # partial reads: "nvidia-smi -q -x output is truncated ..."


def health(card: CardFacts) -> str:
    """Why `card` is unhealthy ("" when it is not): every reason found, joined."""
    why = []
    if card.error:
        why.append(f"the GPU did not answer ({card.error}): fell off the bus or lost; it needs a reset or a reboot")
    if card.ecc_uncorrectable:
        why.append(f"{card.ecc_uncorrectable} uncorrectable ECC error(s) since the driver loaded; "
                   f"reset the GPU (nvidia-smi -r) and watch whether they come back")
    if card.retired_pages_pending:
        why.append("a retired memory page is pending: reset the GPU (nvidia-smi -r) to retire it")
    if card.row_remap_failure:
        why.append("row remapping failed: the card's memory cannot repair itself; it needs service")
    return "; ".join(why)


def pending_change(card: CardFacts) -> str:
    """The reason a card whose MIG mode is about to change is kept out ("" when it is not)."""
    if card.mig_pending is None or card.mig_current is None or card.mig_pending == card.mig_current:
        return ""
    now, then = ("on", "off") if card.mig_current else ("off", "on")
    return (f"MIG mode is {now} but a change to {then} is pending: a GPU reset is needed "
            f"(nvidia-smi -r, with no process on the card, or a reboot)")


def to_gpus(facts: MachineFacts) -> tuple[Gpu, ...]:
    """Every device of the machine: whole cards by position (0, 1, …); a MIG-mode card listed
    unplaceable, then its instances as `mig_index(card, n)` (n = position under the card)."""
    out: list[Gpu] = []
    for i, card in enumerate(facts.cards):
        sick = health(card)
        klass = card_class(card.name, card.memory_total or 0)
        pending = pending_change(card)
        whole = Gpu(index=i, uuid=card.uuid, name=card.name, gpu_class=klass, memory_total=card.memory_total or 0,
                    memory_used=card.memory_used, healthy=not sick, reason=sick, utilization=card.utilization,
                    temperature_c=card.temperature_c, power_w=card.power_w, processes=card.processes)
        if pending or card.mig_current:
            why = pending or (MIG_PARENT if card.instances else NO_INSTANCES)
            out.append(_unplaceable(whole, why))
        elif card.memory_total is None and not sick:
            out.append(_unplaceable(whole, "its memory size is unknown"))
        elif not card.uuid and not sick:
            out.append(_unplaceable(whole, "its UUID is unknown, so no engine can be pointed at it"))
        else:
            out.append(whole)
        if not card.mig_current:
            continue
        for n, inst in enumerate(card.instances):
            profile = inst.profile or "unknown"
            g = Gpu(index=mig_index(i, n), uuid=inst.uuid, name=f"{card.name} MIG {profile}",
                    gpu_class=mig_class(klass, profile), memory_total=inst.memory_total or 0,
                    memory_used=inst.memory_used, healthy=not sick, reason=sick, mig_profile=inst.profile,
                    parent_index=i, utilization=None, temperature_c=card.temperature_c, power_w=card.power_w,
                    processes=inst.processes)
            if pending:
                g = _unplaceable(g, pending)
            elif not inst.uuid:
                g = _unplaceable(g, "its MIG UUID is unknown (not listed by the driver), so no engine can use it")
            elif not inst.profile:
                g = _unplaceable(g, "its MIG profile is unknown")
            elif inst.memory_total is None:
                g = _unplaceable(g, "its memory size is unknown")
            out.append(g)
    return tuple(out)


def _unplaceable(g: Gpu, why: str) -> Gpu:
    reason = f"{g.reason}; {why}" if g.reason else why
    return replace(g, placeable=False, reason=reason)


def warnings(facts: MachineFacts) -> tuple[str, ...]:
    """States in which nothing can run on a card, in words an operator acts on."""
    said: list[str] = []
    for i, card in enumerate(facts.cards):
        pending = pending_change(card)
        if pending:
            said.append(f"GPU {i}: {pending}")
        elif card.mig_current and not card.instances:
            said.append(f"GPU {i}: {NO_INSTANCES}")
        sick = health(card)
        if sick:
            said.append(f"GPU {i} is unhealthy: {sick}")
        elif card.row_remap_pending:
            said.append(f"GPU {i}: a memory row remap is pending; reset the GPU (nvidia-smi -r) when it is idle")
    return (*said, *facts.notes)
