"""What the mirror accepts, read and validated from headers alone (docs/mirror.md, "What is validated").
Owns `inspect_file(path) -> FileFacts` (a GGUF or a single safetensors file, told apart by their first
bytes, never by the name) and `inspect_dir(path) -> CheckpointFacts` (a safetensors checkpoint directory).

Built on the header readers (llmgw/weights): every refusal is a `WeightsError` whose `reason` the
operator reads. Stricter than the storage scanner, because a file the mirror accepts is copied to
every node: a GGUF must end within its alignment's padding of the data its header describes (no
trailing bytes), and a tensor type or dtype this reader cannot size is refused, since the file's
bytes could not be checked against its header.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llmgw.weights import WeightsError
from llmgw.weights.gguf import MAGIC, GgufInfo, check_gguf_from
from llmgw.weights.safetensors import DTYPE_BITS, INDEX_NAME, ShardInfo, check_safetensors_dir, read_shard_from

__all__ = ["KINDS", "CheckpointFacts", "FileFacts", "WeightsError", "inspect_dir", "inspect_file", "inspect_open"]

KINDS = ("gguf", "safetensors")
# A Llama Guard model by its name: general.name "Llama Guard 3 1B", general.basename "Llama-Guard-3",
# files named Llama-Guard-3-1B.Q4_K_M.gguf or llama_guard_3_1b-q8_0.gguf.
GUARD_NAME = re.compile(r"llama[-_. ]?guard", re.IGNORECASE)
# ... or by its chat template, which builds Llama Guard's own prompt (llmgw/guard/prompt.py).
GUARD_TEMPLATE = "<BEGIN UNSAFE CONTENT CATEGORIES>"
# {arch}.pooling_type (llama.h's llama_pooling_type): "rank" is a reranker's head.
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
MAX_CONFIG_BYTES = 1 << 20  # a checkpoint's config.json (a few KiB)

_GGUF_KEYS = ("version", "architecture", "name", "quantization", "context_length", "general_type", "lora_adapter",
              "pooling", "split_part", "split_count", "memory")


@dataclass(frozen=True)
class FileFacts:
    """One file the mirror may hold, as its header describes it. Both kinds: `size` (bytes),
    `tensor_count`, `parameter_count` (from the tensors' shapes), `data_bytes` (the tensor data)
    and `llama_guard`. GGUF only: the rest but `dtypes`; `memory` is what a memory estimate needs
    (`GgufInfo.memory_facts`). safetensors only: `dtypes`. A fact the header lacks is None."""

    kind: str
    size: int
    tensor_count: int
    parameter_count: int
    data_bytes: int
    llama_guard: bool = False
    version: int | None = None
    architecture: str | None = None
    name: str | None = None  # general.name
    quantization: str | None = None  # general.file_type's name: Q4_K_M, F16 ...
    context_length: int | None = None
    general_type: str | None = None  # general.type: model, adapter, mmproj ...
    lora_adapter: bool = False
    pooling: str | None = None
    split_part: int | None = None  # a GGUF split in parts (llama-gguf-split): this one's number, from 1
    split_count: int | None = None
    memory: tuple[tuple[str, int], ...] = ()
    dtypes: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        """JSON-ready: the common facts and those of this kind."""
        doc: dict[str, Any] = {"kind": self.kind, "size": self.size, "tensor_count": self.tensor_count,
                               "parameter_count": self.parameter_count, "data_bytes": self.data_bytes,
                               "llama_guard": self.llama_guard}
        if self.kind == "gguf":
            doc |= {k: getattr(self, k) for k in _GGUF_KEYS}
            doc["memory"] = dict(self.memory)
        else:
            doc["dtypes"] = list(self.dtypes)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> FileFacts:
        """`to_doc` read back (`ValueError` when it is not one)."""
        try:
            kind = doc["kind"]
            if kind not in KINDS:
                raise ValueError(f"unknown kind {kind!r}")
            size, tensors, params, data = (int(doc[k]) for k in ("size", "tensor_count", "parameter_count",
                                                                 "data_bytes"))
            guard = bool(doc["llama_guard"])
            if kind == "safetensors":
                return cls(kind, size, tensors, params, data, guard, dtypes=tuple(str(d) for d in doc["dtypes"]))
            return cls(
                kind, size, tensors, params, data, guard, version=_int(doc.get("version")),
                architecture=_text(doc.get("architecture")), name=_text(doc.get("name")),
                quantization=_text(doc.get("quantization")), context_length=_int(doc.get("context_length")),
                general_type=_text(doc.get("general_type")), lora_adapter=bool(doc.get("lora_adapter")),
                pooling=_text(doc.get("pooling")), split_part=_int(doc.get("split_part")),
                split_count=_int(doc.get("split_count")),
                memory=tuple((str(k), int(v)) for k, v in dict(doc.get("memory") or {}).items()),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"not a file's facts: {error!r}") from None


@dataclass(frozen=True)
class CheckpointFacts:
    """A safetensors checkpoint directory: its shards (`files`: file name -> facts), their totals,
    whether an index maps them, and what its config.json says (None without one)."""

    files: tuple[tuple[str, FileFacts], ...]
    index: bool
    size: int
    tensor_count: int
    parameter_count: int
    data_bytes: int
    dtypes: tuple[str, ...]
    llama_guard: bool
    architecture: str | None = None  # config.json's architectures[0]
    model_type: str | None = None
    context_length: int | None = None  # max_position_embeddings

    def to_doc(self) -> dict[str, Any]:
        return {"kind": "safetensors-dir", "files": {name: f.to_doc() for name, f in self.files},
                "index": self.index, "size": self.size, "tensor_count": self.tensor_count,
                "parameter_count": self.parameter_count, "data_bytes": self.data_bytes, "dtypes": list(self.dtypes),
                "llama_guard": self.llama_guard, "architecture": self.architecture, "model_type": self.model_type,
                "context_length": self.context_length}


def inspect_file(path: str | os.PathLike[str], *, name: str | None = None) -> FileFacts:
    """The facts of the file at `path` once it is a complete GGUF or safetensors file whose bytes match
    its header; `WeightsError` with the reason otherwise. `name` (default: the file's own) is the name
    the operator gave it, used in reasons and to recognise a Llama Guard file."""
    p = Path(path)
    label = name or p.name
    if p.is_dir():
        raise WeightsError(f"{label} is a directory, not a file (a safetensors checkpoint directory is read whole)")
    try:
        if not stat.S_ISREG(p.stat().st_mode):  # before opening: a FIFO would block the open
            raise WeightsError(f"{label} is not a regular file")
        with p.open("rb", buffering=1 << 20) as f:
            return inspect_open(f, os.fstat(f.fileno()).st_size, label)
    except OSError as error:
        raise WeightsError(f"cannot read {p}: {error.strerror or error}", transient=True) from None


def inspect_open(f: BinaryIO, size: int, name: str) -> FileFacts:
    """`inspect_file` of an open file of `size` bytes positioned at 0, called `name`."""
    head = f.read(9)
    f.seek(0)
    if head[:4] == MAGIC:
        return _gguf_facts(check_gguf_from(f, size, name), size, name)
    if len(head) == 9 and head[8:9] == b"{":  # an 8-byte header length, then a JSON object
        return _shard_facts(read_shard_from(f, size, Path(name)), name)
    if not head:
        raise WeightsError(f"{name} is empty: neither a GGUF nor a safetensors file")
    raise WeightsError(f"{name} is neither a GGUF nor a safetensors file (it starts with {head[:8]!r})")


def _gguf_facts(info: GgufInfo, size: int, name: str) -> FileFacts:
    needed = info.expected_size
    if needed is None:
        unknown = [t for t in info.tensors if t.nbytes is None]
        raise WeightsError(f"GGUF {name}: tensor {unknown[0].name!r} has {unknown[0].type_name}, unknown to this "
                           f"llmgw, so its size cannot be checked against the file ({len(unknown)} such tensors)")
    if size > -(-needed // info.alignment) * info.alignment:  # more than the last tensor's padding
        raise WeightsError(f"GGUF {name} is {size} bytes but its header describes {needed} "
                           f"({size - needed} bytes after the tensor data: not the file its header describes)")
    meta = info.metadata
    general_type = _text(meta.get("general.type"))
    lora = general_type == "adapter"
    names = (info.name, _text(meta.get("general.basename")), _text(meta.get("general.finetune")), name)
    template = _text(meta.get("tokenizer.chat_template")) or ""
    guard = not lora and (any(n and GUARD_NAME.search(n) for n in names) or GUARD_TEMPLATE in template)
    pooling = meta.get(f"{info.architecture}.pooling_type")
    part, count = _int(meta.get("split.no")), _int(meta.get("split.count"))
    split = part is not None and count is not None and count > 1
    return FileFacts(
        kind="gguf", size=size, tensor_count=info.tensor_count, parameter_count=info.parameter_count,
        data_bytes=info.tensor_bytes or 0, llama_guard=guard, version=info.version, architecture=info.architecture,
        name=info.name, quantization=info.quantization, context_length=info.context_length,
        general_type=general_type, lora_adapter=lora,
        pooling=POOLING.get(pooling) if isinstance(pooling, int) and not isinstance(pooling, bool) else None,
        split_part=part + 1 if split and part is not None else None, split_count=count if split else None,
        memory=tuple(info.memory_facts().items()),
    )


def _shard_facts(shard: ShardInfo, name: str) -> FileFacts:
    unknown = sorted(d for d in shard.dtypes if d not in DTYPE_BITS)
    if unknown:
        raise WeightsError(f"safetensors {name}: dtype {', '.join(unknown)} is unknown to this llmgw, so its "
                           "tensors' sizes cannot be checked against the file")
    return FileFacts(kind="safetensors", size=shard.size, tensor_count=len(shard.tensors),
                     parameter_count=shard.parameters, data_bytes=shard.data_bytes,
                     llama_guard=bool(GUARD_NAME.search(name)), dtypes=tuple(sorted(shard.dtypes)))


def inspect_dir(path: str | os.PathLike[str], *, name: str | None = None) -> CheckpointFacts:
    """The facts of the safetensors checkpoint in directory `path`: its index (when it has one) names only
    shards that are there and complete, no tensor is in two shards, and config.json, when there, is a JSON
    object; `WeightsError` otherwise. Other files (tokenizer, generation config) are not looked at."""
    d = Path(path)
    label = name or d.name
    shards = check_safetensors_dir(d)
    files = tuple((s.path.name, _shard_facts(s, s.path.name)) for s in shards)
    config = _config(d / "config.json")
    archs = config.get("architectures")
    ctx = config.get("max_position_embeddings")
    model_type = config.get("model_type")
    return CheckpointFacts(
        files=files, index=(d / INDEX_NAME).is_file(), size=sum(f.size for _, f in files),
        tensor_count=sum(f.tensor_count for _, f in files), parameter_count=sum(f.parameter_count for _, f in files),
        data_bytes=sum(f.data_bytes for _, f in files), dtypes=tuple(sorted({t for _, f in files for t in f.dtypes})),
        llama_guard=bool(GUARD_NAME.search(label) or GUARD_NAME.search(str(config.get("_name_or_path", "")))),
        architecture=archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None,
        model_type=model_type if isinstance(model_type, str) else None,
        context_length=ctx if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0 else None,
    )


def _config(p: Path) -> dict[str, Any]:
    """config.json as an object; {} when there is none."""
    try:
        if not p.is_file():
            return {}
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise WeightsError(f"{p.parent.name}: config.json is larger than {MAX_CONFIG_BYTES >> 20} MiB")
        doc = json.loads(p.read_bytes())
    except OSError as error:
        raise WeightsError(f"cannot read {p}: {error.strerror or error}", transient=True) from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise WeightsError(f"{p.parent.name}: config.json is not JSON (damaged)") from None
    if not isinstance(doc, dict):
        raise WeightsError(f"{p.parent.name}: config.json is not a JSON object")
    return doc


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
