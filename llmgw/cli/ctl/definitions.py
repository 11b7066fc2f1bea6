"""Model definitions as ctl reads them, from a TOML file (`--file`) or from flags, into
the JSON documents the admin API validates; ctl checks only what the API cannot see."""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cyclopts import Parameter

from llmgw.cli.ctl.errors import UsageError

REQUIRED_FLAGS = ("--name", "--engine", "--source")


@Parameter(name="*")  # flattened: `--name`, `--engine`, ... on the command that takes it
@dataclass(frozen=True)
class ModelFlags:
    """What a model is, as flags: the ones `model serve` and `plan` both take (a command's
    docstring may say more of one, as `flags.name`)."""

    name: str | None = None
    """Model name (without --file)."""
    engine: str | None = None
    """sim, llama.cpp or vllm."""
    source: str | None = None
    """A path on storage, mirror://NAME, hf://ORG/REPO or sim://NAME."""
    role: str | None = None
    """chat, embedding, guard or rerank."""
    mode: str | None = None
    """always or on-demand."""
    base: str | None = None
    """Serve a LoRA adapter of this defined model: --source is the adapter file's absolute path; the engine
    and role are the base's (no --engine needed)."""

    def given(self) -> dict[str, str]:
        """The flags given, as a definition's fields."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def missing(self) -> list[str]:
        """The flags a definition from flags alone needs and that were not given."""
        values = (self.name, self.engine or self.base, self.source)  # an adapter takes its base's engine
        return [flag for flag, value in zip(REQUIRED_FLAGS, values, strict=True) if not value]


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
        return fallbacks_first(models), True
    if "name" in doc:
        return [doc], False
    raise UsageError(f"{path} has no [[models]] tables and is not a model table (no `name = ...`)")


def fallbacks_first(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The file's definitions in an order in which each comes after the fallbacks the file defines too (the API
    refuses a fallback not yet defined); otherwise in the file's order. Fallbacks that name each other keep
    it: the API names the one refused."""
    names = {d.get("name") for d in docs}
    ordered: list[dict[str, Any]] = []
    placed: set[Any] = set()
    rest = list(docs)
    while rest:
        ready = [d for d in rest if all(f in placed or f not in names for f in _names(d.get("fallbacks")))]
        if not ready:
            return ordered + rest
        ordered += ready
        placed.update(d.get("name") for d in ready)
        rest = [d for d in rest if all(d is not r for r in ready)]
    return ordered


def _names(value: Any) -> list[Any]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def definition_from_flags(
    flags: ModelFlags,
    *,
    min_: int | None = None,
    max_: int | None = None,
    gpus: int | None = None,
    cpu: bool = False,
    args: Sequence[str] | None = None,
    max_tokens: int | None = None,
    max_n: int | None = None,
    timeouts: dict[str, float | None] | None = None,
    fallbacks: Sequence[str] | None = None,
    aliases: Sequence[str] | None = None,
    slots: int | None = None,
    affinity: str | None = None,
    prefix_chars: int | None = None,
    schedules: Sequence[str] | None = None,
) -> dict[str, Any]:
    missing = flags.missing()
    if missing:
        raise UsageError(
            f"model serve needs --name, --engine and --source (missing: {', '.join(missing)}); "
            f"e.g. {example_serve(name=flags.name, engine=flags.engine, source=flags.source)}, or --file FILE"
        )
    doc: dict[str, Any] = flags.given()
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
    limits = {k: v for k, v in (("max_tokens", max_tokens), ("max_n", max_n), ("concurrency_per_replica", slots))
              if v is not None}
    if limits:
        doc["limits"] = limits  # checked by the API, as every other field
    waits = {k: v for k, v in (timeouts or {}).items() if v is not None}
    if waits:
        doc["timeouts"] = waits  # e.g. {"first_byte_s": 30}; the rest stay the gateway's defaults
    if fallbacks:
        doc["fallbacks"] = list(fallbacks)  # checked by the API against the catalog
    if aliases:
        doc["aliases"] = list(aliases)
    routing = {k: v for k, v in (("affinity", affinity), ("prefix_chars", prefix_chars)) if v is not None}
    if routing:
        doc["routing"] = routing  # the rest stay the defaults; the range is checked by the API
    if schedules:
        doc["schedules"] = [schedule_from_flag(text) for text in schedules]
    return doc


SCHEDULE_KEYS = ("start", "end", "duration_s", "min", "max")


def schedule_from_flag(text: str) -> dict[str, Any]:
    """One `--schedule` value, `start=CRON; end=CRON (or duration_s=SECONDS); min=N; max=N`, as a rule of the
    definition's `schedules`; the API checks the crons and the numbers (400 invalid_model), ctl only the shape."""
    rule: dict[str, Any] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in SCHEDULE_KEYS:
            raise UsageError(f"--schedule {text!r}: {part.strip()!r} is not KEY=VALUE with a key of "
                             f"{', '.join(SCHEDULE_KEYS)} (e.g. --schedule 'start=0 8 * * mon-fri; "
                             f"end=0 18 * * mon-fri; min=2; max=4')")
        if key in rule:
            raise UsageError(f"--schedule {text!r}: {key} is given twice")
        rule[key] = value if key in ("start", "end") else _number(value)
    return rule


def _number(text: str) -> Any:
    """An int or float from a flag's text; the text itself when it is neither (the API names what is wrong)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


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

