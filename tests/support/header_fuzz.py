"""Mutated real weights headers for the header parsers' fuzz tests (tests/unit/test_header_fuzz.py) and its
longer runner (tests/bench/fuzz_headers.py).

API:
- `Corpus`: one real file to mutate: its kind, its bytes up to the end of its header (`head`), its size,
  and the fields the parser reads (`fields`: (offset, width) of each number: counts, lengths, type ids,
  dims, offsets), so that mutations hit the header's structure rather than a token's spelling.
  `gguf_corpus(path)` / `safetensors_corpus(path)` make one (a GGUF's head ends where its data starts; a safetensors file is all head).
  `write_safetensors(path, tensors)` writes one (`SMALL_SAFETENSORS`: six tensors of six dtypes).
- `Mutation(op, pos, length, payload)`: flip a bit, overwrite a field with a boundary value, overwrite,
  insert or delete bytes in the header, truncate the file anywhere, or append bytes to it.
  `mutations(corpus)` is its Hypothesis strategy, `random_mutation(rng, corpus)` the bench's.
- `apply(corpus, mutation, base) -> Mutant`: the mutated file as a read-only raw file of `size` bytes (`open()`
  buffers it): the mutated head, then the original file's bytes after its head, so a 100 MB GGUF costs no copy.
- `try_mutant(corpus, mutation, base) -> Outcome`: the mutant through `inspect_open` (what the mirror runs):
  refused with its reason, accepted, or broken (another exception, or accepted though inconsistent), timed.
- `gguf_consistent(f, size)` / `safetensors_consistent(data)`: the oracles for an accepted mutant,
  recomputing the size its header requires from sizes taken elsewhere (gguf-py's block table, a literal
  dtype table), and `None` when consistent, else what is wrong.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hypothesis import strategies as st

from llmgw.mirror.inspect import FileFacts, inspect_open
from llmgw.weights import WeightsError
from llmgw.weights.gguf import read_gguf

__all__ = ["OPS", "SMALL_SAFETENSORS", "Corpus", "Mutant", "Mutation", "Outcome", "apply", "gguf_consistent",
           "gguf_corpus", "mutations", "random_mutation", "safetensors_consistent", "safetensors_corpus", "try_mutant",
           "write_safetensors"]

OPS = ("flip", "field", "overwrite", "insert", "delete", "truncate", "append")
# Values a field is overwritten with: each width's edges, and small numbers near real ones.
_EDGES = (0, 1, 2, 3, 4, 7, 8, 9, 31, 32, 33, 63, 64, 255, 256, 1 << 16, (1 << 31) - 1, 1 << 31, (1 << 32) - 1,
          1 << 32, 1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)


@dataclass(frozen=True)
class Corpus:
    name: str
    kind: str  # "gguf" or "safetensors"
    path: Path
    head: bytes
    size: int
    fields: tuple[tuple[int, int], ...]


class _Recording(io.BytesIO):
    """A file that notes where each number was read (a read of 1, 2, 4 or 8 bytes)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.fields: list[tuple[int, int]] = []

    def read(self, n: int | None = -1, /) -> bytes:
        at = self.tell()
        data = super().read(n)
        if n in (1, 2, 4, 8):
            self.fields.append((at, n))
        return data


def gguf_corpus(path: Path, name: str | None = None) -> Corpus:
    """The GGUF at `path` (valid): its head up to the aligned start of its data, and the numbers in it."""
    size = path.stat().st_size
    with path.open("rb") as f:
        data_start = read_gguf(f, size).data_start
        f.seek(0)
        head = f.read(data_start)
    rec = _Recording(head)
    read_gguf(rec, size)
    return Corpus(name or path.name, "gguf", path, head, size, tuple(rec.fields))


