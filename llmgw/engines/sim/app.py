"""The simulator's answers: a raw ASGI app (chat, completions, guard, embeddings; rerank and tokenize in
llama.cpp's shapes, tokens.py) with deterministic replies.
Owns `SimOptions` (what a sim process is told), `make_app` and `SimApp`; `process.py` serves it.

A raw ASGI app rather than Quart: the simulator is the baseline of the
gateway-overhead benchmark, so a request costs one JSON parse and one dump.
Replies echo the last user message after "sim says:"; a token is a
whitespace-separated word. As a judge (`--role guard`) it answers in Llama Guard's format: `safe`, or
`unsafe` and the codes of the `--unsafe WORD=CODE` words (and `[unsafe:S6]` markers) in the last turn of
the Llama Guard prompt it was given (requests.judged_text). Prompts and replies are never logged.
"""

from __future__ import annotations

import base64
import itertools
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import trio

from llmgw.domain.model import ROLES
from llmgw.engines.sim.group import GroupRole
from llmgw.engines.sim.lora import LOAD_PATH, UNLOAD_PATH, SimAdapters
from llmgw.engines.sim.prefix import PrefixCache
from llmgw.engines.sim import tokens as sim_tokens
from llmgw.engines.sim.requests import (check_input, check_messages, check_optional, check_prompt, content_text,
                                        count_words, embed, focus_text, judged_text, max_tokens)
from llmgw.engines.sim.structured import (ToolCall, cut, json_answer, legacy_logprobs, pieces, response_format, stops,
                                          token_logprobs, tool_calls)
from llmgw.errors import OpenAIError
from llmgw.wire.asgi import (Exchange, RawApp, Receive, Scope, Send, cancel_on_disconnect, dumps, parse_object,
                             read_body, send_json)

__all__ = ["SimApp", "SimOptions", "make_app"]

_MAX_EMBEDDING_DIM = 8192
_UNSAFE_MARKER = re.compile(r"\[unsafe:(S\d{1,2})\]")
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_ROUTES: dict[str, str] = {
    "/health": "GET",
    "/v1/models": "GET",
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/embeddings": "POST",
    LOAD_PATH: "POST",
    UNLOAD_PATH: "POST",
    "/v1/rerank": "POST",  # llama.cpp's paths and shapes (tokens.py)
    "/tokenize": "POST",
    "/detokenize": "POST",
    # vLLM's sleep mode (its dev-mode endpoints: `VLLM_SERVER_DEV_MODE=1`), modelled for fast wake.
    "/sleep": "POST",
    "/wake_up": "POST",
    "/is_sleeping": "GET",
}


@dataclass
class SimOptions:
    """Where to listen and what to answer as, then the tunables of `ENGINE_ARGS["sim"]`."""

    host: str
    port: int
    model: str
    role: str = "chat"
    tokens_per_s: float = 0.0  # 0: answer at once
    startup_delay: float = 0.0
    fail_start: bool = False
    exit_after: float = 0.0  # serve this many seconds, then exit with an error (a flap); 0: until stopped
    embedding_dim: int = 16
    group: GroupRole | None = None  # a member of a multi-node replica (`group.py`)
    unsafe: tuple[tuple[str, str], ...] = ()  # as a judge: (word, hazard code) pairs, `--unsafe WORD=S6`
    prefill_tokens_per_s: float = 0.0  # prompt reading speed past what the prefix cache holds; 0: instant
    prefix_cache_blocks: int = 4096  # the prefix cache's size (prefix.py), with prefill_tokens_per_s
    lora_lie: bool = False  # a LoRA adapter load answers 200 and loads nothing (lora.py)
    wake_delay: float = 0.0  # fast wake: how long `POST /wake_up` takes (a cold start takes `startup_delay`)


@dataclass(frozen=True)
class _Reply:
    """One generated answer: its tokens (concatenating to the text, or to its tool calls' arguments), the
    finish reason, the tool calls it makes, and the prompt it echoes first (legacy completions' `echo`)."""

    tokens: list[str]
    finish_reason: str
    calls: tuple[ToolCall, ...] = ()
    echo: str = ""
    stop_reason: str | None = None  # the stop string that ended it, as vLLM says (`stop_reason` on the choice)

    @property
    def text(self) -> str:
        return "".join(self.tokens)


