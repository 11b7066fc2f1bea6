"""The GGUF header reader on real files: written by the `gguf` package (llama.cpp's own writer)
and crafted byte by byte for what no writer produces (absurd counts, overlaps, lies)."""

from __future__ import annotations

import io
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from llmgw.weights import WeightsError
from llmgw.weights.gguf import FILE_TYPES, GGML_TYPES, GgufArray, check_gguf, read_gguf
from tests.support.tiny_gguf import minimal_gguf, truncate, write_lying_header, write_tiny_llama

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def crafted(*, version: int = 3, kv: bytes = b"", n_kv: int = 0, n_tensors: int | None = None, data: int = 0,
            tensors: list[tuple[str, list[int], int, int]] | None = None) -> bytes:
    """A GGUF from parts: raw metadata bytes, and tensor infos (name, dims, type, offset)."""
    infos = tensors or []
    out = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors, n_kv) + kv
    for name, dims, type_id, offset in infos:
        out += _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", type_id, offset)
    out += b"\0" * (-len(out) % 32)
    return out + b"\0" * data


def write(tmp_path: Path, blob: bytes, name: str = "x.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(blob)
    return p


def test_the_tiny_llama_reads_whole(tiny: Path) -> None:
    info = check_gguf(tiny)
    assert (info.version, info.architecture, info.name) == (3, "llama", "tiny-llama")
    assert (info.quantization, info.context_length, info.layer_count) == ("F32", 2048, 2)
    assert info.tensor_count == 21 and info.alignment == 32
    assert info.expected_size == os.path.getsize(tiny) == info.file_size
    reader = gguf.GGUFReader(str(tiny))
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert [(t.name, t.offset) for t in info.tensors] == [
        (t.name, int(t.data_offset) - info.data_start) for t in reader.tensors]
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GgufArray) and tokens.count == 512 and tokens.items[:3] == ("<unk>", "<s>", "</s>")


def test_an_unknown_architecture_is_read_not_judged(tmp_path: Path) -> None:
    info = check_gguf(write_tiny_llama(tmp_path / "odd.gguf", arch="notarealarch"))
    assert info.architecture == "notarealarch" and info.context_length == 2048


def test_block_sizes_match_ggml() -> None:
    for type_id, (name, block, size) in GGML_TYPES.items():
        q = gguf.GGMLQuantizationType(type_id)
        assert (q.name, gguf.GGML_QUANT_SIZES[q]) == (name, (block, size))


def test_file_type_names_match_llama_cpp() -> None:
    for value, name in FILE_TYPES.items():
        assert gguf.LlamaFileType(value).name in (f"MOSTLY_{name}", f"ALL_{name}")


@pytest.mark.parametrize("keep", [3, 20, 3000, 200_000, -1])
def test_a_truncated_file_is_refused(tiny: Path, tmp_path: Path, keep: int) -> None:
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny.read_bytes())
    truncate(p, os.path.getsize(p) + keep if keep < 0 else keep)
    with pytest.raises(WeightsError, match="truncated"):
        check_gguf(p)


def test_a_header_that_lies_about_its_data_is_refused(tmp_path: Path) -> None:
    p = write_lying_header(tmp_path / "lie.gguf")
    with pytest.raises(WeightsError, match="header describes 702464 bytes"):
        check_gguf(p)


def test_bad_magic_and_old_versions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="not a GGUF file"):
        check_gguf(write(tmp_path, b"PK\x03\x04" + b"\0" * 100))
    with pytest.raises(WeightsError, match="version 1 is not supported"):
        check_gguf(write(tmp_path, crafted(version=1)))
    with pytest.raises(WeightsError, match="cannot read"):
        check_gguf(tmp_path / "absent.gguf")


def test_every_value_type_is_read(tmp_path: Path) -> None:
    p = tmp_path / "kv.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_uint8("u8", 200), w.add_int8("i8", -5), w.add_uint16("u16", 60000), w.add_int16("i16", -300)
    w.add_uint32("u32", 4_000_000_000), w.add_int32("i32", -7), w.add_float32("f32", 0.5)
    w.add_uint64("u64", 1 << 40), w.add_int64("i64", -(1 << 40)), w.add_float64("f64", 0.25)
    w.add_bool("yes", True), w.add_string("s", "héllo")
    w.add_array("ints", list(range(100))), w.add_array("strs", ["a", "b"]), w.add_array("nested", [[1, 2], [3]])
    w.add_tensor("t", gguf.np.zeros(4, dtype=gguf.np.float16))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    m = check_gguf(p).metadata
    assert [m[k] for k in ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "u64", "i64", "f64", "yes", "s")] == [
        200, -5, 60000, -300, 4_000_000_000, -7, 0.5, 1 << 40, -(1 << 40), 0.25, True, "héllo"]
    assert m["ints"].count == 100 and m["ints"].items == tuple(range(64)) and m["ints"].item_type == "INT32"
    assert m["strs"].items == ("a", "b")
    assert [a.items for a in m["nested"].items] == [(1, 2), (3,)]


