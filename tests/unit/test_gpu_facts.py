"""One rule from card facts to the inventory: both discovery paths give the same `Gpu` entries
for the same machine (a fixture's machine, and any machine Hypothesis makes up), and the class,
MIG and placeability rules hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.agent.gpus import nvml, smi
from llmgw.agent.gpus.classes import card_class, marketed_gib, profile_from_name, profile_from_slices
from llmgw.agent.gpus.facts import NO_INSTANCES, CardFacts, MachineFacts, MigFacts, to_gpus, warnings
from llmgw.domain.observed import Gpu
from gpu_fakes import Card, FakeNvml, Instance, Machine, a100_fleet_box, render_smi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
MIB = 1 << 20
GIB = 1 << 30


def by_smi(name: str) -> tuple[Gpu, ...]:
    return to_gpus(smi.parse((FIXTURES / f"{name}.L.txt").read_text(), (FIXTURES / f"{name}.xml").read_text()))


def test_both_paths_give_the_fixture_machine_the_same_inventory() -> None:
    from_nvml = to_gpus(nvml.read(FakeNvml(a100_fleet_box())))
    from_smi = by_smi("v12-535-a100-80g-mig")
    assert from_nvml == from_smi
    assert [g.label for g in from_smi] == ["0", "0/mig0", "0/mig1", "0/mig2", "1", "2", "3"]


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    cards = []
    for n in range(draw(st.integers(0, 4))):
        total = draw(st.sampled_from([16384, 24564, 40960, 46068, 81559, 81920]))
        mig = draw(st.sampled_from([None, (0, 0), (1, 1), (0, 1), (1, 0)]))
        instances = []
        if mig and mig[0]:
            for k in range(draw(st.integers(0, 3))):
                size = draw(st.sampled_from([("1g.10gb", 9856), ("2g.20gb", 19968), ("3g.40gb", 40192)]))
                instances.append(Instance(size[0], f"MIG-{n}-{k}-{draw(st.uuids())}", size[1],
                                          draw(st.integers(0, size[1])), gi=k + 1,
                                          pids=tuple(draw(st.lists(st.integers(1, 99999), max_size=2, unique=True)))))
        cards.append(Card(
            name=draw(st.sampled_from(["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L40S",
                                       "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB"])),
            uuid=f"GPU-{n}-{draw(st.uuids())}", total_mib=total, used_mib=draw(st.integers(0, total)), mig=mig,
            instances=instances, temp=draw(st.integers(20, 90)), power_mw=draw(st.integers(0, 700_000)) // 10 * 10,
            util=draw(st.one_of(st.none(), st.integers(0, 100))), ecc=draw(st.one_of(st.none(), st.integers(0, 3))),
            retired_pending=draw(st.one_of(st.none(), st.booleans())),
            remap=draw(st.one_of(st.none(), st.tuples(st.just(0), st.just(0), st.integers(0, 1), st.integers(0, 1)))),
            pids=tuple(draw(st.lists(st.integers(100000, 199999), max_size=2, unique=True)))))
    return Machine(cards=cards)


@settings(max_examples=150, deadline=None)
@given(machines())
def test_any_machine_reads_the_same_by_nvml_and_by_nvidia_smi(machine: Machine) -> None:
    listing, query = render_smi(machine)
    assert to_gpus(nvml.read(FakeNvml(machine))) == to_gpus(smi.parse(listing, query))


@pytest.mark.parametrize(("name", "mib", "expected"), [
    ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
    ("NVIDIA H100 PCIe", 81559, "h100-80g"),
    ("NVIDIA H100 NVL", 95830, "h100-94g"),
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-40g"),
    ("NVIDIA A100-SXM4-80GB", 81920, "a100-80g"),
    ("NVIDIA A100 80GB PCIe", 81920, "a100-80g"),
    ("NVIDIA L40S", 46068, "l40s-48g"),
    ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090-24g"),
    ("Tesla V100-SXM2-32GB", 32510, "v100-32g"),
    ("Tesla V100-PCIE-16GB", 16160, "v100-16g"),
    ("NVIDIA RTX A6000", 49140, "rtx-a6000-48g"),
    ("NVIDIA A10", 23028, "a10-24g"),
    ("Tesla T4", 15360, "t4-16g"),
    ("NVIDIA H200", 143771, "h200-141g"),
    ("NVIDIA GH200 480GB", 97871, "gh200-96g"),  # 480GB is CPU + GPU memory; the card has 96
    ("", 0, "gpu-1g"),
])
def test_card_classes_follow_the_documented_rule(name: str, mib: int, expected: str) -> None:
    assert card_class(name, mib * MIB) == expected


def test_the_docs_show_the_class_rule_and_its_examples() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "gpus.md").read_text()
    for example in ("h100-80g", "a100-40g", "l40s-48g", "rtx-4090-24g", "v100-32g", "a100-80g-mig-3g.40gb",
                    "81559 MiB"):
        assert example in doc
    assert marketed_gib(81559 * MIB) == 80 and marketed_gib(46068 * MIB) == 48 and marketed_gib(300 * GIB) == 300


def test_mig_profiles_from_names_and_from_slices() -> None:
    assert profile_from_name("NVIDIA A100-SXM4-80GB MIG 3g.40gb") == "3g.40gb"
    assert profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert profile_from_name("NVIDIA A100-PCIE-40GB MIG 1c.3g.20gb") == "1c.3g.20gb"
    assert profile_from_name("NVIDIA A100-SXM4-80GB") == ""
    assert profile_from_slices(3, 3, 40192) == "3g.40gb"
    assert profile_from_slices(7, 7, 81152) == "7g.80gb"
    assert profile_from_slices(3, 1, 19968) == "1c.3g.20gb"


def card(**kw: object) -> CardFacts:
    base: dict[str, object] = {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-a", "memory_total": 81920 * MIB,
                               "memory_used": 0}
    return CardFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_mig_instances_take_index_label_class_and_the_cards_heat_but_no_utilisation() -> None:
    inst = [MigFacts("MIG-x", "3g.40gb", 40192 * MIB, 5 * MIB, (7,)), MigFacts("MIG-y", "1g.10gb", 9856 * MIB, 0)]
    whole = card(uuid="GPU-0")
    migd = card(uuid="GPU-1", mig_current=True, mig_pending=True, instances=tuple(inst), utilization=55.0,
                temperature_c=61.0, power_w=300.0, ecc_uncorrectable=0)
    gpus = to_gpus(MachineFacts("nvml", cards=(whole, migd)))
    assert [(g.index, g.label) for g in gpus] == [(0, "0"), (1, "1"), (1100, "1/mig0"), (1101, "1/mig1")]
    parent, first = gpus[1], gpus[2]
    assert not parent.placeable and "instances are placed" in parent.reason
    assert first.gpu_class == "a100-80g-mig-3g.40gb" and first.mig_profile == "3g.40gb"
    assert first.parent_index == 1 and first.uuid == "MIG-x" and first.processes == (7,)
    assert first.memory_total == 40192 * MIB and first.memory_used == 5 * MIB
    assert (first.temperature_c, first.power_w, first.utilization) == (61.0, 300.0, None)
    assert first.usable and not parent.usable


def test_a_mig_card_with_nothing_carved_stays_out_with_the_words_to_fix_it() -> None:
    facts = MachineFacts("nvml", cards=(card(mig_current=True, mig_pending=True),))
    (g,) = to_gpus(facts)
    assert not g.placeable and g.reason == NO_INSTANCES
    assert warnings(facts) == (f"GPU 0: {NO_INSTANCES}",)


@pytest.mark.parametrize(("current", "pending"), [(False, True), (True, False)])
def test_a_pending_mig_change_keeps_the_card_and_its_instances_out_until_a_reset(current: bool, pending: bool) -> None:
    inst = (MigFacts("MIG-x", "3g.40gb", 40192 * MIB, 0),) if current else ()
    facts = MachineFacts("nvml", cards=(card(mig_current=current, mig_pending=pending, instances=inst),))
    gpus = to_gpus(facts)
    assert gpus and all(not g.placeable and "GPU reset is needed" in g.reason for g in gpus)
    assert "GPU reset is needed" in warnings(facts)[0]


@pytest.mark.parametrize(("fact", "words"), [
    ({"ecc_uncorrectable": 2}, "2 uncorrectable ECC"),
    ({"retired_pages_pending": True}, "retired memory page is pending"),
    ({"row_remap_failure": True}, "row remapping failed"),
    ({"error": "NVML: GPU is lost"}, "fell off the bus"),
])
def test_unhealthy_cards_and_their_instances_say_why(fact: dict[str, object], words: str) -> None:
    facts = MachineFacts("nvml", cards=(card(mig_current=True, mig_pending=True,
                                             instances=(MigFacts("MIG-x", "3g.40gb", 40192 * MIB, 0),), **fact),))
    gpus = to_gpus(facts)
    assert all(not g.healthy and words in g.reason and not g.usable for g in gpus)
    assert any(words in w for w in warnings(facts))


def test_healthy_is_not_assumed_from_unknown_but_unknown_is_not_sickness() -> None:
    (g,) = to_gpus(MachineFacts("nvml", cards=(card(ecc_uncorrectable=None, retired_pages_pending=None),)))
    assert g.healthy and g.usable and g.utilization is None and g.temperature_c is None
    (g,) = to_gpus(MachineFacts("nvidia-smi", cards=(card(memory_total=None, memory_used=None),)))
    assert not g.placeable and "memory size is unknown" in g.reason and g.memory_used is None
