"""Storage observation: the directories an agent is told to look in (`--storage PATH:FABRIC[:shared]`)
and the weights it finds there. Owns `StorageDir`, `parse_storage_flag`, `StorageScanner`, the reports.

What counts as weights is decided from headers alone (`llmgw.weights`): a
GGUF whose size covers its tensor data, a safetensors directory whose shards
are all present and complete. Anything else that looks like weights (a
partial download, an empty directory, an index naming a missing shard) is
reported under `not_weights` with why. A rescan re-reads no file whose (path,
size, mtime_ns, inode) is unchanged. `scan()` does blocking file I/O: the
agent runs it in a worker thread. It never raises: a directory that cannot be
read, or vanishes mid-scan, is that report's `error`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from llmgw.weights import WeightsError
from llmgw.weights.gguf import check_gguf
from llmgw.weights.safetensors import INDEX_NAME, SINGLE_NAME, ShardInfo, check_index, read_index, read_shard

__all__ = [
    "MAX_DEPTH", "ModelSeen", "NotWeights", "StorageDir", "StorageReport", "StorageScanner",
    "parse_storage_flag", "parse_storage_flags",
]

logger = logging.getLogger("llmgw.agent.storage")

MAX_DEPTH = 8  # a Hugging Face cache puts weights three levels down; eight is plenty
MAX_NOT_WEIGHTS = 200  # per directory: the inventory travels on every change
MAX_CONFIG_BYTES = 1 << 20
# The facts each model entry may carry for the memory estimate (llmgw/domain/memory.py reads them).
FACTS = ("layers", "context_length", "embedding_length", "head_count", "head_count_kv", "key_length",
         "value_length", "tensor_bytes", "dtype")
# config.json (Hugging Face) key -> our fact; text_config for the multimodal ones that nest it.
_CONFIG_FACTS = {"num_hidden_layers": "layers", "max_position_embeddings": "context_length",
                 "hidden_size": "embedding_length", "num_attention_heads": "head_count",
                 "num_key_value_heads": "head_count_kv", "head_dim": "key_length"}
PARTIAL_SUFFIXES = (".part", ".partial", ".incomplete", ".tmp", ".crdownload", ".download", ".aria2")
_FABRIC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_SHARD = re.compile(r"-(?P<no>\d{5})-of-(?P<count>\d{5})\.safetensors$")
T = TypeVar("T")


@dataclass(frozen=True)
class StorageDir:
    """A directory to look in, on `fabric`; `shared` as the operator said (never guessed)."""

    path: Path
    fabric: str
    shared: bool = False

    def __str__(self) -> str:
        return f"{self.path}:{self.fabric}" + (":shared" if self.shared else "")


def parse_storage_flag(text: str) -> StorageDir:
    """`PATH:FABRIC[:shared]` (`:local`, the default, may be said too); ValueError with why."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--storage {text!r}: expected PATH:FABRIC or PATH:FABRIC:shared (a path cannot hold ':')")
    raw, fabric = parts[0], parts[1]
    suffix = parts[2] if len(parts) == 3 else "local"
    if suffix not in ("shared", "local"):
        raise ValueError(f"--storage {text!r}: unknown suffix {suffix!r}; expected 'shared' or nothing")
    if not raw or not os.path.isabs(raw):
        raise ValueError(f"--storage {text!r}: the path must be absolute, got {raw!r}")
    if not fabric:
        raise ValueError(f"--storage {text!r}: the fabric is empty (name the network the storage is on)")
    if not _FABRIC.match(fabric):
        raise ValueError(f"--storage {text!r}: fabric {fabric!r} may hold only letters, digits, '.', '_' and '-'")
    return StorageDir(Path(os.path.normpath(raw)), fabric, suffix == "shared")


def parse_storage_flags(values: Iterable[str]) -> tuple[StorageDir, ...]:
    """Each `--storage` value; the same directory twice, or one inside another, is refused
    (its models would be reported twice)."""
    dirs = tuple(parse_storage_flag(v) for v in values)
    for i, a in enumerate(dirs):
        for b in dirs[i + 1:]:
            if a.path == b.path or a.path in b.path.parents or b.path in a.path.parents:
                raise ValueError(f"--storage {a} and {b}: one directory is inside the other")
    return dirs