def safetensors_corpus(path: Path, name: str | None = None) -> Corpus:
    """A small safetensors file: all of it is the head; its fields are the length and each number in the JSON."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    fields = [(0, 8)]
    header = data[8:8 + n]
    i = 0
    while i < len(header):  # each run of digits is a number: a dim or an offset
        if chr(header[i]).isdigit():
            j = i
            while j < len(header) and chr(header[j]).isdigit():
                j += 1
            fields.append((8 + i, j - i))
            i = j
        else:
            i += 1
    return Corpus(name or path.name, "safetensors", path, data, len(data), tuple(fields))


# A small safetensors file of several dtypes: tensor name -> (dtype, shape).
SMALL_SAFETENSORS = {"embed.weight": ("F16", [16, 8]), "norm.weight": ("F32", [8]), "head.weight": ("BF16", [3, 8]),
                     "positions": ("I64", [5]), "mask": ("BOOL", [7]), "q": ("U8", [2, 3])}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> Path:
    """A complete safetensors file of `tensors` (name -> (dtype, shape)), laid end to end, data not all zeros."""
    widths = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "BOOL": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, (dtype, shape) in tensors.items():
        n = widths[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(range(256)) * (at // 256) + b"\7" * (at % 256))
    return path


@dataclass(frozen=True)
class Mutation:
    op: str
    pos: int = 0
    length: int = 0
    payload: bytes = b""

    def describe(self) -> str:
        return f"{self.op} at {self.pos} ({self.length} bytes, payload {self.payload[:16]!r})"


class Mutant(io.RawIOBase):
    """`head`, then `base`'s bytes from `base_from`, then `tail`: `size` bytes in all."""

    def __init__(self, head: bytes, base: BinaryIO | None, base_from: int, size: int, tail: bytes = b"") -> None:
        super().__init__()
        self.head, self.base, self.base_from, self.size, self.tail = head, base, base_from, size, tail
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        body_end = self.size - len(self.tail)
        if end <= len(self.head) and end <= body_end:  # the header parsers' many small reads
            data = self.head[self.pos:end]
            self.pos = end
            return data
        out = bytearray()
        at = self.pos
        while at < end:
            if at < min(len(self.head), body_end):
                stop = min(end, len(self.head), body_end)
                out += self.head[at:stop]
            elif at < body_end:
                assert self.base is not None
                stop = min(end, body_end)
                self.base.seek(self.base_from + at - len(self.head))
                out += self.base.read(stop - at)
            else:
                stop = end
                out += self.tail[at - body_end:stop - body_end]
            at = stop
        self.pos = at
        return bytes(out)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def open(self) -> io.BufferedReader:
        """The mutant behind a buffer, at 0: what the parsers read (as fast as a file)."""
        fresh = Mutant(self.head, self.base, self.base_from, self.size, self.tail)  # a reader closes its raw file
        return io.BufferedReader(fresh, 1 << 16)

    def all_bytes(self) -> bytes:
        return Mutant(self.head, self.base, self.base_from, self.size, self.tail).read()


def apply(corpus: Corpus, m: Mutation, base: BinaryIO | None) -> Mutant:
    """The file `m` makes of `corpus` (`base`: the corpus's file, open, when it is bigger than its head)."""
    head, size, rest = bytearray(corpus.head), corpus.size, len(corpus.head)
    pos = min(m.pos, max(len(head) - 1, 0))
    if m.op == "flip":
        head[pos] ^= 1 << (m.length % 8)
    elif m.op in ("field", "overwrite"):
        head[pos:pos + len(m.payload)] = m.payload[:max(0, len(head) - pos)]
    elif m.op == "insert":
        head[pos:pos] = m.payload
        size += len(m.payload)
    elif m.op == "delete":
        cut = min(m.length, len(head) - pos)
        del head[pos:pos + cut]
        size -= cut
    elif m.op == "truncate":
        size = min(m.pos, corpus.size)
        del head[size:]
    elif m.op == "append":
        return Mutant(bytes(head), base, rest, size + len(m.payload), m.payload)
    return Mutant(bytes(head), base if size > len(head) else None, rest, size)


