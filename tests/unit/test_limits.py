"""The limits table (llmgw/domain/limits.py): the caps each listener takes from the open-files limit, the
`LLMGW_LIMITS` overrides, and docs/operations.md's "Limits" table, held equal to the code."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest

import llmgw.wire.gate as gate_module
from llmgw.domain.limits import LIMITS, MIN_CAP, Caps, Limits, connection_caps
from llmgw.wire.gate import configured_limits, listener_gate

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_a_listener_takes_its_share_of_what_the_reserve_leaves() -> None:
    # 1,024 - 256 reserved = 768: alone, the admin API all of it, a gateway half (two descriptors a request).
    assert connection_caps(LIMITS, "admin", 1024) == Caps(768, 384)
    assert connection_caps(LIMITS, "gateway", 1024) == Caps(384, 192)
    # In `llmgw up`, beside each other: a quarter and three eighths.
    assert connection_caps(LIMITS, "admin", 1024, beside=True) == Caps(192, 96)
    assert connection_caps(LIMITS, "gateway", 1024, beside=True) == Caps(288, 144)
    # A generous limit: the table's values.
    assert connection_caps(LIMITS, "admin", 1 << 20) == Caps(LIMITS.admin_connections, LIMITS.admin_connections // 2)
    assert connection_caps(LIMITS, "gateway", 1 << 20).connections == LIMITS.gateway_connections
    # A limit below the reserve still leaves a listener a few.
    assert connection_caps(LIMITS, "admin", 100) == Caps(MIN_CAP, MIN_CAP // 2)


@pytest.mark.parametrize("open_files", [512, 1024, 4096, 65536, 1 << 20])
def test_in_up_the_reserve_and_both_listeners_fit_the_open_files_limit(open_files: int) -> None:
    admin = connection_caps(LIMITS, "admin", open_files, beside=True).connections
    gateway = connection_caps(LIMITS, "gateway", open_files, beside=True).connections
    assert LIMITS.descriptors_reserved + admin + 2 * gateway <= open_files


def test_an_address_limit_set_may_reach_its_listeners_whole_limit_never_past_it() -> None:
    behind_a_balancer = Limits(gateway_connections_per_address=1 << 30)
    assert connection_caps(behind_a_balancer, "gateway", 1 << 20) == Caps(65536, 65536)
    assert connection_caps(Limits(admin_connections_per_address=10), "admin", 1 << 20) == Caps(8192, 10)


def test_llmgw_limits_overrides_by_name_and_refuses_what_it_does_not_know() -> None:
    limits = configured_limits({"LLMGW_LIMITS": "admin_connections=64, descriptors_reserved=0"})
    assert (limits.admin_connections, limits.descriptors_reserved) == (64, 0)
    assert configured_limits({}) is LIMITS
    for spec, words in [("nope=1", "NAME=COUNT"), ("admin_connections=1.5", "not a whole number"),
                        ("admin_connections=0", "at least 1"), ("descriptors_reserved=-1", "at least 0")]:
        with pytest.raises(ValueError, match=words) as refused:
            configured_limits({"LLMGW_LIMITS": spec})
        assert str(refused.value).startswith("LLMGW_LIMITS: ")


def test_a_second_kind_of_listener_in_the_process_lowers_the_first_ones_caps() -> None:
    # This process's other gates (servers other tests ran here; a traceback may still hold one) are set
    # aside: the test is about two listeners, no more.
    gc.collect()
    others = set(gate_module._GATES)
    gate_module._GATES.clear()
    try:
        two_listeners()
    finally:
        gate_module._GATES.update(others)


def two_listeners() -> None:
    admin = listener_gate("admin", log_every_s=60.0, open_files=1024)
    assert admin.caps == Caps(768, 384)
    gateway = listener_gate("gateway", log_every_s=60.0, open_files=1024)
    assert (admin.caps, gateway.caps) == (Caps(192, 96), Caps(288, 144))


# --- docs/operations.md lists the same table ------------------------------------------------------


def markdown_table() -> str:
    """The table as docs/operations.md shows it (paste this when the test below fails)."""
    rows = ["| name | area | default | what it bounds |", "| --- | --- | --- | --- |"]
    rows += [f"| `{name}` | {area} | {default} | {help} |" for name, area, default, help in Limits.table()]
    return "\n".join(rows)


def doc_rows(text: str) -> list[tuple[str, str, int, str]]:
    section = re.search(r"^## Limits\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "docs/operations.md has no '## Limits' section"
    rows = []
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 4 or cells[0] in ("name", "---"):
            continue
        rows.append((cells[0].strip("`"), cells[1], int(cells[2]), cells[3]))
    return rows


def test_the_operations_doc_lists_exactly_the_table() -> None:
    rows = doc_rows(OPERATIONS.read_text(encoding="utf-8"))
    assert rows == Limits.table(), "docs/operations.md drifted from Limits; its table is:\n" + markdown_table()


def test_the_doc_check_sees_a_changed_default() -> None:
    text = OPERATIONS.read_text(encoding="utf-8").replace("| `descriptors_reserved` | process | 256 |",
                                                         "| `descriptors_reserved` | process | 255 |")
    assert doc_rows(text) != Limits.table()
