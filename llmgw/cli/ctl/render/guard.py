"""What ctl prints for guardrails: the policies, guards off/on, the judges' status, a served judge, and the
guard lines of `ctl status`. Pure functions of the API's JSON; unknown is `-`, never 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmgw.cli.ctl.render import _known_count, _short, cell, clean, dig, table

# The server says it too (`notice`); these words stand when an answer lacks them.
GUARDS_OFF = "guards are OFF: no request is checked (llmgw ctl guard on)"
GUARDS_ON = "guards are on: each policy checks its models' requests (llmgw ctl guard list)"
NO_POLICIES = "no guard policies (add one: llmgw ctl guard set NAME --judge MODEL)"
STATUS_WORDS = {"ok": "ok", "missing": "MISSING", "not_a_judge": "NOT A JUDGE", "down": "DOWN",
                "failing": "FAILING", "unknown": "unknown"}


def _off_line(doc: Any) -> list[str]:
    if dig(doc, "enabled") is False:
        return [clean(str(dig(doc, "notice") or GUARDS_OFF)), ""]
    return []


def _models(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    return "* (every model but judges)" if value == ["*"] else ", ".join(clean(str(m)) for m in value)


def _categories(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    return "all (S1-S14)" if not value else ",".join(clean(str(c)) for c in value)


def _budget(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return f"{cell(value)} s"


def _policy_row(p: Any) -> list[Any]:
    return [dig(p, "name"), dig(p, "judge"), dig(p, "check"), _models(dig(p, "models")),
            _categories(dig(p, "categories")), dig(p, "on_error"), _budget(dig(p, "budget_s"))]


POLICY_HEADERS = ["NAME", "JUDGE", "CHECK", "MODELS", "CATEGORIES", "ON ERROR", "BUDGET"]


def render_policies(doc: Mapping[str, Any]) -> str:
    policies = dig(doc, "policies")
    out = _off_line(doc)
    if not isinstance(policies, list) or not policies:
        return "\n".join([*out, NO_POLICIES])
    return "\n".join([*out, table(POLICY_HEADERS, (_policy_row(p) for p in policies))])


def render_policy_set(doc: Mapping[str, Any]) -> str:
    policy = dig(doc, "policy")
    verb = "created" if dig(doc, "created") is True else "set" if dig(doc, "changed") is not False else "unchanged:"
    out = [f"guard policy {cell(dig(policy, 'name'))} {verb}", "", table(POLICY_HEADERS, [_policy_row(policy)])]
    warnings = dig(doc, "warnings")
    if isinstance(warnings, list):
        out += [f"warning: {clean(str(w))}" for w in warnings]
    if dig(doc, "enabled") is False:
        out += ["", clean(str(dig(doc, "notice") or GUARDS_OFF))]
    return "\n".join(out)


def render_switch(doc: Mapping[str, Any]) -> str:
    """The answer to `PUT /api/v1/settings/guard.enabled`."""
    value = dig(doc, "value")
    return GUARDS_OFF if value is False else GUARDS_ON if value is True else f"guard.enabled = {cell(value)}"


def _ready(j: Any) -> str:
    return f"{_known_count(dig(j, 'ready'))}/{_known_count(dig(j, 'desired'))}"


def _failure(j: Any) -> str | None:
    words = dig(j, "last_failure")
    if not words:
        return None
    age = dig(j, "last_failure_age_s")
    when = f"{age:.0f} s ago" if isinstance(age, (int, float)) and not isinstance(age, bool) else "-"
    return f"{when}: {_short(clean(str(words)), 60)}"


def _judge_rows(judges: list[Any]) -> str:
    return table(["JUDGE", "POLICIES", "DEFINED", "ROLE", "READY", "LAST FAILURE", "STATUS"],
                 ([dig(j, "model"), ", ".join(map(str, dig(j, "policies") or [])) or None, dig(j, "defined"),
                   dig(j, "role"), _ready(j), _failure(j), STATUS_WORDS.get(str(dig(j, "status")), dig(j, "status"))]
                  for j in judges))


def _problems(judges: list[Any]) -> list[str]:
    return [f"  ! {clean(str(dig(j, 'problem')))}" for j in judges if dig(j, "problem") and dig(j, "status") != "ok"]


def render_judges(doc: Mapping[str, Any]) -> str:
    judges = dig(doc, "judges")
    out = _off_line(doc)
    if not isinstance(judges, list) or not judges:
        return "\n".join([*out, "no guard policy names a judge (llmgw ctl guard set NAME --judge MODEL)"])
    out.append(_judge_rows(judges))
    problems = _problems(judges)
    return "\n".join([*out, *(["", "WHAT IS WRONG", *problems] if problems else [])])


def render_enabled(doc: Mapping[str, Any]) -> str:
    name, model = cell(dig(doc, "judge")), dig(doc, "model")
    if dig(doc, "changed") is False:
        out = [f"judge {name} is already served so (from {cell(dig(model, 'source'))}): nothing changed"]
    else:
        out = [f"judge {name} served from {cell(dig(model, 'source'))}: {cell(dig(model, 'engine'))} on CPU, "
               f"role {cell(dig(model, 'role'))}, 1 replica"]
        if dig(doc, "replaced"):
            out.append(f"replaced the model {name} that had role {cell(dig(doc, 'replaced'))}")
    found = dig(doc, "found_on")
    if isinstance(found, list) and found:
        out.append(f"the file was found in the storage of: {', '.join(clean(str(n)) for n in found)}")
    mirror_file = dig(doc, "mirror_file")
    if isinstance(mirror_file, str) and mirror_file and dig(doc, "changed") is not False:
        out.append(f"the file is the mirror's {clean(mirror_file)}: each node fetches it from the control planes")
    warnings = dig(doc, "warnings")
    if isinstance(warnings, list):
        out += [f"warning: {clean(str(w))}" for w in warnings]
    out.append("follow it: llmgw ctl guard judge status")
    return "\n".join(out)


# --- `ctl status` ----------------------------------------------------------------------------


def status_header(doc: Mapping[str, Any]) -> list[str]:
    """The line under the status page's header when guards are off; nothing otherwise."""
    return [GUARDS_OFF] if dig(doc, "guard", "enabled") is False else []


def status_section(doc: Mapping[str, Any]) -> list[str]:
    """The status page's judges, when any policy names one (an older server's summary has none: nothing)."""
    judges = dig(doc, "guard", "judges")
    if not isinstance(judges, list) or not judges:
        return []
    policies = dig(doc, "guard", "policies")
    return ["", f"GUARD JUDGES ({_known_count(policies)} policies; `llmgw ctl guard judge status`)",
            _judge_rows(judges), *_problems(judges)]