def test_a_big_endian_file_is_read(tmp_path: Path) -> None:
    p = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(p), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("llama.block_count", 3)
    w.add_tensor("t", gguf.np.zeros(8, dtype=gguf.np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    info = check_gguf(p)
    assert (info.byte_order, info.layer_count, info.tensors[0].dims) == ("big", 3, (8,))


@pytest.mark.parametrize(("blob", "reason"), [
    (crafted(n_tensors=1 << 40), "claims 1099511627776 tensors"),
    (crafted(n_kv=1 << 40), "metadata entries"),
    (crafted(n_kv=1, kv=_s("k") + struct.pack("<IIQ", 9, 4, 1 << 60)), "larger than 64 MiB"),
    (crafted(n_kv=1, kv=_s("k") + struct.pack("<IIQ", 9, 8, 1 << 60)), "larger than 64 MiB"),
    (crafted(n_kv=1, kv=_s("k") + struct.pack("<IQ", 8, 1 << 62)), "larger than 64 MiB"),
    (crafted(n_kv=1, kv=_s("k") + struct.pack("<I", 99)), "unknown value type 99"),
    (crafted(n_kv=1, kv=struct.pack("<Q", 1 << 50)), "metadata key is"),
    (crafted(n_kv=2, kv=(_s("k") + struct.pack("<IB", 0, 1)) * 2), "appears twice"),
    (crafted(n_kv=1, kv=_s("general.alignment") + struct.pack("<II", 4, 48)), "not a power of two"),
    (crafted(tensors=[("t", [1, 1, 1, 1, 1], 0, 0)]), "5 dimensions"),
    (crafted(tensors=[("t", [1 << 40, 1 << 40], 0, 0)]), "impossible shape"),
    (crafted(tensors=[("t" * 64, [4], 0, 0)]), "longer than 63 bytes"),
    (crafted(tensors=[("t", [33], 2, 0)]), "not whole Q4_0 blocks"),
    (crafted(tensors=[("a", [32], 0, 0), ("b", [32], 0, 64)], data=256), "overlap"),
    (crafted(tensors=[("a", [8], 0, 0), ("a", [8], 0, 32)], data=64), "appears twice"),
    (crafted(tensors=[("a", [8], 0, 4)], data=64), "not aligned"),
])
def test_bad_headers_are_refused_with_a_reason(tmp_path: Path, blob: bytes, reason: str) -> None:
    started = time.perf_counter()
    with pytest.raises(WeightsError, match=reason):
        check_gguf(write(tmp_path, blob))
    assert time.perf_counter() - started < 1  # refused before reading or allocating anything big


def test_an_unknown_tensor_type_leaves_the_size_unknown(tmp_path: Path) -> None:
    info = check_gguf(write(tmp_path, crafted(tensors=[("a", [8], 0, 0), ("b", [8], 77, 32)], data=64)))
    assert info.expected_size is None
    assert "type 77" in info.size_note and "not checked" in info.size_note
    assert info.tensor_bytes is None and "tensor_bytes" not in info.memory_facts()  # unknown, not a guess


def test_the_memory_facts_are_what_gguf_py_reads(tiny: Path) -> None:
    info = check_gguf(tiny)
    reader = gguf.GGUFReader(str(tiny))
    assert info.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert info.memory_facts() == {
        "layers": 2, "context_length": 2048, "embedding_length": 64, "head_count": 4, "head_count_kv": 2,
        "tensor_bytes": info.tensor_bytes}


def test_per_layer_head_counts_and_key_lengths_are_read(tmp_path: Path) -> None:
    p = tmp_path / "varied.gguf"
    w = gguf.GGUFWriter(str(p), "openelm")
    w.add_block_count(3), w.add_head_count(12)
    w.add_array("openelm.attention.head_count_kv", [3, 4, 6])  # varies by layer: 13 in all
    w.add_key_length(192), w.add_value_length(128)
    w.add_tensor("t", gguf.np.zeros(8, dtype=gguf.np.float16))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    facts = check_gguf(p).memory_facts()
    assert facts == {"layers": 3, "head_count": 12, "head_count_kv": 5, "key_length": 192, "value_length": 128,
                     "tensor_bytes": 16}


class CountingFile(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, n: int | None = -1, /) -> bytes:
        data = super().read(n)
        self.bytes_read += len(data)
        return data


def test_only_the_header_is_read(tiny: Path) -> None:
    f = CountingFile(tiny.read_bytes())
    info = read_gguf(f, os.path.getsize(tiny))
    assert f.bytes_read <= info.data_start < os.path.getsize(tiny) // 10


def test_the_minimal_gguf_is_what_gguf_py_reads(tmp_path: Path) -> None:
    p = write(tmp_path, minimal_gguf("qwen2", tensors=3, elements=40))
    ours: Any = check_gguf(p)
    theirs = gguf.GGUFReader(str(p))
    assert ours.architecture == "qwen2" and ours.expected_size == os.path.getsize(p)
    assert [(t.name, t.offset) for t in ours.tensors] == [
        (t.name, int(t.data_offset) - ours.data_start) for t in theirs.tensors]
