"""GPUs through NVML (nvidia-ml-py), read into `MachineFacts` over the `NvmlApi` seam
(llmgw/interfaces.py): the real one is the `pynvml` module; tests pass a fake raising pynvml's errors.

A query a card does not support leaves its fact unknown (None); any other NVML error on a card
(GPU is lost, unknown error) marks that card unhealthy with the error, and the others still count.
"""

from __future__ import annotations

from typing import Any

import pynvml

from llmgw.agent.gpus.classes import profile_from_name, profile_from_slices
from llmgw.agent.gpus.facts import CardFacts, MachineFacts, MigFacts
from llmgw.interfaces import NvmlApi

# Errors that mean "this card has no such thing" (or we may not ask): the fact stays unknown.
_UNKNOWN = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NO_PERMISSION,
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine at all (no library, no driver, a driver/library
    version mismatch); the message says which. A CPU node, or one for nvidia-smi to read."""


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _CardLost(Exception):
    """An NVML error on a card that is not "unsupported": the card stops answering."""


def _optional(call: Any, *args: Any) -> Any:
    """`call(*args)`, or None when the card does not support it; any other error: `_CardLost`."""
    try:
        return call(*args)
    except pynvml.NVMLError as e:
        if e.value in _UNKNOWN:
            return None
        raise _CardLost(f"NVML: {e}") from e


def read(api: NvmlApi) -> MachineFacts:
    """Every card NVML sees, in NVML's index order. Raises `NvmlUnavailable` when NVML cannot start."""
    try:
        api.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML did not start: {e}") from None
    except OSError as e:  # the library itself would not load
        raise NvmlUnavailable(f"NVML did not load: {e}") from None
    try:
        driver = _str(_optional(api.nvmlSystemGetDriverVersion) or "")
        try:
            count = api.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML cannot count the GPUs: {e}") from None
        return MachineFacts(source="nvml", driver=driver, cards=tuple(_card(api, i) for i in range(count)))
    except _CardLost as e:
        raise NvmlUnavailable(str(e)) from None
    finally:
        try:
            api.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _card(api: NvmlApi, index: int) -> CardFacts:
    """One card; an NVML error partway keeps what was read and says the error."""
    got: dict[str, Any] = {"name": "", "uuid": "", "memory_total": None, "memory_used": None}
    try:
        h = api.nvmlDeviceGetHandleByIndex(index)
        got["name"] = _str(api.nvmlDeviceGetName(h))
        got["uuid"] = _str(api.nvmlDeviceGetUUID(h))
        mem = api.nvmlDeviceGetMemoryInfo(h)
        got["memory_total"], got["memory_used"] = int(mem.total), int(mem.used)
        _health(api, h, got)
        mode = _optional(api.nvmlDeviceGetMigMode, h)
        if mode is not None:
            got["mig_current"] = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            got["mig_pending"] = mode[1] == pynvml.NVML_DEVICE_MIG_ENABLE
        procs = _optional(api.nvmlDeviceGetComputeRunningProcesses, h) or []
        got["processes"] = tuple(int(p.pid) for p in procs)
        if got.get("mig_current"):
            got["instances"] = _instances(api, h, got["name"], procs)
    except pynvml.NVMLError as e:
        got["error"] = f"NVML: {e}"
    except _CardLost as e:
        got["error"] = str(e)
    return CardFacts(**got)


def _health(api: NvmlApi, h: Any, got: dict[str, Any]) -> None:
    temp = _optional(api.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    got["temperature_c"] = None if temp is None else float(temp)
    power = _optional(api.nvmlDeviceGetPowerUsage, h)
    got["power_w"] = None if power is None else power / 1000.0  # milliwatts
    util = _optional(api.nvmlDeviceGetUtilizationRates, h)  # not supported on a MIG-mode card
    got["utilization"] = None if util is None else float(util.gpu)
    ecc = _optional(api.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_VOLATILE_ECC)
    got["ecc_uncorrectable"] = None if ecc is None else int(ecc)
    pending = _optional(api.nvmlDeviceGetRetiredPagesPendingStatus, h)
    got["retired_pages_pending"] = None if pending is None else pending == pynvml.NVML_FEATURE_ENABLED
    rows = _optional(api.nvmlDeviceGetRemappedRows, h)  # (corrected, uncorrected, pending, failed)
    if rows is not None:
        got["row_remap_pending"], got["row_remap_failure"] = bool(rows[2]), bool(rows[3])


def _instances(api: NvmlApi, h: Any, card_name: str, card_procs: Any) -> tuple[MigFacts, ...]:
    """The MIG devices carved on a card, in NVML's index order; empty slots (NotFound) skipped."""
    found = []
    for slot in range(api.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = api.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_NOT_FOUND:
                continue
            raise
        mem = api.nvmlDeviceGetMemoryInfo(m)
        gi = _optional(api.nvmlDeviceGetGpuInstanceId, m)
        ci = _optional(api.nvmlDeviceGetComputeInstanceId, m)
        profile = profile_from_name(_str(_optional(api.nvmlDeviceGetName, m) or ""))
        if not profile:
            attrs = _optional(api.nvmlDeviceGetAttributes, m)
            if attrs is not None:
                profile = profile_from_slices(int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount),
                                              int(attrs.memorySizeMB))
        procs = _optional(api.nvmlDeviceGetComputeRunningProcesses, m)
        if procs is None:  # older drivers answer on the card only, with each process's instance ids
            procs = [p for p in card_procs if gi is not None and getattr(p, "gpuInstanceId", None) == gi
                     and getattr(p, "computeInstanceId", None) == ci]
        found.append(MigFacts(uuid=_str(api.nvmlDeviceGetUUID(m)), profile=profile, memory_total=int(mem.total),
                              memory_used=int(mem.used), processes=tuple(int(p.pid) for p in procs),
                              gpu_instance_id=gi, compute_instance_id=ci))
    return tuple(found)
