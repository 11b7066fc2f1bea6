"""llama.cpp complete on CPU, on a tiny random-weight GGUF the suite writes offline: chat (streamed and
not) and embeddings through the real engine started from `launch_spec`, an unknown architecture read
back as the reason, and broken files refused before any process starts."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.engines import EngineError, LaunchSpec, launch_spec, start_failure
from tests.support.processes import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]

START_S = 60.0


def tiny(tmp_path: Path, arch: str = "llama") -> str:
    from tests.support.tiny_gguf import write_tiny_llama

    return str(write_tiny_llama(tmp_path / f"{arch}.gguf", arch=arch))


def spec(weights: str, port: int, *, role: str = "chat", args: tuple[str, ...] = (), cwd: Path | None = None,
         roots: tuple[str, ...] = ()) -> LaunchSpec:
    # No engine binary on PATH: the CPU engine (xllamacpp) is the one chosen.
    return launch_spec("llama.cpp", model="tiny", role=role, source=weights, host="127.0.0.1", port=port,
                       args=list(args), roots=roots, cwd=str(cwd) if cwd else None,
                       environ={"PATH": "/nonexistent"})


class Engine:
    def __init__(self, launch: LaunchSpec, log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(launch.argv, env={**os.environ, **launch.env}, cwd=launch.cwd,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_healthy(self, url: str) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"engine exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        pytest.fail(f"engine not healthy within {START_S} s:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    started: list[Engine] = []
    yield started
    for engine in started:
        engine.stop()


def serve(engines: list[Engine], launch: LaunchSpec, port: int, log: Path) -> str:
    engine = Engine(launch, log)
    engines.append(engine)
    url = f"http://127.0.0.1:{port}"
    engine.wait_healthy(url)
    return url


def printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\t" for ch in text)


def test_chat_from_a_tiny_gguf_streamed_and_not(tmp_path: Path, engines: list[Engine]) -> None:
    weights = tiny(tmp_path)
    port = free_port("127.0.0.1")
    url = serve(engines, spec(weights, port, args=("--ctx-size", "256"), roots=(str(tmp_path),)), port,
                tmp_path / "chat.log")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
            "temperature": 0}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()
    text = answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] >= 1 and printable(text)
    chunks: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[len("data: "):])["choices"][0]["delta"]
                chunks.append(delta.get("content") or "")
    assert len(chunks) >= 2 and printable("".join(chunks))
    assert "".join(chunks) == text  # temperature 0: the same tokens either way


def test_embeddings_from_the_llama_cpp_engine(tmp_path: Path, engines: list[Engine]) -> None:
    from tests.support.tiny_gguf import N_EMBD

    weights = tiny(tmp_path)
    port = free_port("127.0.0.1")
    url = serve(engines, spec(weights, port, role="embedding", args=("--pooling", "mean", "--ctx-size", "256")),
                port, tmp_path / "embed.log")
    answer = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny", "input": ["hello world", "the cluster"]},
                        timeout=30).json()
    vectors = [item["embedding"] for item in answer["data"]]
    assert len(vectors) == 2 and all(len(v) == N_EMBD for v in vectors)
    assert vectors[0] != vectors[1]


def test_an_unknown_architecture_is_the_reason(tmp_path: Path, engines: list[Engine]) -> None:
    weights = tiny(tmp_path, arch="notarealarch")
    launch = spec(weights, free_port("127.0.0.1"))  # its header is sound: only llama.cpp can tell
    engine = Engine(launch, tmp_path / "arch.log")
    engines.append(engine)
    assert engine.proc.wait(timeout=START_S) != 0
    assert start_failure("llama.cpp", engine.output()) == "engine cannot load architecture notarealarch"


def test_truncated_and_lying_files_never_reach_the_engine(tmp_path: Path) -> None:
    from tests.support.tiny_gguf import truncate, write_lying_header

    cut = truncate(tiny(tmp_path), 4096)
    lying = write_lying_header(tmp_path / "lying.gguf")
    for path, words in ((cut, "truncated"), (lying, "")):
        with pytest.raises(EngineError) as caught:
            spec(str(path), 1)
        assert caught.value.code == "bad_weights" and words in caught.value.message