def _field_value(width: int, value: int, order: str = "<") -> bytes:
    code = {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
    return struct.pack(order + code, value % (1 << (8 * width)))


def _field_mutation(corpus: Corpus, index: int, value: int, delta: int) -> Mutation:
    pos, width = corpus.fields[index % len(corpus.fields)]
    if corpus.kind == "safetensors" and pos >= 8:
        old = int(corpus.head[pos:pos + width])
        new = str(max(0, old + delta) if delta else value).encode()
        return Mutation("field", pos, width, new.ljust(width) if len(new) < width else new)
    old = int.from_bytes(corpus.head[pos:pos + width], "little")
    return Mutation("field", pos, width, _field_value(width, old + delta if delta else value))


@st.composite
def mutations(draw: Any, corpus: Corpus) -> Mutation:
    """A Hypothesis strategy of mutations of `corpus`, half of them on its fields."""
    head = len(corpus.head)
    op = draw(st.sampled_from(OPS + ("field",) * 3))
    if op == "field":
        index = draw(st.integers(0, len(corpus.fields) - 1))
        if draw(st.booleans()):
            return _field_mutation(corpus, index, 0, draw(st.sampled_from((-64, -32, -8, -1, 1, 8, 32, 64))))
        return _field_mutation(corpus, index, draw(st.sampled_from(_EDGES)), 0)
    if op == "truncate":
        return Mutation(op, draw(st.one_of(st.integers(0, head), st.integers(0, corpus.size))))
    pos = draw(st.integers(0, head - 1))
    payload = draw(st.binary(min_size=1, max_size=16))
    return Mutation(op, pos, draw(st.integers(0, 64)), payload)


def random_mutation(rng: random.Random, corpus: Corpus) -> Mutation:
    """`mutations` with `random` (the bench's loop: thousands a second, no shrinking)."""
    head = len(corpus.head)
    op = rng.choice(OPS + ("field",) * 3)
    if op == "field":
        index = rng.randrange(len(corpus.fields))
        if rng.random() < 0.5:
            return _field_mutation(corpus, index, 0, rng.choice((-64, -32, -8, -1, 1, 8, 32, 64)))
        return _field_mutation(corpus, index, rng.choice(_EDGES), 0)
    if op == "truncate":
        return Mutation(op, rng.randrange(head + 1) if rng.random() < 0.5 else rng.randrange(corpus.size + 1))
    payload = rng.randbytes(rng.randint(1, 16))
    return Mutation(op, rng.randrange(head), rng.randint(0, 64), payload)


def gguf_consistent(f: BinaryIO, size: int) -> str | None:
    """None when the GGUF `f` (of `size` bytes) holds exactly the tensor data its header describes, by
    gguf-py's block sizes: every tensor aligned, none overlapping, all inside the file, nothing after
    them but the alignment's padding, no tensor name twice. Else what is wrong."""
    import gguf

    f.seek(0)
    info = read_gguf(f, size)
    spans = []
    for t in info.tensors:
        try:
            block, per_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.type_id)]
        except (ValueError, KeyError):
            return f"tensor {t.name!r} has type {t.type_id}, which gguf-py does not know"
        elements = 1
        for d in t.dims:
            elements *= d
        if elements % block:
            return f"tensor {t.name!r}: {elements} elements, not whole blocks of {block}"
        start = info.data_start + t.offset
        spans.append((start, start + elements // block * per_block, t.name))
    if len({name for _, _, name in spans}) != len(spans):
        return "a tensor name twice"
    end = info.data_start
    for start, stop, name in sorted(spans):
        if (start - info.data_start) % info.alignment:
            return f"tensor {name!r} is not aligned"
        if start < end:
            return f"tensor {name!r} overlaps the one before"
        end = stop
    if end > size:
        return f"the tensors end at {end}, past the file's {size} bytes"
    if size - end >= info.alignment:
        return f"{size - end} bytes after the tensors"
    return None


_WIDTH = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
          "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_consistent(data: bytes) -> str | None:
    """None when `data` is a safetensors file whose tensors, sized by a literal dtype table, tile its data
    exactly, and whose header names no tensor twice. Else what is wrong."""
    (n,) = struct.unpack("<Q", data[:8])
    pairs: list[list[tuple[str, Any]]] = []

    def hook(items: list[tuple[str, Any]]) -> dict[str, Any]:
        pairs.append(items)
        return dict(items)

    header = json.loads(data[8:8 + n], object_pairs_hook=hook)
    if len({k for k, _ in pairs[-1]}) != len(pairs[-1]):
        return "a key twice"
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        elements = 1
        for d in t["shape"]:
            if type(d) is not int or d < 0:
                return f"tensor {name!r}: dim {d!r}"
            elements *= d
        begin, end = t["data_offsets"]
        if t["dtype"] not in _WIDTH:
            return f"tensor {name!r}: dtype {t['dtype']!r} outside the table"
        if type(begin) is not int or type(end) is not int or end - begin != elements * _WIDTH[t["dtype"]]:
            return f"tensor {name!r}: {begin}..{end} is not {elements} {t['dtype']}"
        spans.append((begin, end))
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            return f"a gap or overlap at {begin}"
        at = end
    if 8 + n + at != len(data):
        return f"{len(data)} bytes, header describes {8 + n + at}"
    return None


@dataclass(frozen=True)
class Outcome:
    """What the mirror's inspection made of a mutant: `facts` when accepted, `refusal` (the reason) when
    refused, `broken` when it did neither properly (the exception, or why an accepted mutant is inconsistent)."""

    mutant: Mutant
    seconds: float
    facts: FileFacts | None = None
    refusal: str = ""
    broken: str = ""


def try_mutant(corpus: Corpus, m: Mutation, base: BinaryIO | None) -> Outcome:
    mutant = apply(corpus, m, base)
    started = time.perf_counter()
    try:
        facts = inspect_open(mutant.open(), mutant.size, corpus.name)
    except WeightsError as error:
        return Outcome(mutant, time.perf_counter() - started, refusal=error.reason)
    except BaseException as error:  # noqa: BLE001 - MemoryError, RecursionError ...: what this hunts
        return Outcome(mutant, time.perf_counter() - started, broken=f"{type(error).__name__}: {error}")
    seconds = time.perf_counter() - started
    if facts.size != mutant.size:
        return Outcome(mutant, seconds, facts, broken=f"accepted with size {facts.size}, file is {mutant.size}")
    if facts.kind == "gguf":
        problem = gguf_consistent(mutant.open(), mutant.size)
    else:
        problem = safetensors_consistent(mutant.all_bytes())
    return Outcome(mutant, seconds, facts, broken=f"accepted but {problem}" if problem else "")
