"""The console's Settings page (`/settings`): every cluster setting with its help, default and current
value (`domain.settings.SETTINGS`, as `GET /api/v1/settings` gives them), and which are set.

Webhook URLs often carry a token in their path (Slack's do): a viewer sees their scheme and host only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from llmgw.console import auth, sessions
from llmgw.console.layout import esc, page, table
from llmgw.domain.settings import SETTINGS, effective

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

SECRET_BEARING = ("notify.webhooks",)


def _mask(value: Any) -> Any:
    """Webhooks with their URLs cut to scheme and host (what a viewer may see)."""
    if not isinstance(value, list):
        return value

    def cut(url: Any) -> Any:
        if not isinstance(url, str):
            return url
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}/…" if parts.netloc else "…"

    return [{**item, "url": cut(item.get("url"))} if isinstance(item, dict) else cut(item) for item in value]


def _json(value: Any) -> str:
    return f"<code>{esc(json.dumps(value))}</code>"


def render(stored: Any, role: str) -> str:
    rows = []
    for key, spec in sorted(SETTINGS.items()):
        value = effective(stored, key)
        if role != "admin" and key in SECRET_BEARING:
            value = _mask(value)
        is_set = key in stored
        rows.append([f'<span id="setting-{esc(key)}">{esc(key)}</span>', _json(value), _json(spec.default),
                     "set" if is_set else "default", esc(spec.help)])
    intro = ("<p>Every cluster setting, live on every member. Change one with "
             "<code>llmgw ctl settings KEY VALUE</code> (the value as JSON).</p>")
    return intro + table(["setting", "value", "default", "", "what it does"], rows, testid="settings-table")


def register(app: QuartTrio) -> None:
    @auth.console_route(app, "/settings")
    async def settings(session: sessions.Session, ctx: Context) -> str:
        return page("Settings", "Settings", render(ctx.state().settings, session.role), session=session)