@dataclass(frozen=True)
class ModelSeen:
    """Weights found: a GGUF file or a safetensors directory. None is unknown, never zero."""

    name: str
    path: str
    kind: str  # "gguf" | "safetensors"
    size: int
    architecture: str | None = None
    quantization: str | None = None
    parameters: int | None = None
    note: str = ""
    # What a memory estimate needs, under one set of names for GGUF and safetensors (`FACTS`);
    # a fact the files do not say is absent.
    facts: tuple[tuple[str, int | str], ...] = ()

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "path": self.path, "kind": self.kind, "size": self.size}
        for key in ("architecture", "quantization", "parameters"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        if self.note:
            doc["note"] = self.note
        return doc | dict(self.facts)

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> ModelSeen:
        return cls(name=str(d["name"]), path=str(d["path"]), kind=str(d["kind"]), size=int(d["size"]),
                   architecture=d.get("architecture"), quantization=d.get("quantization"),
                   parameters=d.get("parameters"), note=str(d.get("note", "")),
                   facts=tuple((k, d[k]) for k in FACTS if k in d))


@dataclass(frozen=True)
class NotWeights:
    path: str
    reason: str


@dataclass(frozen=True)
class StorageReport:
    """One configured directory's report. `omitted`: `not_weights` entries left out past
    `MAX_NOT_WEIGHTS`."""

    path: str
    fabric: str
    shared: bool
    models: tuple[ModelSeen, ...] = ()
    not_weights: tuple[NotWeights, ...] = ()
    error: str = ""
    omitted: int = 0

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "path": self.path, "fabric": self.fabric, "shared": self.shared,
            "models": [m.to_doc() for m in self.models],
            "not_weights": [{"path": n.path, "reason": n.reason} for n in self.not_weights],
            "error": self.error,
        }
        if self.omitted:
            doc["omitted"] = self.omitted
        return doc

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> StorageReport:
        return cls(
            path=str(d["path"]), fabric=str(d["fabric"]), shared=bool(d["shared"]),
            models=tuple(ModelSeen.from_doc(m) for m in d.get("models", ())),
            not_weights=tuple(NotWeights(str(n["path"]), str(n["reason"])) for n in d.get("not_weights", ())),
            error=str(d.get("error", "")), omitted=int(d.get("omitted", 0)),
        )


class _RootGone(Exception):
    pass


@dataclass(frozen=True)
class _Refused:
    """A remembered verdict: this file is not weights, for `reason`."""

    reason: str


@dataclass
class _Found:
    """What one directory's walk collects."""

    root: StorageDir
    real_root: str
    models: list[ModelSeen] = field(default_factory=list)
    not_weights: list[NotWeights] = field(default_factory=list)
    visited: set[tuple[int, int]] = field(default_factory=set)

    def refuse(self, path: str | Path, reason: str) -> None:
        self.not_weights.append(NotWeights(str(path), reason))


