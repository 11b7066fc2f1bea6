"""The root `ctl` app: it registers in the root CLI (directly or lazily), and every
command group in COMMAND_GROUPS registers its commands and shows in `ctl --help`."""

from __future__ import annotations

import ast
import importlib
import io
import sys
from pathlib import Path
from typing import Any

import cyclopts
import pytest

import llmgw.cli.ctl
from ctl_fakes import closed_port
from llmgw.cli.ctl import ctl_app, run_ctl
from llmgw.cli.ctl.app import COMMAND_GROUPS, register_groups


@pytest.mark.parametrize("registered", [ctl_app, "llmgw.cli.ctl:ctl_app"], ids=["app", "lazy"])
def test_ctl_app_registers_in_a_root_app(registered: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = cyclopts.App(name="llmgw")
    root.command(registered, name="ctl")
    url = f"http://127.0.0.1:{closed_port()}"
    for argv in (["ctl", "--url", url, "--key", "k", "status"], ["ctl", "models", "--url", url, "--key", "k"]):
        rc = root(argv, result_action="return_value")
        assert rc == 1
        assert (
            capsys.readouterr().err == f"error: the server at {url} (from --url) is not reachable: connection refused\n"
        )


# --- command groups: one module and one line in COMMAND_GROUPS each ------------------


def commands_of(group: str) -> set[str]:
    """The command names the group's `register(app)` adds to an empty app."""
    app = cyclopts.App(name="probe")
    before = set(app)
    register_groups(app, [group])
    return set(app) - before


@pytest.mark.parametrize("group", COMMAND_GROUPS)
def test_each_command_group_registers_commands_that_ctl_help_lists(group: str) -> None:
    added = commands_of(group)
    assert added, f"llmgw.cli.ctl.{group}.register(app) added no command"
    out = io.StringIO()
    assert run_ctl(["--help"], stdout=out, stderr=io.StringIO()) == 0
    listed = {line.strip("│ ").split(" ")[0] for line in out.getvalue().splitlines()}
    assert added <= listed, f"{sorted(added - listed)} missing from `ctl --help`:\n{out.getvalue()}"


def test_every_module_with_register_is_a_listed_command_group() -> None:
    package = Path(llmgw.cli.ctl.__file__).parent
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    with_register = [
        m for m in modules if callable(getattr(importlib.import_module(f"llmgw.cli.ctl.{m}"), "register", None))
    ]
    assert with_register == sorted(COMMAND_GROUPS), "a group module is missing from app.COMMAND_GROUPS (or vice versa)"


def test_ctl_imports_only_the_standard_library_cyclopts_httpx_and_itself() -> None:
    # rich only inside a function, for tests' consoles; cyclopts loads it anyway.
    allowed = {*sys.stdlib_module_names, "cyclopts", "httpx", "rich"}
    # The one table of timeouts (ctl's request timeout is in it) and the one file hasher (diskfiles): standard
    # library only, checked by test_purity.
    also = {"llmgw.domain.timeouts", "llmgw.diskfiles"}
    package = Path(llmgw.cli.ctl.__file__).parent
    bad = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                anchor = {0: "", 1: "llmgw.cli.ctl"}.get(node.level, "llmgw.cli")  # `from .. import` leaves
                names = [".".join(filter(None, [anchor, node.module]))]
            for name in names:
                if name.split(".")[0] not in allowed and not (name + ".").startswith("llmgw.cli.ctl.") and name not in also:
                    bad.append(f"{path.name}:{node.lineno}: imports {name}")
    assert bad == [], "ctl starts fast and stands alone:\n" + "\n".join(bad)
