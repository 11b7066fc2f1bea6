"""What completing engine answers to OpenAI's schemas costs the gateway (llmgw/gateway/normalise.py, docs/api.md
"What the gateway adds to answers"), per answer, beside the baseline of parsing and writing the answer again
(what a naive normaliser would pay on every answer): an answer that lacks nothing (the sim's, vLLM's: read
from its bytes, relayed as it came) and one that lacks fields (llama.cpp's: parsed, completed, written), for a
whole chat answer, one streamed chat chunk, and an embeddings answer of 8 vectors of 1024 floats.

Run: `.venv/bin/python tests/bench/normalise.py [--calls 20000] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from llmgw.gateway.normalise import Fill, StreamNormaliser, normalise_body
from llmgw.wire.asgi import dumps

FILL = Fill("bench", "req-1")
TEXT = "The gateway is fast today, and its answers are complete. " * 4
CHAT_OK = dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "bench", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": TEXT, "refusal": None}, "logprobs": None,
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 48, "total_tokens": 60}})
# llama.cpp's (b0-unknown): no `logprobs`, no `refusal`, its `timings`.
CHAT_LACKING = dumps({"choices": [{"finish_reason": "stop", "index": 0, "message": {"role": "assistant",
                                                                                  "content": TEXT}}],
                      "created": 1, "model": "bench", "system_fingerprint": "b0-unknown", "object": "chat.completion",
                      "usage": {"completion_tokens": 48, "prompt_tokens": 12, "total_tokens": 60},
                      "id": "chatcmpl-1", "timings": {"cache_n": 0, "prompt_n": 12, "predicted_ms": 0.8}})
CHUNK_OK = b"data: " + dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "bench",
                              "choices": [{"index": 0, "delta": {"content": " fast"}, "logprobs": None,
                                           "finish_reason": None}]}) + b"\n\n"
CHUNK_LACKING = b"data: " + dumps({"choices": [{"finish_reason": None, "index": 0, "delta": {"content": " fast"},
                                                "logprobs": {"content": [{"token": " fast", "logprob": -0.1,
                                                                          "bytes": [32], "top_logprobs": []}]}}],
                                   "created": 1, "id": "chatcmpl-1", "model": "bench",
                                   "object": "chat.completion.chunk"}) + b"\n\n"
VECTORS = [{"object": "embedding", "index": i, "embedding": [((i * 1024 + j) % 97) / 97 - 0.5 for j in range(1024)]}
           for i in range(8)]
EMBED_OK = dumps({"object": "list", "model": "bench", "data": VECTORS,
                  "usage": {"prompt_tokens": 16, "total_tokens": 16}})
EMBED_LACKING = dumps({"object": "list", "data": VECTORS})  # no model, no usage


def _us(fn: Callable[[], object], calls: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - started) / calls / 1000


def _chunk(body: bytes) -> Callable[[], object]:
    normaliser = StreamNormaliser("chat", FILL)
    return lambda: normaliser.feed(body)


def measure(calls: int = 20_000, rounds: int = 5) -> dict[str, tuple[float, float]]:
    """µs per answer for each case: (the normaliser, the baseline: parse and write again)."""
    cases: dict[str, tuple[str, bytes, Callable[[], object]]] = {
        "chat, complete (sim, vLLM)": ("chat", CHAT_OK, lambda: normalise_body("chat", CHAT_OK, FILL)),
        "chat, lacking (llama.cpp)": ("chat", CHAT_LACKING, lambda: normalise_body("chat", CHAT_LACKING, FILL)),
        "stream chunk, complete": ("chunk", CHUNK_OK, _chunk(CHUNK_OK)),
        "stream chunk, lacking (llama.cpp logprobs)": ("chunk", CHUNK_LACKING, _chunk(CHUNK_LACKING)),
        "embeddings 8x1024, complete": ("embedding", EMBED_OK, lambda: normalise_body("embedding", EMBED_OK, FILL)),
        "embeddings 8x1024, lacking": ("embedding", EMBED_LACKING,
                                       lambda: normalise_body("embedding", EMBED_LACKING, FILL)),
    }
    out: dict[str, tuple[float, float]] = {}
    for name, (kind, body, fn) in cases.items():
        payload = body[6:-2] if kind == "chunk" else body
        n = max(1, calls // 200) if kind == "embedding" else calls
        mine, base = [], []
        for _ in range(rounds):
            mine.append(_us(fn, n))
            base.append(_us(lambda p=payload: dumps(json.loads(p)), n))  # type: ignore[misc]
        out[name] = (statistics.median(mine), statistics.median(base))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    result = measure(args.calls, args.rounds)
    width = max(len(name) for name in result)
    print(f"{'answer':<{width}}  {'normalise µs':>12}  {'parse+write µs':>14}  {'ratio':>6}")
    for name, (mine, base) in result.items():
        print(f"{name:<{width}}  {mine:12.2f}  {base:14.2f}  {mine / base:5.2f}x")


if __name__ == "__main__":
    main()
