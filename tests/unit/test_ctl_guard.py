"""`llmgw ctl guard` (list, set, remove, off, on, judge status, judge enable) and the guard lines of
`ctl status`: the requests each sends, and what it prints, guards off said plainly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctl_fakes import STATUS, FakeApi, columns, ctl
from llmgw.cli.ctl.errors import UsageError
from llmgw.cli.ctl.guard import parse_budget

OFF = "guards are OFF: no request is checked (llmgw ctl guard on)"
POLICY = {"name": "default", "judge": "llama-guard", "check": "prompt", "models": ["*"], "categories": ["S1", "S6"],
          "on_error": "closed", "budget_s": 2.0}
POLICIES = {"enabled": True, "notice": "", "policies": [
    POLICY, {**POLICY, "name": "all-out", "check": "both", "models": ["demo", "smol"], "categories": [],
             "on_error": "open", "budget_s": 0.5}]}
JUDGES = {"enabled": True, "notice": "", "judges": [
    {"model": "llama-guard", "policies": ["default"], "defined": False, "role": None, "ready": None,
     "desired": None, "last_failure": None, "last_failure_age_s": None, "status": "missing",
     "problem": "no model named llama-guard: define it with role guard, or "
                "`llmgw ctl guard judge enable llama-guard --source FILE.gguf`"},
    {"model": "lg2", "policies": ["other", "third"], "defined": True, "role": "guard", "ready": 1, "desired": 1,
     "last_failure": "no answer within the 2 s budget", "last_failure_age_s": 31.4, "status": "failing",
     "problem": "lg2 failed to answer 31 s ago: no answer within the 2 s budget"},
    {"model": "lg3", "policies": ["fine"], "defined": True, "role": "guard", "ready": 1, "desired": 1,
     "last_failure": None, "last_failure_age_s": None, "status": "ok", "problem": ""}]}


def last_body(api: FakeApi) -> Any:
    return json.loads(api.requests[-1].content)


def test_list_shows_each_policy_and_says_when_guards_are_off() -> None:
    result = ctl(["guard"], FakeApi().on("GET", "/api/v1/guard/policies", json_body=POLICIES))
    assert result.rc == 0, result.err
    rows = columns(result.out, "NAME")
    assert rows[0] == ["NAME", "JUDGE", "CHECK", "MODELS", "CATEGORIES", "ON ERROR", "BUDGET"]
    assert rows[1] == ["default", "llama-guard", "prompt", "* (every model but judges)", "S1,S6", "closed", "2 s"]
    assert rows[2] == ["all-out", "llama-guard", "both", "demo, smol", "all (S1-S14)", "open", "0.5 s"]
    assert "OFF" not in result.out
    off = ctl(["guard", "list"], FakeApi().on("GET", "/api/v1/guard/policies", json_body={
        **POLICIES, "enabled": False, "notice": OFF}))
    assert off.out.splitlines()[0] == OFF
    empty = ctl(["guard", "list"], FakeApi().on("GET", "/api/v1/guard/policies", json_body={
        "enabled": False, "policies": []}))
    assert OFF in empty.out and "no guard policies" in empty.out


def test_set_creates_with_the_flags_given() -> None:
    api = (FakeApi().on("GET", "/api/v1/guard/policies/strict", 404,
                        json_body={"error": {"code": "policy_not_found", "message": "no guard policy named 'strict'"}})
           .on("PUT", "/api/v1/guard/policies/strict", 201, json_body={
               "enabled": True, "policy": {**POLICY, "name": "strict"}, "created": True, "changed": True,
               "warnings": ["no model named llama-guard: ..."]}))
    result = ctl(["guard", "set", "strict", "--judge", "llama-guard", "--check", "both", "--models", "demo, smol",
                  "--categories", "S1,S6", "--on-error", "open", "--budget", "500ms"], api)
    assert result.rc == 0, result.err
    assert last_body(api) == {"name": "strict", "judge": "llama-guard", "check": "both", "models": ["demo", "smol"],
                                "categories": ["S1", "S6"], "on_error": "open", "budget_s": 0.5}
    assert "Idempotency-Key" in api.requests[-1].headers
    assert "guard policy strict created" in result.out and "warning: no model named llama-guard" in result.out


def test_set_keeps_what_is_not_given_and_all_clears_the_categories() -> None:
    api = (FakeApi().on("GET", "/api/v1/guard/policies/default", json_body={"enabled": True, "policy": POLICY})
           .on("PUT", "/api/v1/guard/policies/default",
               json_body={"policy": POLICY, "created": False, "changed": True}))
    result = ctl(["guard", "set", "default", "--categories", "all", "--budget", "3s"], api)
    assert result.rc == 0, result.err
    assert last_body(api) == {**POLICY, "categories": [], "budget_s": 3.0}
    assert "guard policy default set" in result.out


def test_set_from_a_toml_or_json_file(tmp_path: Path) -> None:
    toml = tmp_path / "policy.toml"
    toml.write_text('[[guard.policies]]\nname = "f"\njudge = "lg"\ncheck = ["prompt", "response"]\n')
    api = FakeApi().on("PUT", "/api/v1/guard/policies/f", 201, json_body={"policy": POLICY, "created": True})
    assert ctl(["guard", "set", "f", "--file", str(toml), "--on-error", "open"], api).rc == 0
    assert last_body(api) == {"name": "f", "judge": "lg", "check": ["prompt", "response"], "on_error": "open"}
    js = tmp_path / "policy.json"
    js.write_text(json.dumps({"judge": "lg", "categories": ["S2"]}))
    assert ctl(["guard", "set", "f", "--file", str(js)], api).rc == 0
    assert last_body(api) == {"name": "f", "judge": "lg", "categories": ["S2"]}
    other = ctl(["guard", "set", "g", "--file", str(toml)], api)
    assert other.rc == 2 and "names the policy 'f', not 'g'" in other.err
    broken = tmp_path / "broken.toml"
    broken.write_text("judge = ")
    assert ctl(["guard", "set", "f", "--file", str(broken)], api).rc == 2


def test_a_refused_policy_names_the_field() -> None:
    api = (FakeApi().on("GET", "/api/v1/guard/policies/p", json_body={"policy": POLICY})
           .on("PUT", "/api/v1/guard/policies/p", 400, json_body={"error": {
               "code": "invalid_policy", "message": "categories: 'S99' is not a hazard code: use S1..S14"}}))
    result = ctl(["guard", "set", "p", "--categories", "S99"], api)
    assert result.rc == 1 and "invalid_policy: categories: 'S99' is not a hazard code" in result.err


def test_remove() -> None:
    api = FakeApi().on("DELETE", "/api/v1/guard/policies/default", json_body={"removed": "default"})
    result = ctl(["guard", "remove", "default"], api)
    assert result.rc == 0 and result.out.strip() == "removed guard policy default"
    gone = ctl(["guard", "remove", "ghost"], FakeApi().on("DELETE", "/api/v1/guard/policies/ghost", 404, json_body={
        "error": {"code": "policy_not_found", "message": "no guard policy named 'ghost'"}}))
    assert gone.rc == 1 and "policy_not_found" in gone.err


def test_off_and_on_set_guard_enabled() -> None:
    api = (FakeApi().on("PUT", "/api/v1/settings/guard.enabled", json_body={"key": "guard.enabled", "value": False}))
    result = ctl(["guard", "off"], api)
    assert result.rc == 0 and result.out.strip() == OFF and api.bodies() == [False]
    api = FakeApi().on("PUT", "/api/v1/settings/guard.enabled", json_body={"key": "guard.enabled", "value": True})
    result = ctl(["guard", "on"], api)
    assert result.rc == 0 and result.out.startswith("guards are on") and api.bodies() == [True]


def test_judge_status_shows_each_judge_and_what_is_wrong() -> None:
    result = ctl(["guard", "judge", "status"], FakeApi().on("GET", "/api/v1/guard/judges", json_body=JUDGES))
    assert result.rc == 0, result.err
    rows = columns(result.out, "JUDGE")
    assert rows[0] == ["JUDGE", "POLICIES", "DEFINED", "ROLE", "READY", "LAST FAILURE", "STATUS"]
    assert rows[1] == ["llama-guard", "default", "no", "-", "-/-", "-", "MISSING"]
    assert rows[2] == ["lg2", "other, third", "yes", "guard", "1/1", "31 s ago: no answer within the 2 s budget",
                       "FAILING"]
    assert rows[3][-1] == "ok"
    problems = result.out.split("WHAT IS WRONG")[1]
    assert "! no model named llama-guard" in problems and "! lg2 failed to answer 31 s ago" in problems
    assert "lg3" not in problems
    none = ctl(["guard", "judge", "status"], FakeApi().on("GET", "/api/v1/guard/judges", json_body={
        "enabled": False, "notice": OFF, "judges": []}))
    assert none.out.splitlines()[0] == OFF and "no guard policy names a judge" in none.out


def test_judge_enable_sends_the_name_source_and_replace() -> None:
    answer = {"judge": "llama-guard", "changed": True, "replaced": "chat", "found_on": [], "warnings": [],
              "model": {"name": "llama-guard", "engine": "llama.cpp", "role": "guard", "source": "/m/lg.gguf"}}
    api = FakeApi().on("POST", "/api/v1/guard/judges/enable", 201, json_body=answer)
    result = ctl(["guard", "judge", "enable", "llama-guard", "--source", "/m/lg.gguf", "--replace"], api)
    assert result.rc == 0, result.err
    assert api.bodies() == [{"name": "llama-guard", "source": "/m/lg.gguf", "replace": True}]
    assert "judge llama-guard served from /m/lg.gguf: llama.cpp on CPU, role guard" in result.out
    assert "replaced the model llama-guard that had role chat" in result.out
    found = {**answer, "replaced": None, "found_on": ["n1", "n2"]}
    api = FakeApi().on("POST", "/api/v1/guard/judges/enable", 201, json_body=found)
    result = ctl(["guard", "judge", "enable"], api)
    assert api.bodies() == [{}] and "found in the storage of: n1, n2" in result.out and "replaced" not in result.out


def test_judge_enable_refused_says_what_to_do() -> None:
    api = FakeApi().on("POST", "/api/v1/guard/judges/enable", 409, json_body={"error": {
        "code": "model_not_a_judge", "message": "a model named lg exists with role chat, not guard: --replace ..."}})
    result = ctl(["guard", "judge", "enable", "lg", "--source", "/m/lg.gguf"], api)
    assert result.rc == 1 and "model_not_a_judge: a model named lg exists with role chat" in result.err


def test_status_says_guards_are_off_and_shows_the_judges() -> None:
    doc = {**STATUS, "guard": {"enabled": False, "policies": 2, "judges": JUDGES["judges"]}}
    result = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=doc))
    assert result.rc == 0, result.err
    lines = result.out.splitlines()
    assert lines[1] == OFF, "said right under the header"
    rows = columns(result.out, "JUDGE")
    assert rows[1][0] == "llama-guard" and rows[1][-1] == "MISSING"
    assert "GUARD JUDGES (2 policies" in result.out and "! lg2 failed to answer 31 s ago" in result.out
    plain = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=STATUS))
    assert plain.rc == 0 and "OFF" not in plain.out and "JUDGE" not in plain.out


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("1.5", 1.5), ("500ms", 0.5), (" 3 s ", 3.0)])
def test_budget_durations(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "2m", "-1s", ""])
def test_a_budget_that_is_not_a_duration(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_budget(bad)


def test_status_shows_a_down_judge_and_why() -> None:
    down = {"model": "lg4", "policies": ["fine"], "defined": True, "role": "guard", "ready": 0, "desired": 1,
            "last_failure": None, "last_failure_age_s": None, "status": "down",
            "problem": "lg4 has no ready replica (1 starting): no node has the llama.cpp engine"}
    doc = {**STATUS, "guard": {"enabled": True, "policies": 1, "judges": [down]}}
    result = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=doc))
    assert result.rc == 0, result.err
    rows = columns(result.out, "JUDGE")
    assert rows[1][0] == "lg4" and rows[1][4] == "0/1" and rows[1][-1] == "DOWN"
    assert "! lg4 has no ready replica (1 starting): no node has the llama.cpp engine" in result.out
    assert "OFF" not in result.out
