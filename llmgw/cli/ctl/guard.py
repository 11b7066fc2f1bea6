"""The `guard` commands: list, set and remove guard policies, turn every check off or on
(`guard.enabled`, live); the judges' commands (`guard judge ...`) are in `guard_judge`."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, Refused, UsageError
from llmgw.cli.ctl.guard_judge import judge_app
from llmgw.cli.ctl.render.guard import render_policies, render_policy_set, render_switch
from llmgw.cli.ctl.session import Session, SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(guard_app)


guard_app = cyclopts.App(name="guard", help="Guardrails: policies (list, set, remove), off/on, the judges.")
guard_app.command(judge_app)

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*\Z")


@guard_app.command(name="list")
def guard_list(*, session: SessionParam) -> int:
    """Every guard policy, and whether guards are on."""
    return session.show_answer("GET", api_path("guard", "policies"), render=render_policies)


guard_app.default(guard_list)  # `ctl guard` alone does the same


@guard_app.command(name="set")
def guard_set(
    name: str,
    /,
    *,
    file: Annotated[Path | None, Parameter(name="--file")] = None,
    judge: Annotated[str | None, Parameter(name="--judge")] = None,
    check: Annotated[str | None, Parameter(name="--check")] = None,
    models: Annotated[str | None, Parameter(name="--models")] = None,
    categories: Annotated[str | None, Parameter(name="--categories")] = None,
    on_error: Annotated[str | None, Parameter(name="--on-error")] = None,
    budget: Annotated[str | None, Parameter(name="--budget")] = None,
    session: SessionParam,
) -> int:
    """Create a guard policy, or change one: options not given keep the policy's current values
    (a new policy takes the defaults: check prompt, every model, every category, on-error closed, 2 s).

    Parameters
    ----------
    name
        The policy's name.
    file
        A TOML or JSON file holding the policy (the keys of docs/guardrails.md); options override it.
    judge
        The judge model (role guard) that reads the text, e.g. llama-guard.
    check
        What the judge reads: prompt, response or both.
    models
        The models whose requests it checks: a,b or * (every model that is not a judge).
    categories
        The hazard codes that refuse, e.g. S1,S6 (all: every one of S1..S14).
    on_error
        When the judge cannot answer: closed (refuse the request) or open (let it through, recorded).
    budget
        The time one check may take: 2s, 1.5, 500ms.
    """
    doc: dict[str, Any] = _current(session, name) if file is None else read_policy_file(file)
    flags = {"judge": judge, "check": check, "on_error": on_error,
             "models": None if models is None else _list(models),
             "categories": None if categories is None else [] if categories.strip().lower() == "all"
             else _list(categories),
             "budget_s": None if budget is None else parse_budget(budget)}
    if file is not None and doc.get("name", name) != name:
        raise UsageError(f"{file}: names the policy {doc['name']!r}, not {name!r}")
    doc.update({k: v for k, v in flags.items() if v is not None})
    doc["name"] = name
    _, answer = session.request("PUT", api_path("guard", "policies", name), body=doc, send_body=True)
    session.show(answer, render_policy_set)
    return EXIT_OK


@guard_app.command(name="remove")
def guard_remove(name: str, /, *, session: SessionParam) -> int:
    """Remove a guard policy: its models' requests are no longer checked by it.

    Parameters
    ----------
    name
        The policy's name, as `llmgw ctl guard list` shows it.
    """
    return session.show_answer("DELETE", api_path("guard", "policies", name),
                               render=lambda _: f"removed guard policy {name}")


@guard_app.command(name="off")
def guard_off(*, session: SessionParam) -> int:
    """Turn every guard check off, live (guard.enabled = false): no request is checked."""
    return session.show_answer("PUT", api_path("settings", "guard.enabled"), body=False, send_body=True,
                               render=render_switch)


@guard_app.command(name="on")
def guard_on(*, session: SessionParam) -> int:
    """Turn guard checks on again, live (guard.enabled = true)."""
    return session.show_answer("PUT", api_path("settings", "guard.enabled"), body=True, send_body=True,
                               render=render_switch)


def _current(session: Session, name: str) -> dict[str, Any]:
    """The policy as stored (so options not given keep their values); {} for a new one."""
    try:
        _, doc = session.request("GET", api_path("guard", "policies", name))
    except Refused as e:
        if e.message.startswith("policy_not_found:"):
            return {}
        raise
    policy = doc.get("policy") if isinstance(doc, Mapping) else None
    return dict(policy) if isinstance(policy, Mapping) else {}


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_budget(text: str) -> float:
    """Seconds from `2s`, `1.5`, `500ms`; UsageError otherwise (the API checks the range)."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"--budget {text!r}: give seconds (2s, 1.5) or milliseconds (500ms)")
    value = float(match.group(1))
    return value / 1000 if match.group(2) == "ms" else value


def read_policy_file(path: Path) -> dict[str, Any]:
    """One policy from a TOML or JSON file: the policy's keys at the top, or one `[[guard.policies]]` entry."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    try:
        doc: Any = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {e}") from None
    section = doc.get("guard") if isinstance(doc, dict) else None
    nested = section.get("policies") if isinstance(section, dict) else None
    if isinstance(nested, list):
        if len(nested) != 1 or not isinstance(nested[0], dict):
            raise UsageError(f"{path}: holds {len(nested)} guard policies; give a file with one")
        doc = nested[0]
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: a policy is an object (a TOML table or a JSON object)")
    return doc
