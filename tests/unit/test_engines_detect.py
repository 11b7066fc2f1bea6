"""Which engines a node can start, with versions; and what an engine's last lines say when it failed.

Binaries are shell scripts in tmp_path; output samples are what llama.cpp and vLLM print.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from llmgw import __version__
from llmgw.engines import available_engines, detect_engines, start_failure

HAS_XLLAMACPP = importlib.util.find_spec("xllamacpp") is not None


def script(folder: Path, name: str, body: str, mode: int = 0o755) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


def test_nothing_installed_leaves_sim_and_what_this_interpreter_has() -> None:
    engines = detect_engines({"PATH": "/nonexistent"})
    assert engines["sim"] == __version__
    assert ("llama.cpp" in engines) == HAS_XLLAMACPP
    if HAS_XLLAMACPP:
        assert engines["llama.cpp"].startswith("xllamacpp 20")
    assert set(available_engines()) >= {"sim"}


def test_binaries_on_path_are_found_with_their_versions(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    # llama-server prints its version on stderr; vLLM prints log lines before its own.
    script(tmp_path / "bin", "llama-server",
           f'echo run >> {calls}; echo "version: 6490 (3f1e5b9d)" >&2; echo "built with cc for x86_64-linux-gnu" >&2')
    script(tmp_path / "bin", "vllm", 'echo "INFO 10-01 12:00:00 [__init__.py:216] Automatically detected platform cuda."'
                                     '; echo 0.11.1')
    engines = detect_engines({"PATH": str(tmp_path / "bin")})
    assert engines["vllm"] == "0.11.1"
    assert engines["llama.cpp"].endswith("llama-server 6490 (3f1e5b9d)")
    detect_engines({"PATH": str(tmp_path / "bin")})
    assert calls.read_text() == "run\n"  # cached: --version ran once


def test_an_engine_installed_or_upgraded_later_is_seen_at_the_next_inventory(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path / "bin")}
    assert "vllm" not in detect_engines(env)
    vllm = script(tmp_path / "bin", "vllm", "echo 0.11.1")
    assert detect_engines(env)["vllm"] == "0.11.1", "installed after the agent started"
    vllm.write_text("#!/bin/sh\necho 0.12.0 # upgraded in place, a longer file\n")
    assert detect_engines(env)["vllm"] == "0.12.0"


def test_a_version_it_cannot_read_is_unknown_not_absent(tmp_path: Path) -> None:
    script(tmp_path / "bin", "vllm", "echo Traceback; exit 1")
    assert detect_engines({"PATH": str(tmp_path / "bin")})["vllm"] == ""


def test_a_binary_that_is_not_executable_cannot_start(tmp_path: Path) -> None:
    configured = script(tmp_path, "llama-server", 'echo "version: 1 (abc)"', mode=0o644)
    engines = detect_engines({"PATH": "/nonexistent", "LLMGW_LLAMA_SERVER": str(configured)})
    assert "llama-server" not in engines.get("llama.cpp", "")


def test_detection_imports_no_engine(tmp_path: Path) -> None:
    before = {name for name in ("xllamacpp", "vllm", "torch") if name in sys.modules}
    detect_engines({"PATH": str(tmp_path)})
    assert {name for name in ("xllamacpp", "vllm", "torch") if name in sys.modules} == before


# -- start failures ---------------------------------------------------------------------------------

LLAMA_UNKNOWN_ARCH = """\
llama_model_loader: - kv   0:                       general.architecture str              = notarealarch
llama_model_loader: - type  f32:   10 tensors
llama_model_load: error loading model: error loading model architecture: unknown model architecture: 'notarealarch'
llama_model_load_from_file_impl: failed to load model
common_init_from_params: failed to load model '/models/tiny.gguf'
srv    load_model: failed to load model, '/models/tiny.gguf'
llama.cpp could not start model tiny from /models/tiny.gguf on 127.0.0.1:9001: failed to load model
"""

VLLM_ARCH = ("ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported "
             "architectures: dict_keys(['AquilaModel', 'LlamaForCausalLM'])")


@pytest.mark.parametrize(
    ("engine", "tail", "reason"),
    [
        ("llama.cpp", LLAMA_UNKNOWN_ARCH, "engine cannot load architecture notarealarch"),
        # the supervisor's one-line tail, lines joined with " | "
        ("llama.cpp", " | ".join(LLAMA_UNKNOWN_ARCH.splitlines()[-5:]), "engine cannot load architecture notarealarch"),
        ("llama.cpp", "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc "
                      "failed: out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 4294967296",
         "engine ran out of GPU memory (allocating 4096.00 MiB)"),
        ("llama.cpp", "/usr/local/bin/llama-server: error while loading shared libraries: libcuda.so.1: cannot open "
                      "shared object file: No such file or directory",
         "engine cannot start: library libcuda.so.1 is missing"),
        ("llama.cpp", "error: invalid argument: --no-webui", "engine does not know the argument --no-webui "
                                                             "(an older llama.cpp build?)"),
        ("vllm", VLLM_ARCH, "engine cannot load architecture FooForCausalLM"),
        ("vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total "
                 "capacity of 79.10 GiB of which 1.20 GiB is free.",
         "engine ran out of GPU memory (tried to allocate 1.96 GiB)"),
        ("vllm", "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can "
                 "be stored in KV cache (45000). Try increasing `gpu_memory_utilization` or decreasing "
                 "`max_model_len` when initializing the engine.",
         "engine cannot fit a context of 131072 tokens in the KV cache: lower --max-model-len"),
        ("vllm", "vllm: error: unrecognized arguments: --nnodes 2 --headless",
         "engine does not know the arguments --nnodes 2 --headless (an older vLLM?)"),
    ],
)
def test_known_lines_become_reasons(engine: str, tail: str, reason: str) -> None:
    assert start_failure(engine, tail) == reason


def test_unknown_lines_are_passed_on() -> None:
    tail = "loading\nsomething odd happened\nSegmentation fault\n"
    assert start_failure("llama.cpp", tail) == "engine failed to start: loading | something odd happened | " \
                                               "Segmentation fault"
    assert start_failure("vllm", "") == "vllm engine exited before serving and printed nothing"
    # a sim's architecture-like words are not llama.cpp's: each engine reads its own lines
    assert start_failure("sim", LLAMA_UNKNOWN_ARCH).startswith("engine failed to start: ")
