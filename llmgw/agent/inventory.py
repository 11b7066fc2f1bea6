"""What this node has: CPUs (cores, memory, vector flags from /proc), GPUs (through the discovery
path LLMGW_GPU_PROBE picks, llmgw/agent/gpus/) and engines; `HostProbe` is the agent's `GpuProbe`.
`changed` says whether a new observation is worth sending (the agent sends it at once when it is,
else at the slow refresh, `inventory_refresh_s`).

The /proc parsers are pure (text in); the probe reads each file once per inventory.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw import __version__
from llmgw.agent.gpus.probe import Discovery, Runner, chosen, discover
from llmgw.domain.observed import Gpu, NodeInfo

log = logging.getLogger("llmgw.agent.inventory")

# CPU flags engines care about (llama.cpp picks its kernels by them); others are not reported.
CPU_FLAGS_OF_INTEREST = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                         "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


@dataclass(frozen=True)
class CpuFacts:
    logical: int  # processors the kernel lists (0 = the text listed none)
    cores: int  # physical cores (0 = the text does not say)
    flags: tuple[str, ...]  # of CPU_FLAGS_OF_INTEREST, in that order
    model: str = ""


def parse_cpuinfo(text: str) -> CpuFacts:
    """/proc/cpuinfo -> processors, physical cores (distinct (physical id, core id) pairs, or
    "cpu cores" × sockets), flags of interest (x86 `flags`, ARM `Features`) and the model name."""
    logical = 0
    pairs: set[tuple[str, str]] = set()
    flags: set[str] = set()
    model = ""
    block: dict[str, str] = {}

    def close() -> None:
        if "physical id" in block and "core id" in block:
            pairs.add((block["physical id"], block["core id"]))

    for line in [*text.splitlines(), ""]:
        if not line.strip():
            close()
            block = {}
            continue
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        block[key] = value
        if key == "processor" and value.isdigit():
            logical += 1
        elif key in ("flags", "features"):
            flags.update(value.split())
        elif key in ("model name", "cpu model") and not model:
            model = value
    return CpuFacts(logical=logical, cores=len(pairs), flags=tuple(f for f in CPU_FLAGS_OF_INTEREST if f in flags),
                    model=model)


def parse_meminfo(text: str) -> int:
    """/proc/meminfo -> MemTotal in bytes (0 when absent)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "MemTotal":
            number, _, unit = value.strip().partition(" ")
            if number.isdigit():
                return int(number) * (1024 if unit.strip().lower() == "kb" else 1)
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _usable_cpus(parsed: CpuFacts) -> int:
    """The processors this process may run on (its affinity: a container or a taskset may give
    fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return parsed.logical or os.cpu_count() or 0


def _memory_total(meminfo: str) -> int:
    total = parse_meminfo(meminfo)
    if total:
        return total
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


# A GPU's readings: they move by themselves from one observation to the next (a busy card's utilisation,
# temperature and power never read the same twice), so they alone never make an inventory "changed"; they
# travel with every inventory sent, and with the slow refresh. Used memory counts once it moved by
# MEMORY_STEP of the card's memory since the inventory last sent (an engine loaded, another program took
# the card), or became known or unknown.
GPU_READINGS = ("utilization", "temperature_c", "power_w", "processes", "memory_used")
MEMORY_STEP = 0.10


def changed(sent: NodeInfo, seen: NodeInfo) -> bool:
    """Whether `seen` says something the inventory `sent` did not: any field but the GPUs' readings (their
    devices, health, reasons, classes, MIG layout, storage, engines, reserve, warnings …), or used memory
    moved by MEMORY_STEP of a card's memory."""
    if sent == seen:
        return False
    if replace(sent, gpus=()) != replace(seen, gpus=()) or len(sent.gpus) != len(seen.gpus):
        return True
    return any(_steady(a) != _steady(b) or _memory_moved(a, b) for a, b in zip(sent.gpus, seen.gpus))


def _steady(gpu: Gpu) -> Gpu:
    return replace(gpu, utilization=None, temperature_c=None, power_w=None, processes=(), memory_used=None)


def _memory_moved(a: Gpu, b: Gpu) -> bool:
    if a.memory_used is None or b.memory_used is None:
        return (a.memory_used is None) != (b.memory_used is None)
    return a.memory_used != b.memory_used and abs(a.memory_used - b.memory_used) >= MEMORY_STEP * b.memory_total


def engine_versions() -> dict[str, str]:
    """Engines this node can start -> version ("" unknown)."""
    from llmgw.engines import detect_engines

    return detect_engines()


class HostProbe:
    """This machine as an inventory. `choice` None reads LLMGW_GPU_PROBE; `nvml_api`, `smi_run`
    and `proc` stand in for pynvml, nvidia-smi and /proc in tests."""

    def __init__(self, choice: str | None = None, *, nvml_api: Any = None, smi_run: Runner | None = None,
                 proc: Path = Path("/proc")) -> None:
        self._problem = ""
        if choice is None:
            try:
                choice = chosen()
            except ValueError as e:
                self._problem = f"{e}; using auto"
                choice = "auto"
        self.choice = choice
        self._nvml_api = nvml_api
        self._smi_run = smi_run
        self._proc = proc
        self._said: tuple[str, ...] = ()

    def discovery(self) -> Discovery:
        return discover(self.choice, nvml_api=self._nvml_api, smi_run=self._smi_run)

    def inventory(self, node: str) -> NodeInfo:
        found = self.discovery()
        warnings = (*((self._problem,) if self._problem else ()), *found.all_warnings)
        if warnings != self._said:  # each new state once in the log, not at every report
            for w in warnings:
                log.warning("%s", w)
            if not warnings and found.path == "none":
                log.info("no GPU found (%s): this node offers CPU only", found.error or "none")
            self._said = warnings
        cpu = parse_cpuinfo(_read(self._proc / "cpuinfo"))
        versions = engine_versions()
        return NodeInfo(
            node=node,
            hostname=socket.gethostname(),
            cpus=_usable_cpus(cpu),
            memory_total=_memory_total(_read(self._proc / "meminfo")),
            gpus=found.gpus,
            engines=tuple(versions),
            version=__version__,
            cpu_flags=cpu.flags,
            engine_versions=versions,
            probe=found.path,
            warnings=warnings,
        )


# The name the agent's config used before the nvidia-smi path existed; the path is LLMGW_GPU_PROBE's.
NvmlProbe = HostProbe

__all__ = ["GPU_READINGS", "MEMORY_STEP", "CpuFacts", "HostProbe", "NvmlProbe", "changed", "engine_versions",
           "parse_cpuinfo", "parse_meminfo"]
