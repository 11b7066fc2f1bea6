"""Directories of weights for storage tests and the scan benchmark: safetensors files and models
(standard library only), and `build_tree`: a mixed tree of GGUFs, safetensors models and junk."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.support.tiny_gguf import minimal_gguf

__all__ = ["build_tree", "write_safetensors", "write_safetensors_model"]


def write_safetensors(path: Path, tensors: dict[str, int]) -> Path:
    """A complete safetensors file of F32 tensors with the given lengths."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [at, at + 4 * n]}
        at += 4 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * at)
    return path


def write_safetensors_model(d: Path, *, shards: int = 2, arch: str = "LlamaForCausalLM") -> Path:
    """A Hugging Face style model directory: config.json, `shards` shards and their index
    (one shard: a lone model.safetensors, no index)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "llama"}))
    if shards == 1:
        write_safetensors(d / "model.safetensors", {"w0": 8})
        return d
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        write_safetensors(d / name, {f"w{i}": 8})
        weight_map[f"w{i}"] = name
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def build_tree(root: Path, files: int = 2000) -> dict[str, int]:
    """About `files` files under `root`, in 20-file folders: per folder 8 GGUFs, one 3-shard
    safetensors model (5 files), 3 partial downloads and junk. Returns what it wrote, by kind."""
    counts = {"gguf": 0, "safetensors": 0, "partial": 0, "junk": 0, "files": 0}
    blob = minimal_gguf(tensors=2)
    folder = 0
    while counts["files"] < files:
        d = root / f"group-{folder // 10:03d}" / f"folder-{folder:04d}"
        d.mkdir(parents=True)
        for i in range(8):
            (d / f"model-{folder}-{i}.gguf").write_bytes(blob)
        counts["gguf"] += 8
        write_safetensors_model(d / f"hf-{folder}", shards=3)
        counts["safetensors"] += 1
        for suffix in (".part", ".incomplete", ".tmp"):
            (d / f"download-{folder}.gguf{suffix}").write_bytes(blob[:100])
        counts["partial"] += 3
        for i in range(4):
            (d / f"notes-{i}.txt").write_text("not weights")
        counts["junk"] += 4
        counts["files"] += 20
        folder += 1
    return counts
