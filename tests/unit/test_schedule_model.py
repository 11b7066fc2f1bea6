"""A model's schedule rules end to end but the clock: the definition refuses bad rules naming every problem (and
the admin API says so with 400 invalid_model, a bad zone with 400 invalid_setting), the stored field is level 3
and left out while unset, agents never see it, `decide` scales by it, and `ctl model show`, `ctl status` and the
console's model page say which rule rules now and when that changes."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import httpx
import pytest

from console_world import NOW, World, rows, sign_in
from ctl_fakes import FakeApi, ctl
from llmgw.cli.ctl.render import render_model
from llmgw.cli.ctl.render.fleet import render_status
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import codec, commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.settings import SettingError, validate
from llmgw.domain.state import ClusterState
from llmgw.reconcile import ModelView, decide, desired_replicas
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node, model, observed, store_with

OFFICE = {"start": "0 8 * * mon-fri", "end": "0 18 * * mon-fri", "min": 2, "max": 3}
NIGHT = {"start": "0 22 * * *", "duration_s": 8 * 3600, "min": 0, "max": 0}


def defined(**extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": "m", "engine": "sim", "source": "sim://m", **extra})


def utc(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=dt.timezone.utc).timestamp()


# --- the definition -----------------------------------------------------------------------------------------------


def test_rules_are_read_and_written_back_and_only_when_set() -> None:
    m = defined(schedules=[OFFICE, NIGHT])
    assert [r.start for r in m.schedules] == ["0 8 * * mon-fri", "0 22 * * *"]
    assert m.schedules[1].duration_s == 28800 and m.schedules[1].max == 0
    assert m.to_doc()["schedules"] == [OFFICE, {**NIGHT, "duration_s": 28800.0}]
    assert ModelDef.from_doc(m.to_doc()) == m
    assert "schedules" not in defined().to_doc()
    assert m.launch_hash() == defined().launch_hash()  # a schedule changes no running replica


def test_every_problem_of_every_rule_is_named() -> None:
    with pytest.raises(DefinitionError) as caught:
        defined(schedules=[{"start": "0 25 * * *", "end": "61 * * * *", "min": 3, "max": 2},
                           {"start": "0 8 * * *", "min": 1, "max": 1},
                           {"start": "0 8 * * *", "duration_s": 10, "max": 1, "every": "day"},
                           "nightly"])
    assert caught.value.errors == (
        ("schedules[0].start", "hour: '25' is not a value from 0 to 23"),
        ("schedules[0].end", "minute: '61' is not a value from 0 to 59"),
        ("schedules[0].min", "must not exceed schedules[0].max"),
        ("schedules[1]", "needs one of end (a cron expression) or duration_s (seconds), not both"),
        ("schedules[2].every", "unknown key; known: start, end, duration_s, min, max"),
        ("schedules[2].min", "is required (the replicas while the rule rules; max 0: none)"),
        ("schedules[2].duration_s", "must be from 60 to 31622400 seconds (366 days)"),
        ("schedules[3]", 'must be an object like {start = "0 8 * * mon-fri", duration_s = 36000, min = 2, max = 4}'),
    )
    with pytest.raises(DefinitionError, match="schedules: must be a list of at most 16 rules"):
        defined(schedules=[OFFICE] * 17)


def test_the_stored_field_is_level_3_and_absent_while_unset() -> None:
    plain, ruled = defined(), defined(schedules=[OFFICE])
    assert codec.later_level(plain) == 1 and codec.later_level(ruled) == 3
    state = ClusterState(models={"a": plain, "b": replace(ruled, name="b")})
    doc = codec.state_to_json(state)
    assert "schedules" not in doc["state"]["models"]["a"]  # an older member reads it
    assert codec.state_from_json(doc).models["b"].schedules == ruled.schedules


def test_the_time_zone_setting_refuses_an_unknown_zone() -> None:
    validate("cluster.time_zone", "Europe/Berlin")
    for bad in ("Europe/Atlantis", "", 3, "../../etc/passwd"):
        with pytest.raises(SettingError, match="time zone"):
            validate("cluster.time_zone", bad)


# --- decide -------------------------------------------------------------------------------------------------------


def test_decide_scales_by_the_rule_in_force_and_agents_never_see_rules() -> None:
    store = store_with([model("m").replicas(1).schedule("0 8 * * mon-fri", 2, 3, end="0 18 * * mon-fri")],
                       settings={"cluster.time_zone": "Europe/Berlin"})
    state, seen = store.snapshot(), observed([cpu_node("a", "sim")])
    m = state.models["m"]
    monday_0800_berlin = utc("2026-12-07 07:00")
    assert desired_replicas(state, m, seen, monday_0800_berlin - 60) == 1
    assert desired_replicas(state, m, seen, monday_0800_berlin) == 2
    plan = decide(state, seen, monday_0800_berlin)
    assert sum(c["op"] == "placement.add" for c in plan.commands) == 2
    for cmd in plan.commands:
        store.submit_nowait(cmd)
    starts = [a for a in decide(store.snapshot(), seen, monday_0800_berlin + 1).actions if a.kind == "start"]
    assert len(starts) == 2 and all("schedules" not in a.model for a in starts)  # an older agent would refuse it
    # In UTC the rule starts an hour later.
    assert desired_replicas(store_with([m]).snapshot(), m, seen, monday_0800_berlin) == 1


def test_a_rule_with_max_0_stops_an_on_demand_model_that_is_asked_for_and_says_until_when() -> None:
    store = store_with([model("m").on_demand().schedule("0 22 * * *", 0, 0, duration_s=8 * 3600)])
    state = store.snapshot()
    at_night = utc("2026-12-07 23:00")
    seen = observed([cpu_node("a", "sim")], demand={"m": at_night - 5})
    assert desired_replicas(state, state.models["m"], seen, at_night) == 0
    morning = utc("2026-12-08 06:00")
    asked = observed([cpu_node("a", "sim")], demand={"m": morning - 5})
    assert desired_replicas(state, state.models["m"], asked, morning) == 1
    plan = decide(state, seen, at_night)
    view = plan.views["m"]
    assert (view.state, view.reason) == ("absent", "schedule rule 1 allows no replica until 2026-12-08 06:00 UTC")
    # Gateways refuse its requests at once until then (`model_scheduled_off`), rather than wait for a start.
    assert plan.routes["m"].off_until == morning
    assert decide(state, asked, morning).routes["m"].off_until is None


# --- what the operator sees ---------------------------------------------------------------------------------------


def test_ctl_model_show_and_status_say_which_rule_rules_and_the_next_change() -> None:
    m = defined(schedules=[OFFICE, NIGHT], replicas={"min": 1, "max": 1}).to_doc()
    status = {"state": "ready", "schedule": {
        "rule": 0, "min": 2, "max": 3, "next_change": 1.0,
        "words": "rule 1 (0 8 * * mon-fri until 0 18 * * mon-fri: replicas 2..3) since 2026-12-07 08:00 UTC; "
                 "next change 2026-12-07 18:00 UTC"}}
    api = FakeApi().on("GET", "/api/v1/models/m", json_body={"model": {**m, "status": status}})
    r = ctl(["model", "show", "m"], api)
    assert r.rc == 0, r.err
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in r.out.splitlines() if ":" in line}
    assert lines["schedules"] == "1) 0 8 * * mon-fri until 0 18 * * mon-fri: 2..3; 2) 0 22 * * * for 8 h: 0..0"
    assert lines["schedule now"].startswith("rule 1 (0 8 * * mon-fri") and "next change 2026-12-07 18:00" in \
        lines["schedule now"]
    assert "schedule" not in render_model({"name": "x", "status": {"state": "ready"}})
    shown = render_status({"models": [{"name": "m", "ready": 2, "desired": 2, "state": "ready",
                                       "schedule": "rule 1 (...) since ...; next change 2026-12-07 18:00 UTC"}]})
    assert "  m: schedule rule 1 (...) since ...; next change 2026-12-07 18:00 UTC" in shown


def test_ctl_serve_sends_schedule_flags_and_refuses_a_malformed_one_before_sending() -> None:
    base = ["model", "serve", "--name", "m", "--engine", "sim", "--source", "sim://m"]
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "m"}})
    argv = [*base, "--schedule", "start=0 8 * * mon-fri; end=0 18 * * mon-fri; min=2; max=3",
            "--schedule", "start=0 22 * * *;duration_s=28800;min=0;max=0"]
    assert ctl(argv, api).rc == 0
    assert api.bodies()[0]["schedules"] == [OFFICE, NIGHT]
    for bad, words in (("start=0 8 * * *; min 2", "'min 2' is not KEY=VALUE"),
                       ("start=0 8 * * *; every=day", "'every=day' is not KEY=VALUE"),
                       ("min=1; min=2", "min is given twice")):
        refused = FakeApi()
        r = ctl([*base, "--schedule", bad], refused)
        assert r.rc == 2 and words in r.err, r.err
        assert refused.requests == []


def _admin() -> httpx.AsyncClient:
    store, hub = MemoryStore(), AgentHub()
    store.submit_nowait(commands.add_key(hash_key("sk-admin"), "admin", "admin", 0.0))
    app: Any = make_app(Context(store=store, hub=hub, reconciler=Reconciler(store, hub),
                                clock=lambda: utc("2026-12-07 12:00")))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://control.test",
                             headers={"Authorization": "Bearer sk-admin"})


async def test_the_admin_api_refuses_bad_rules_and_zones_with_400_and_shows_the_rule_in_force() -> None:
    async with _admin() as c:
        bad = await c.post("/api/v1/models", json={"name": "m", "engine": "sim", "source": "sim://m",
                                                   "schedules": [{"start": "0 8 * *", "duration_s": 60,
                                                                  "min": 4, "max": 3}]})
        zone = await c.put("/api/v1/settings/cluster.time_zone", json="Mars/Olympus")
        good = await c.post("/api/v1/models", json={"name": "m", "engine": "sim", "source": "sim://m",
                                                    "schedules": [OFFICE]})
        shown = await c.get("/api/v1/models/m")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_model"
    assert bad.json()["error"]["message"] == (
        "schedules[0].start: '0 8 * *' has 4 fields; a cron expression has 5: minute hour day-of-month month "
        "day-of-week (e.g. \"0 8 * * mon-fri\"); schedules[0].min: must not exceed schedules[0].max")
    assert zone.status_code == 400 and zone.json()["error"]["code"] == "invalid_setting"
    assert "'Mars/Olympus' is not a time zone" in zone.json()["error"]["message"]
    assert good.status_code == 201, good.text
    ruled = shown.json()["model"]["status"]["schedule"]
    assert (ruled["rule"], ruled["min"], ruled["max"], ruled["time_zone"]) == (0, 2, 3, "UTC")
    assert ruled["next_change"] == utc("2026-12-07 18:00") and ruled["since"] == utc("2026-12-07 08:00")


async def test_the_console_model_page_says_which_rule_rules() -> None:
    friday_0800 = dt.datetime.fromtimestamp(NOW, dt.timezone.utc)
    assert friday_0800.strftime("%a %H:%M") == "Fri 08:00"  # console_world's clock
    store = store_with([model("m").replicas(1).schedule("0 8 * * mon-fri", 2, 3, end="0 18 * * mon-fri")])
    world = World(store=store, views={"m": ModelView("m", 2, 0, 0, 0, "starting", "")})
    async with world.client() as c:
        await sign_in(c)
        page = (await c.get("/models/m")).text
    facts = dict((r[0], r[1]) for r in rows(page, "model-status"))
    assert facts["Schedule"].startswith("rule 1 (0 8 * * mon-fri until 0 18 * * mon-fri: replicas 2..3) since "
                                        "2027-01-15 08:00 UTC; next change 2027-01-15 18:00 UTC")


def test_a_catalog_file_gives_rules_as_toml_tables(tmp_path: Any) -> None:
    from llmgw.cli.ctl.definitions import definitions_from_file
    path = tmp_path / "catalog.toml"
    path.write_text('[[models]]\nname = "m"\nengine = "sim"\nsource = "sim://m"\nreplicas = {min = 0, max = 1}\n\n'
                    '[[models.schedules]]\nstart = "0 8 * * mon-fri"\nend = "0 18 * * mon-fri"\nmin = 2\nmax = 3\n')
    (doc,), _ = definitions_from_file(path)
    assert ModelDef.from_doc(doc).to_doc()["schedules"] == [OFFICE]
