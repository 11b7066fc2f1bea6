"""The nvidia-smi parser on real-shaped output of each driver generation (tests/fixtures/gpus/),
MIG included, and on output it must refuse with a reason: truncated XML, garbage, a lost GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.agent.gpus import smi
from llmgw.agent.gpus.facts import to_gpus, warnings
from llmgw.agent.gpus.probe import by_smi, discover

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
MIB = 1 << 20


def read(name: str, query: str | None = None) -> smi.MachineFacts:
    return smi.parse((FIXTURES / f"{name}.L.txt").read_text(), (FIXTURES / (query or f"{name}.xml")).read_text())


def test_v10_driver_v100_indexed_by_position_not_minor_number() -> None:
    facts = read("v10-440-v100")
    assert facts.driver == "440.82"
    g0, g1 = to_gpus(facts)
    assert (g0.index, g0.uuid, g0.gpu_class) == (0, "GPU-f124aa59-d406-d45b-9481-8fcd694e6c9e", "v100-32g")
    assert g1.uuid == "GPU-61a65011-6571-a6d2-5ab8-66cbb6f7f9c3"  # minor_number 0, second in the output
    assert (g0.memory_total, g0.memory_used, g0.utilization, g0.power_w) == (32510 * MIB, 30890 * MIB, 93.0, 243.17)
    assert g0.processes == (31544,) and g0.healthy and g0.usable
    assert facts.cards[0].mig_current is None and facts.cards[0].ecc_uncorrectable == 0
    assert facts.cards[0].retired_pages_pending is False and facts.cards[0].row_remap_failure is None


def test_v11_a100_40g_mig_instances_with_their_own_memory_and_processes() -> None:
    gpus = to_gpus(read("v11-470-a100-40g-mig"))
    assert [(g.label, g.gpu_class) for g in gpus] == [
        ("0", "a100-40g"), ("0/mig0", "a100-40g-mig-4g.20gb"), ("0/mig1", "a100-40g-mig-2g.10gb"),
        ("0/mig2", "a100-40g-mig-1g.5gb")]
    mig1 = gpus[2]
    assert mig1.index == 1001 and mig1.uuid == "MIG-2cc993d7-588c-5c28-b454-b3851897e3d7"
    assert (mig1.memory_total, mig1.memory_used, mig1.processes) == (9856 * MIB, 7301 * MIB, (239709,))
    assert (mig1.temperature_c, mig1.power_w, mig1.utilization) == (36.0, 71.44, None)
    assert gpus[1].processes == () and not gpus[0].placeable


def test_v12_a100_80g_mig_carved_empty_pending_and_whole() -> None:
    facts = read("v12-535-a100-80g-mig")
    gpus = {g.label: g for g in to_gpus(facts)}
    assert gpus["0/mig0"].gpu_class == "a100-80g-mig-3g.40gb" and gpus["0/mig0"].processes == (48213,)
    assert gpus["0/mig2"].index == 1002 and gpus["0/mig2"].processes == (51877,)
    assert gpus["0"].processes == (48213, 51877) and gpus["0"].utilization is None
    assert not gpus["1"].placeable and "no instances are carved" in gpus["1"].reason
    assert not gpus["2"].placeable and "GPU reset is needed" in gpus["2"].reason
    assert gpus["3"].usable and gpus["3"].utilization == 87.0
    assert [g.label for g in to_gpus(facts) if g.usable] == ["0/mig0", "0/mig1", "0/mig2", "3"]
    assert len(warnings(facts)) == 2


def test_v13_h100_power_and_split_ecc_counters() -> None:
    facts = read("v13-560-h100")
    h0, h1 = to_gpus(facts)
    assert facts.driver == "560.35.03" and h0.gpu_class == "h100-80g" and h0.memory_total == 81559 * MIB
    assert h0.power_w == 498.12 and facts.cards[0].ecc_uncorrectable == 0 and h1.usable


def test_l40s_and_rtx_4090_classes_and_a_card_without_ecc() -> None:
    facts = read("v12-550-l40s-4090")
    l40s, rtx = to_gpus(facts)
    assert (l40s.gpu_class, rtx.gpu_class) == ("l40s-48g", "rtx-4090-24g")
    assert facts.cards[1].ecc_uncorrectable is None and facts.cards[1].row_remap_failure is None
    assert rtx.healthy and rtx.processes == (9123,)


def test_ecc_retired_pages_and_row_remap_failures_are_unhealthy_with_reasons() -> None:
    a, b, v = to_gpus(read("v12-535-unhealthy"))
    assert not a.healthy and "2 uncorrectable ECC" in a.reason  # volatile only: aggregate 2 is history
    assert not b.healthy and "row remapping failed" in b.reason  # its aggregate 17 alone would not be
    assert not v.healthy and "retired memory page is pending" in v.reason
    assert not any(g.usable for g in (a, b, v))


def test_a_gpu_lost_from_the_bus_is_listed_unhealthy_in_its_place() -> None:
    fine, lost = to_gpus(read("lost", "lost.xml"))
    assert fine.usable and fine.index == 0
    assert lost.index == 1 and not lost.healthy and "Unknown Error" in lost.reason and "0000:2A:00.0" in lost.reason


def test_truncated_xml_keeps_what_the_listing_says_and_places_nothing() -> None:
    facts = read("v13-560-h100", "truncated.xml")
    gpus = to_gpus(facts)
    assert [g.uuid for g in gpus] == [c.uuid for c in read("v13-560-h100").cards]
    assert not any(g.placeable for g in gpus) and all("memory size is unknown" in g.reason for g in gpus)
    assert any("truncated" in w for w in warnings(facts))
    with pytest.raises(smi.SmiOutputError, match="truncated"):
        smi.parse_query((FIXTURES / "truncated.xml").read_text())


@pytest.mark.parametrize("name", ["garbage.txt", "no-driver.txt"])
def test_output_that_names_no_gpu_is_refused_with_what_it_said(name: str) -> None:
    text = (FIXTURES / name).read_text()
    with pytest.raises(smi.SmiOutputError, match="names no GPU"):
        smi.parse(text, None)
    with pytest.raises(smi.SmiOutputError, match="not XML"):
        smi.parse_query(text)


def test_r450_mig_uuids_and_no_devices() -> None:
    listing = ("GPU 0: A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
               "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/1/0)\n")
    (card,) = smi.parse(listing, None).cards
    assert card.instances[0].uuid == "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/1/0"
    assert card.instances[0].profile == "3g.20gb" and card.mig_current is True
    assert smi.parse("No devices were found\n", None).cards == ()


def fake_smi(fixture: str, query: str | None = None, fail_query: BaseException | None = None):  # type: ignore[no-untyped-def]
    """nvidia-smi at the edge: argv -> a fixture's text."""
    def run(argv: list[str]) -> str:
        if argv[1:] == ["-L"]:
            return (FIXTURES / f"{fixture}.L.txt").read_text()
        if fail_query is not None:
            raise fail_query
        return (FIXTURES / (query or f"{fixture}.xml")).read_text()
    return run


def test_the_nvidia_smi_path_survives_a_query_that_times_out_and_says_so() -> None:
    d = by_smi(fake_smi("v13-560-h100", fail_query=subprocess.TimeoutExpired(["nvidia-smi"], 10)))
    assert d.facts is not None and len(d.gpus) == 2 and not any(g.placeable for g in d.gpus)
    assert any("did not answer within" in w for w in d.all_warnings)


def test_forcing_nvidia_smi_with_garbage_gives_a_cpu_node_with_the_reason() -> None:
    d = discover("nvidia-smi", smi_run=lambda argv: (FIXTURES / "garbage.txt").read_text())
    assert d.path == "none" and d.gpus == () and "names no GPU" in d.warnings[0]
