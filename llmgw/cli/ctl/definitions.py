"""Model definitions as ctl reads them, from a TOML file (`--file`) or from flags, into
the JSON documents the admin API validates; ctl checks only what the API cannot see."""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmgw.cli.ctl.errors import UsageError

REQUIRED_FLAGS = ("--name", "--engine", "--source")


def definitions_from_file(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(definitions, whether the file is a catalog): `[[models]]` tables, or one
    top-level model table."""
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not valid TOML: {e}") from None
    if "models" in doc:
        models = doc["models"]
        if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
            raise UsageError(f"{path}: `models` must be [[models]] tables")
        if not models:
            raise UsageError(f"{path} has an empty models list")
        return models, True
    if "name" in doc:
        return [doc], False
    raise UsageError(f"{path} has no [[models]] tables and is not a model table (no `name = ...`)")


def definition_from_flags(
    *,
    name: str | None,
    engine: str | None,
    source: str | None,
    role: str | None,
    mode: str | None,
    min_: int | None,
    max_: int | None,
    gpus: int | None,
    cpu: bool,
    args: Sequence[str] | None,
    max_tokens: int | None = None,
    max_n: int | None = None,
    timeouts: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    given = dict(zip(REQUIRED_FLAGS, (name, engine, source), strict=True))
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise UsageError(
            f"model serve needs --name, --engine and --source (missing: {', '.join(missing)}); "
            f"e.g. {example_serve(name=name, engine=engine, source=source)}, or --file FILE"
        )
    doc: dict[str, Any] = {"name": name, "engine": engine, "source": source}
    if role is not None:
        doc["role"] = role
    if mode is not None:
        doc["mode"] = mode
    replicas = {k: v for k, v in (("min", min_), ("max", max_)) if v is not None}
    if replicas:
        doc["replicas"] = replicas
    profile: dict[str, Any] = {}
    if gpus is not None:
        profile.update(gpus=gpus, tp=gpus)  # tensor-parallel across the replica's GPUs
    if cpu:
        profile["cpu"] = True
    if profile:
        doc["profile"] = profile
    if args:
        doc["args"] = list(args)
    limits = {k: v for k, v in (("max_tokens", max_tokens), ("max_n", max_n)) if v is not None}
    if limits:
        doc["limits"] = limits  # checked by the API, as every other field
    waits = {k: v for k, v in (timeouts or {}).items() if v is not None}
    if waits:
        doc["timeouts"] = waits  # e.g. {"first_byte_s": 30}; the rest stay the gateway's defaults
    return doc


def example_serve(*, name: str | None, engine: str | None, source: str | None) -> str:
    """A complete `model serve` command: what was given, and a plausible value for the rest."""
    name = name or "demo"
    if not engine:
        engine = "sim" if not source or source.startswith("sim://") else "llama.cpp"
    if not source:
        source = {"sim": f"sim://{name}", "llama.cpp": f"/models/{name}.gguf", "vllm": "hf://ORG/REPO"}.get(
            engine, "SOURCE"
        )
    values = (name, engine, source)
    quoted = " ".join(f"{flag} {shlex.quote(value)}" for flag, value in zip(REQUIRED_FLAGS, values, strict=True))
    return f"llmgw ctl model serve {quoted}"

