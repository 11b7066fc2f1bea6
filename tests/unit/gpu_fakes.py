"""Fakes at the world's edge for GPU discovery: `FakeNvml` stands in for the pynvml module
(same function names, same return shapes, pynvml's own errors), and `Machine` describes one
machine that both `FakeNvml` and `render_smi` (its nvidia-smi -L and -q -x text) report."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1 << 20


@dataclass
class Instance:
    profile: str  # "3g.40gb"
    uuid: str
    total_mib: int
    used_mib: int
    gi: int
    ci: int = 0
    pids: tuple[int, ...] = ()
    slot: int | None = None  # NVML's index for it (holes allowed); None = its position


@dataclass
class Card:
    name: str
    uuid: str
    total_mib: int
    used_mib: int
    mig: tuple[int, int] | None = None  # (current, pending); None: not MIG-capable
    instances: list[Instance] = field(default_factory=list)
    temp: int = 40
    power_mw: int = 60_000
    util: int | None = 0  # None: not supported (a MIG-mode card)
    ecc: int | None = 0  # volatile uncorrectable; None: ECC off
    retired_pending: bool | None = None  # None: not supported (Ampere and later)
    remap: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    pids: tuple[int, ...] = ()  # processes on the whole card (not on an instance)
    fail: dict[str, int] = field(default_factory=dict)  # pynvml function name -> NVML error code


@dataclass
class Machine:
    cards: list[Card]
    driver: str = "535.129.03"


class FakeNvml:
    """pynvml, as far as discovery calls it, over a `Machine`. `init_error`: nvmlInit's error code."""

    NVMLError = pynvml.NVMLError

    def __init__(self, machine: Machine, init_error: int | None = None) -> None:
        self.m = machine
        self.init_error = init_error
        self.calls: list[str] = []
        self.open = False

    # --- helpers -----------------------------------------------------------------
    def _card(self, h: Any, fn: str) -> Card:
        self.calls.append(fn)
        card = self.m.cards[h[1]]
        if fn in card.fail:
            raise pynvml.NVMLError(card.fail[fn])
        return card

    def _inst(self, h: Any, fn: str) -> Instance:
        card = self._card(h, fn)
        return self._slots(card)[h[2]]

    @staticmethod
    def _slots(card: Card) -> dict[int, Instance]:
        return {(i.slot if i.slot is not None else n): i for n, i in enumerate(card.instances)}

    @staticmethod
    def _unsupported() -> pynvml.NVMLError:
        return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # --- pynvml ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.open = True

    def nvmlShutdown(self) -> None:
        self.open = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.m.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.m.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        h = ("card", index)
        self._card(h, "nvmlDeviceGetHandleByIndex")
        return h

    def nvmlDeviceGetName(self, h: Any) -> str:
        card = self._card(h, "nvmlDeviceGetName")
        if h[0] == "mig":
            return f"{card.name} MIG {self._slots(card)[h[2]].profile}"
        return card.name

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._inst(h, "nvmlDeviceGetUUID").uuid if h[0] == "mig" else self._card(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        x = self._inst(h, "nvmlDeviceGetMemoryInfo") if h[0] == "mig" else self._card(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=x.total_mib * MIB, used=x.used_mib * MIB, free=(x.total_mib - x.used_mib) * MIB)

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        card = self._card(h, "nvmlDeviceGetMigMode")
        if card.mig is None:
            raise self._unsupported()
        return list(card.mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        card = self._card(h, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if card.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: int) -> Any:
        card = self._card(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index not in self._slots(card):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], index)

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return self._inst(h, "nvmlDeviceGetGpuInstanceId").gi

    def nvmlDeviceGetComputeInstanceId(self, h: Any) -> int:
        return self._inst(h, "nvmlDeviceGetComputeInstanceId").ci

    def nvmlDeviceGetAttributes(self, h: Any) -> Any:
        inst = self._inst(h, "nvmlDeviceGetAttributes")
        slices = int(inst.profile.split("g.")[0].split(".")[-1])
        return SimpleNamespace(gpuInstanceSliceCount=slices, computeInstanceSliceCount=slices,
                               memorySizeMB=inst.total_mib)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        if h[0] == "mig":
            inst = self._inst(h, "nvmlDeviceGetComputeRunningProcesses")
            return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in inst.pids]
        card = self._card(h, "nvmlDeviceGetComputeRunningProcesses")
        on_instances = [p for i in card.instances for p in i.pids] if card.mig and card.mig[0] else []
        return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in (*card.pids, *on_instances)]

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._card(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._card(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        card = self._card(h, "nvmlDeviceGetUtilizationRates")
        if card.util is None or (card.mig and card.mig[0]):
            raise self._unsupported()
        return SimpleNamespace(gpu=card.util, memory=card.util)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        card = self._card(h, "nvmlDeviceGetTotalEccErrors")
        if card.ecc is None:
            raise self._unsupported()
        return card.ecc

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        card = self._card(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        if card.retired_pending is None:
            raise self._unsupported()
        return pynvml.NVML_FEATURE_ENABLED if card.retired_pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        card = self._card(h, "nvmlDeviceGetRemappedRows")
        if card.remap is None:
            raise self._unsupported()
        return card.remap


def _yes(flag: bool | None) -> str:
    return "N/A" if flag is None else ("Yes" if flag else "No")


def render_smi(machine: Machine) -> tuple[str, str]:
    """The machine as nvidia-smi prints it: (`-L` text, `-q -x` text), v12 DTD."""
    listing: list[str] = []
    gpus: list[str] = []
    for n, c in enumerate(machine.cards):
        listing.append(f"GPU {n}: {c.name} (UUID: {c.uuid})")
        migs = []
        mig_on = bool(c.mig and c.mig[0])
        procs = [("N/A", "N/A", p) for p in c.pids]
        for k, i in enumerate(c.instances if mig_on else []):
            listing.append(f"  MIG {i.profile:<11} Device {k:>2}: (UUID: {i.uuid})")
            migs.append(f"<mig_device><index>{k}</index><gpu_instance_id>{i.gi}</gpu_instance_id>"
                        f"<compute_instance_id>{i.ci}</compute_instance_id><fb_memory_usage>"
                        f"<total>{i.total_mib} MiB</total><reserved>0 MiB</reserved><used>{i.used_mib} MiB</used>"
                        f"<free>{i.total_mib - i.used_mib} MiB</free></fb_memory_usage></mig_device>")
            procs += [(str(i.gi), str(i.ci), p) for p in i.pids]
        mode = ("<current_mig>N/A</current_mig><pending_mig>N/A</pending_mig>" if c.mig is None else
                "".join(f"<{t}>{'Enabled' if v else 'Disabled'}</{t}>" for t, v in zip(("current_mig", "pending_mig"), c.mig)))
        util = "N/A" if c.util is None or mig_on else f"{c.util} %"
        ecc = "N/A" if c.ecc is None else str(c.ecc)
        remap = ("<remapped_rows>N/A</remapped_rows>" if c.remap is None else
                 f"<remapped_rows><remapped_row_corr>{c.remap[0]}</remapped_row_corr><remapped_row_unc>{c.remap[1]}"
                 f"</remapped_row_unc><remapped_row_pending>{_yes(bool(c.remap[2]))}</remapped_row_pending>"
                 f"<remapped_row_failure>{_yes(bool(c.remap[3]))}</remapped_row_failure></remapped_rows>")
        process_xml = "".join(f"<process_info><gpu_instance_id>{gi}</gpu_instance_id><compute_instance_id>{ci}"
                              f"</compute_instance_id><pid>{p}</pid><type>C</type><process_name>python3</process_name>"
                              f"<used_memory>100 MiB</used_memory></process_info>" for gi, ci, p in procs)
        gpus.append(
            f'<gpu id="00000000:{n + 7:02X}:00.0"><product_name>{c.name}</product_name>'
            f"<mig_mode>{mode}</mig_mode><mig_devices>{''.join(migs) or 'None'}</mig_devices>"
            f"<uuid>{c.uuid}</uuid><minor_number>{len(machine.cards) - 1 - n}</minor_number>"
            f"<fb_memory_usage><total>{c.total_mib} MiB</total><reserved>0 MiB</reserved><used>{c.used_mib} MiB</used>"
            f"<free>{c.total_mib - c.used_mib} MiB</free></fb_memory_usage>"
            f"<utilization><gpu_util>{util}</gpu_util></utilization>"
            f"<ecc_errors><volatile><sram_correctable>0</sram_correctable><sram_uncorrectable>0</sram_uncorrectable>"
            f"<dram_correctable>0</dram_correctable><dram_uncorrectable>{ecc}</dram_uncorrectable></volatile>"
            f"</ecc_errors><retired_pages><pending_blacklist>{_yes(c.retired_pending)}</pending_blacklist>"
            f"<pending_retirement>{_yes(c.retired_pending)}</pending_retirement></retired_pages>{remap}"
            f"<temperature><gpu_temp>{c.temp} C</gpu_temp></temperature>"
            f"<gpu_power_readings><power_draw>{c.power_mw / 1000:.2f} W</power_draw></gpu_power_readings>"
            f"<processes>{process_xml}</processes></gpu>")
    query = (f'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<nvidia_smi_log>'
             f"<driver_version>{machine.driver}</driver_version><attached_gpus>{len(gpus)}</attached_gpus>"
             f"{''.join(gpus)}</nvidia_smi_log>\n")
    return "\n".join(listing) + "\n", query


def a100_fleet_box() -> Machine:
    """The machine of tests/fixtures/gpus/v12-535-a100-80g-mig.*, as NVML would report it."""
    u = ["GPU-5d1c8d26-0e27-3a5d-1b8e-7a6f0c6a9f10", "GPU-8a9e2a4b-61e0-ef42-7f2c-0c4e92d3b711",
         "GPU-c3f1b7d2-4a8e-11ad-9e51-5b0a7e3c2d12", "GPU-e7a04f3c-9d2b-6c18-a4f3-21d9b8c6e513"]
    name = "NVIDIA A100-SXM4-80GB"
    return Machine(driver="535.129.03", cards=[
        Card(name, u[0], 81920, 34843, mig=(1, 1), util=None, temp=38, power_mw=92_170, retired_pending=None,
             instances=[Instance("3g.40gb", "MIG-4f1b2c3d-8e9a-5b6c-9d0e-1f2a3b4c5d60", 40192, 30723, gi=2, pids=(48213,)),
                        Instance("2g.20gb", "MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c61", 19968, 13, gi=3, slot=2),
                        Instance("1g.10gb", "MIG-b0c1d2e3-f4a5-5b6c-8d7e-9f0a1b2c3d62", 9856, 4107, gi=9,
                                 pids=(51877,), slot=5)]),
        Card(name, u[1], 81920, 0, mig=(1, 1), util=None, temp=33, power_mw=61_400),
        Card(name, u[2], 81920, 4, mig=(0, 1), util=0, temp=31, power_mw=58_030),
        Card(name, u[3], 81920, 71133, mig=(0, 0), util=87, temp=61, power_mw=318_550, pids=(50311,)),
    ])
