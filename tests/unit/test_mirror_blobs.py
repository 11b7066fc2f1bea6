"""The mirror's blob store on one control plane's disk (llmgw/mirror/blobs.py): an upload resumes at its offset,
a piece at another offset is refused with the offset held, a torn piece is continued, a commit hashes, inspects
and keeps the file, a refused file is deleted, a corrupt blob is detected, and unnamed blobs are collected."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.mirror.blobs import BlobStore, MirrorError, upload_id
from llmgw.mirror.inspect import FileFacts
from llmgw.control.ops.mirror import INSPECT as inspect_file
from llmgw.weights import WeightsError
from tests.support.tiny_gguf import minimal_gguf

DATA = minimal_gguf(elements=4096)
SHA = hashlib.sha256(DATA).hexdigest()


async def body(*pieces: bytes) -> AsyncIterator[bytes]:
    for p in pieces:
        yield p


async def torn(data: bytes, keep: int) -> AsyncIterator[bytes]:
    """A body whose connection drops after `keep` bytes."""
    yield data[:keep]
    raise ConnectionResetError("the client went away")


def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "mirror", clock=lambda: 7.0)


async def test_an_upload_resumes_at_its_offset_and_another_offset_is_refused(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.start("tiny", len(DATA), SHA)
    assert (up.offset, up.id) == (0, upload_id("tiny", len(DATA), SHA))
    up = await s.write(up.id, 0, len(DATA), body(DATA[:1000], DATA[1000:3000]))
    assert up.offset == 3000
    assert s.start("tiny", len(DATA), SHA).offset == 3000  # started again: found, with its offset
    with pytest.raises(MirrorError) as e:
        await s.write(up.id, 1000, len(DATA), body(DATA[1000:2000]))
    assert (e.value.status, e.value.code, e.value.offset) == (409, "upload_offset_mismatch", 3000)
    up = await s.write(up.id, 3000, len(DATA), body(DATA[3000:]))
    assert up.offset == len(DATA)
    done, sha, facts, path = s.finish(up.id, inspect_file)
    assert (sha, facts.kind, path) == (SHA, "gguf", s.blobs / SHA)
    assert path.read_bytes() == DATA and s.in_progress() == [] and s.held() == {SHA: len(DATA)}


async def test_a_torn_piece_keeps_what_arrived_and_the_upload_goes_on_from_there(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.start("tiny", len(DATA), None)
    with pytest.raises(ConnectionResetError):
        await s.write(up.id, 0, len(DATA), torn(DATA, 5000))
    held = s.get(up.id).offset
    assert held == 5000
    await s.write(up.id, held, len(DATA), body(DATA[held:]))
    assert s.finish(up.id, inspect_file)[1] == SHA


async def test_bytes_past_the_size_are_refused(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.start("tiny", 10, None)
    with pytest.raises(MirrorError) as e:
        await s.write(up.id, 0, 10, body(b"x" * 12))
    assert e.value.code == "invalid_request" and s.get(up.id).offset == 10


async def test_a_refused_file_and_a_wrong_sha256_are_deleted(tmp_path: Path) -> None:
    s = store(tmp_path)
    bad = DATA[:-100]
    up = s.start("bad", len(bad), None)
    await s.write(up.id, 0, len(bad), body(bad))
    with pytest.raises(MirrorError) as e:
        s.finish(up.id, inspect_file)
    assert e.value.code == "invalid_file" and "truncated" in e.value.message
    other = s.start("tiny", len(DATA), "0" * 64)
    await s.write(other.id, 0, len(DATA), body(DATA))
    with pytest.raises(MirrorError) as e:
        s.finish(other.id, inspect_file)
    assert e.value.code == "sha256_mismatch"
    assert list(s.uploads.iterdir()) == [] and s.held() == {}


async def test_an_incomplete_upload_is_not_committed(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.start("tiny", len(DATA), None)
    await s.write(up.id, 0, len(DATA), body(DATA[:10]))
    with pytest.raises(MirrorError) as e:
        s.finish(up.id, inspect_file)
    assert (e.value.code, e.value.offset) == ("upload_incomplete", 10) and s.get(up.id).offset == 10


async def test_a_corrupt_blob_is_detected_and_unnamed_blobs_are_collected(tmp_path: Path) -> None:
    s = store(tmp_path)
    up = s.start("tiny", len(DATA), None)
    await s.write(up.id, 0, len(DATA), body(DATA))
    s.finish(up.id, lambda p, name: FileFacts("gguf", 0, 0, 0, 0, False))
    assert s.verify(SHA)
    with (s.blobs / SHA).open("r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    assert not s.verify(SHA)
    (s.blobs / "not-a-blob.txt").write_text("left alone")
    assert s.collect(frozenset({SHA})) == [] and s.held() == {SHA: len(DATA)}
    assert s.collect(frozenset()) == [SHA] and s.held() == {}
    assert (s.blobs / "not-a-blob.txt").exists()


def test_a_commit_refuses_what_is_neither_gguf_nor_safetensors(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(WeightsError):
        inspect_file(p, "f")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.sampled_from(["ok", "torn", "wrong"])), min_size=1,
                max_size=30))
def test_any_pieces_cuts_and_wrong_offsets_end_in_the_exact_file(steps: list[tuple[int, str]]) -> None:
    """Whatever pieces a client sends, cut or at a wrong offset, continuing from the offset the store says always
    ends in exactly the file's bytes."""

    async def main(root: Path) -> None:
        s = BlobStore(root)
        up = s.start("tiny", len(DATA), SHA)
        for n, how in [*steps, (len(DATA), "ok")]:
            at = s.get(up.id).offset
            if at == len(DATA):
                break
            if how == "wrong":
                with pytest.raises(MirrorError):
                    await s.write(up.id, (at + 1 + n) % len(DATA) if (at + 1 + n) % len(DATA) != at else at + 1,
                                  len(DATA), body(b"x"))
            elif how == "torn":
                with pytest.raises(ConnectionResetError):
                    await s.write(up.id, at, len(DATA), torn(DATA[at:at + n], n // 2))
            else:
                await s.write(up.id, at, len(DATA), body(DATA[at:at + n]))
        while (at := s.get(up.id).offset) < len(DATA):
            await s.write(up.id, at, len(DATA), body(DATA[at:]))
        assert s.finish(up.id, inspect_file)[3].read_bytes() == DATA

    with tempfile.TemporaryDirectory() as root:
        trio.run(main, Path(root))
