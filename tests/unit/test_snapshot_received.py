"""A snapshot the leader sends is read whole before it replaces the member's own (llmgw/store/snapshot.py,
`check_received`). The fault campaign (seed 4101, round 108) saw chunks of two transfers interleave on a
rejoined member: the file was longer than its header, pysyncobj renamed it over the member's good
snapshot before anything read it, the load refused it, and the member's next start refused too.

These drive pysyncobj's own Serializer, on both sides: the leader's chunks of two snapshots, the
follower's file, in the orders that broke it and in the one that works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.serializer import Serializer

from llmgw.domain import commands
from llmgw.domain.state import ClusterState
from llmgw.domain.model import ModelDef
from llmgw.store.snapshot import Snapshot, check_received, read, write

CHUNK = 4096


def state_with(models: int) -> ClusterState:
    state = ClusterState()
    for i in range(models):
        model = ModelDef.from_doc({"name": f"m{i}-{'x' * 40}", "engine": "sim", "source": f"sim://m{i}"})
        state, _ = commands.apply(state, commands.put_model(model, 1.0 + i))
    return state


def chunks_of(path: Path) -> list[tuple[bytes, bool, bool]]:
    """What a leader's Serializer sends for the snapshot at `path` (data, is_first, is_last)."""
    sender = Serializer(str(path), CHUNK, False, None, None, None)
    out: list[tuple[bytes, bool, bool]] = []
    opened = None
    try:
        while True:
            data = sender.getTransmissionData("follower")
            assert data is not None and data is not False
            opened = opened or sender._Serializer__transmissions["follower"]["file"]
            out.append(data)
            if data[2]:
                return out
    finally:
        if opened is not None:
            opened.close()


@pytest.fixture
def follower(tmp_path: Path) -> tuple[Serializer, Path, bytes]:
    own = tmp_path / "follower" / "snapshot.json"
    own.parent.mkdir()
    write(own, Snapshot(state_with(3), (b"x", 7, 1), (b"w", 6, 1)))
    receiver = Serializer(str(own), CHUNK, False, None, None, None)
    check_received(receiver)
    return receiver, own, own.read_bytes()


def snapshots(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    write(first, Snapshot(state_with(120), (b"x", 500, 2), (b"w", 499, 2)))
    write(second, Snapshot(state_with(200), (b"x", 900, 3), (b"w", 899, 3)))
    return first, second


def feed(receiver: Serializer, chunks: list[tuple[bytes, bool, bool]]) -> list[bool]:
    return [bool(receiver.setTransmissionData(c)) for c in chunks]


def test_two_transfers_interleaved_never_replace_the_members_own_snapshot(
        tmp_path: Path, follower: tuple[Serializer, Path, bytes]) -> None:
    receiver, own, before = follower
    first, second = snapshots(tmp_path)
    old, new = chunks_of(first), chunks_of(second)
    assert len(old) > 4 and len(new) > 4
    # The old transfer starts, the new one restarts the file, the old one's queued chunks land after it.
    done = feed(receiver, old[:3] + new[:2] + old[3:])
    assert not any(done), "a file longer than its header is never taken"
    assert own.read_bytes() == before, "the member keeps its own snapshot"
    assert not own.with_name(own.name + ".1.tmp").exists()
    # The leader sends it again, whole: taken, and what was sent is what is on disk.
    assert feed(receiver, new)[-1] is True
    assert own.read_bytes() == second.read_bytes()
    assert read(own).last == (b"x", 900, 3)


def test_a_last_chunk_without_its_first_is_ignored(tmp_path: Path, follower: tuple[Serializer, Path, bytes]) -> None:
    receiver, own, before = follower
    _, second = snapshots(tmp_path)
    assert feed(receiver, chunks_of(second)[2:]) == [False] * (len(chunks_of(second)) - 2)
    assert own.read_bytes() == before


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_whatever_the_order_the_file_on_disk_is_one_the_leader_sent_whole(tmp_path_factory: Any, data: Any) -> None:
    """Property: chunks of two transfers in any interleaving (each in its own order) leave on disk the
    member's own snapshot or one of the two sent, whole: never a mix."""
    tmp_path = tmp_path_factory.mktemp("order")
    own = tmp_path / "snapshot.json"
    write(own, Snapshot(state_with(2), (b"x", 7, 1), (b"w", 6, 1)))
    receiver = Serializer(str(own), CHUNK, False, None, None, None)
    check_received(receiver)
    first, second = snapshots(tmp_path)
    a, b = chunks_of(first), chunks_of(second)
    picks = data.draw(st.lists(st.booleans(), min_size=len(a) + len(b), max_size=len(a) + len(b)))
    merged, i, j = [], 0, 0
    for take_a in picks:
        if (take_a and i < len(a)) or j >= len(b):
            merged.append(a[i])
            i += 1
        else:
            merged.append(b[j])
            j += 1
    possible = {own.read_bytes(), first.read_bytes(), second.read_bytes()}
    feed(receiver, merged)
    assert own.read_bytes() in possible
    read(own)  # and it reads
