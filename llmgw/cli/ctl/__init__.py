"""`llmgw ctl`: the operator's command line over the admin API (`/api/v1/...`). It owns
argument parsing, URL/key resolution, error wording and rendering; every fact comes from the API.

The layout, one concern per module:

    app.py          the root app: global options, dispatch, `run_ctl`, COMMAND_GROUPS
    target.py       where the API is and with which key (flags > env > credentials file)
    session.py      one run's HTTP session; answers that are not 2xx JSON become errors
    errors.py       CtlError / UsageError / Refused and the exit codes
    render/         what each command prints: tables, models, settings (`__init__`), the
                    status and plan pages (`fleet`), guardrails (`guard`)
    definitions.py  model definitions from a TOML file or from flags
    models.py, settings.py, status.py
                    one command group each, with `register(app)`

A new command group is a new module with `register(app)` and one line in
`app.COMMAND_GROUPS`. Imports only the standard library, cyclopts and httpx, so
that start-up stays fast (tests/unit/test_purity.py checks).

Entry points: `ctl_app`, registered in the root app under a name
(`app.command("llmgw.cli.ctl:ctl_app", name="ctl")`), and `run_ctl(argv,
transport=..., env=..., stdout=..., stderr=...)`, the seam tests drive with
`httpx.MockTransport`.
"""

from llmgw.cli.ctl.app import ctl_app, run_ctl

__all__ = ["ctl_app", "run_ctl"]
