"""The request log on real files (tmp_path): records come back newest first, filtered and paged; a
torn or damaged line is skipped; retention by bytes and age; the queue never blocks; the writer's
interval (MockClock); rollups batched, sent again with the same seq, and applied once."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.domain import codec, commands, usage
from llmgw.domain.commands.usage import add_usage, row_doc
from llmgw.domain.state import ClusterState
from llmgw.gateway.requestlog import (
    FIELDS,
    Limits,
    RequestLog,
    RequestRecord,
    Rollups,
    SegmentWriter,
    segments,
)
from llmgw.gateway.requestlog_query import find, parse_cursor, query
from llmgw.wire.logquery import ID_RE, Filters, QueryError, gateway_tag


def rec(i: int, *, key: str | None = None, model: str | None = None, status: int = 200, replica: str = "r1",
        t0: float = 1_000_000.0, priority: str = "") -> RequestRecord:
    return RequestRecord(f"req-gw-{i:016x}", t0 + i, key if key is not None else f"key_{i % 3}",
                         model if model is not None else f"m{i % 2}", status, "", replica, "n1",
                         "/v1/chat/completions", 10, 20, 5.0, None, "", "gw", priority=priority)


def write(directory: Path, records: list[RequestRecord], segment_bytes: int = 4000) -> SegmentWriter:
    writer = SegmentWriter(directory, segment_bytes)
    for i in range(0, len(records), 7):  # batches as the writer task makes them
        writer.write(records[i:i + 7])
    writer.close()
    return writer


def all_pages(directory: Path, filters: Filters, limit: int) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        found, positions, nxt = query(directory, filters, limit, parse_cursor(cursor))
        assert len(found) == len(positions) <= limit
        ids += [d["id"] for d in found]
        if nxt is None:
            return ids
        cursor = nxt


@pytest.mark.parametrize("filters", [
    Filters(), Filters(key="key_1"), Filters(model="m0", status="200"), Filters(status="4xx"),
    Filters(status="429", key="key_2"), Filters(since=1_000_050.0, until=1_000_150.0), Filters(key="nobody"),
    Filters(priority="bulk"), Filters(priority="default", model="m1", status="200"), Filters(priority="system"),
])
def test_pages_return_every_match_newest_first_once(tmp_path: Path, filters: Filters) -> None:
    records = [rec(i, status=429 if i % 17 == 0 else 200, priority=("bulk", "default", "")[i % 5 % 3])
               for i in range(300)]
    write(tmp_path, records)
    assert len(segments(tmp_path)) > 5  # the summaries and offsets of many sealed segments are used
    expected = [r.id for r in reversed(records) if filters.match({"model": r.model, "key": r.key, "status": r.status,
                                                                    "time": r.time, "priority": r.priority})]
    if filters.priority is not None and filters.priority != "system":
        assert expected and all(records[int(i[-16:], 16)].priority == filters.priority for i in expected)
    assert all_pages(tmp_path, filters, 7) == expected
    assert all_pages(tmp_path, filters, 1000) == expected


def test_a_torn_tail_and_a_damaged_line_are_skipped_not_fatal(tmp_path: Path) -> None:
    records = [rec(i) for i in range(20)]
    write(tmp_path, records, segment_bytes=1 << 20)
    (_, path), = segments(tmp_path)
    data = bytearray(path.read_bytes())
    line_5 = data.index(records[5].id.encode())
    data[line_5 + 3] ^= 0x01  # a flipped bit: the checksum no longer matches
    data += rec(20).line()[:40]  # a write cut short
    path.write_bytes(bytes(data))
    path.with_suffix(".sum").unlink()  # as a crash leaves it: no summary
    found, _, _ = query(tmp_path, Filters(), 100)
    assert [d["id"] for d in found] == [r.id for r in reversed(records) if r is not records[5]]
    assert find(tmp_path, records[7].id) == {f: getattr(records[7], f) for f in FIELDS}
    assert find(tmp_path, records[5].id) is None


def test_retention_removes_the_oldest_segments_by_bytes_then_by_age(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, 2000)
    for i in range(0, 100, 10):
        writer.write([rec(j) for j in range(i, i + 10)])
    before = segments(tmp_path)
    total = sum(p.stat().st_size for _, p in before)
    assert writer.prune(Limits(total // 2, 1e9), now=1_000_100.0) > 0
    after = segments(tmp_path)
    assert sum(p.stat().st_size for _, p in after) <= total // 2 + 2000
    assert after[-1] == before[-1] and after[0][0] > before[0][0]  # the oldest went
    writer.write([rec(200)])  # an open segment: never pruned
    removed = writer.prune(Limits(1 << 40, 1.0), now=2_000_000.0)
    assert removed == len(after) and [p.name for _, p in segments(tmp_path)] == [f"seg-{writer.seq:010d}.log"]
    writer.close()


async def test_the_queue_never_blocks_a_full_one_drops_and_counts() -> None:
    rlog = RequestLog(None, "gw", queue_records=3)
    for i in range(5):
        rlog.record(rec(i))
    assert rlog.statistics()["queued"] == 3 and rlog.dropped == 2
    assert [r.id for r in rlog.take()] == [rec(i).id for i in range(3)]


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_the_writer_writes_each_interval_and_what_is_left_on_stop(tmp_path: Path,
                                                                         clock: trio.testing.MockClock) -> None:
    if True:
        rlog = RequestLog(tmp_path, "gw 1!")
        assert ID_RE.match(rlog.new_id()) and rlog.new_id().startswith("req-gw1-")
        async with trio.open_nursery() as nursery:
            await nursery.start(rlog.run)
            rlog.record(rec(1))
            await trio.sleep(rlog.timeouts.requestlog_flush_s / 2)
            assert rlog.written == 0  # not yet: the request path never writes
            await trio.sleep(rlog.timeouts.requestlog_flush_s)
            for _ in range(1000):  # the write itself runs in a real thread: wait for it in real time
                if rlog.written:
                    break
                await trio.to_thread.run_sync(time.sleep, 0.005)
            assert rlog.written == 1 and find(tmp_path, rec(1).id) is not None
            rlog.record(rec(2))
            nursery.cancel_scope.cancel()
        assert find(tmp_path, rec(2).id) is not None  # flushed on the way out
        assert rlog.rollups.batch() is not None  # and counted for usage


def test_rollups_send_the_same_batch_until_acknowledged() -> None:
    rollups = Rollups("gw", boot="b1")
    assert rollups.batch() is None
    rollups.add([rec(1), rec(2, status=503, replica=""), rec(3, status=502)])
    first = rollups.batch()
    assert first is not None and first["seq"] == 1
    rollups.add([rec(4)])
    assert rollups.batch() is first  # unacknowledged: the same again, new counts wait
    assert not rollups.acked("b1", 2) and rollups.acked("b1", 1)
    second = rollups.batch()
    assert second is not None and second["seq"] == 2
    counted = {(r["key"], r["model"]): r for r in first["rows"]}
    assert counted[("key_2", "m0")]["refusals"] == 1 and counted[("key_0", "m1")]["errors"] == 1


def apply(state: ClusterState, command: dict[str, object]) -> ClusterState:
    new, outcome = commands.apply_entry(state, commands.encode(command))
    assert outcome.ok, outcome.message
    return new


def test_usage_batches_apply_once_per_gateway_boot_and_seq_and_expire() -> None:
    row = row_doc(7200, "key_a", "demo", 3, 30, 60, 1, 0)
    state = apply(ClusterState(), add_usage("gw", "b1", 1, [row], "http://10.0.0.2:8080", 8000.0))
    again = apply(state, add_usage("gw", "b1", 1, [row], "http://10.0.0.2:8080", 8001.0))
    assert usage.query(again, since=0, until=1e9) == usage.query(state, since=0, until=1e9)  # a retry: no change
    other = apply(again, add_usage("gw", "b2", 1, [row], "", 8002.0))  # the gateway restarted
    (total,) = usage.query(other, since=0, until=1e9)
    assert (total["requests"], total["tokens_in"], total["tokens_out"], total["errors"]) == (6, 60, 120, 2)
    assert usage.gateways(other)["gw"].seq == 1 and usage.query(other, since=0, until=7200) == []
    # Round trips: the snapshot codec and pickle (pysyncobj's snapshot).
    assert codec.state_from_json(codec.state_to_json(other)) == other
    assert pickle.loads(pickle.dumps(other)) == other
    later = apply(other, add_usage("gw", "b2", 2, [row_doc(100 * 86400, "k", "m", 1, 0, 0, 0, 0)], "",
                                         100 * 86400.0))
    assert [h.start for h in later.usage.values()] == [100 * 86400]  # past usage.retention_days: dropped


@pytest.mark.parametrize("bad", [
    {"seq": 0}, {"rows": []}, {"rows": [{"hour": 5}]}, {"gateway": ""},
    {"rows": [row_doc(3600, "k", "m", -1, 0, 0, 0, 0)]},
])
def test_a_malformed_usage_batch_is_refused_before_the_log(bad: dict[str, object]) -> None:
    command = {**add_usage("gw", "b", 1, [row_doc(3600, "k", "m", 1, 0, 0, 0, 0)], "", 1.0), **bad}
    with pytest.raises(commands.CommandError):
        commands.check(command)


def test_filters_and_cursors_refuse_what_they_cannot_read() -> None:
    for query_args in ({"status": "4x"}, {"since": "yesterday"}, {"until": "nan"}, {"priority": "urgent"}):
        with pytest.raises(QueryError):
            Filters.parse(query_args)
    with pytest.raises(QueryError):
        parse_cursor("12")
    assert gateway_tag("GW-East.1") == "gweast1" and gateway_tag("---") == "gw"
