"""The NVML reader against a fake pynvml (`FakeNvml`): MIG slots with holes, per-instance memory,
UUIDs and processes, health facts, and NVML errors that must not stop discovery."""

from __future__ import annotations

import pynvml
import pytest
from gpu_fakes import Card, FakeNvml, Instance, Machine, a100_fleet_box

from llmgw.agent.gpus import nvml
from llmgw.agent.gpus.facts import to_gpus
from llmgw.agent.gpus.probe import discover

MIB = 1 << 20


def test_mig_devices_are_read_slot_by_slot_skipping_empty_ones() -> None:
    fake = FakeNvml(a100_fleet_box())
    facts = nvml.read(fake)
    card = facts.cards[0]
    assert card.mig_current and card.mig_pending and card.utilization is None
    assert [(i.profile, i.gpu_instance_id, i.processes) for i in card.instances] == [
        ("3g.40gb", 2, (48213,)), ("2g.20gb", 3, ()), ("1g.10gb", 9, (51877,))]
    assert card.instances[2].uuid == "MIG-b0c1d2e3-f4a5-5b6c-8d7e-9f0a1b2c3d62"
    assert card.instances[0].memory_total == 40192 * MIB and card.instances[0].memory_used == 30723 * MIB
    # 7 slots asked on each MIG card; 4 were empty (NotFound) on card 0, all 7 on card 1
    assert fake.calls.count("nvmlDeviceGetMigDeviceHandleByIndex") == 14
    assert facts.cards[1].instances == () and facts.cards[2].mig_pending and not facts.cards[2].mig_current
    assert not fake.open, "NVML is shut down after each read"


def test_temperature_power_and_wear_come_from_the_card_utilisation_from_nowhere_on_mig() -> None:
    gpus = {g.label: g for g in to_gpus(nvml.read(FakeNvml(a100_fleet_box())))}
    assert (gpus["0/mig1"].temperature_c, gpus["0/mig1"].power_w, gpus["0/mig1"].utilization) == (38.0, 92.17, None)
    assert gpus["3"].utilization == 87.0 and gpus["3"].processes == (50311,)


@pytest.mark.parametrize(("card", "words"), [
    (Card("NVIDIA H100 80GB HBM3", "GPU-h", 81559, 0, ecc=3), "3 uncorrectable ECC"),
    (Card("Tesla V100-SXM2-32GB", "GPU-v", 32510, 0, retired_pending=True, remap=None), "retired memory page"),
    (Card("NVIDIA A100-SXM4-80GB", "GPU-a", 81920, 0, remap=(0, 1, 0, 1)), "row remapping failed"),
])
def test_health_facts_make_a_card_unhealthy_with_the_reason(card: Card, words: str) -> None:
    (g,) = to_gpus(nvml.read(FakeNvml(Machine([card]))))
    assert not g.healthy and words in g.reason and not g.usable


def test_a_card_that_falls_off_the_bus_mid_query_is_unhealthy_and_the_others_still_count() -> None:
    lost = Card("NVIDIA H100 80GB HBM3", "GPU-lost", 81559, 0, fail={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_GPU_IS_LOST})
    fine = Card("NVIDIA H100 80GB HBM3", "GPU-fine", 81559, 0)
    g0, g1 = to_gpus(nvml.read(FakeNvml(Machine([lost, fine]))))
    assert g0.uuid == "GPU-lost" and not g0.healthy and "GPU is lost" in g0.reason and "fell off the bus" in g0.reason
    assert g1.usable


def test_a_card_whose_handle_cannot_be_had_keeps_its_place() -> None:
    bad = Card("x", "GPU-x", 1, 0, fail={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_UNKNOWN})
    g0, g1 = to_gpus(nvml.read(FakeNvml(Machine([bad, Card("NVIDIA L40S", "GPU-l", 46068, 0)]))))
    assert (g0.index, g0.healthy, g1.index, g1.gpu_class) == (0, False, 1, "l40s-48g")
    assert "Unknown Error" in g0.reason


def test_an_instance_that_errors_makes_its_card_unhealthy_not_the_agent_crash() -> None:
    machine = a100_fleet_box()
    machine.cards[0].fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
    gpus = to_gpus(nvml.read(FakeNvml(machine)))
    assert not gpus[0].healthy and gpus[0].label == "0" and gpus[1].label == "1"


def test_unsupported_queries_leave_facts_unknown_not_zero() -> None:
    card = Card("NVIDIA GeForce RTX 4090", "GPU-r", 24564, 100, util=None, ecc=None, retired_pending=None, remap=None)
    (facts,) = nvml.read(FakeNvml(Machine([card]))).cards
    assert (facts.utilization, facts.ecc_uncorrectable, facts.retired_pages_pending, facts.row_remap_failure) == (
        None, None, None, None)
    assert facts.mig_current is None


def test_nvml_that_cannot_start_is_unavailable_and_auto_falls_back_to_nvidia_smi() -> None:
    broken = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(nvml.NvmlUnavailable, match="version mismatch"):
        nvml.read(broken)
    listing = "GPU 0: NVIDIA L40S (UUID: GPU-l)\n"
    d = discover("auto", nvml_api=broken, smi_run=lambda argv: listing if argv[1:] == ["-L"] else "<nvidia_smi_log/>")
    assert d.path == "nvidia-smi" and [g.uuid for g in d.gpus] == ["GPU-l"]
    assert "driver/library mismatch" in d.warnings[0]


def test_auto_without_any_nvidia_stack_is_a_quiet_cpu_node() -> None:
    absent = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def no_smi(argv: list[str]) -> str:
        raise FileNotFoundError(argv[0])

    d = discover("auto", nvml_api=absent, smi_run=no_smi)
    assert d.path == "none" and d.gpus == () and d.warnings == ()
    forced = discover("nvml", nvml_api=absent)
    assert forced.path == "none" and "NVML failed" in forced.warnings[0]
