"""`ctl status` prints the same page from the paged status document (`GET /api/v1/status`'s default, plus the short
models' rows when the page leaves some out) as from the whole one (`?full=1`, or a control plane before 0.3.0):
every node of a small fleet with its last contact, the counts of a large one, the models short of what they want in
a large catalog with how many more, the unasked-for and how many more."""

from __future__ import annotations

import json
from typing import Any

import httpx

from llmgw.domain import summary
from llmgw.domain.summary import Summary
from llmgw.domain.summary_pages import StatusQuery, document
from llmgw.reconcile import ModelView
from llmgw.testing.builders import model, node, observed, placed, state_with

from ctl_fakes import ctl

NOW = 1_800_000_000.0


def fleet_summary(nodes: int, models: int, short_every: int) -> Summary:
    names = [f"gpu-{i:03}" for i in range(nodes)]
    defs = [model(f"m{i:03}").gpus(1) for i in range(models)]
    # Placed models hold replicas: listed as unasked-for (asked an hour ago, a minute ago, or never seen asked).
    held = [placed(f"m{i:03}", names[i % nodes], [i // nodes % 8]) for i in range(min(models, 8 * nodes, 40))]
    views = {f"m{i:03}": ModelView(f"m{i:03}", 1, 0, 0, 0, "unplaceable", f"no node fits m{i:03}") if i % short_every == 0
             else ModelView(f"m{i:03}", 1, 1, 1, 0, "ready", "") for i in range(models)}
    seen = observed([node(n).gpus(8, "h100-80g").fabric("ib-a") for n in names[1:]], lost={names[0]: NOW - 60},
                    demand={f"m{i:03}": NOW - 60 * i for i in range(0, 40, 3)})
    agents = [{"node": n, "connected": n != names[0], "last_contact": NOW - i, "last_contact_age_s": float(i)}
              for i, n in enumerate(names)]
    cluster = {"leader": "cp-1", "self": "cp-1", "members": [], "agents": agents, "gateways": []}
    return summary.summarize(state_with(defs, held), seen, views, cluster, NOW)


def answering(s: Summary, paged: bool) -> tuple[httpx.MockTransport, list[str]]:
    """The status route's answers from `s`: each query's page (as the control plane writes it), or the whole
    document whatever the query (a control plane before pages)."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.query.decode())
        query = StatusQuery.parse(dict(request.url.params)) if paged else StatusQuery(full=True)
        return httpx.Response(200, content=json.dumps(document(s, query)).encode(),
                              headers={"content-type": "application/json"})

    return httpx.MockTransport(answer), asked


def both(s: Summary) -> tuple[str, str, list[str]]:
    new, asked = answering(s, paged=True)
    old, _ = answering(s, paged=False)
    paged_out, full_out = ctl(["status"], transport=new), ctl(["status"], transport=old)
    assert paged_out.rc == full_out.rc == 0, paged_out.err
    return paged_out.out, full_out.out, asked


def test_a_large_fleet_and_catalog_print_the_same_from_pages_as_from_the_whole_document() -> None:
    s = fleet_summary(nodes=40, models=150, short_every=4)
    paged, full, asked = both(s)
    assert paged == full
    assert "NODES  39 connected, 1 not connected" in paged
    assert "… 26 more short, 112 satisfied not listed" in paged  # 38 short: 12 listed
    assert "… 34 more (`--json` lists each)" in paged  # 40 unasked-for: 6 listed
    # The default page lists 100 of the 150 models: the short ones' rows were asked for.
    assert asked == ["", "nodes=0&idle=0&models=12&short=1"]


def test_a_small_fleet_prints_each_node_with_its_last_contact_from_one_page() -> None:
    s = fleet_summary(nodes=5, models=9, short_every=3)
    paged, full, asked = both(s)
    assert paged == full
    assert "LAST CONTACT" in paged and sum(line.startswith("gpu-00") for line in paged.splitlines()) == 5
    assert asked == [""]


def test_a_catalog_the_page_holds_whole_needs_one_request() -> None:
    s = fleet_summary(nodes=30, models=60, short_every=5)
    paged, full, asked = both(s)
    assert paged == full and "satisfied not listed" in paged
    assert asked == [""]


def test_json_prints_the_default_document_and_full_the_whole_one() -> None:
    s = fleet_summary(nodes=30, models=150, short_every=4)
    new, asked = answering(s, paged=True)
    doc: dict[str, Any] = json.loads(ctl(["status", "--json"], transport=new).out)
    assert doc["pages"]["nodes"] == {"offset": 0, "limit": 20, "total": 30} and len(doc["nodes"]) == 20
    whole = json.loads(ctl(["status", "--json", "--full"], transport=new).out)
    assert "pages" not in whole and len(whole["nodes"]) == 30 and len(whole["models"]) == 150
    assert asked == ["", "full=1"]
