"""What the mirror reads of a file before accepting it (llmgw/mirror/inspect.py), by example: the tiny GGUFs'
facts, a Llama Guard file and a LoRA adapter recognised, a safetensors file's dtypes and counts, a checkpoint
directory's totals, and each refusal with its reason."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from llmgw.mirror.inspect import FileFacts, inspect_dir, inspect_file
from llmgw.weights import WeightsError
from llmgw.weights.gguf import check_gguf
from tests.support.tiny_gguf import minimal_gguf, write_lying_header, write_tiny_llama, write_tiny_lora, write_tiny_reranker

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("inspect") / "tiny.gguf")


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def shard(path: Path, header: dict[str, Any], data: int | None = None) -> Path:
    """A safetensors file of `header` with `data` bytes (default: the last end offset)."""
    raw = json.dumps(header).encode()
    end = max((v["data_offsets"][-1] for k, v in header.items() if k != "__metadata__"), default=0)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\1" * (end if data is None else data))
    return path


def test_the_tiny_llama_facts(tiny: Path) -> None:
    facts = inspect_file(tiny)
    reader = gguf.GGUFReader(str(tiny))
    assert (facts.kind, facts.size, facts.version) == ("gguf", os.path.getsize(tiny), 3)
    assert (facts.architecture, facts.name, facts.quantization, facts.context_length) == (
        "llama", "tiny-llama", "F32", 2048)
    assert facts.tensor_count == len(reader.tensors) == 21
    assert facts.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert facts.data_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert not facts.llama_guard and not facts.lora_adapter and facts.pooling is None
    assert dict(facts.memory)["layers"] == 2


def test_the_tiny_reranker_says_its_pooling(tmp_path: Path) -> None:
    facts = inspect_file(write_tiny_reranker(tmp_path / "rerank.gguf"))
    assert (facts.architecture, facts.pooling, facts.context_length, facts.tensor_count) == ("bert", "rank", 512, 41)


def test_a_lora_adapter_is_recognised(tmp_path: Path) -> None:
    facts = inspect_file(write_tiny_lora(tmp_path / "lora.gguf"))
    assert facts.lora_adapter and facts.general_type == "adapter" and not facts.llama_guard
    assert (facts.tensor_count, facts.parameter_count) == (8, 8 * 4 * 64)


def _guard_gguf(path: Path, *, name: str | None = None, basename: str | None = None,
                template: str | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if name:
        w.add_name(name)
    if basename:
        w.add_basename(basename)
    if template:
        w.add_chat_template(template)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tensor("t", gguf.np.zeros(32, dtype=gguf.np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


@pytest.mark.parametrize(("file", "kwargs"), [
    ("a.gguf", {"name": "Llama Guard 3 1B"}),  # what Llama Guard 3 GGUFs carry
    ("b.gguf", {"basename": "Llama-Guard-3"}),
    ("c.gguf", {"template": "{{ 'Task: Check if there is unsafe content' }}<BEGIN UNSAFE CONTENT CATEGORIES>"}),
    ("Llama-Guard-3-1B.Q4_K_M.gguf", {}),  # by its file name, as the storage scan finds judges
])
def test_a_llama_guard_file_is_recognised(tmp_path: Path, file: str, kwargs: dict[str, str]) -> None:
    facts = inspect_file(_guard_gguf(tmp_path / file, **kwargs))
    assert facts.llama_guard and facts.quantization == "Q8_0"


def test_the_name_given_counts_and_an_ordinary_model_is_not_a_guard(tmp_path: Path) -> None:
    p = _guard_gguf(tmp_path / "0123abcd", name="SmolLM2 135M")
    assert not inspect_file(p).llama_guard
    assert inspect_file(p, name="llama_guard_3_1b-q8_0.gguf").llama_guard  # a blob named by its sha256


def test_a_part_of_a_split_gguf_says_which(tmp_path: Path) -> None:
    p = tmp_path / "m-00002-of-00003.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_uint16("split.no", 1), w.add_uint16("split.count", 3), w.add_int32("split.tensors.count", 3)
    w.add_tensor("t", gguf.np.zeros(32, dtype=gguf.np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    facts = inspect_file(p)
    assert (facts.split_part, facts.split_count) == (2, 3)
    assert FileFacts.from_doc(facts.to_doc()) == facts


def test_a_safetensors_file_facts(tmp_path: Path) -> None:
    p = shard(tmp_path / "model.safetensors", {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
        "b": {"dtype": "F32", "shape": [8], "data_offsets": [64, 96]},
        "c": {"dtype": "F4", "shape": [2, 8], "data_offsets": [96, 104]},
    })
    facts = inspect_file(p)
    assert (facts.kind, facts.size, facts.tensor_count, facts.parameter_count, facts.data_bytes) == (
        "safetensors", os.path.getsize(p), 3, 32 + 8 + 16, 104)
    assert facts.dtypes == ("BF16", "F32", "F4")
    assert facts.to_doc() == {"kind": "safetensors", "size": facts.size, "tensor_count": 3, "parameter_count": 56,
                              "data_bytes": 104, "llama_guard": False, "dtypes": ["BF16", "F32", "F4"]}


def test_the_document_reads_back(tiny: Path, tmp_path: Path) -> None:
    st = shard(tmp_path / "x.safetensors", {"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})
    for facts in (inspect_file(tiny), inspect_file(st)):
        doc = json.loads(json.dumps(facts.to_doc()))
        assert FileFacts.from_doc(doc) == facts
    with pytest.raises(ValueError, match="unknown kind"):
        FileFacts.from_doc({"kind": "zip"})


def test_a_checkpoint_directory(tmp_path: Path) -> None:
    shard(tmp_path / "model-00001-of-00002.safetensors", {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}})
    shard(tmp_path / "model-00002-of-00002.safetensors", {"b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 4096}))
    facts = inspect_dir(tmp_path)
    assert [name for name, _ in facts.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert (facts.index, facts.tensor_count, facts.parameter_count, facts.data_bytes, facts.dtypes) == (
        True, 2, 6, 16, ("F16", "F32"))
    assert (facts.architecture, facts.model_type, facts.context_length) == ("LlamaForCausalLM", "llama", 4096)
    assert facts.to_doc()["files"]["model-00002-of-00002.safetensors"]["dtypes"] == ["F32"]


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    for n in (1, 2):
        shard(tmp_path / f"model-0000{n}-of-00002.safetensors",
              {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(WeightsError, match="lacks it|in both"):
        inspect_dir(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "x": "model-00002-of-00002.safetensors"}}))
    shard(tmp_path / "model-00002-of-00002.safetensors", {
        "a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
        "x": {"dtype": "F16", "shape": [4], "data_offsets": [8, 16]}})
    with pytest.raises(WeightsError, match="tensor 'a' is in both model-00001-of-00002.safetensors and model-00002"):
        inspect_dir(tmp_path)


def test_a_damaged_config_is_refused(tmp_path: Path) -> None:
    shard(tmp_path / "model.safetensors", {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}})
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(WeightsError, match="config.json is not a JSON object"):
        inspect_dir(tmp_path)


A = '{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'


@pytest.mark.parametrize(("blob", "reason"), [
    (b"PK\x03\x04" + b"\0" * 100, r"neither a GGUF nor a safetensors file \(it starts with b'PK"),
    (b"", "is empty"),
    (b"GGUF" + struct.pack("<I", 4) + b"\0" * 16, "version 4 is not supported"),
    (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0), "claims 1099511627776 tensors"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("k") + struct.pack("<IQ", 8, 1 << 62), "larger than 64 MiB"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2) + b"\xff\xfe", "metadata key at byte 32 is not UTF-8"),
    (minimal_gguf()[:-1], "truncated"),
    (minimal_gguf() + b"\0" * 40, "40 bytes after the tensor data"),
    (struct.pack("<Q", 1000) + b"{}", "shorter than its 1000-byte header"),
    (struct.pack("<Q", 2) + b"{}" + b"\0", "trailing bytes"),
    (struct.pack("<Q", 1 << 40) + b"{}", "claims a 1099511627776-byte header"),
    (struct.pack("<Q", len(A) + 6) + f'{{"a": {A}}}'.encode() + b"\0" * 10, "not JSON"),
    (struct.pack("<Q", 2 * len(A) + 14) + f'{{"a": {A}, "a": {A}}}'.encode() + b"\0" * 8, "'a' appears twice"),
])
def test_refusals_say_why(tmp_path: Path, blob: bytes, reason: str) -> None:
    p = tmp_path / "file"
    p.write_bytes(blob)
    with pytest.raises(WeightsError, match=reason) as refused:
        inspect_file(p)
    assert not refused.value.transient


@pytest.mark.parametrize(("header", "reason"), [
    ({"a": {"dtype": "F32", "shape": [-2, -1], "data_offsets": [0, 8]}}, "no valid dtype/shape/data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, "no valid dtype/shape/data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}}, "no valid dtype/shape/data_offsets"),
    ({"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, "no valid dtype/shape/data_offsets"),
    ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, "does not match its data"),  # half a byte
    ({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, "dtype Q9 is unknown to this llmgw"),
    ({"__metadata__": {"n": 1}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, "__metadata__"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, "does not match its data"),
])
def test_lying_safetensors_headers_are_refused(tmp_path: Path, header: dict[str, Any], reason: str) -> None:
    with pytest.raises(WeightsError, match=reason):
        inspect_file(shard(tmp_path / "x.safetensors", header))


def test_a_gguf_lying_about_its_data_or_of_an_unknown_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="header describes 702464 bytes"):
        inspect_file(write_lying_header(tmp_path / "lie.gguf"))
    blob = bytearray(minimal_gguf(tensors=2))
    at = blob.index(b"t1.weight") + len("t1.weight") + 4 + 8  # after its n_dims and its one dim: its type
    blob[at:at + 4] = struct.pack("<I", 77)
    p = tmp_path / "odd.gguf"
    p.write_bytes(bytes(blob))
    assert check_gguf(p).expected_size is None  # the storage scan reads it, size unchecked
    with pytest.raises(WeightsError, match="tensor 't1.weight' has type 77, unknown to this llmgw"):
        inspect_file(p)


def test_a_quantised_tensor_of_part_rows_is_refused(tmp_path: Path) -> None:
    """ggml wants each row whole blocks: 64 Q8_0 elements as 2 rows of 32 are fine, as 32 rows of 2 are not."""
    def one(dims: list[int]) -> Path:
        out = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _s("t") + struct.pack("<I", len(dims))
        out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", 8, 0)
        out += b"\0" * (-len(out) % 32) + b"\0" * 68
        p = tmp_path / "q.gguf"
        p.write_bytes(out)
        return p
    assert inspect_file(one([32, 2])).quantization is None
    with pytest.raises(WeightsError, match="rows of 2 elements, not whole Q8_0 blocks"):
        inspect_file(one([2, 32]))


def test_what_cannot_be_read_is_transient_and_a_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="cannot read") as refused:
        inspect_file(tmp_path / "absent.gguf")
    assert refused.value.transient
    with pytest.raises(WeightsError, match="is a directory"):
        inspect_file(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(WeightsError, match="fifo is not a regular file"):
        inspect_file(tmp_path / "fifo")
