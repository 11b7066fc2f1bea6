"""The `llmgw` command line (cyclopts). Commands load lazily, so `--help` and `ctl`
start without importing the servers (trio, quart, hypercorn)."""

from __future__ import annotations

import cyclopts

from llmgw import __version__

app = cyclopts.App(
    name="llmgw",
    help="Run open-weight LLMs on your own machines behind one OpenAI-compatible endpoint.",
    version=__version__,
)
app.command("llmgw.cli.up:up", name="up")
app.command("llmgw.cli.roles:control", name="control")
app.command("llmgw.cli.roles:agent", name="agent")
app.command("llmgw.cli.engine:engine_app", name="engine")
app.command("llmgw.cli.ctl:ctl_app", name="ctl")


def main() -> None:
    app()
