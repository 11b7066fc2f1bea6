"""The console reads at a glance (issue 27): the usage chart scales to its card with the current hour's bar
at the right, visible, and time labels that never overlap; no reason, title or warning is printed twice
(a MIG node's health cell, a model page's memory line and last error, a refusal page's title)."""

from __future__ import annotations

import html as html_lib
import re

from hypothesis import given
from hypothesis import strategies as st

from console_world import NOW, VIEWER, World, csrf_of, rows, sign_in
from llmgw.agent.gpus.facts import CardFacts, MachineFacts, MigFacts, pending_change, to_gpus, warnings
from llmgw.console import chart
from llmgw.domain import commands, summary
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.observed import NodeInfo, Observed
from llmgw.reconcile import ModelView
from llmgw.testing.builders import GIB, model, store_with
from test_console_pages import models_world

HOUR = 3600


def rects(svg: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', r)) for r in re.findall(r"<rect ([^>]*)>", svg)]


def ticks(svg: str) -> list[tuple[float, str]]:
    return [(float(x), label) for x, label in re.findall(r'<text x="([\d.]+)"[^>]*class="tick">([^<]*)</text>', svg)]


# --- the usage chart -----------------------------------------------------------------------------------


def test_the_current_hours_bar_is_drawn_at_the_right_inside_a_chart_that_scales_to_its_card() -> None:
    now = NOW + 1234  # within the hour
    current = int(now) - int(now) % HOUR
    rows_ = [{"period_start": current, "requests": 272}, {"period_start": current - 5 * HOUR, "requests": 40}]
    points = chart.hourly(rows_, now, 24, "requests")
    svg = chart.bars("requests per hour", points, testid="chart-requests")
    opening = svg[:svg.index(">")]
    # Drawn to the card's width: a viewBox, no width in pixels (a 640 px chart in a 420 px card hid its right end).
    assert f'viewBox="0 0 {chart.WIDTH} {chart.HEIGHT}"' in opening and 'width="100%"' in opening
    assert not re.search(r'\b(width|height)="\d+"', opening), opening
    newest = rects(svg)[-1]
    assert newest["data-at"] == str(current) and newest["data-value"] == "272" and newest.get("data-newest") == "1"
    x, w, h = float(newest["x"]), float(newest["width"]), float(newest["height"])
    assert chart.PAD_LEFT < x and x + w <= chart.WIDTH - chart.PAD_RIGHT and h > 0
    assert ticks(svg)[-1][1] == f"{current // HOUR % 24:02d}:00"  # the current hour is labelled


def test_a_small_value_beside_a_large_one_is_a_visible_bar_not_zero() -> None:
    svg = chart.bars("t", [(0.0, 1_000_000.0), (3600.0, 3.0), (7200.0, 0.0)], testid="c")
    drawn = rects(svg)
    assert float(drawn[1]["height"]) >= 1 and float(drawn[2]["height"]) == 0


@given(st.integers(min_value=1, max_value=200))
def test_time_labels_never_overlap_and_the_newest_hour_is_always_labelled(count: int) -> None:
    points = [(float(i * HOUR), float(i % 7)) for i in range(count)]
    svg = chart.bars("t", points, testid="c")
    xs = [x for x, _ in ticks(svg)]
    label_w = 5 * chart.LABEL_FONT * 0.62  # "HH:MM"
    assert all(b - a >= label_w for a, b in zip(xs, xs[1:])), xs
    assert ticks(svg)[-1][1] == f"{(count - 1) % 24:02d}:00"
    assert xs[0] - label_w / 2 >= 0 and xs[-1] + label_w / 2 <= chart.WIDTH
    for r in rects(svg):
        assert chart.PAD_LEFT <= float(r["x"]) and float(r["x"]) + float(r["width"]) <= chart.WIDTH - chart.PAD_RIGHT


# --- one source per fact ---------------------------------------------------------------------------------


def pending_mig_node() -> NodeInfo:
    """A node as its agent reports it: card 0 in MIG mode with a change to off pending (the card and its two
    instances kept out, the probe warning too), cards 1 and 2 in MIG mode with nothing carved."""
    inst = tuple(MigFacts(f"MIG-p-{n}", "3g.40gb", 40 * GIB, 0) for n in range(2))
    facts = MachineFacts("nvml", cards=(
        CardFacts("NVIDIA A100 80GB", "GPU-p-0", 80 * GIB, 0, mig_current=True, mig_pending=False, instances=inst),
        CardFacts("NVIDIA A100 80GB", "GPU-p-1", 80 * GIB, 0, mig_current=True, mig_pending=True),
        CardFacts("NVIDIA A100 80GB", "GPU-p-2", 80 * GIB, 0, mig_current=True, mig_pending=True)))
    return NodeInfo("mig-p", hostname="mig-p", cpus=64, memory_total=512 * GIB, gpus=to_gpus(facts),
                    engines=("vllm",), fabric="ib-a", version="1.2.3", probe="nvml", warnings=warnings(facts))


def body(html: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", html[html.index("<body"):]))


async def test_a_mig_nodes_health_says_each_reason_once() -> None:
    info = pending_mig_node()
    pending = pending_change(CardFacts("x", "u", 1, 0, mig_current=True, mig_pending=False))
    uncarved = "no instances are carved"
    world = World(nodes=[info])
    async with world.client() as c:
        await sign_in(c)
        listed = (await c.get("/nodes")).text
        one = (await c.get("/nodes/mig-p")).text
    cell = {r[0]: r for r in rows(listed, "nodes-table")}["mig-p"][4]
    assert cell.count(pending) == 1 and cell.count(uncarved) == 1, cell
    assert "GPUs 0, 0/mig0, 0/mig1" in cell and "GPUs 1, 2" in cell
    # One node's page: each device's reason in its row of the GPU table, no second list saying them again.
    gpus = rows(one, "node-gpus")
    assert [g[6].count(pending) for g in gpus] == [1, 1, 1, 0, 0]
    assert body(one).count(pending) == 3 and body(one).count(uncarved) == 2


async def test_a_model_pages_memory_line_and_last_error_say_their_words_once() -> None:
    world = models_world()
    world.reconciler.last_plan.views["broken"] = world.reconciler.last_plan.views["broken"].__class__(
        "broken", 1, 0, 0, 0, "parked", "parked after 5 failed starts in a row: ImportError: no module named torch")
    async with world.client() as c:
        await sign_in(c)
        page = (await c.get("/models/broken")).text
        overview = (await c.get("/")).text
    facts = {r[0]: r[1] for r in rows(page, "model-status")}
    memory = facts["Memory (one replica)"]
    detail = html_lib.unescape(re.search(r'data-testid="memory-detail">([^<]+)<', page).group(1))  # type: ignore[union-attr]
    assert detail and memory.count(detail) == 1, memory
    assert body(page).count("ImportError: no module named torch") == 1
    assert facts["Last error"] == "in why"
    stuck = {r[0]: r for r in rows(overview, "stuck-models")}["broken"]
    assert " ".join(stuck).count("ImportError") == 1, stuck
    assert body(overview).count("ImportError: no module named torch") == 1  # not again in the warnings
    assert "model broken is parked: why in Models by state, below" in body(overview)


async def test_a_refusal_page_says_its_title_once() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c, VIEWER)
        do = (await c.get("/do")).text
        r = await c.post("/do/system", data={"csrf": csrf_of(do), "to": "stop"})
    assert r.status_code == 403
    assert body(r.text).count("Refused: a viewer cannot act") == 1, body(r.text)
    assert "<h1>Refused: a viewer cannot act</h1>" in r.text


def test_a_restart_storm_of_a_model_failing_its_starts_is_one_warning_quoting_its_error_once() -> None:
    state = store_with([model("m").sim().replicas(3)]).snapshot()
    crash = ModelView("m", 3, 1, 1, 0, "ready", "", failures_in_row=4, last_error="ImportError: no module x")
    observed = Observed(restarts={"m": (NOW - 3, NOW - 2, NOW - 1, NOW)})
    warnings = summary.summarize(state, observed, {"m": crash}, {}, NOW).warnings
    said = [w for w in warnings if w.startswith("model m")]
    assert said == ["model m: 4 restarts of its replicas in the last restart window (a restart storm), 4 failed "
                    "start(s) in a row, 1/3 ready: ImportError: no module x"], said


async def test_the_overview_says_a_judges_problem_once() -> None:
    store = store_with()
    store.submit_nowait(commands.set_policy(GuardPolicy("strict", "guard-1"), 0.0))
    world = World(store)
    await world.reconciler.run_once()
    async with world.client() as c:
        await sign_in(c)
        page = (await c.get("/")).text
    problem = {r[0]: r[2] for r in rows(page, "judges-table")}["guard-1"]
    assert problem and body(page).count(problem) == 1, body(page)
    assert "judge guard-1 (policies strict): why in Judges and guards, below" in body(page)
