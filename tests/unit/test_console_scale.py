"""The console at fleet scale: 200 nodes and 2,000 models. The Overview shows aggregates and the first rows
of each growing list (with how many more), so its size is bounded whatever the fleet; counts and sizes
are asserted, never wall time."""

from __future__ import annotations

import re
from typing import Any

import trio

from llmgw.console import layout, overview
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands, summary
from llmgw.reconcile import ModelView
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model, node

NODES, MODELS = 200, 2000
NOW = 1_800_000_000.0


def big_world() -> tuple[Context, dict[str, ModelView]]:
    store = MemoryStore()
    for i in range(MODELS):
        store.submit_nowait(commands.put_model(model(f"m{i:04}").sim().build(), 0.0))
    hub = AgentHub(clock=lambda: NOW)
    for i in range(NODES):
        send, _ = trio.open_memory_channel[dict[str, Any]](1)
        info = node(f"n{i:03}").gpus(8, "h100-80g" if i % 2 else "a100-80g").fabric(f"ib-{i % 4}").build()
        hub.report_inventory(hub.connect(info.node, send), info)
    # Every third model cannot be placed: the lists that grow with the fleet are long.
    views = {f"m{i:04}": ModelView(f"m{i:04}", 1, 0, 0, 0, "unplaceable", f"no node fits m{i:04}") if i % 3 == 0
             else ModelView(f"m{i:04}", 1, 1, 1, 0, "ready", "") for i in range(MODELS)}
    deps = Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: NOW)
    return deps, views


def test_the_overview_at_200_nodes_and_2000_models_is_aggregates_and_bounded_lists() -> None:
    deps, views = big_world()
    html = overview.render(summary.summarize(deps.store.snapshot(), deps.hub.observed(), views, {"members": []}, NOW),
                           deps)
    assert len(html) < 60_000, len(html)  # ~2 KB per 100 rows shown; the fleet's size does not show
    assert html.count("<tr>") < 6 * overview.SHOWN + 40
    stuck = re.search(r'data-testid="stuck-models">(.*?)</table>', html)
    assert stuck is not None and stuck.group(1).count("<tr>") == 1 + overview.SHOWN
    unplaceable = (MODELS + 2) // 3
    assert f"… and {unplaceable - overview.SHOWN} more" in html
    assert f"<td>{MODELS}</td><td>{MODELS - unplaceable}</td><td>{unplaceable}</td>" in html  # models by state
    assert "<td>h100-80g</td><td>whole card</td><td>0</td><td>800</td>" in html  # 100 nodes × 8 free
    assert f"{NODES} nodes connected" in html


def test_the_pager_names_rows_and_keeps_the_filters() -> None:
    html = layout.pager(2000, 3, 50, "/models?state=parked&page=9")
    assert "rows 101–150 of 2000 (page 3 of 40)" in html
    assert 'href="/models?state=parked&amp;page=4"' in html and 'href="/models?state=parked&amp;page=40"' in html
    assert layout.page_number("999", 2000, 50) == 40 and layout.page_number("x", 2000, 50) == 1
    assert "pager-previous" not in layout.pager(10, 1, 50, "/nodes") and "rows 0–0 of 0" in layout.pager(
        0, 1, 50, "/nodes")


def test_a_table_escapes_text_and_shows_unknown_never_zero() -> None:
    html = layout.table(["a", "b"], [["<b>html</b>", None], [layout.esc("<script>"), 0]])
    assert "<b>html</b>" in html and "&lt;script&gt;" in html and layout.UNKNOWN in html and "<td>0</td>" in html
