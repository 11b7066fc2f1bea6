"""The fault catalog (docs/faults.md): each fault injected into a real control plane with real agents (and sim
engine processes where one must crash), or into a group of real control plane processes, and seen within two
reconcile ticks in `ctl status`, `GET /api/v1/status`, /metrics and a webhook POST to a loopback server; then
fixed and seen resolved in each (tests/support/fault_catalog.py has each fault; tests/bench/faults.py repeats
them in random order). One world is shared by the faults that do not interfere; each leaves it as it found it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault_catalog import FAULTS, PLACES, Fault, GroupFault, run_world_fault
from tests.support.faults import Group, World

DOC = Path(__file__).resolve().parents[2] / "docs" / "faults.md"
WORLD_FAULTS = [n for n, f in FAULTS.items() if isinstance(f, Fault)]
GROUP_FAULTS = [n for n, f in FAULTS.items() if isinstance(f, GroupFault)]
PLACE_WORDS = {"ctl": "ctl status", "api": "API", "metric": "metric", "webhook": "webhook"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("faults")).start()
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    g = Group(tmp_path_factory.mktemp("faults-group"))
    try:
        yield g.start()
    finally:
        g.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", WORLD_FAULTS)
def test_fault(world: World, name: str) -> None:
    fault = FAULTS[name]
    assert isinstance(fault, Fault)
    took = run_world_fault(world, fault)
    two_ticks = 2 * world.timeouts.reconcile_tick_s
    if took["settle_s"] is None:  # engines starting take what they take: the four places agree within two ticks
        assert took["seen_s"] - took["first_s"] <= two_ticks, took
    else:
        assert took["seen_s"] <= took["settle_s"] + two_ticks, took


@pytest.mark.slow
@pytest.mark.parametrize("name", GROUP_FAULTS)
def test_group_fault(group: Group, name: str) -> None:
    fault = FAULTS[name]
    assert isinstance(fault, GroupFault)
    took = fault.run(group, 1.0)
    assert took["seen_s"] <= took["settle_s"] + 2 * 1.0, took  # the members' reconcile_tick_s: GROUP_TIMEOUTS'


def doc_rows() -> dict[str, list[str]]:
    """docs/faults.md's catalog: fault id -> its row's cells."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `([a-z_]+)` \|", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


def test_every_fault_in_the_doc_has_a_test_and_each_test_a_row() -> None:
    rows = doc_rows()
    assert set(rows) == set(FAULTS), (sorted(set(rows) - set(FAULTS)), sorted(set(FAULTS) - set(rows)))
    assert len(FAULTS) >= 12 and set(WORLD_FAULTS) | set(GROUP_FAULTS) == set(FAULTS)


def test_the_doc_says_where_each_fault_shows_and_why_not_elsewhere() -> None:
    for name, cells in doc_rows().items():
        where = cells[2]
        shown = {p for p, word in PLACE_WORDS.items() if re.search(rf"\b{word}\b", where.split("not:")[0])}
        assert shown == set(FAULTS[name].places), (name, where)
        if set(PLACES) - shown:
            assert "not:" in where, f"{name}: say why it cannot show in {sorted(set(PLACES) - shown)}"
