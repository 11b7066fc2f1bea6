"""The `settings` command: list the cluster's settings, show one, or set one; VALUE
is read as JSON, else taken as a plain string."""

from __future__ import annotations

import json
from typing import Any

import cyclopts

from llmgw.cli.ctl.errors import EXIT_OK
from llmgw.cli.ctl.render import json_field, render_setting, render_settings
from llmgw.cli.ctl.session import SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(settings)


def settings(key: str | None = None, value: str | None = None, /, *, session: SessionParam) -> int:
    """List the settings, show one (KEY), or set one (KEY VALUE).

    Parameters
    ----------
    key
        A setting such as serving.stopped or notify.webhooks.
    value
        JSON (true, 5, '["https://hooks.example/x"]'), else taken as a plain string.
    """
    if key is None:
        _, doc = session.request("GET", api_path("settings"))
        session.show(doc, render_settings)
    elif value is None:
        _, doc = session.request("GET", api_path("settings", key))
        session.show(doc, lambda d: render_setting(key, d))
    else:
        _, doc = session.request("PUT", api_path("settings", key), body=parse_setting_value(value), send_body=True)
        session.show(doc, lambda d: f"{key} = {json_field(d, 'value')}")
    return EXIT_OK


def parse_setting_value(text: str) -> Any:
    """VALUE as JSON (`true`, `5`, `["https://..."]`), else the plain string."""

    def no_constants(name: str) -> Any:
        raise ValueError(name)  # NaN/Infinity are not JSON; keep them as text

    try:
        return json.loads(text, parse_constant=no_constants)
    except ValueError:
        return text
