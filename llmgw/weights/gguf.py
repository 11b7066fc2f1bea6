"""The GGUF header reader: magic, version, metadata, tensor infos, and the size the data must have.
Owns `check_gguf(path) -> GgufInfo` (`check_gguf_from` an open file), which refuses bad magic, truncated files and lying headers.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md. Only the
header is read (at most `MAX_HEADER_BYTES`), never the tensor data; every
count and length in it is bounded before anything is allocated, so a crafted
file costs a refusal, not memory. Big arrays (a tokenizer's 150k tokens) are
walked but only their first `KEEP_ARRAY_ITEMS` items are kept.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from llmgw.weights import WeightsError

__all__ = [
    "FILE_TYPES", "GGML_TYPES", "MAX_HEADER_BYTES", "GgufArray", "GgufInfo", "TensorInfo",
    "WeightsError", "check_gguf", "check_gguf_from", "read_gguf",
]

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Tokenizers put the biggest things in a header (Llama 3: ~6 MiB); ten times that is absurd.
MAX_HEADER_BYTES = 64 << 20
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 63  # GGML_MAX_NAME is 64 with its terminating NUL: llama.cpp refuses longer names
MAX_NESTING = 3
KEEP_ARRAY_ITEMS = 64
DEFAULT_ALIGNMENT = 32
_INT64_MAX = (1 << 63) - 1

# ggml type id -> (name, elements per block, bytes per block), as in ggml.h's type_traits.
GGML_TYPES: Mapping[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# general.file_type (llama.h's llama_ftype) -> the quantisation name people use.
FILE_TYPES: Mapping[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}

# Metadata value type id -> (name, struct code); STRING (8) and ARRAY (9) are read by hand.
_SCALARS: Mapping[int, tuple[str, str]] = {
    0: ("UINT8", "B"), 1: ("INT8", "b"), 2: ("UINT16", "H"), 3: ("INT16", "h"), 4: ("UINT32", "I"),
    5: ("INT32", "i"), 6: ("FLOAT32", "f"), 7: ("BOOL", "?"), 10: ("UINT64", "Q"), 11: ("INT64", "q"),
    12: ("FLOAT64", "d"),
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufArray:
    """An array value: its item type and length, and its first `KEEP_ARRAY_ITEMS` items."""

    item_type: str
    count: int
    items: tuple[Any, ...]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        known = GGML_TYPES.get(self.type_id)
        return known[0] if known else f"type {self.type_id}"

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        """Bytes of data, or None for a type this reader does not know."""
        known = GGML_TYPES.get(self.type_id)
        if known is None:
            return None
        _, block, size = known
        return self.elements // block * size


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF header says. `expected_size` is None when a tensor type is unknown
    (`size_note` says which), never a guess."""

    version: int
    metadata: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_start: int
    expected_size: int | None
    file_size: int | None = None
    size_note: str = ""
    byte_order: str = "little"

    @property
    def tensor_count(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str | None:
        return _text(self.metadata.get("general.architecture"))

    @property
    def name(self) -> str | None:
        return _text(self.metadata.get("general.name"))

    @property
    def parameter_count(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def file_type(self) -> int | None:
        value = self.metadata.get("general.file_type")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def quantization(self) -> str | None:
        ft = self.file_type
        return None if ft is None else FILE_TYPES.get(ft, f"file type {ft}")

    @property
    def context_length(self) -> int | None:
        return self._arch_int("context_length")

    @property
    def layer_count(self) -> int | None:
        return self._arch_int("block_count")

    @property
    def tensor_bytes(self) -> int | None:
        """Bytes of tensor data the header describes (what is loaded), None when a type is unknown."""
        sizes = [t.nbytes for t in self.tensors]
        return None if any(n is None for n in sizes) else sum(n or 0 for n in sizes)

    def memory_facts(self) -> dict[str, int]:
        """What a memory estimate needs (llmgw/domain/memory.py), under the names the storage
        report uses for every kind of weights; a fact the header lacks is left out, never 0.
        `head_count_kv` may be a per-layer array (some architectures vary it): then its total
        over the layers divided by them, rounded up, when every item was kept."""
        facts = {
            "layers": self.layer_count,
            "context_length": self.context_length,
            "embedding_length": self._arch_int("embedding_length"),
            "head_count": self._arch_int("attention.head_count"),
            "head_count_kv": self._arch_int("attention.head_count_kv") or self._per_layer("attention.head_count_kv"),
            "key_length": self._arch_int("attention.key_length"),
            "value_length": self._arch_int("attention.value_length"),
            "tensor_bytes": self.tensor_bytes,
        }
        return {k: v for k, v in facts.items() if v is not None and v > 0}

    def _arch_int(self, key: str) -> int | None:
        arch = self.architecture
        value = self.metadata.get(f"{arch}.{key}") if arch else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _per_layer(self, key: str) -> int | None:
        arch = self.architecture
        value = self.metadata.get(f"{arch}.{key}") if arch else None
        if not isinstance(value, GgufArray) or not value.count or len(value.items) != value.count:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.items):
            return None
        total: int = sum(value.items)
        return -(-total // value.count)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def check_gguf(path: str | os.PathLike[str]) -> GgufInfo:
    """The header of the GGUF at `path`, once its size is known to cover the tensor data the
    header describes; `WeightsError` otherwise (unreadable, bad magic, truncated, lying)."""
    p = Path(path)
    try:
        with p.open("rb", buffering=1 << 20) as f:
            return check_gguf_from(f, os.fstat(f.fileno()).st_size, p.name)
    except OSError as error:
        raise WeightsError(f"cannot read {p}: {error.strerror or error}", transient=True) from None


def check_gguf_from(f: BinaryIO, size: int, name: str) -> GgufInfo:
    """`check_gguf` of an open file of `size` bytes positioned at 0 (`name` names it in the reasons)."""
    info = read_gguf(f, size)
    needed = info.expected_size
    if needed is not None and size < needed:
        raise WeightsError(
            f"GGUF {name} is {size} bytes but its header describes {needed} bytes of tensor data "
            f"(truncated, or a header that does not match its data)"
        )
    return info


@dataclass
class _Reader:
    """Bounded reads from a file object: a short read is a truncated file, a read past
    `MAX_HEADER_BYTES` a refusal."""

    f: BinaryIO
    file_size: int
    pos: int = 0
    order: str = "<"
    budget: int = field(default=MAX_HEADER_BYTES)

    def _reserve(self, n: int, what: str) -> None:
        if self.pos + n > self.budget:
            raise WeightsError(f"GGUF header is larger than {self.budget >> 20} MiB ({what}): refusing to read it")
        if self.pos + n > self.file_size:
            raise WeightsError(f"GGUF file ends inside its header at byte {self.file_size} ({what}): truncated")

    def read(self, n: int, what: str) -> bytes:
        self._reserve(n, what)
        data = self.f.read(n)
        if len(data) < n:
            raise WeightsError(f"GGUF file ends inside its header at byte {self.pos + len(data)} ({what}): truncated")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        self._reserve(n, what)
        self.f.seek(n, os.SEEK_CUR)
        self.pos += n

    def scalar(self, code: str, what: str) -> Any:
        size = struct.calcsize(code)
        return struct.unpack(self.order + code, self.read(size, what))[0]

    def u32(self, what: str) -> int:
        value: int = self.scalar("I", what)
        return value

    def u64(self, what: str) -> int:
        value: int = self.scalar("Q", what)
        return value

    def string(self, what: str, limit: int | None = None, *, strict: bool = False) -> str:
        """A string; `strict`: one that names something (a key, a tensor) must be UTF-8, as the format
        says (a value's bad bytes are replaced: a tokenizer's are only data)."""
        n = self.u64(what)
        if limit is not None and n > limit:
            raise WeightsError(f"GGUF {what} is {n} bytes long (at most {limit})")
        self._reserve(n, what)
        at = self.pos
        raw = self.read(n, what)
        try:
            return raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raise WeightsError(f"GGUF {what} at byte {at} is not UTF-8 ({raw[:40]!r})") from None


def read_gguf(f: BinaryIO, file_size: int) -> GgufInfo:
    """Parse the header from `f` (positioned at 0) of a file of `file_size` bytes."""
    r = _Reader(f, file_size)
    magic = r.read(4, "magic")
    if magic != MAGIC:
        raise WeightsError(f"not a GGUF file: magic is {magic!r}, expected {MAGIC!r}")
    raw = r.read(4, "version")
    version, order, byte_order = struct.unpack("<I", raw)[0], "<", "little"
    if version & 0xFFFF == 0:  # a big-endian file reads as a huge little-endian version
        version, order, byte_order = struct.unpack(">I", raw)[0], ">", "big"
    r.order = order
    if version not in SUPPORTED_VERSIONS:
        raise WeightsError(f"GGUF version {version} is not supported (expected one of {SUPPORTED_VERSIONS})")
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    if n_tensors > MAX_TENSORS:
        raise WeightsError(f"GGUF header claims {n_tensors} tensors (at most {MAX_TENSORS})")
    if n_kv > MAX_KV:
        raise WeightsError(f"GGUF header claims {n_kv} metadata entries (at most {MAX_KV})")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string("metadata key", limit=1 << 16, strict=True)
        if key in metadata:
            raise WeightsError(f"GGUF metadata key {key!r} appears twice")
        metadata[key] = _value(r, r.u32(f"type of {key}"), key, depth=0)
    tensors = tuple(_tensor(r) for _ in range(n_tensors))
    alignment = _alignment(metadata)
    data_start = -(-r.pos // alignment) * alignment
    expected, note = _expected_size(tensors, alignment, data_start)
    return GgufInfo(
        version=version, metadata=metadata, tensors=tensors, alignment=alignment, data_start=data_start,
        expected_size=expected, file_size=file_size, size_note=note, byte_order=byte_order,
    )


def _value(r: _Reader, type_id: int, key: str, depth: int) -> Any:
    if type_id in _SCALARS:
        return r.scalar(_SCALARS[type_id][1], key)
    if type_id == _STRING:
        return r.string(key)
    if type_id != _ARRAY:
        raise WeightsError(f"GGUF metadata {key!r} has unknown value type {type_id}")
    if depth >= MAX_NESTING:
        raise WeightsError(f"GGUF metadata {key!r} nests arrays more than {MAX_NESTING} deep")
    item_type = r.u32(f"item type of {key}")
    count = r.u64(f"length of {key}")
    if item_type in _SCALARS:
        _, code = _SCALARS[item_type]
        size = struct.calcsize(code)
        r._reserve(count * size, key)  # refuse an absurd count before reading any of it
        kept = min(count, KEEP_ARRAY_ITEMS)
        items = struct.unpack(f"{r.order}{kept}{code}", r.read(kept * size, key))
        r.skip((count - kept) * size, key)
        return GgufArray(_SCALARS[item_type][0], count, tuple(items))
    if item_type not in (_STRING, _ARRAY):
        raise WeightsError(f"GGUF metadata {key!r} is an array of unknown type {item_type}")
    r._reserve(count * 8, key)  # each string or array is at least its 8-byte length
    kept_items: list[Any] = []
    for i in range(count):
        if item_type == _STRING:
            n = r.u64(key)
            if i < KEEP_ARRAY_ITEMS:
                r._reserve(n, key)
                kept_items.append(r.read(n, key).decode("utf-8", errors="replace"))
            else:
                r.skip(n, key)
        else:
            item = _value(r, _ARRAY, key, depth + 1)
            if i < KEEP_ARRAY_ITEMS:
                kept_items.append(item)
    return GgufArray("STRING" if item_type == _STRING else "ARRAY", count, tuple(kept_items))


def _tensor(r: _Reader) -> TensorInfo:
    name = r.string("tensor name", limit=1 << 16, strict=True)
    if len(name.encode()) > MAX_NAME:
        raise WeightsError(f"GGUF tensor name {name[:80]!r} is longer than {MAX_NAME} bytes")
    n_dims = r.u32(f"dimensions of {name}")
    if n_dims > MAX_DIMS:
        raise WeightsError(f"GGUF tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
    dims = tuple(r.u64(f"shape of {name}") for _ in range(n_dims))
    elements = 1
    for d in dims:
        elements *= d
        if d > _INT64_MAX or elements > _INT64_MAX:
            raise WeightsError(f"GGUF tensor {name!r} has an impossible shape {dims}")
    type_id = r.u32(f"type of {name}")
    known = GGML_TYPES.get(type_id)
    row = dims[0] if dims else 1
    if known and row % known[1]:  # ggml's rule: each row is whole blocks (gguf.cpp refuses the file otherwise)
        raise WeightsError(f"GGUF tensor {name!r} has rows of {row} elements, not whole {known[0]} blocks")
    return TensorInfo(name=name, dims=dims, type_id=type_id, offset=r.u64(f"offset of {name}"))


def _alignment(metadata: Mapping[str, Any]) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
        raise WeightsError(f"GGUF general.alignment is {value!r}, not a power of two")
    return value


def _expected_size(tensors: tuple[TensorInfo, ...], alignment: int, data_start: int) -> tuple[int | None, str]:
    """The file size the tensor infos require, checking that they do not overlap, are aligned
    and are unique; None with a note when a type's size is unknown."""
    seen: set[str] = set()
    unknown = sorted({t.type_name for t in tensors if t.nbytes is None})
    end = 0
    previous: TensorInfo | None = None
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.name in seen:
            raise WeightsError(f"GGUF tensor {t.name!r} appears twice")
        seen.add(t.name)
        if t.offset % alignment:
            raise WeightsError(f"GGUF tensor {t.name!r} starts at offset {t.offset}, not aligned to {alignment}")
        if previous is not None and t.offset < end:
            raise WeightsError(f"GGUF tensors {previous.name!r} and {t.name!r} overlap: the header lies about its data")
        end = max(end, t.offset + (t.nbytes or 0))
        previous = t
    if unknown:
        return None, f"tensor types unknown to this reader ({', '.join(unknown)}): size not checked"
    return data_start + end, ""
