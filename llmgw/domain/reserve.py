"""A node's reserve: devices, CPU memory and GPU memory kept for other work (`llmgw agent --reserve`).

The agent parses its flags once (`parse_reserve`), checks them against what it finds (`Reserve.check`), and
reports the reserve with every inventory (`Reserve.apply`: `NodeInfo.reserved_*`). Placement never uses what
is reserved; `ctl status` counts reserved devices apart from used, free and unusable. Pure.

Syntax, one `--reserve KEY=VALUE` per flag (repeat it):

    gpu=0,1          these devices (indexes or labels as `ctl nodes` shows them: 3, 0/mig1; or GPU-/MIG- UUIDs);
                     a MIG-mode card reserves its instances too
    memory_gib=16    this much of the node's memory (CPU replicas' budget)
    vram_gib=8       this much of every GPU's memory
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from llmgw.domain.observed import Gpu, NodeInfo

GIB = 1 << 30
KEYS = ("gpu", "memory_gib", "vram_gib")
SYNTAX = "gpu=0,1 | memory_gib=16 | vram_gib=8"


@dataclass(frozen=True)
class Reserve:
    """What the operator keeps off placement on this node (as given: device words, GiB in bytes)."""

    gpus: tuple[str, ...] = ()  # indexes, labels or UUIDs, as given
    memory: int = 0  # bytes of the node's memory
    vram: int = 0  # bytes of each GPU's memory

    def __bool__(self) -> bool:
        return bool(self.gpus or self.memory or self.vram)

    def devices(self, gpus: Sequence[Gpu]) -> tuple[int, ...]:
        """The reserved devices' indexes (a MIG-mode card's instances with it); ValueError naming a word
        that matches no device."""
        out: set[int] = set()
        for word in self.gpus:
            found = [g for g in gpus if word in (str(g.index), g.label, g.uuid)]
            if not found:
                have = ", ".join(g.label for g in gpus) or "none"
                raise ValueError(f"--reserve gpu={word}: no such GPU on this node (its GPUs: {have})")
            for g in found:
                out.add(g.index)
                out.update(i.index for i in gpus if i.parent_index == g.index)
        return tuple(sorted(out))

    def check(self, info: NodeInfo) -> None:
        """ValueError when the reserve does not fit the node: an unknown device, all the memory or more."""
        self.devices(info.gpus)
        if self.memory and info.memory_total and self.memory >= info.memory_total:
            raise ValueError(f"--reserve memory_gib={_gib(self.memory)}: the node has {_gib(info.memory_total)} GiB "
                             f"of memory; a reserve must leave some")
        if self.vram:
            if not info.gpus:
                raise ValueError("--reserve vram_gib: this node has no GPU")
            largest = max(g.memory_total for g in info.gpus)
            if self.vram >= largest:
                raise ValueError(f"--reserve vram_gib={_gib(self.vram)}: the largest GPU here has {_gib(largest)} "
                                 f"GiB; a reserve must leave some")

    def apply(self, info: NodeInfo) -> NodeInfo:
        """The inventory with this reserve reported (a device no longer found is left out, not an error)."""
        from dataclasses import replace

        known = [w for w in self.gpus if any(w in (str(g.index), g.label, g.uuid) for g in info.gpus)]
        return replace(info, reserved_gpus=Reserve(tuple(known)).devices(info.gpus), reserved_memory=self.memory,
                       reserved_vram=self.vram)


def parse_reserve(flags: Sequence[str]) -> Reserve:
    """`--reserve` flags -> a Reserve; ValueError with the flag's words and the syntax when one is malformed."""
    gpus: list[str] = []
    sizes: dict[str, int] = {}
    for flag in flags:
        key, eq, value = flag.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in KEYS or not value:
            raise ValueError(f"--reserve {flag!r}: expected KEY=VALUE with KEY one of {', '.join(KEYS)} ({SYNTAX})")
        if key == "gpu":
            words = [w.strip() for w in value.split(",")]
            if any(not w for w in words):
                raise ValueError(f"--reserve {flag!r}: an empty device in the list (e.g. gpu=0,1)")
            gpus.extend(w for w in words if w not in gpus)
            continue
        if key in sizes:
            raise ValueError(f"--reserve {key} is given twice")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"--reserve {flag!r}: {key} must be a positive number of GiB (e.g. {key}=16)")
        sizes[key] = int(number * GIB)
    return Reserve(tuple(gpus), sizes.get("memory_gib", 0), sizes.get("vram_gib", 0))


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}".removesuffix(".0")
