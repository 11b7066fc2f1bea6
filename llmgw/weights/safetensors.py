"""safetensors checks from the headers alone: one file, or a directory with its shard index.
Owns `read_shard(path)` (`read_shard_from` an open file), `check_index(dir, index, shards)` and `check_safetensors_dir(path)`.

A file is an 8-byte little-endian header length, that many bytes of JSON
(`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`)
and the data, whose offsets run from 0 without gaps or overlaps; so a complete
file is exactly 8 + header length + the last end offset bytes. A tensor named twice
(which `json` would silently collapse to its last) is refused. A directory is
weights when `model.safetensors.index.json` names only shards that are present
and complete (and each tensor it maps is in the shard it names), or, without an
index, when it holds one complete `model.safetensors`.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llmgw.weights import WeightsError

__all__ = [
    "DTYPE_BITS", "DTYPE_BYTES", "INDEX_NAME", "SINGLE_NAME", "MAX_HEADER_BYTES", "ShardInfo", "WeightsError",
    "check_index", "check_safetensors_dir", "read_index", "read_shard", "read_shard_from",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# The safetensors library refuses headers over 100 MB; so do we, before reading one.
MAX_HEADER_BYTES = 100_000_000
MAX_INDEX_BYTES = 64 << 20
# Bytes per element of each dtype.
DTYPE_BYTES: Mapping[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
    "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
# Bits per element, sub-byte float types included (a tensor of them must fill whole bytes, as the
# safetensors library demands); a dtype not here is tiled but its size left unchecked.
DTYPE_BITS: Mapping[str, int] = {**{k: 8 * v for k, v in DTYPE_BYTES.items()}, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


@dataclass(frozen=True)
class ShardInfo:
    """A complete safetensors file: its size, its tensors' names, their parameter count and dtypes."""

    path: Path
    size: int
    tensors: frozenset[str]
    parameters: int
    dtypes: frozenset[str] = frozenset()
    data_bytes: int = 0  # the tensor data: the file less its 8-byte length and its header


