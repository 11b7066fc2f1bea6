"""Each engine's allowlisted tunables (`ENGINE_ARGS`), read the same way by the control plane (a definition's
args are checked against it when given) and by each engine process (its command line): `parse_engine_args`,
the canonical tokens back (`engine_tokens`), and an engine process's parser and `--help`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.domain.model import ROLES
from llmgw.engines.base import EngineArg, EngineError

_POOLING = ("none", "mean", "cls", "last", "rank")
# vLLM's tool-call parsers (its docs' list); `--tool-parser-plugin`, which imports code, is not offered.
_TOOL_PARSERS = ("deepseek_v3", "deepseek_v31", "glm45", "granite", "granite-20b-fc", "hermes", "internlm", "jamba",
                 "kimi_k2", "llama3_json", "llama4_json", "llama4_pythonic", "minimax", "mistral", "openai",
                 "phi4_mini_json", "pythonic", "qwen3_coder", "xlam")

# The one table of engine tunables, also the allowlist docs/engines.md shows: `launch_spec` checks a
# definition's args against it, and each engine process parses its own with it (`parse_engine_args`),
# so the two never disagree. What llmgw sets itself (host, port, model, devices, parallelism) is not
# in it; nor is anything that runs code from the model's files (vLLM's --trust-remote-code).
ENGINE_ARGS: dict[str, dict[str, EngineArg]] = {
    "sim": {
        "--tokens-per-s": EngineArg(float, "generation speed; 0 answers at once"),
        "--startup-delay": EngineArg(float, "seconds to wait before listening (a slow model load)"),
        "--fail-start": EngineArg(bool, "exit with an error instead of serving (failure injection)"),
        "--exit-after": EngineArg(float, "serve for this many seconds, then exit with an error (a flapping engine: "
                                         "failure injection); 0 (default) serves until stopped"),
        "--embedding-dim": EngineArg(int, "length of the vectors an embedding model returns (default 16)"),
        "--prefill-tokens-per-s": EngineArg(float, "prompt reading speed before the first token, past the prefix "
                                                   "cache's hits; 0 (default) reads at once"),
        "--prefix-cache-blocks": EngineArg(int, "blocks of 16 words the prefix cache keeps (default 4096), with "
                                                "--prefill-tokens-per-s"),
        "--lora-lie": EngineArg(bool, "a LoRA adapter load answers 200 and loads nothing (failure injection)"),
        "--wake-delay": EngineArg(float, "seconds a `POST /wake_up` takes after `POST /sleep` (fast wake: vLLM's "
                                         "sleep mode, modelled); 0 (default) wakes at once"),
    },
    "llama.cpp": {
        "--ctx-size": EngineArg(int, "context length (default 2048 on CPU; llama.cpp's choice with llama-server)"),
        "--threads": EngineArg(int, "CPU threads (default: llama.cpp's choice)"),
        "--parallel": EngineArg(int, "concurrent sequences (default: llama.cpp's choice)"),
        "--n-gpu-layers": EngineArg(int, "layers on the GPUs (default: all of them when given GPUs)"),
        "--embedding": EngineArg(bool, "serve /v1/embeddings (implied by role embedding)"),
        "--pooling": EngineArg(str, "how token vectors become one embedding", _POOLING),
    },
    "vllm": {
        "--max-model-len": EngineArg(int, "context length (default: the model's)"),
        "--gpu-memory-utilization": EngineArg(float, "share of each GPU's memory vLLM may take (0..1, default 0.9)",
                                              maximum=1.0),
        "--max-num-seqs": EngineArg(int, "concurrent sequences"),
        "--max-num-batched-tokens": EngineArg(int, "tokens in one scheduler step"),
        "--enable-auto-tool-choice": EngineArg(bool, "the model may call tools with tool_choice auto (needs "
                                                     "--tool-call-parser)"),
        "--tool-call-parser": EngineArg(str, "how vLLM reads the model's tool calls (its model family's)",
                                        _TOOL_PARSERS),
        "--dtype": EngineArg(str, "weights and activations type", ("auto", "half", "float16", "bfloat16", "float",
                                                                  "float32")),
        "--kv-cache-dtype": EngineArg(str, "KV cache type", ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
        "--enforce-eager": EngineArg(bool, "no CUDA graphs (less memory, slower)"),
        "--enable-prefix-caching": EngineArg(bool, "reuse the KV cache of shared prompt prefixes"),
        "--enable-lora": EngineArg(bool, "serve LoRA adapters (models with `base`), loaded at run time"),
        "--max-loras": EngineArg(int, "LoRA adapters in one batch, with --enable-lora"),
        "--max-lora-rank": EngineArg(int, "the largest adapter rank, with --enable-lora"),
    },
}


def parse_engine_args(engine: str, args: Sequence[str]) -> dict[str, Any]:
    """An engine's tunables from `--flag VALUE`, `--flag=VALUE` and `--switch` tokens, checked
    against `ENGINE_ARGS`: {"ctx_size": 4096, ...}. Raises EngineError("bad_args") naming every problem."""
    values, problems = _read_args(engine, args)
    if problems:
        raise EngineError("bad_args", "; ".join(problems))
    return values


def engine_args_problems(engine: str, args: Sequence[str]) -> list[str]:
    """Every problem of `args` for `engine`, in words (none: they pass); the control plane checks a definition
    with it, so what an engine process would refuse is refused before anything is stored."""
    return _read_args(engine, args)[1]


def _read_args(engine: str, args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    allowed = ENGINE_ARGS[engine]
    values: dict[str, Any] = {}  # typed by the table: int, float, str or True
    problems: list[str] = []
    unknown: list[str] = []
    tokens = list(args)
    i = 0
    while i < len(tokens):
        arg = tokens[i]
        i += 1
        if not isinstance(arg, str):
            problems.append(f"engine argument {arg!r} is not a string")
            continue
        flag, eq, value = arg.partition("=")
        spec = allowed.get(flag)
        if spec is None:
            unknown.append(flag)
            following = tokens[i] if i < len(tokens) else None
            if not eq and flag.startswith("-") and isinstance(following, str) and not following.startswith("-"):
                i += 1  # its value (`--host 0.0.0.0`): not a problem of its own
            continue
        dest = flag.lstrip("-").replace("-", "_")
        if spec.kind is bool:
            if eq:
                problems.append(f"engine argument {flag} takes no value")
            else:
                values[dest] = True
            continue
        raw: str | None = value
        if not eq:
            raw = tokens[i] if i < len(tokens) else None
            i += 1
        if raw is None:
            problems.append(f"engine argument {flag} needs a value")
        elif spec.kind is str:
            if raw in spec.choices:
                values[dest] = raw
            else:
                problems.append(f"engine argument {flag} is one of {', '.join(spec.choices)}, not {raw!r}")
        else:
            try:
                values[dest] = _number(flag, spec, raw)
            except EngineError as e:
                problems.append(e.message)
    if unknown:
        known = ", ".join(sorted(allowed))
        problems.insert(0, f"engine {engine} does not accept {', '.join(map(repr, unknown))} (accepted: {known})")
    return values, problems


def _number(flag: str, spec: EngineArg, raw: str) -> int | float:
    if spec.kind is int:
        # Plain ASCII digits only: int() would also take "+2", " 2" and "٣". A length cap keeps
        # int() from refusing thousands of digits with an error of its own.
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or int(raw) < 1:
            raise EngineError("bad_args", f"engine argument {flag} needs a whole number >= 1, got {raw!r}")
        return int(raw)
    try:
        number = float(raw)
    except ValueError:
        raise EngineError("bad_args", f"engine argument {flag} needs a number, got {raw!r}") from None
    if not number >= 0:  # also refuses NaN
        raise EngineError("bad_args", f"engine argument {flag} must be a number >= 0, got {raw!r}")
    if spec.maximum is not None and not number <= spec.maximum:
        raise EngineError("bad_args", f"engine argument {flag} must be at most {spec.maximum:g}, got {raw!r}")
    return number


def engine_tokens(engine: str, values: Mapping[str, Any]) -> list[str]:
    """Checked tunables back into one canonical form (`--flag VALUE`, `--switch`) for an engine
    binary, whatever form the definition used (`--flag=VALUE` is not every parser's)."""
    flags = {flag.lstrip("-").replace("-", "_"): flag for flag in ENGINE_ARGS[engine]}
    tokens: list[str] = []
    for dest, value in values.items():
        tokens += [flags[dest]] if value is True else [flags[dest], str(value)]
    return tokens


def engine_args_help(engine: str) -> str:
    """The tunables of `engine`, one per line, for an engine process's `--help`."""
    lines = ["engine tunables (also what a model definition's args may hold):"]
    for flag, spec in ENGINE_ARGS[engine].items():
        shape = " {" + ",".join(spec.choices) + "}" if spec.kind is str else {int: " N", float: " NUMBER"}.get(
            spec.kind, "")
        usage = flag + shape
        # argparse's own layout: a long usage puts its words on the next line.
        lines += [f"  {usage:<22}  {spec.help}"] if len(usage) <= 22 else [f"  {usage}", f"{'':24}{spec.help}"]
    return "\n".join(lines)


def engine_parser(engine: str, *, prog: str, description: str, role_help: str) -> argparse.ArgumentParser:
    """An engine process's command line: where to listen and what to answer as; its
    tunables (`ENGINE_ARGS[engine]`) are left over for `parse_engine_args`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=engine_args_help(engine),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # a shortened flag must not pass for one of these
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", required=True, type=int, help="port to listen on")
    parser.add_argument("--model", required=True, help="the model name it answers as")
    parser.add_argument("--role", default="chat", choices=ROLES, help=role_help)
    return parser
