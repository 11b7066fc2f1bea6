"""safetensors checks on real files in tmp_path: complete files and directories pass; truncated
files, lying headers and indexes naming missing shards are refused with a reason."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from llmgw.weights import WeightsError
from llmgw.weights.safetensors import INDEX_NAME, check_safetensors_dir, read_index, read_shard


def header_for(tensors: dict[str, int]) -> dict[str, Any]:
    """F32 tensors of the given lengths, laid end to end."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [at, at + 4 * n]}
        at += 4 * n
    return header


def write_shard(path: Path, tensors: dict[str, int] | None = None, *, header: dict[str, Any] | None = None,
                data: int | None = None) -> Path:
    h = header if header is not None else header_for(tensors or {"w": 4})
    raw = json.dumps(h).encode()
    end = max((v.get("data_offsets", [0, 0])[1] for k, v in h.items() if k != "__metadata__"), default=0)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\1" * (end if data is None else data))
    return path


def write_index(d: Path, weight_map: dict[str, str]) -> None:
    (d / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def test_a_complete_file_passes(tmp_path: Path) -> None:
    shard = read_shard(write_shard(tmp_path / "model.safetensors", {"a": 4, "b": 6}))
    assert shard.tensors == {"a", "b"} and shard.parameters == 10
    assert shard.size == (tmp_path / "model.safetensors").stat().st_size


@pytest.mark.parametrize(("data", "reason"), [(10, "truncated"), (0, "truncated"), (100, "trailing bytes")])
def test_a_file_of_the_wrong_length_is_refused(tmp_path: Path, data: int, reason: str) -> None:
    with pytest.raises(WeightsError, match=reason):
        read_shard(write_shard(tmp_path / "model.safetensors", {"a": 4, "b": 6}, data=data))


@pytest.mark.parametrize(("blob", "reason"), [
    (b"\1\2\3", "too short"),
    (struct.pack("<Q", 1 << 40) + b"{}", "claims a 1099511627776-byte header"),
    (struct.pack("<Q", 100) + b"{}", "shorter than its 100-byte header"),
    (struct.pack("<Q", 4) + b"nope", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
])
def test_a_damaged_header_is_refused(tmp_path: Path, blob: bytes, reason: str) -> None:
    (tmp_path / "model.safetensors").write_bytes(blob)
    with pytest.raises(WeightsError, match=reason):
        read_shard(tmp_path / "model.safetensors")


@pytest.mark.parametrize(("header", "reason"), [
    ({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 16]}}, "does not match its data"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, "expected 0"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, "gap or overlap"),
    ({"a": {"dtype": "F32", "shape": [4]}}, "no valid dtype/shape/data_offsets"),
])
def test_a_header_that_lies_about_its_data_is_refused(tmp_path: Path, header: dict[str, Any], reason: str) -> None:
    with pytest.raises(WeightsError, match=reason):
        read_shard(write_shard(tmp_path / "model.safetensors", header=header))


def test_an_unknown_dtype_is_not_size_checked_but_still_tiled(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F3_NEW", "shape": [8], "data_offsets": [0, 3]}}
    assert read_shard(write_shard(tmp_path / "model.safetensors", header=header)).parameters == 8


def test_a_sharded_directory_with_its_index_passes(tmp_path: Path) -> None:
    write_shard(tmp_path / "model-00001-of-00002.safetensors", {"a": 4})
    write_shard(tmp_path / "model-00002-of-00002.safetensors", {"b": 4})
    write_index(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    assert [s.path.name for s in check_safetensors_dir(tmp_path)] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_an_index_naming_a_missing_shard_is_refused(tmp_path: Path) -> None:
    write_shard(tmp_path / "model-00001-of-00002.safetensors", {"a": 4})
    write_index(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    with pytest.raises(WeightsError, match="names model-00002-of-00002.safetensors, which is not there"):
        check_safetensors_dir(tmp_path)


def test_an_index_mapping_a_tensor_its_shard_lacks_is_refused(tmp_path: Path) -> None:
    write_shard(tmp_path / "model-00001-of-00001.safetensors", {"a": 4})
    write_index(tmp_path, {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"})
    with pytest.raises(WeightsError, match="puts 'b' in model-00001-of-00001.safetensors, whose header lacks it"):
        check_safetensors_dir(tmp_path)


@pytest.mark.parametrize(("content", "reason"), [
    ('{"weight_map": {"a": "../elsewhere.safetensors"}}', "not a file name in this directory"),
    ('{"weight_map": {}}', "no weight_map"),
    ('{"weight_map": ', "not JSON"),
])
def test_a_bad_index_is_refused(tmp_path: Path, content: str, reason: str) -> None:
    (tmp_path / INDEX_NAME).write_text(content)
    with pytest.raises(WeightsError, match=reason):
        read_index(tmp_path / INDEX_NAME)


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="neither"):
        check_safetensors_dir(tmp_path)
