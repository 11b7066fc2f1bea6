"""The `guard judge` commands: each judge model's status (defined, as a judge, ready, its last failure,
what is wrong), `enable` (serve a missing judge from a Llama Guard GGUF file) and `ask` (a judge reads a text)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.render import clean
from llmgw.cli.ctl.render.guard import render_enabled, render_judges
from llmgw.cli.ctl.session import SessionParam, api_path

judge_app = cyclopts.App(name="judge", help="The judge models the policies ask for: status, enable, ask.")


@judge_app.command(name="status")
def judge_status(*, session: SessionParam) -> int:
    """Each judge model the policies ask for: defined?, a judge?, replicas ready, last failure, what is wrong."""
    return session.show_answer("GET", api_path("guard", "judges"), render=render_judges)


@judge_app.command(name="enable")
def judge_enable(
    name: str | None = None,
    /,
    *,
    source: Annotated[str | None, Parameter(name="--source")] = None,
    replace: Annotated[bool, Parameter(name="--replace", negative="", show_default=False)] = False,
    session: SessionParam,
) -> int:
    """Serve a missing judge: Llama Guard 3 1B on CPU via llama.cpp, role guard, one replica, under the
    name the policies give it.

    Parameters
    ----------
    name
        The judge's name; omitted: the one judge the policies ask for that is missing.
    source
        The GGUF file, as the nodes see it (/models/Llama-Guard-3-1B.Q4_K_M.gguf) or mirror://NAME; omitted:
        one an agent's storage report lists, else the mirror's Llama Guard file.
    replace
        Replace a model of that name that is not a judge (its clients lose it).
    """
    body: dict[str, Any] = {}
    if name is not None:
        body["name"] = name
    if source is not None:
        body["source"] = source
    if replace:
        body["replace"] = True
    return session.show_answer("POST", api_path("guard", "judges", "enable"), body=body, send_body=True,
                               render=render_enabled)


# --- `guard judge ask` (the admin API's ops/judges.py, `ask`) --------------------------------------------


@judge_app.command(name="ask")
def judge_ask(
    text: str,
    /,
    *,
    judge: Annotated[str | None, Parameter(name="--judge")] = None,
    answer: Annotated[str | None, Parameter(name="--answer")] = None,
    session: SessionParam,
) -> int:
    """Have a judge read TEXT, past the verdict cache: its raw answer and how it was parsed. Nothing of the
    text is recorded (no log, no audit).

    Parameters
    ----------
    text
        What the judge reads, as a user's prompt.
    judge
        The judge model; omitted: the one the policies ask for.
    answer
        A model's answer to TEXT: the judge then reads it as a response check does (the Agent's turn).
    """
    body: dict[str, Any] = {"text": text}
    if judge is not None:
        body["judge"] = judge
    if answer is not None:
        body["answer"] = answer
    return session.show_answer("POST", api_path("guard", "judges", "ask"), body=body, send_body=True, render=render_ask)


def render_ask(doc: Any) -> str:
    """The judge's raw answer (escaped: one line, no control characters) and what llmgw reads in it."""
    parsed = doc.get("parsed") if isinstance(doc.get("parsed"), dict) else {}
    if parsed.get("ok"):
        codes = parsed.get("categories") or []
        reading = "safe" if parsed.get("safe") else "unsafe: " + ", ".join(
            f"{c.get('code')} {c.get('name')}" for c in codes if isinstance(c, dict))
    else:
        reading = f"not Llama Guard's format: {parsed.get('error')} (a policy treats this as a judge failure)"
    rows = [("judge", f"{doc.get('judge')} (replica {doc.get('replica')}), read as a {doc.get('checked')}, "
                      f"{doc.get('latency_ms')} ms, past the cache"),
            ("raw answer", json.dumps(doc.get("raw"), ensure_ascii=True)),
            ("parsed", reading),
            ("guard rule", parsed.get("rule"))]
    return "\n".join(f"{name + ':':<12}{clean(str(value))}" for name, value in rows)
