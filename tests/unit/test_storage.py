"""Storage observation on real directories (tmp_path): what is weights and what is not, with
why; configured, never guessed; rescans that re-read nothing unchanged; scans that never raise."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from llmgw.agent.storage import (
    MAX_CONFIG_BYTES, MAX_NOT_WEIGHTS, StorageDir, StorageReport, StorageScanner, parse_storage_flag, parse_storage_flags,
)
from tests.support.tiny_gguf import minimal_gguf, truncate
from tests.support.weights_tree import write_safetensors, write_safetensors_model

AS_ROOT = os.geteuid() == 0
GGUF_SIZE = len(minimal_gguf())


def gguf_at(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(minimal_gguf())
    return path


def scan_one(root: Path, *, shared: bool = False) -> StorageReport:
    (report,) = StorageScanner([StorageDir(root, "ib-a", shared)]).scan_reports()
    return report


def refused(report: StorageReport) -> dict[str, str]:
    return {os.path.relpath(n.path, report.path): n.reason for n in report.not_weights}


def test_told_nothing_it_reports_nothing() -> None:
    assert StorageScanner([]).scan() == ()


def test_weights_are_reported_with_fabric_and_sharing_as_configured(tmp_path: Path) -> None:
    for d in ("local", "filer"):
        gguf_at(tmp_path / d / "m.gguf")
        write_safetensors_model(tmp_path / d / "hf", shards=2)
    docs = StorageScanner([StorageDir(tmp_path / "local", "ib-a"),
                           StorageDir(tmp_path / "filer", "ib-b", shared=True)]).scan()
    assert [(d["fabric"], d["shared"], d["error"]) for d in docs] == [("ib-a", False, ""), ("ib-b", True, "")]
    assert docs[0]["models"] == [
        {"name": "hf", "path": str(tmp_path / "local" / "hf"), "kind": "safetensors",
         "size": sum(p.stat().st_size for p in (tmp_path / "local" / "hf").glob("*.safetensors")),
         "architecture": "LlamaForCausalLM", "parameters": 16},
        {"name": "m", "path": str(tmp_path / "local" / "m.gguf"), "kind": "gguf", "size": GGUF_SIZE,
         "architecture": "llama", "parameters": 32, "tensor_bytes": 128},
    ]
    assert docs[0]["not_weights"] == []
    assert StorageReport.from_doc(docs[1]).to_doc() == docs[1]


def test_an_empty_directory_is_not_weights(tmp_path: Path) -> None:
    (tmp_path / "models" / "empty").mkdir(parents=True)
    (tmp_path / "models" / "only-hidden").mkdir()
    (tmp_path / "models" / "only-hidden" / ".lock").write_text("")
    report = scan_one(tmp_path / "models")
    assert report.models == ()
    assert refused(report) == {"empty": "empty directory", "only-hidden": "empty directory"}
    (tmp_path / "bare").mkdir()
    assert refused(scan_one(tmp_path / "bare")) == {".": "empty directory"}


def test_partial_downloads_are_not_weights(tmp_path: Path) -> None:
    gguf_at(tmp_path / "a.gguf.part")
    gguf_at(tmp_path / "b.gguf.incomplete")
    write_safetensors_model(tmp_path / "hf-part", shards=2)
    (tmp_path / "hf-part" / "model-00002-of-00002.safetensors.incomplete").write_bytes(b"x")
    write_safetensors_model(tmp_path / "hf-cli", shards=1)
    pending = tmp_path / "hf-cli" / ".cache" / "huggingface" / "download"
    pending.mkdir(parents=True)
    (pending / "abc123.incomplete").write_bytes(b"x")
    report = scan_one(tmp_path)
    assert report.models == ()
    assert refused(report) == {
        "a.gguf.part": "partial download (.part file)",
        "b.gguf.incomplete": "partial download (.incomplete file)",
        "hf-part": "partial download: model-00002-of-00002.safetensors.incomplete is still there",
        "hf-cli": "download in progress: .cache/huggingface/download/abc123.incomplete",
    }


def test_a_gguf_beside_safetensors_is_still_seen(tmp_path: Path) -> None:
    write_safetensors_model(tmp_path / "repo", shards=2)
    gguf_at(tmp_path / "repo" / "repo-q4.gguf")
    gguf_at(tmp_path / "repo" / "sub" / "other.gguf")
    (tmp_path / "repo" / "model-00003-of-00003.safetensors.part").write_bytes(b"")
    report = scan_one(tmp_path)
    assert sorted(m.name for m in report.models) == ["other", "repo-q4"]
    assert refused(report) == {"repo": "partial download: model-00003-of-00003.safetensors.part is still there"}


def test_an_index_naming_a_missing_shard_is_not_weights(tmp_path: Path) -> None:
    write_safetensors_model(tmp_path / "hf", shards=3)
    (tmp_path / "hf" / "model-00002-of-00003.safetensors").unlink()
    assert refused(scan_one(tmp_path)) == {
        "hf": "hf: model.safetensors.index.json names model-00002-of-00003.safetensors, which is not there"}


def test_shards_without_an_index_must_all_be_there(tmp_path: Path) -> None:
    (tmp_path / "two").mkdir()
    write_safetensors(tmp_path / "two" / "model-00001-of-00002.safetensors", {"a": 4})
    (tmp_path / "lone").mkdir()
    write_safetensors(tmp_path / "lone" / "adapter_model.safetensors", {"a": 4})
    report = scan_one(tmp_path)
    assert [m.name for m in report.models] == ["lone"]
    assert refused(report) == {"two": "1 of 2 shards and no model.safetensors.index.json"}


def test_a_truncated_gguf_is_not_weights(tmp_path: Path) -> None:
    truncate(gguf_at(tmp_path / "cut.gguf"), GGUF_SIZE - 10)
    truncate(gguf_at(tmp_path / "header.gguf"), 40)
    assert refused(scan_one(tmp_path)) == {
        "cut.gguf": f"GGUF cut.gguf is {GGUF_SIZE - 10} bytes but its header describes {GGUF_SIZE} bytes "
                    "of tensor data "
                    "(truncated, or a header that does not match its data)",
        "header.gguf": "GGUF file ends inside its header at byte 40 (metadata key): truncated",
    }


def test_a_split_gguf_is_one_model_when_every_part_is_there(tmp_path: Path) -> None:
    for i in (1, 2, 3):
        gguf_at(tmp_path / "full" / f"big-{i:05d}-of-00003.gguf")
    for i in (1, 3):
        gguf_at(tmp_path / "gap" / f"big-{i:05d}-of-00003.gguf")
    report = scan_one(tmp_path)
    assert [(m.name, m.path, m.size) for m in report.models] == [
        ("big", str(tmp_path / "full" / "big-00001-of-00003.gguf"), 3 * GGUF_SIZE)]
    assert refused(report) == {"gap/big-00001-of-00003.gguf": "split GGUF: part 2 of 3 is not there"}
    assert report.models[0].to_doc()["tensor_bytes"] == 3 * 128  # every part's data, not the first's


def test_a_gguf_entry_carries_the_facts_a_memory_estimate_needs(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import write_tiny_llama

    write_tiny_llama(tmp_path / "tiny.gguf")
    (entry,) = StorageScanner([StorageDir(tmp_path, "ib-a")]).scan()[0]["models"]
    assert {k: entry[k] for k in ("layers", "context_length", "embedding_length", "head_count",
                                  "head_count_kv", "quantization")} == {
        "layers": 2, "context_length": 2048, "embedding_length": 64, "head_count": 4, "head_count_kv": 2,
        "quantization": "F32"}
    assert "key_length" not in entry and "value_length" not in entry  # not in this header: absent, not 0
    # 21 F32 tensors: 2 x (512 x 64) embeddings, and per layer 4 x 64 x 64 attention (k, v: 32 rows),
    # 3 x 128 x 64 feed-forward and two norms of 64; the output norm.
    per_layer = 4 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 3 * 128 * 64 + 2 * 64)
    assert entry["tensor_bytes"] == 4 * 2 * 512 * 64 + 2 * per_layer + 4 * 64
    assert StorageReport.from_doc({"path": "/m", "fabric": "f", "shared": False, "models": [entry]}).models[0] \
        .to_doc() == entry


def test_a_safetensors_entry_carries_what_config_json_says(tmp_path: Path) -> None:
    d = write_safetensors_model(tmp_path / "qwen", shards=2)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28, "num_key_value_heads": 4,
        "hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16", "head_dim": True, "vocab_size": 152064}))
    # A multimodal model nests its language model's config: that one counts.
    v = write_safetensors_model(tmp_path / "vl", shards=1)
    (v / "config.json").write_text(json.dumps({
        "architectures": ["LlavaForConditionalGeneration"], "num_hidden_layers": 99,
        "text_config": {"num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128, "dtype": "float16"}}))
    models = {m["name"]: m for m in StorageScanner([StorageDir(tmp_path, "ib-a")]).scan()[0]["models"]}
    facts = {k: v for k, v in models["qwen"].items() if k not in ("name", "path", "kind", "size", "parameters")}
    assert facts == {"architecture": "Qwen2ForCausalLM", "layers": 28, "head_count_kv": 4, "embedding_length": 3584,
                     "head_count": 28, "context_length": 32768, "dtype": "bfloat16"}  # head_dim True: not a number
    assert (models["vl"]["layers"], models["vl"]["key_length"], models["vl"]["value_length"]) == (32, 128, 128)
    assert models["vl"]["dtype"] == "float16" and "tensor_bytes" not in models["vl"]


def test_a_config_json_is_read_bounded_and_a_bad_one_says_nothing(tmp_path: Path) -> None:
    big = write_safetensors_model(tmp_path / "big", shards=1)
    (big / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "pad": "x" * MAX_CONFIG_BYTES}))
    bad = write_safetensors_model(tmp_path / "bad", shards=1)
    (bad / "config.json").write_text("[" * 100_000)
    models = {m.name: m for m in scan_one(tmp_path).models}
    assert models["big"].facts == () and models["bad"].facts == () and models["bad"].architecture is None


def test_a_gguf_of_unknown_tensor_types_is_weights_with_a_note(tmp_path: Path) -> None:
    blob = bytearray(minimal_gguf())
    at = blob.index(b"t0.weight") + len(b"t0.weight") + 4 + 8
    blob[at:at + 4] = (77).to_bytes(4, "little")
    (tmp_path / "new.gguf").write_bytes(bytes(blob))
    (model,) = scan_one(tmp_path).models
    assert "type 77" in model.note and model.to_doc()["note"] == model.note


def test_a_root_that_vanishes_mid_scan_is_an_error_not_an_exception(tmp_path: Path) -> None:
    root = tmp_path / "models"
    gguf_at(root / "a.gguf")
    gguf_at(root / "sub" / "b.gguf")
    scanner = StorageScanner([StorageDir(root, "ib-a")], on_entry=lambda p: shutil.rmtree(root, ignore_errors=True))
    (doc,) = scanner.scan()
    assert doc["error"] == f"{root} vanished during the scan"
    assert doc["models"] == [] and doc["not_weights"] == []


def test_a_subdirectory_that_vanishes_mid_scan_is_not_weights(tmp_path: Path) -> None:
    gguf_at(tmp_path / "a" / "x.gguf")
    gguf_at(tmp_path / "b" / "y.gguf")

    def remove_b(path: Path) -> None:
        if path.name == "a":
            shutil.rmtree(tmp_path / "b")

    (report,) = StorageScanner([StorageDir(tmp_path, "ib-a")], on_entry=remove_b).scan_reports()
    assert report.error == "" and [m.name for m in report.models] == ["x"]
    assert refused(report) == {"b": "vanished during the scan"}


def test_a_missing_or_wrong_root_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    docs = StorageScanner([StorageDir(tmp_path / "absent", "ib-a"), StorageDir(tmp_path / "file", "ib-a")]).scan()
    assert [d["error"] for d in docs] == [
        f"cannot read {tmp_path / 'absent'}: No such file or directory", f"{tmp_path / 'file'} is not a directory"]


@pytest.mark.skipif(AS_ROOT, reason="root reads through chmod 000")
def test_an_unreadable_directory_is_an_error_or_not_weights(tmp_path: Path) -> None:
    gguf_at(tmp_path / "root" / "locked" / "a.gguf")
    (tmp_path / "root" / "locked").chmod(0)
    try:
        assert refused(scan_one(tmp_path / "root")) == {"locked": "cannot read: Permission denied"}
        (tmp_path / "root").chmod(0)
        assert scan_one(tmp_path / "root").error == f"cannot read {tmp_path / 'root'}: Permission denied"
    finally:
        (tmp_path / "root").chmod(0o755)
        (tmp_path / "root" / "locked").chmod(0o755)


def test_symlinks_outside_the_directory_are_not_followed(tmp_path: Path) -> None:
    gguf_at(tmp_path / "elsewhere" / "o.gguf")
    root = tmp_path / "root"
    gguf_at(root / "real" / "m.gguf")
    (root / "out.gguf").symlink_to(tmp_path / "elsewhere" / "o.gguf")
    (root / "outdir").symlink_to(tmp_path / "elsewhere")
    (root / "again").symlink_to(root / "real")  # inside: walked once, under its own path
    (root / "dangling.gguf").symlink_to(root / "nothing")
    report = scan_one(root)
    assert [m.path for m in report.models] == [str(root / "real" / "m.gguf")]
    assert refused(report) == {
        "out.gguf": f"symlink to {tmp_path / 'elsewhere' / 'o.gguf'}, outside {root}: not followed",
        "outdir": f"symlink to {tmp_path / 'elsewhere'}, outside {root}: not followed",
        "dangling.gguf": "broken symlink",
    }


def test_depth_is_bounded(tmp_path: Path) -> None:
    gguf_at(tmp_path / "a" / "b" / "c" / "deep.gguf")
    (report,) = StorageScanner([StorageDir(tmp_path, "ib-a")], max_depth=2).scan_reports()
    assert report.models == ()
    assert refused(report) == {"a/b/c": f"deeper than 2 levels below {tmp_path}: not scanned"}


def test_a_hugging_face_cache_names_models_by_repo(tmp_path: Path) -> None:
    snap = tmp_path / "models--org--tiny" / "snapshots" / "0123abcd"
    write_safetensors_model(snap, shards=1)
    assert [m.name for m in scan_one(tmp_path).models] == ["org/tiny"]


def test_not_weights_is_bounded(tmp_path: Path) -> None:
    for i in range(MAX_NOT_WEIGHTS + 5):
        (tmp_path / f"{i:04d}.gguf.part").write_bytes(b"")
    doc = scan_one(tmp_path).to_doc()
    assert len(doc["not_weights"]) == MAX_NOT_WEIGHTS and doc["omitted"] == 5


def test_a_rescan_reads_only_what_changed(tmp_path: Path) -> None:
    gguf_at(tmp_path / "a.gguf")
    gguf_at(tmp_path / "b.gguf")
    write_safetensors_model(tmp_path / "hf", shards=2)  # index + 2 shards + config
    scanner = StorageScanner([StorageDir(tmp_path, "ib-a")])
    first = scanner.scan()
    assert scanner.reads == 6
    assert scanner.scan() == first and scanner.reads == 6
    b = tmp_path / "b.gguf"
    os.utime(b, ns=(b.stat().st_atime_ns, b.stat().st_mtime_ns + 1_000_000))
    scanner.scan()
    assert scanner.reads == 7
    truncate(tmp_path / "a.gguf", 100)  # same inode and (maybe) mtime, new size: read again
    (doc,) = scanner.scan()
    assert scanner.reads == 8 and [n["path"] for n in doc["not_weights"]] == [str(tmp_path / "a.gguf")]
    (tmp_path / "a.gguf").unlink()
    scanner.scan()
    assert scanner.reads == 8 and len(scanner._cache) == 5  # what is gone is forgotten


@pytest.mark.skipif(AS_ROOT, reason="root reads through chmod 000")
def test_a_file_that_cannot_be_read_is_read_again_next_time(tmp_path: Path) -> None:
    a = gguf_at(tmp_path / "a.gguf")
    a.chmod(0)
    scanner = StorageScanner([StorageDir(tmp_path, "ib-a")])
    try:
        (report,) = scanner.scan_reports()
        assert refused(report) == {"a.gguf": f"cannot read {a}: Permission denied"}
    finally:
        a.chmod(0o644)
    assert [m.name for m in scanner.scan_reports()[0].models] == ["a"] and scanner.reads == 2


def test_a_file_that_vanishes_mid_scan_is_not_weights_then_found_again(tmp_path: Path) -> None:
    a = gguf_at(tmp_path / "a.gguf")
    scanner = StorageScanner([StorageDir(tmp_path, "ib-a")],
                             on_entry=lambda p: p.unlink() if p.name == "a.gguf" and scanner.reads == 0 else None)
    gguf_at(tmp_path / "b.gguf")
    (report,) = scanner.scan_reports()
    assert refused(report) == {"a.gguf": "vanished during the scan"}
    gguf_at(a)
    assert [m.name for m in scanner.scan_reports()[0].models] == ["a", "b"]


@pytest.mark.parametrize(("flag", "expected"), [
    ("/srv/models:ib-a", StorageDir(Path("/srv/models"), "ib-a", False)),
    ("/srv/filer/:ib-b:shared", StorageDir(Path("/srv/filer"), "ib-b", True)),
    ("/srv/models:eth.0:local", StorageDir(Path("/srv/models"), "eth.0", False)),
])
def test_storage_flags_parse(flag: str, expected: StorageDir) -> None:
    assert parse_storage_flag(flag) == expected
    assert parse_storage_flag(str(expected)) == expected


@pytest.mark.parametrize(("flag", "reason"), [
    ("models:ib-a", "must be absolute"),
    ("/srv/models:", "fabric is empty"),
    ("/srv/models:ib-a:sharde", "unknown suffix 'sharde'"),
    ("/srv/models", "expected PATH:FABRIC"),
    ("/srv/a:b:c:shared", "expected PATH:FABRIC"),
    ("/srv/models:ib a", "may hold only"),
])
def test_bad_storage_flags_say_why(flag: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_storage_flag(flag)


def test_the_same_directory_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="one directory is inside the other"):
        parse_storage_flags(["/srv/models:ib-a", "/srv/models/gguf:ib-a:shared"])
    assert len(parse_storage_flags(["/srv/a:ib-a", "/srv/ab:ib-a"])) == 2
