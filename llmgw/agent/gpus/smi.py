"""The pure parser of `nvidia-smi -L` and `nvidia-smi -q -x` output (no I/O): text in, `MachineFacts` out.

Holds to every generation of the XML (nvsmi_device_v10 to v13 DTDs): the element names that moved
are each read under all of their names. Malformed output raises `SmiOutputError` with what was wrong.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace

from llmgw.agent.gpus.facts import MIB, CardFacts, MachineFacts, MigFacts


class SmiOutputError(ValueError):
    """nvidia-smi said something this parser cannot read; the message says what and where."""


# `GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-…)`
_CARD = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*(\S+?)\)\s*$")
# `  MIG 3g.40gb     Device  0: (UUID: MIG-…)`; R450 drivers: `(UUID: MIG-GPU-…/1/0)`
_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(\S+?)\)\s*$")
# `Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system …`
_UNREADABLE = re.compile(r"^Unable to determine the device handle for (?:GPU\s*)?([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f])\s*:\s*(.*?)\.?\s*$", re.IGNORECASE)
_LOST_WORDS = ("gpu is lost", "unknown error", "gpu requires reset", "fallen off the bus")


@dataclass
class ListedCard:
    """One card as `nvidia-smi -L` lists it (or the line saying it could not be read)."""

    name: str = ""
    uuid: str = ""
    migs: list[tuple[int, str, str]] = field(default_factory=list)  # (device number, profile, uuid)
    error: str = ""


def parse_list(text: str) -> list[ListedCard]:
    """`nvidia-smi -L` -> one entry per card in output order. Raises `SmiOutputError` when the
    text has lines but none of them names a GPU (not nvidia-smi's listing)."""
    cards: list[ListedCard] = []
    strange: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.strip() == "No devices were found":
            continue
        if m := _CARD.match(line):
            cards.append(ListedCard(name=m.group(2).strip(), uuid=m.group(3)))
        elif (m := _MIG.match(line)) and cards:
            cards[-1].migs.append((int(m.group(2)), m.group(1).lower(), m.group(3)))
        elif m := _UNREADABLE.match(line.strip()):
            cards.append(ListedCard(error=f"nvidia-smi: {m.group(2).strip() or 'unreadable'} (bus {m.group(1)})"))
        else:
            strange.append(line)
    if strange and not cards:
        raise SmiOutputError(f"nvidia-smi -L output names no GPU; it starts: {strange[0][:200]!r}")
    return cards


def _text(node: ET.Element | None, *paths: str) -> str | None:
    """The first of `paths` under `node` that holds a value; None for absent, "N/A" and the like."""
    if node is None:
        return None
    for path in paths:
        found = node.find(path)
        if found is not None and found.text is not None:
            value = found.text.strip()
            if value and value.lower() not in ("n/a", "[n/a]", "not supported", "[not supported]", "none"):
                return value
    return None


def _number(node: ET.Element | None, *paths: str) -> float | None:
    value = _text(node, *paths)
    if value is None:
        return None
    m = re.match(r"^(-?\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def _mib(node: ET.Element | None, path: str) -> int | None:
    value = _number(node, path)
    return None if value is None else int(value) * MIB


def _yes(node: ET.Element | None, *paths: str) -> bool | None:
    """Yes/No, Enabled/Disabled -> True/False; any of `paths` saying yes wins; None if none says."""
    said = [_text(node, p) for p in paths]
    known = [v.lower() in ("yes", "enabled", "active") for v in said if v is not None]
    return any(known) if known else None


def _ecc_uncorrectable(gpu: ET.Element) -> int | None:
    """Volatile uncorrectable ECC errors across the generations' names: `double_bit/total`
    (before Ampere), `sram_uncorrectable` + `dram_uncorrectable` (v11, v12), the SRAM count split
    into `_parity` and `_secded` (late v12, v13)."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    counts = [_number(volatile, p) for p in ("double_bit/total", "sram_uncorrectable", "sram_uncorrectable_parity",
                                              "sram_uncorrectable_secded", "dram_uncorrectable")]
    known = [int(c) for c in counts if c is not None]
    return sum(known) if known else None


def _lost(gpu: ET.Element) -> str:
    """nvidia-smi prints a lost GPU's values as words ("GPU is lost", "Unknown Error")."""
    for path in ("uuid", "product_name", "fb_memory_usage/total"):
        value = _text(gpu, path)
        if value and any(w in value.lower() for w in _LOST_WORDS):
            return f"nvidia-smi: {value}"
    return ""


def _processes(gpu: ET.Element) -> list[tuple[int, int | None, int | None]]:
    """(pid, gpu instance, compute instance) of each process on the card."""
    found = []
    for p in gpu.findall("processes/process_info"):
        pid = _number(p, "pid")
        if pid is None:
            continue
        gi, ci = _number(p, "gpu_instance_id"), _number(p, "compute_instance_id")
        found.append((int(pid), None if gi is None else int(gi), None if ci is None else int(ci)))
    return found


@dataclass(frozen=True)
class QueriedMig:
    number: int  # the `Device N` of `nvidia-smi -L`
    gi: int | None
    ci: int | None
    memory_total: int | None
    memory_used: int | None
    uuid: str  # "" on every driver seen so far: -L is where a MIG UUID is


@dataclass(frozen=True)
class QueriedCard:
    card: CardFacts
    migs: tuple[QueriedMig, ...]
    processes: tuple[tuple[int, int | None, int | None], ...]  # (pid, gpu instance, compute instance)


def parse_query(text: str) -> tuple[str, list[QueriedCard]]:
    """`nvidia-smi -q -x` -> (driver version, cards in output order). MIG devices carry no
    profile or UUID here (only `-L` says them); processes are per card, each with its GPU and
    compute instance ids. Raises `SmiOutputError` when the text is not a whole nvidia_smi_log."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise SmiOutputError(f"nvidia-smi -q -x output is not XML that parses (truncated?): {e}") from None
    if root.tag != "nvidia_smi_log":
        raise SmiOutputError(f"nvidia-smi -q -x output is <{root.tag}>, not <nvidia_smi_log>")
    driver = _text(root, "driver_version", "kmd_version") or ""
    cards = []
    for gpu in root.findall("gpu"):
        procs = _processes(gpu)
        migs: list[QueriedMig] = []
        for m in gpu.findall("mig_devices/mig_device"):
            gi, ci = _number(m, "gpu_instance_id"), _number(m, "compute_instance_id")
            number = _number(m, "index")
            migs.append(QueriedMig(number=int(number) if number is not None else len(migs),
                                   gi=None if gi is None else int(gi), ci=None if ci is None else int(ci),
                                   memory_total=_mib(m, "fb_memory_usage/total"),
                                   memory_used=_mib(m, "fb_memory_usage/used"), uuid=_text(m, "uuid") or ""))
        card = CardFacts(
            name=_text(gpu, "product_name") or "",
            uuid=_text(gpu, "uuid") or "",
            memory_total=_mib(gpu, "fb_memory_usage/total"),
            memory_used=_mib(gpu, "fb_memory_usage/used"),
            mig_current=_yes(gpu, "mig_mode/current_mig"),
            mig_pending=_yes(gpu, "mig_mode/pending_mig"),
            utilization=_number(gpu, "utilization/gpu_util"),
            temperature_c=_number(gpu, "temperature/gpu_temp"),
            power_w=_number(gpu, "gpu_power_readings/power_draw", "gpu_power_readings/instant_power_draw",
                            "gpu_power_readings/average_power_draw", "power_readings/power_draw"),
            processes=tuple(p for p, _, _ in procs),
            ecc_uncorrectable=_ecc_uncorrectable(gpu),
            retired_pages_pending=_yes(gpu, "retired_pages/pending_retirement", "retired_pages/pending_blacklist"),
            row_remap_pending=_yes(gpu, "remapped_rows/remapped_row_pending"),
            row_remap_failure=_yes(gpu, "remapped_rows/remapped_row_failure"),
            error=_lost(gpu),
        )
        if card.error:  # what a lost card "reports" is words, not values
            card = replace(card, uuid=card.uuid if card.uuid.startswith("GPU-") else "",
                           name="" if card.name in card.error else card.name, memory_total=None, memory_used=None)
        cards.append(QueriedCard(card, tuple(migs), tuple(procs)))
    return driver, cards


def parse(listing: str, query: str | None) -> MachineFacts:
    """Both outputs -> the machine's facts. `-L` orders the cards and names the MIG devices
    (profile, UUID); `-q -x` adds memory, health, MIG mode and processes, matched by card UUID
    (by position for a card neither names). `query` None or unreadable leaves what `-L` says,
    with a note why."""
    listed = parse_list(listing)
    notes: list[str] = []
    driver = ""
    queried: list[QueriedCard] = []
    if query is not None:
        try:
            driver, queried = parse_query(query)
        except SmiOutputError as e:
            notes.append(f"{e}; only what nvidia-smi -L says is known")
    by_uuid = {q.card.uuid: q for q in queried if q.card.uuid}
    taken: set[int] = set()
    cards = []
    for pos, entry in enumerate(listed):
        match = by_uuid.get(entry.uuid) if entry.uuid else None
        if match is None and not entry.uuid and pos < len(queried) and not queried[pos].card.uuid:
            match = queried[pos]
        if match is not None:
            taken.add(id(match))
        cards.append(_merge(entry, match, queried_ok=query is not None and not notes))
    # A card that -q -x shows and -L left out still exists: it comes after the listed ones.
    cards += [_merge(ListedCard(), q, queried_ok=True) for q in queried if id(q) not in taken]
    return MachineFacts(source="nvidia-smi", driver=driver, cards=tuple(cards), notes=tuple(notes))


def _merge(entry: ListedCard, match: QueriedCard | None, *, queried_ok: bool) -> CardFacts:
    if match is None:
        # Only -L knows this card: name, UUID, MIG devices; memory and health unknown.
        error = entry.error or ("nvidia-smi -q -x did not report this card" if queried_ok else "")
        migs = tuple(MigFacts(uuid=u, profile=p, memory_total=None, memory_used=None) for _, p, u in entry.migs)
        return CardFacts(name=entry.name, uuid=entry.uuid, memory_total=None, memory_used=None,
                         mig_current=True if migs else None, instances=migs, error=error)
    card = match.card
    details = {q.number: q for q in match.migs}
    listed = entry.migs or [(q.number, "", q.uuid) for q in match.migs]
    instances = []
    for number, profile, uuid in listed:
        q = details.get(number)
        pids = tuple(pid for pid, gi, ci in match.processes
                     if q is not None and gi is not None and (gi, ci) == (q.gi, q.ci))
        instances.append(MigFacts(uuid=uuid or (q.uuid if q else ""), profile=profile,
                                  memory_total=q.memory_total if q else None,
                                  memory_used=q.memory_used if q else None, processes=pids,
                                  gpu_instance_id=q.gi if q else None, compute_instance_id=q.ci if q else None))
    return replace(card, name=card.name or entry.name, uuid=card.uuid or entry.uuid,
                   error=card.error or entry.error, instances=tuple(instances))