def read_shard(path: str | os.PathLike[str]) -> ShardInfo:
    """The header of the safetensors file at `path`, once the file is exactly as long as the
    header says; `WeightsError` otherwise."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return read_shard_from(f, os.fstat(f.fileno()).st_size, p)
    except OSError as error:
        raise WeightsError(f"cannot read {p}: {error.strerror or error}", transient=True) from None


def read_shard_from(f: BinaryIO, size: int, path: Path) -> ShardInfo:
    """`read_shard` of an open file of `size` bytes positioned at 0 (`path` names it in the reasons)."""
    head = f.read(8)
    if len(head) < 8:
        raise WeightsError(f"safetensors {path.name} is {size} bytes: too short for a header (truncated)")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise WeightsError(f"safetensors {path.name} claims a {n}-byte header (at most {MAX_HEADER_BYTES})")
    if 8 + n > size:
        raise WeightsError(
            f"safetensors {path.name} is {size} bytes, shorter than its {n}-byte header (truncated)")
    raw = f.read(n)
    if len(raw) < n:
        raise WeightsError(f"safetensors {path.name} ends inside its header (truncated)")
    try:
        header = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise WeightsError(f"safetensors {path.name}: {dup.args[0]!r} appears twice in its header") from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise WeightsError(f"safetensors {path.name}: its header is not JSON (not safetensors, or damaged)") from None
    if not isinstance(header, dict):
        raise WeightsError(f"safetensors {path.name}: its header is not a JSON object")
    end, names, parameters, dtypes = _layout(path.name, header)
    expected = 8 + n + end
    if size != expected:
        words = "truncated" if size < expected else "trailing bytes after the data"
        raise WeightsError(f"safetensors {path.name} is {size} bytes but its header describes {expected} ({words})")
    return ShardInfo(path=path, size=size, tensors=frozenset(names), parameters=parameters,
                     dtypes=frozenset(dtypes), data_bytes=end)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: `json` keeps the last of a repeated key, which would hide
    a tensor named twice (or a second `__metadata__`)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _count(value: Any) -> int:
    """A JSON number that counts something: an int >= 0 (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(value)
    return value


def _layout(name: str, header: Mapping[str, Any]) -> tuple[int, list[str], int, set[str]]:
    """The data's end offset, the tensor names, the parameter count and the dtypes, checking that the
    tensors tile the data from 0 without gaps or overlaps and that each is as big as its shape."""
    spans: list[tuple[int, int, str]] = []
    parameters = 0
    dtypes: set[str] = set()
    for tensor, info in header.items():
        if tensor == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise WeightsError(f"safetensors {name}: __metadata__ is not an object of strings")
            continue
        try:
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
                raise TypeError(info)
            elements = 1
            for d in shape:
                elements *= _count(d)
            begin, end = (_count(o) for o in offsets)
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"safetensors {name}: tensor {tensor!r} has no valid dtype/shape/data_offsets") from None
        bits = DTYPE_BITS.get(dtype)
        if end < begin or (bits is not None and (elements * bits % 8 or end - begin != elements * bits // 8)):
            raise WeightsError(
                f"safetensors {name}: tensor {tensor!r} ({dtype} {list(shape)}) spans bytes {begin}..{end}: "
                "the header does not match its data"
            )
        spans.append((begin, end, tensor))
        parameters += elements
        dtypes.add(dtype)
    at = 0
    for begin, end, tensor in sorted(spans):
        if begin != at:
            raise WeightsError(
                f"safetensors {name}: tensor {tensor!r} starts at {begin}, expected {at} (gap or overlap)")
        at = end
    return at, [t for _, _, t in spans], parameters, dtypes


def read_index(path: str | os.PathLike[str]) -> dict[str, str]:
    """`weight_map` of a `model.safetensors.index.json`: tensor name -> shard file name."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_INDEX_BYTES:
            raise WeightsError(f"{p.name} is larger than {MAX_INDEX_BYTES >> 20} MiB")
        doc = json.loads(p.read_bytes())
    except OSError as error:
        raise WeightsError(f"cannot read {p}: {error.strerror or error}", transient=True) from None
    except (ValueError, UnicodeDecodeError):
        raise WeightsError(f"{p.name} is not JSON (damaged or still being written)") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{p.name} has no weight_map")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard in (".", ".."):
            raise WeightsError(f"{p.name} maps {tensor!r} to {shard!r}, not a file name in this directory")
    return {str(k): v for k, v in weight_map.items()}


def check_index(directory: Path, weight_map: Mapping[str, str], shards: Mapping[str, ShardInfo]) -> None:
    """Every shard the index names was read (`shards`: file name -> its info) and holds the
    tensors the index maps to it, and no tensor is in two shards; `WeightsError` names the first
    missing or repeated piece."""
    for shard in sorted(set(weight_map.values())):
        if shard not in shards:
            raise WeightsError(f"{directory.name}: {INDEX_NAME} names {shard}, which is not there")
    for tensor, shard in weight_map.items():
        if tensor not in shards[shard].tensors:
            raise WeightsError(f"{directory.name}: {INDEX_NAME} puts {tensor!r} in {shard}, whose header lacks it")
    held: dict[str, str] = {}
    for shard in sorted(shards):
        for tensor in sorted(shards[shard].tensors):
            if tensor in held:
                raise WeightsError(f"{directory.name}: tensor {tensor!r} is in both {held[tensor]} and {shard}")
            held[tensor] = shard


def check_safetensors_dir(path: str | os.PathLike[str]) -> tuple[ShardInfo, ...]:
    """The shards of the safetensors model in directory `path` (uncached: the storage scanner
    does the same with a cache); `WeightsError` when it is not complete weights."""
    d = Path(path)
    index = d / INDEX_NAME
    if index.is_file():
        weight_map = read_index(index)
        present = {name for name in set(weight_map.values()) if (d / name).is_file()}
        shards = {name: read_shard(d / name) for name in sorted(present)}
        check_index(d, weight_map, shards)
        return tuple(shards[name] for name in sorted(shards))
    if (d / SINGLE_NAME).is_file():
        return (read_shard(d / SINGLE_NAME),)
    raise WeightsError(f"{d.name}: neither {INDEX_NAME} nor {SINGLE_NAME}")