class StorageScanner:
    """Scans its directories on each `scan()`; `reads` counts files opened, so a test sees a
    rescan of unchanged files read none. `on_entry` (tests only) runs before each directory
    entry is looked at, which lets a test remove a directory mid-scan."""

    def __init__(self, dirs: Iterable[StorageDir], *, max_depth: int = MAX_DEPTH,
                 on_entry: Callable[[Path], None] | None = None) -> None:
        self.dirs = tuple(dirs)
        self.max_depth = max_depth
        self.reads = 0
        self._on_entry = on_entry
        self._cache: dict[tuple[str, str, int, int, int], Any] = {}
        self._next: dict[tuple[str, str, int, int, int], Any] = {}

    def scan(self) -> tuple[dict[str, Any], ...]:
        """One plain report per configured directory (`NodeInfo.storage`); () when told nothing."""
        return tuple(r.to_doc() for r in self.scan_reports())

    def scan_reports(self) -> tuple[StorageReport, ...]:
        self._next = {}
        reports = tuple(self._scan_root(d) for d in self.dirs)
        self._cache = self._next  # forget what is gone
        return reports

    def describe(self, paths: Iterable[str]) -> dict[str, dict[str, Any]]:
        """What a storage report would say of each of `paths` (a GGUF file, or a safetensors model
        directory), by path; a path that is neither, or cannot be read, is left out. Files read
        before and unchanged are not read again; what is not asked for again is forgotten."""
        self._next = {}
        out: dict[str, dict[str, Any]] = {}
        for path in paths:
            try:
                seen = self._one(Path(path))
            except (OSError, WeightsError):
                seen = None
            if seen is not None:
                out[path] = seen.to_doc()
        self._cache = self._next
        return out

    def _one(self, path: Path) -> ModelSeen | None:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and path.name.endswith(".safetensors"):  # a file of a model directory
            path, st = path.parent, os.stat(path.parent)
        if stat.S_ISREG(st.st_mode) and path.name.lower().endswith(".gguf"):
            seen = self._gguf(path, st)
            return None if isinstance(seen, str) else seen
        if not stat.S_ISDIR(st.st_mode):
            return None
        found = _Found(StorageDir(path, ""), os.path.realpath(path), visited=set())
        self._safetensors_dir(path, {e.name for e in os.scandir(path)}, found)
        return found.models[0] if found.models else None

    # --- one configured directory -------------------------------------------------------

    def _scan_root(self, root: StorageDir) -> StorageReport:
        base = StorageReport(str(root.path), root.fabric, root.shared)
        try:
            st = os.stat(root.path)
            if not stat.S_ISDIR(st.st_mode):
                return _with(base, error=f"{root.path} is not a directory")
            found = _Found(root, os.path.realpath(root.path), visited={(st.st_dev, st.st_ino)})
            self._walk(root.path, 0, found)
            if not os.path.isdir(root.path):
                raise _RootGone
        except _RootGone:
            return _with(base, error=f"{root.path} vanished during the scan")
        except OSError as error:
            return _with(base, error=f"cannot read {root.path}: {error.strerror or error}")
        except Exception as error:  # a bug must cost one report, never the agent
            logger.exception("storage scan of %s failed", root.path)
            return _with(base, error=f"scan of {root.path} failed: {error!r}")
        models = tuple(sorted(found.models, key=lambda m: m.path))
        refused = sorted(found.not_weights, key=lambda n: n.path)
        return StorageReport(
            str(root.path), root.fabric, root.shared, models, tuple(refused[:MAX_NOT_WEIGHTS]),
            omitted=max(0, len(refused) - MAX_NOT_WEIGHTS),
        )

    def _walk(self, d: Path, depth: int, found: _Found) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except FileNotFoundError:
            if depth == 0:
                raise _RootGone from None
            found.refuse(d, "vanished during the scan")
            return
        except OSError as error:
            if depth == 0:
                raise
            found.refuse(d, f"cannot read: {error.strerror or error}")
            return
        names = {e.name for e in entries}
        visible = [e for e in entries if not e.name.startswith(".")]  # caches, VCS, hidden temp files
        if INDEX_NAME in names or any(n.endswith(".safetensors") for n in names):
            self._safetensors_dir(d, names, found)
            # The rest of a model directory (a GGUF beside, subfolders) is still looked at.
            visible = [e for e in visible if not _safetensors_part(e.name)]
        elif not visible:
            found.refuse(d, "empty directory")
            return
        splits: dict[str, dict[int, tuple[int, ModelSeen | str]]] = {}
        for entry in visible:
            if self._on_entry is not None:
                self._on_entry(Path(entry.path))
            self._entry(Path(entry.path), entry.is_symlink(), depth, found, splits)
        for stem, parts in splits.items():
            self._split_gguf(d, stem, parts, found)

    def _entry(self, path: Path, is_link: bool, depth: int, found: _Found,
               splits: dict[str, dict[int, tuple[int, ModelSeen | str]]]) -> None:
        if is_link:
            target = os.path.realpath(path)
            if os.path.commonpath([found.real_root, target]) != found.real_root:
                found.refuse(path, f"symlink to {target}, outside {found.root.path}: not followed")
                return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            found.refuse(path, "broken symlink" if is_link else "vanished during the scan")
            return
        except OSError as error:
            found.refuse(path, f"cannot read: {error.strerror or error}")
            return
        if stat.S_ISDIR(st.st_mode):
            if is_link or (st.st_dev, st.st_ino) in found.visited:
                return  # inside the root: walked under its own path (a bind mount loop: once)
            found.visited.add((st.st_dev, st.st_ino))
            if depth + 1 > self.max_depth:
                found.refuse(path, f"deeper than {self.max_depth} levels below {found.root.path}: not scanned")
            else:
                self._walk(path, depth + 1, found)
            return
        if not stat.S_ISREG(st.st_mode):
            return
        lower = path.name.lower()
        if lower.endswith(PARTIAL_SUFFIXES):
            found.refuse(path, f"partial download ({path.suffix} file)")
        elif lower.endswith(".gguf"):
            seen = self._gguf(path, st)
            split = _SPLIT_GGUF.match(path.name)
            if split and int(split["count"]) > 1:
                splits.setdefault(split["stem"], {})[int(split["no"])] = (int(split["count"]), seen)
            elif isinstance(seen, str):
                found.refuse(path, seen)
            else:
                found.models.append(seen)

    # --- GGUF ---------------------------------------------------------------------------

    def _gguf(self, path: Path, st: os.stat_result) -> ModelSeen | str:
        def check(p: Path) -> ModelSeen:
            info = check_gguf(p)
            return ModelSeen(
                name=p.name[:-5], path=str(p), kind="gguf", size=st.st_size, architecture=info.architecture,
                quantization=info.quantization, parameters=info.parameter_count, note=info.size_note,
                facts=tuple(info.memory_facts().items()),
            )
        result = self._cached("gguf", path, st, check)
        return result.reason if isinstance(result, _Refused) else result

    def _split_gguf(self, d: Path, stem: str, parts: dict[int, tuple[int, ModelSeen | str]], found: _Found) -> None:
        """A GGUF split into `-0000N-of-0000M` files: weights when every part is there and complete."""
        count = max(c for c, _ in parts.values())
        first = d / f"{stem}-00001-of-{count:05d}.gguf"
        missing = [n for n in range(1, count + 1) if n not in parts]
        bad = [(n, seen) for n, (_, seen) in sorted(parts.items()) if isinstance(seen, str)]
        if missing:
            found.refuse(first, f"split GGUF: part {missing[0]} of {count} is not there")
        elif bad:
            found.refuse(first, f"split GGUF: part {bad[0][0]} of {count}: {bad[0][1]}")
        else:
            seen = [s for _, s in parts.values() if isinstance(s, ModelSeen)]
            head = next(s for n, (_, s) in parts.items() if n == 1 and isinstance(s, ModelSeen))
            found.models.append(ModelSeen(
                name=stem, path=str(first), kind="gguf", size=sum(s.size for s in seen),
                architecture=head.architecture, quantization=head.quantization,
                parameters=sum(s.parameters or 0 for s in seen), note=head.note,
                facts=_split_facts(head, seen),
            ))

    # --- safetensors --------------------------------------------------------------------

    def _safetensors_dir(self, d: Path, names: set[str], found: _Found) -> None:
        partial = sorted(n for n in names if n.lower().endswith(PARTIAL_SUFFIXES))
        if partial:
            found.refuse(d, f"partial download: {partial[0]} is still there")
            return
        pending = _hf_incomplete(d)
        if pending:
            found.refuse(d, f"download in progress: {pending}")
            return
        try:
            if INDEX_NAME in names:
                weight_map = self._cached_or_raise("index", d / INDEX_NAME, read_index)
                wanted = sorted(set(weight_map.values()))
            elif SINGLE_NAME in names:
                wanted = [SINGLE_NAME]
            else:
                wanted = sorted(n for n in names if n.endswith(".safetensors"))
                for name in wanted:
                    shard = _SHARD.search(name)
                    if shard and len(wanted) != int(shard["count"]):
                        raise WeightsError(f"{len(wanted)} of {int(shard['count'])} shards and no {INDEX_NAME}")
            shards = {n: self._cached_or_raise("shard", d / n, read_shard) for n in wanted if n in names}
            if INDEX_NAME in names:
                check_index(d, weight_map, shards)
        except WeightsError as error:
            found.refuse(d, error.reason)
            return
        architecture, facts = self._config(d, names)
        found.models.append(ModelSeen(
            name=_model_name(d), path=str(d), kind="safetensors", size=sum(s.size for s in shards.values()),
            architecture=architecture, parameters=sum(s.parameters for s in shards.values()), facts=facts,
        ))

    def _config(self, d: Path, names: set[str]) -> tuple[str | None, tuple[tuple[str, int | str], ...]]:
        """The architecture and the memory facts `config.json` beside the shards says, if any."""
        if "config.json" not in names:
            return None, ()
        try:
            result: tuple[str | None, tuple[tuple[str, int | str], ...]] = self._cached_or_raise(
                "config", d / "config.json", _read_config)
            return result
        except WeightsError:
            return None, ()

    # --- the cache ----------------------------------------------------------------------

    def _cached_or_raise(self, kind: str, path: Path, read: Callable[[Path], T]) -> T:
        try:
            st = os.stat(path)
        except OSError as error:
            raise WeightsError(f"cannot read {path}: {error.strerror or error}", transient=True) from None
        result = self._cached(kind, path, st, read)
        if isinstance(result, _Refused):
            raise WeightsError(result.reason)
        return result

    def _cached(self, kind: str, path: Path, st: os.stat_result, read: Callable[[Path], T]) -> T | _Refused:
        """`read(path)`, or the verdict remembered for this very file (same size, mtime, inode):
        a value, or the reason it is not weights."""
        key = (kind, str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if key in self._cache:
            self._next[key] = self._cache[key]
            return self._next[key]  # type: ignore[no-any-return]
        self.reads += 1
        try:
            result: T | _Refused = read(path)
        except WeightsError as error:
            if error.transient:
                return _Refused(error.reason)
            result = _Refused(error.reason)
        self._next[key] = result
        return result


def _safetensors_part(name: str) -> bool:
    """A file the safetensors verdict on its directory already covers."""
    lower = name.lower()
    return lower.endswith(PARTIAL_SUFFIXES) or lower.endswith(".safetensors") or name == INDEX_NAME


def _with(report: StorageReport, *, error: str) -> StorageReport:
    return StorageReport(report.path, report.fabric, report.shared, error=error)


def _hf_incomplete(d: Path) -> str:
    """`huggingface-cli download --local-dir` keeps unfinished files under .cache/huggingface/download."""
    pending = d / ".cache" / "huggingface" / "download"
    if not pending.is_dir():
        return ""
    for dirpath, _dirs, files in os.walk(pending):
        for name in files:
            if name.endswith(".incomplete"):
                return os.path.relpath(os.path.join(dirpath, name), d)
    return ""


def _model_name(d: Path) -> str:
    """The directory's name; in a Hugging Face cache (models--org--name/snapshots/REV) the repo id."""
    if d.parent.name == "snapshots" and d.parent.parent.name.startswith("models--"):
        return d.parent.parent.name[len("models--"):].replace("--", "/")
    return d.name


def _split_facts(head: ModelSeen, parts: list[ModelSeen]) -> tuple[tuple[str, int | str], ...]:
    """The first part's facts (it holds the metadata), with the tensor bytes of all parts."""
    facts = dict(head.facts)
    sizes = [dict(p.facts).get("tensor_bytes") for p in parts]
    facts.pop("tensor_bytes", None)
    if all(isinstance(n, int) for n in sizes):
        facts["tensor_bytes"] = sum(n for n in sizes if isinstance(n, int))
    return tuple(facts.items())


def _read_config(path: Path) -> tuple[str | None, tuple[tuple[str, int | str], ...]]:
    """(architecture, memory facts) from a config.json read no further than `MAX_CONFIG_BYTES`;
    one that is not JSON says nothing."""
    try:
        with path.open("rb") as f:
            doc = json.loads(f.read(MAX_CONFIG_BYTES + 1)[:MAX_CONFIG_BYTES])
    except OSError as error:
        raise WeightsError(f"cannot read {path}: {error.strerror or error}", transient=True) from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, ()
    if not isinstance(doc, dict):
        return None, ()
    archs = doc.get("architectures")
    model_type = doc.get("model_type")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else (
        model_type if isinstance(model_type, str) else None)
    text = doc.get("text_config")
    sources = [text, doc] if isinstance(text, dict) else [doc]  # the language model's own config first
    facts: dict[str, int | str] = {}
    for src in sources:
        for key, fact in _CONFIG_FACTS.items():
            value = src.get(key)
            if fact not in facts and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                facts[fact] = value
        dtype = src.get("torch_dtype", src.get("dtype"))
        if "dtype" not in facts and isinstance(dtype, str) and dtype.isidentifier() and len(dtype) <= 32:
            facts["dtype"] = dtype
    if "key_length" in facts:
        facts["value_length"] = facts["key_length"]
    return arch, tuple(facts.items())