@dataclass(frozen=True)
class _Asked:
    """What a request asks of its answer beyond the text: log probabilities (None: none; else how many
    alternatives per token) and the id its tool calls' ids derive from."""

    logprobs: int | None = None
    call_id: str = ""


def make_app(opts: SimOptions) -> SimApp:
    """The ASGI application for one simulated model."""
    if opts.role not in ROLES:
        raise ValueError(f"unknown role {opts.role!r}; expected one of {', '.join(ROLES)}")
    if not 0 < opts.embedding_dim <= _MAX_EMBEDDING_DIM:
        raise ValueError(f"embedding_dim must be in 1..{_MAX_EMBEDDING_DIM}")
    if not opts.tokens_per_s >= 0:
        raise ValueError("tokens_per_s must be >= 0")
    if not opts.prefill_tokens_per_s >= 0:
        raise ValueError("prefill_tokens_per_s must be >= 0")
    if opts.prefix_cache_blocks < 1:
        raise ValueError("prefix_cache_blocks must be >= 1")
    return SimApp(opts)


class SimApp(RawApp):
    """Raw ASGI app; `make_app` builds it."""

    def __init__(self, opts: SimOptions) -> None:
        self.opts = opts
        self._ids = itertools.count(1)
        self._unsafe = [(re.compile(rf"(?<!\w){re.escape(w)}(?!\w)", re.IGNORECASE), code) for w, code in opts.unsafe]
        self.generated = 0  # chat and completion requests answered (tests count a judge's calls)
        # With a prefill speed, each prompt takes time to read before the first token, less what it shares
        # with earlier prompts still in this replica's cache.
        self.prefix = PrefixCache(opts.prefix_cache_blocks) if opts.prefill_tokens_per_s > 0 else None
        self._prefilling = trio.Lock()  # one prompt read at a time: a replica's compute, as prefill is on a GPU
        self.adapters = SimAdapters(opts.model, opts.lora_lie)  # LoRA adapters, vLLM's runtime API (lora.py)
        self.vocabulary = sim_tokens.Vocabulary()
        self.reranked = 0  # rerank requests answered
        self.sleep_level = 0  # vLLM's sleep mode, modelled: 0 awake, else the level it sleeps at

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        allowed = _ROUTES.get(path)
        try:
            if allowed is None:
                raise OpenAIError(404, "not_found", f"Invalid URL ({method} {path})")
            if method != allowed:
                message = f"Method {method} not allowed on {path}; use {allowed}"
                raise OpenAIError(405, "method_not_allowed", message, headers=[(b"allow", allowed.encode())])
            if path == "/health":
                await send_json(send, 200, dumps({"status": "ok"}))
            elif path in ("/sleep", "/wake_up", "/is_sleeping"):
                await self._sleep_mode(path, scope, send)
            elif self.sleep_level and path != "/v1/models":
                raise OpenAIError(503, "engine_asleep", "the engine is asleep (POST /wake_up wakes it)")
            elif path == "/v1/models":
                await send_json(send, 200, dumps(self._models()))
            else:
                ex = Exchange()
                body = parse_object(await read_body(scope, receive, ex))
                if path == "/v1/embeddings":
                    await send_json(send, 200, dumps(self._embeddings(body)))
                elif path in (LOAD_PATH, UNLOAD_PATH):
                    await send_json(send, 200, dumps(self.adapters.answer(path, body)))
                elif path in ("/v1/rerank", "/tokenize", "/detokenize"):
                    await send_json(send, 200, dumps(self._tokens(path, body)))
                else:
                    await self._generate(path, body, receive, send, ex)
        except OpenAIError as error:
            await send_json(send, error.status, dumps(error.doc()), error.headers)

    async def _sleep_mode(self, path: str, scope: Scope, send: Send) -> None:
        """vLLM's sleep mode as its API answers: `POST /sleep?level=1|2` frees the GPU at once (the sim holds
        nothing: it stops serving), `POST /wake_up` serves again after `wake_delay`, `GET /is_sleeping`."""
        if path == "/sleep":
            query = dict(part.split("=", 1) for part in scope.get("query_string", b"").decode().split("&")
                         if "=" in part)
            level = query.get("level", "1")
            if level not in ("1", "2"):
                raise OpenAIError(400, "invalid_value", "level must be 1 or 2", param="level")
            self.sleep_level = int(level)
            await send_json(send, 200, b"{}")
        elif path == "/wake_up":
            if self.sleep_level:
                await trio.sleep(self.opts.wake_delay)
                self.sleep_level = 0
            await send_json(send, 200, b"{}")
        else:
            await send_json(send, 200, dumps({"is_sleeping": bool(self.sleep_level)}))

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.opts.model, "object": "model", "created": 0, "owned_by": "llmgw-sim"},
                     *self.adapters.models()],
        }

    # -- chat and completions -------------------------------------------------

    async def _generate(self, path: str, body: dict[str, Any], receive: Receive, send: Send, ex: Exchange) -> None:
        if self.opts.role in ("embedding", "rerank"):
            words = f"model {self.opts.model} is an {self.opts.role} model; it does not generate"
            raise OpenAIError(400, "unsupported_endpoint", words, param="model")
        chat = path == "/v1/chat/completions"
        self.generated += 1
        if chat:
            messages = check_messages(body)
            prompts = [focus_text(messages, through_end=self.opts.role == "guard")]
            prompt_tokens = sum(count_words(content_text(m.get("content"))) for m in messages)
        else:
            prompts = check_prompt(body)
            prompt_tokens = sum(count_words(p) for p in prompts)
        check_optional(body, "model", str)
        limit = max_tokens(body)
        stream = check_optional(body, "stream", bool) or False
        options = check_optional(body, "stream_options", dict) or {}
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            param = "stream_options.include_usage"
            raise OpenAIError(400, "invalid_type", f"{param} must be a boolean", param=param)
        if self.prefix is not None:
            if chat:
                read = [[w for m in messages for w in (str(m["role"]), *content_text(m.get("content")).split())]]
            else:
                read = [p.split() for p in prompts]
            uncached = sum(len(words) - self.prefix.admit(words) for words in read)
            if uncached:
                async with self._prefilling:  # before any byte: the time to first token, queued behind others'
                    await trio.sleep(uncached / self.opts.prefill_tokens_per_s)
        speaker = self.adapters.speaker(body.get("model"))  # "sim[NAME]" for a loaded LoRA adapter
        n = check_optional(body, "n", int)
        if n is not None and not 1 <= n <= 128:
            raise OpenAIError(400, "invalid_value", "'n' must be in 1..128", param="n")
        stop = stops(body)
        logprobs = self._logprobs(body, chat)
        if chat:
            fmt, schema = response_format(body)
            calls = tuple(tool_calls(body, prompts[0]))
            replies = [self._reply(prompts[0], limit, stop, fmt, schema, calls, speaker=speaker)
                       for _ in range(n or 1)]
        else:
            echo = check_optional(body, "echo", bool) is True
            replies = [self._reply(text, limit, stop, echo=text if echo else "", speaker=speaker)
                       for text in prompts for _ in range(n or 1)]
        completion_tokens = sum(len(r.tokens) for r in replies)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        id_ = f"{'chatcmpl' if chat else 'cmpl'}-sim-{next(self._ids)}"
        asked = _Asked(logprobs, id_.replace("chatcmpl-", "call_"))
        created = int(time.time())
        if not stream:
            if self.opts.tokens_per_s > 0:
                await trio.sleep(completion_tokens / self.opts.tokens_per_s)
            await send_json(send, 200, dumps(self._whole(chat, id_, created, replies, usage, asked)))
            return
        frames = self._chunks(chat, id_, created, replies, usage if include_usage else None, asked)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        async with trio.open_nursery() as nursery:
            # A client that goes away stops the stream instead of being paced to the end.
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope, ex)
            await self._pace(frames, send)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            nursery.cancel_scope.cancel()

    async def _pace(self, frames: Iterator[tuple[bool, dict[str, Any]]], send: Send) -> None:
        tokens_per_s = self.opts.tokens_per_s
        start = trio.current_time()
        emitted = 0
        for is_token, frame in frames:
            if is_token and tokens_per_s > 0:
                emitted += 1
                # Deadlines from the start, so per-frame overhead does not add up.
                await trio.sleep_until(start + emitted / tokens_per_s)
            data = b"data: " + dumps(frame) + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})

    @staticmethod
    def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
        """Chat: `logprobs: true` with `top_logprobs` (0..20) alternatives; completions: the `logprobs` count
        (0..5). None: not asked."""
        if chat:
            top = check_optional(body, "top_logprobs", int)
            if top is not None and not 0 <= top <= 20:
                raise OpenAIError(400, "invalid_value", "'top_logprobs' must be in 0..20", param="top_logprobs")
            if check_optional(body, "logprobs", bool):
                return top or 0
            if top:
                raise OpenAIError(400, "invalid_value", "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            return None
        count: int | None = check_optional(body, "logprobs", int)
        if count is not None and not 0 <= count <= 5:
            raise OpenAIError(400, "invalid_value", "'logprobs' must be in 0..5", param="logprobs")
        return count

    def _reply(self, text: str, limit: int, stop: list[str] | None = None, fmt: str = "text", schema: Any = None,
               calls: tuple[ToolCall, ...] = (), echo: str = "", speaker: str = "sim") -> _Reply:
        if calls:
            return _Reply([p for call in calls for p in pieces(call.arguments)], "tool_calls", calls)
        if self.opts.role == "guard":
            text = judged_text(text)
            found = [(m.start(), code) for pattern, code in self._unsafe if (m := pattern.search(text))]
            found += [(m.start(), m.group(1)) for m in _UNSAFE_MARKER.finditer(text)]
            hazards = list(dict.fromkeys(code for _, code in sorted(found)))
            tokens = ["unsafe", "\n" + ",".join(hazards)] if hazards else ["safe"]
        elif fmt != "text":
            tokens = pieces(json_answer(fmt, schema, text))
        else:
            words = [speaker, "says:", *text.split()]
            tokens = [words[0], *(" " + w for w in words[1:])]
        if stop and (stopped := cut(tokens[:limit], stop)) is not None:
            return _Reply(stopped[0], "stop", echo=echo, stop_reason=stopped[1])
        if len(tokens) > limit:
            return _Reply(tokens[:limit], "length", echo=echo)
        return _Reply(tokens, "stop", echo=echo)

    def _whole(
        self, chat: bool, id_: str, created: int, replies: list[_Reply], usage: dict[str, int], asked: _Asked
    ) -> dict[str, Any]:
        top = asked.logprobs
        choices: list[dict[str, Any]] = []
        for index, reply in enumerate(replies):
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": None if reply.calls else reply.text,
                                           "refusal": None}
                if reply.calls:
                    message["tool_calls"] = [
                        {"id": f"{asked.call_id}-{index}-{k}", "type": "function",
                         "function": {"name": call.name, "arguments": call.arguments}}
                        for k, call in enumerate(reply.calls)]
                logprobs = None if top is None else {"content": token_logprobs(reply.tokens, 0, top), "refusal": None}
                choices.append({"index": index, "message": message, "logprobs": logprobs,
                                "finish_reason": reply.finish_reason, **_said(reply)})
            else:
                legacy = None if top is None else legacy_logprobs(reply.tokens, 0, len(reply.echo), top)
                choices.append({"text": reply.echo + reply.text, "index": index, "logprobs": legacy,
                                "finish_reason": reply.finish_reason, **_said(reply)})
        return {
            "id": id_,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": self.opts.model,
            "choices": choices,
            "usage": usage,
        }

    def _chunks(
        self, chat: bool, id_: str, created: int, replies: list[_Reply], usage: dict[str, int] | None, asked: _Asked
    ) -> Iterator[tuple[bool, dict[str, Any]]]:
        """Stream frames in order, each flagged True when it carries one token."""
        base = {
            "id": id_,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": self.opts.model,
        }
        top = asked.logprobs

        def frame(choice: dict[str, Any]) -> dict[str, Any]:
            extra = {"usage": None} if usage is not None else {}
            return {**base, "choices": [choice], **extra}

        for index, reply in enumerate(replies):
            if chat:
                first = {"role": "assistant", "content": None if reply.calls else "", "refusal": None}
                yield False, frame({"index": index, "delta": first, "logprobs": None, "finish_reason": None})
                position = 0
                for k, call in enumerate(reply.calls):  # as OpenAI streams them: the call, then its arguments
                    head = {"index": k, "id": f"{asked.call_id}-{index}-{k}", "type": "function",
                            "function": {"name": call.name, "arguments": ""}}
                    yield False, frame({"index": index, "delta": {"tool_calls": [head]}, "logprobs": None,
                                        "finish_reason": None})
                    for piece in pieces(call.arguments):
                        delta: dict[str, Any] = {"tool_calls": [{"index": k, "function": {"arguments": piece}}]}
                        yield True, frame({"index": index, "delta": delta, "logprobs": None, "finish_reason": None})
                        position += 1
                for token in ([] if reply.calls else reply.tokens):
                    logprobs = None if top is None else {"content": token_logprobs([token], position, top),
                                                         "refusal": None}
                    yield True, frame({"index": index, "delta": {"content": token}, "logprobs": logprobs,
                                       "finish_reason": None})
                    position += 1
                end = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reply.finish_reason,
                       **_said(reply)}
            else:
                offset = 0
                if reply.echo:
                    yield False, frame({"text": reply.echo, "index": index, "logprobs": None, "finish_reason": None})
                    offset = len(reply.echo)
                for position, token in enumerate(reply.tokens):
                    legacy = None if top is None else legacy_logprobs([token], position, offset, top)
                    yield True, frame({"text": token, "index": index, "logprobs": legacy, "finish_reason": None})
                    offset += len(token)
                end = {"text": "", "index": index, "logprobs": None, "finish_reason": reply.finish_reason,
                       **_said(reply)}
            yield False, frame(end)
        if usage is not None:
            yield False, {**base, "choices": [], "usage": usage}

    # -- rerank, tokenize, detokenize (llama.cpp's shapes) --------------------

    def _tokens(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/v1/rerank":
            if self.opts.role != "rerank":  # as llama.cpp answers a server started without --reranking
                raise OpenAIError(501, "not_supported_error", "This server does not support reranking. Start it "
                                                              "with `--reranking`")
            self.reranked += 1
            return sim_tokens.rerank(body, self.opts.model)
        if path == "/tokenize":
            content = body.get("content")
            if not isinstance(content, str):
                raise OpenAIError(400, "invalid_request_error", "\"content\" must be a string", param="content")
            return {"tokens": self.vocabulary.tokenize(content, body.get("add_special") is True)}
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise OpenAIError(400, "invalid_request_error", "\"tokens\" must be an array of integers", param="tokens")
        return {"content": self.vocabulary.detokenize(ids)}

    # -- embeddings -----------------------------------------------------------

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.opts.role != "embedding":
            words = f"model {self.opts.model} has role {self.opts.role}; embeddings need an embedding model"
            raise OpenAIError(400, "unsupported_endpoint", words, param="model")
        texts = check_input(body)
        check_optional(body, "model", str)
        dim = check_optional(body, "dimensions", int)
        if dim is None:
            dim = self.opts.embedding_dim
        elif not 0 < dim <= _MAX_EMBEDDING_DIM:
            raise OpenAIError(400, None, f"dimensions must be in 1..{_MAX_EMBEDDING_DIM}", param="dimensions")
        encoding = check_optional(body, "encoding_format", str) or "float"
        if encoding not in ("float", "base64"):
            raise OpenAIError(400, None, "encoding_format must be 'float' or 'base64'", param="encoding_format")
        data = []
        for index, text in enumerate(texts):
            vector = embed(text, dim)
            value: list[float] | str = vector
            if encoding == "base64":
                # What OpenAI SDKs ask for by default: little-endian float32.
                value = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": value})
        tokens = sum(count_words(t) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": self.opts.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }



def _said(reply: _Reply) -> dict[str, Any]:
    return {"stop_reason": reply.stop_reason} if reply.stop_reason is not None else {}
