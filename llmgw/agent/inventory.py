"""What this node has: CPUs, memory, GPUs (through a `GpuProbe`) and engines."""

from __future__ import annotations

import logging
import os
import socket

from llmgw import __version__
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.engines import available_engines

log = logging.getLogger("llmgw.agent.inventory")


def _memory_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


class NvmlProbe:
    """GPUs through NVML; a node without a driver is a CPU node, said once in the log."""

    def __init__(self) -> None:
        self._warned = False

    def gpus(self) -> tuple[Gpu, ...]:
        try:
            import pynvml
        except ImportError:
            return ()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if not self._warned:
                log.info("no NVIDIA driver reachable (%s): this node offers CPU only", e)
                self._warned = True
            return ()
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else name
                uuid = pynvml.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                found.append(Gpu(i, uuid, name, gpu_class(name, int(mem.total)), int(mem.total), int(mem.used)))
            return tuple(found)
        finally:
            pynvml.nvmlShutdown()

    def inventory(self, node: str) -> NodeInfo:
        return NodeInfo(
            node=node,
            hostname=socket.gethostname(),
            cpus=os.cpu_count() or 0,
            memory_total=_memory_total(),
            gpus=self.gpus(),
            engines=tuple(available_engines()),
            version=__version__,
        )


def gpu_class(name: str, memory_total: int) -> str:
    """'NVIDIA H100 80GB HBM3', 80 GiB -> 'h100-80g'."""
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    model = words[0] if words else "gpu"
    return f"{model}-{round(memory_total / (1 << 30))}g"
