"""The `notify` commands: the webhooks' deliveries and the conditions active now (`notify status`), and a
test event to every webhook (`notify test`, exit 1 when one did not take it)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import cyclopts

from llmgw.cli.ctl.errors import EXIT_API, EXIT_OK
from llmgw.cli.ctl.render import cell, clean, dig, table
from llmgw.cli.ctl.session import SessionParam, api_path

DELIVERIES_SHOWN = 5  # per webhook; --json has every kept one


def register(app: cyclopts.App) -> None:
    app.command(notify_app)


notify_app = cyclopts.App(name="notify", help="Webhooks: their deliveries and the conditions posted (status), a test.")


@notify_app.command(name="status")
def notify_status(*, session: SessionParam) -> int:
    """Each webhook's health and recent deliveries, and the conditions active now."""
    return session.show_answer("GET", api_path("notify", "status"), render=render_notify_status)


notify_app.default(notify_status)  # `ctl notify` alone does the same


@notify_app.command(name="test")
def notify_test(*, session: SessionParam) -> int:
    """Post a test event to every webhook now (one try each); exit 1 when one did not take it."""
    _, doc = session.request("POST", api_path("notify", "test"))
    session.show(doc, render_notify_test)
    results = dig(doc, "webhooks")
    ok = isinstance(results, list) and all(dig(r, "outcome") == "delivered" for r in results)
    return EXIT_OK if ok else EXIT_API


# --- rendering: pure functions of the JSON; unknown is `-`, never 0 --------------------------------


def render_notify_status(doc: Mapping[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    out: list[str] = []
    hooks = dig(doc, "webhooks")
    if not dig(doc, "configured"):
        out.append(clean(str(dig(doc, "hint") or "no notify.webhooks set")))
    elif isinstance(hooks, list):
        out.append(table(["WEBHOOK", "FORMAT", "HEALTH", "DELIVERED", "FAILED", "DROPPED", "QUEUED", "LAST ERROR"],
                         [[h.get("id"), h.get("format"), _health(h), h.get("delivered"), h.get("failed"),
                           h.get("dropped"), h.get("queued"), h.get("last_error")]
                          for h in hooks if isinstance(h, Mapping)]))
        for h in hooks:
            deliveries = h.get("deliveries") if isinstance(h, Mapping) else None
            if isinstance(deliveries, list) and deliveries:
                out += ["", f"{cell(h.get('id'))}: recent deliveries (newest first)",
                        _indent(table(["WHEN", "EVENT", "CONDITION", "OUTCOME", "TRIES", "HTTP", "ERROR"],
                                      [[_ago(d.get("finished_at") or d.get("queued_at"), now), d.get("event"),
                                        f"{d.get('kind')} {d.get('subject') or ''}".strip(), d.get("outcome"),
                                        d.get("attempts"), d.get("status"), d.get("error")]
                                       for d in deliveries[:DELIVERIES_SHOWN] if isinstance(d, Mapping)]))]
    active = dig(doc, "active")
    if dig(doc, "record_error"):
        out += ["", clean(f"NOT POSTING: the conditions' update was not committed ({dig(doc, 'record_error')}); "
                          f"a leader that cannot commit (no majority?) posts nothing")]
    if dig(doc, "running") is False:
        out += ["", "this control plane runs no notifier"]
    elif isinstance(active, list) and active:
        out += ["", "ACTIVE CONDITIONS",
                _indent(table(["SEVERITY", "KIND", "SUBJECT", "SINCE", "WHAT"],
                              [[c.get("severity"), c.get("kind"), c.get("subject"), _ago(c.get("since"), now),
                                c.get("words")] for c in active if isinstance(c, Mapping)]))]
    elif isinstance(active, list):
        checked = dig(doc, "checked_at")
        out += ["", "no condition active" + (f" (checked {_ago(checked, now)})" if checked is not None else "")]
    return "\n".join(out)


def render_notify_test(doc: Mapping[str, Any]) -> str:
    results = dig(doc, "webhooks")
    if not isinstance(results, list):
        return "no answer about the webhooks"
    return table(["WEBHOOK", "FORMAT", "OUTCOME", "HTTP", "ERROR"],
                 [[r.get("id"), r.get("format"), r.get("outcome"), r.get("status"), r.get("error")]
                  for r in results if isinstance(r, Mapping)])


def _health(h: Mapping[str, Any]) -> str:
    if h.get("failing"):
        return f"FAILING ({h.get('failures_in_row')} failed tries in a row)"
    if h.get("failures_in_row"):
        return f"retrying ({h.get('failures_in_row')} failed tries)"
    return "ok" if h.get("last_ok_at") is not None else "not tried yet"


def _ago(at: Any, now: float) -> str | None:
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return None
    return f"{max(now - at, 0):.0f} s ago"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
