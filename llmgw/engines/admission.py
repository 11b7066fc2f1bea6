"""What a definition must be, beyond its own shape (`ModelDef.from_doc`), before the cluster stores it: its
args inside its engine's table (`ENGINE_ARGS`), a source scheme its engine opens, and a local path only inside
the directories the operator allowed for weights. Pure: the allowed directories come in as an argument.

Why here and not at launch only: a definition the engine would refuse was once stored (201), then failed
on every start until it was parked. The agent still checks at launch (`launch_spec`: its own storage
dirs, symlinks followed); this check is lexical, since the control plane does not see the agents' disks.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llmgw.engines.args import ENGINE_ARGS, engine_args_problems

# The sources each engine opens: `path` is an absolute path on the node; the rest are schemes. The sim reads
# no weights; llama.cpp and vLLM open a file or directory, one inside an installed package (`pkg://`), a
# mirror entry or a hub id (SPEC S1: "a hub id for installations that can reach one").
ENGINE_SOURCES: Mapping[str, tuple[str, ...]] = {
    "sim": ("sim://",),
    "llama.cpp": ("path", "pkg://", "mirror://", "hf://"),
    "vllm": ("path", "pkg://", "mirror://", "hf://"),
}
assert set(ENGINE_SOURCES) == set(ENGINE_ARGS)


def definition_problems(engine: Any, source: Any, args: Any, weights_dirs: Sequence[str]) -> list[tuple[str, str]]:
    """Every (field, words) that keeps a definition out; none: admitted. Fields whose type is wrong (the
    definition's own check names those) and an unknown engine are left alone here.

    `weights_dirs`: the directories a local path may lie in (the agents' storage dirs and the
    `models.weights_dirs` setting, see `allowed_weights_dirs`)."""
    if not isinstance(engine, str) or engine not in ENGINE_ARGS:
        return []
    problems: list[tuple[str, str]] = []
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        problems += [("args", words) for words in engine_args_problems(engine, args)]
    if isinstance(source, str):
        problem = _source_problem(engine, source, weights_dirs)
        if problem:
            problems.append(("source", problem))
    return problems


def adapter_source_problem(source: Any, weights_dirs: Sequence[str]) -> str | None:
    """A LoRA adapter's file (an absolute path, whatever its base's engine) only inside the dirs allowed for
    weights, as a checkpoint's. The place a `mirror://` adapter source is admitted once the mirror fetches
    adapters (the definition's own check refuses it until then)."""
    if isinstance(source, str) and source.startswith("/"):
        return _path_problem(source, weights_dirs)
    return None


def _source_problem(engine: str, source: str, weights_dirs: Sequence[str]) -> str | None:
    kinds = ENGINE_SOURCES[engine]
    if source.startswith("/"):
        if "path" not in kinds:
            return f"engine {engine} opens no local path (it takes {', '.join(_words(kinds))})"
        return _path_problem(source, weights_dirs)
    scheme, sep, _ = source.partition("://")
    if sep and f"{scheme}://" not in kinds:
        return f"engine {engine} cannot fetch {scheme}:// sources (it takes {', '.join(_words(kinds))})"
    return None  # anything else: the definition's own check says what is wrong with it


def _path_problem(source: str, weights_dirs: Sequence[str]) -> str | None:
    if not weights_dirs:
        return (f"{source} is a local path, and no directory is allowed for weights: no agent reports a storage "
                f"dir (llmgw agent --storage) and the setting models.weights_dirs is empty")
    path = _normal(source)
    for root in weights_dirs:
        base = _normal(root)
        if posixpath.commonpath([base, path]) == base:
            return None
    return (f"{source} is outside the directories allowed for weights ({', '.join(weights_dirs)}): put it in an "
            f"agent's storage dir (--storage) or add its directory to the setting models.weights_dirs")


def _normal(path: str) -> str:
    """`path` without `.`, repeated slashes or a trailing one (POSIX keeps a leading `//`: not here)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _words(kinds: Iterable[str]) -> list[str]:
    return ["an absolute path" if k == "path" else f"{k}..." for k in kinds]


def allowed_weights_dirs(storage_reports: Iterable[Mapping[str, Any]], setting: Iterable[Any]) -> list[str]:
    """The directories a definition's local path may lie in: every storage dir an agent reports (each
    report's `path`), then the setting's, each once, in that order."""
    found: list[str] = []
    for path in [*(r.get("path") for r in storage_reports), *setting]:
        if isinstance(path, str) and path.startswith("/") and path not in found:
            found.append(path)
    return found
