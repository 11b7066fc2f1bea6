"""The GPU class rule: product name + memory -> `h100-80g`, `rtx-4090-24g`; MIG: `a100-80g-mig-3g.40gb`.

Pure. docs/gpus.md states the same rule; a test holds the examples it gives.
"""

from __future__ import annotations

import math
import re

# Memory sizes cards are sold with, in GiB. A card reports a little less than its size (the
# driver reserves some; ECC takes its share): an "80GB" H100 says 81559 MiB (79.6 GiB), an L40S
# 46068 MiB (45 GiB, sold as 48GB). A card's class takes the smallest of these it reaches.
MARKETED_GIB = (1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144,
                180, 186, 192, 256, 288)
# Reported memory may overshoot a marketed size by this much and still be that size.
_OVERSHOOT = 0.01
# Words of a product name that say nothing about which GPU it is.
_NOISE = {"nvidia", "tesla", "geforce", "quadro", "gpu", "pcie", "sxm", "sxm2", "sxm3", "sxm4", "sxm5",
          "hbm2", "hbm2e", "hbm3", "hbm3e", "nvl", "smx4"}
_SIZE_WORD = re.compile(r"(\d+)gb")


def marketed_gib(memory_bytes: int) -> int:
    """The marketed size of a card reporting `memory_bytes`: the smallest size in MARKETED_GIB at
    or above it (1 % slack above); past the table, the next whole GiB."""
    gib = memory_bytes / (1 << 30)
    for size in MARKETED_GIB:
        if gib <= size * (1 + _OVERSHOOT):
            return size
    return math.ceil(gib)


def card_class(name: str, memory_bytes: int) -> str:
    """`NVIDIA H100 80GB HBM3`, 79.6 GiB -> `h100-80g`; `NVIDIA GeForce RTX 4090`, 24 GiB ->
    `rtx-4090-24g`. The model is the name's words less vendor, brand, form factor and size words;
    the size is the one the name states when it is within 10 % of the memory found, else the
    memory found rounded up to a marketed size (`marketed_gib`)."""
    words = [w for w in re.split(r"[\s\-_/]+", name.lower()) if w]
    model = [re.sub(r"[^a-z0-9.]", "", w) for w in words if w not in _NOISE and not _SIZE_WORD.fullmatch(w)]
    model = [w for w in model if w]
    stated = [int(m.group(1)) for w in words if (m := _SIZE_WORD.fullmatch(w))]
    gib = marketed_gib(memory_bytes)
    found = memory_bytes / (1 << 30)
    size = next((s for s in stated if abs(s - found) <= 0.1 * s), gib)
    return f"{'-'.join(model) or 'gpu'}-{size}g"


def mig_class(card: str, profile: str) -> str:
    """`a100-80g`, `3g.40gb` -> `a100-80g-mig-3g.40gb`."""
    return f"{card}-mig-{profile}"


def profile_from_name(name: str) -> str:
    """A MIG device's profile from its name, as NVML and `nvidia-smi -L` give it:
    `NVIDIA A100-SXM4-80GB MIG 3g.40gb` -> `3g.40gb`; "" when the name carries none."""
    m = re.search(r"\bMIG\s+(\d+c\.)?(\d+g\.\d+gb(?:\+\w+)?)\s*$", name.strip(), re.IGNORECASE)
    return f"{m.group(1) or ''}{m.group(2)}".lower() if m else ""


def profile_from_slices(gpu_slices: int, compute_slices: int, memory_mib: int) -> str:
    """A MIG profile from an instance's slices and memory, when its name carries none:
    3 slices, 40192 MiB -> `3g.40gb` (memory rounded up to whole GB, as the profiles are named);
    a compute instance smaller than its GPU instance is `1c.3g.40gb`."""
    profile = f"{gpu_slices}g.{math.ceil(memory_mib / 1024)}gb"
    return f"{compute_slices}c.{profile}" if 0 < compute_slices < gpu_slices else profile
