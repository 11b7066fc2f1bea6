"""The model mirror's pure parts (issue 24, points 4 and 5): the byte ranges a control plane serves
(`control/api/mirror_blobs.parse_range`), where a fetch goes on from and what of an answer it keeps
(`agent/mirror_fetch`), the cache's LRU within its budget (never a file in use), the leader's `mirror` on a
start (`control/mirror_starts`), and the fetching progress the leader shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.agent.mirror_fetch import FetchError, MirrorCache, answered_from, range_header, resume_offset
from llmgw.control.api.mirror_blobs import Span, Unsatisfiable, parse_range
from llmgw.control.mirror_starts import blob_urls, member_bases, with_mirror
from llmgw.domain.observed import ReplicaObs
from llmgw.domain.state import ClusterState
from llmgw.domain.observed import Observed
from llmgw.domain.model import ModelDef
from llmgw.wire import protocol_agent as pa

SHA = "ab" * 32


# --- ranges served ---------------------------------------------------------------------------------


@pytest.mark.parametrize("header, span", [
    (None, Span(0, 100, 100, False)),
    ("bytes=0-9", Span(0, 10, 100, True)),
    ("bytes=90-", Span(90, 100, 100, True)),
    ("bytes=90-1000", Span(90, 100, 100, True)),
    ("bytes=-5", Span(95, 100, 100, True)),
    ("bytes=-500", Span(0, 100, 100, True)),
    ("bytes=0-0", Span(0, 1, 100, True)),
    ("items=0-9", Span(0, 100, 100, False)),  # another unit: ignored, the whole file
    ("bytes=0-9,20-29", Span(0, 100, 100, False)),  # several ranges: ignored, the whole file
])
def test_a_range_reads_as_the_bytes_it_asks(header: str | None, span: Span) -> None:
    assert parse_range(header, 100) == span


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=150-160", "bytes=-0", "bytes=20-10"])
def test_a_range_with_no_byte_inside_the_file_is_unsatisfiable(header: str) -> None:
    with pytest.raises(Unsatisfiable):
        parse_range(header, 100)


def test_content_range_names_the_last_byte_inclusive() -> None:
    assert parse_range("bytes=10-19", 100).content_range() == "bytes 10-19/100"


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.one_of(st.none(), st.integers(0, 20_000)))
def test_a_satisfiable_range_lies_inside_the_file(size: int, start: int, last: int | None) -> None:
    header = f"bytes={start}-" + ("" if last is None else str(last))
    try:
        span = parse_range(header, size)
    except Unsatisfiable:
        assert start >= size or (last is not None and last < start)
        return
    assert 0 <= span.start < span.end <= size and span.start == start and span.partial


# --- where a fetch goes on from ---------------------------------------------------------------------


def test_a_fetch_goes_on_from_what_its_part_file_holds() -> None:
    assert resume_offset(0, 100) == 0 and range_header(0) == {}
    assert resume_offset(40, 100) == 40 and range_header(40) == {"range": "bytes=40-"}
    assert resume_offset(100, 100) == 100
    assert resume_offset(140, 100) == 0, "more than the file: another file's bytes, start over"


def test_an_answer_is_kept_from_where_it_says_it_begins() -> None:
    assert answered_from(206, "bytes 40-99/100", 40, 100) == 40
    assert answered_from(200, None, 40, 100) == 0, "the range ignored: the whole file, written over"
    assert answered_from(206, "bytes 0-99/100", 40, 100) is None, "not the range asked"
    assert answered_from(206, "bytes 40-99/200", 40, 100) is None, "another file's size"
    assert answered_from(206, None, 40, 100) is None
    assert answered_from(404, None, 0, 100) is None and answered_from(503, None, 0, 100) is None


@given(st.integers(1, 1 << 40), st.data())
def test_resuming_from_any_cut_asks_for_exactly_the_rest(total: int, data: st.DataObject) -> None:
    """Whatever a dropped transfer left, the next request asks for the bytes after it, and the server's answer to
    that request is kept from there: held + rest == the file, never a gap nor an overlap."""
    held = data.draw(st.integers(0, total - 1))
    offset = resume_offset(held, total)
    assert offset == held
    header = range_header(offset).get("range", f"bytes=0-")
    span = parse_range(header, total)
    assert span.start == held and span.end == total
    status = 206 if span.partial else 200
    assert answered_from(status, span.content_range() if span.partial else None, offset, total) == span.start


# --- the cache ---------------------------------------------------------------------------------------


def put(cache: MirrorCache, sha: str, size: int, used_at: float, name: str = "") -> None:
    cache.dir.mkdir(parents=True, exist_ok=True)
    cache.path(sha).write_bytes(b"x" * size)
    (cache.dir / f"{sha}.name").write_text(name or sha[:4], encoding="utf-8")
    os.utime(cache.path(sha), (used_at, used_at))


def test_room_is_made_by_removing_the_least_recently_used_file_never_one_in_use(tmp_path: Path) -> None:
    in_use = {"1" * 64}
    cache = MirrorCache(tmp_path, 110, in_use=lambda: in_use)
    put(cache, "1" * 64, 40, 1000.0)  # the oldest, but a replica runs from it
    put(cache, "2" * 64, 30, 2000.0)
    put(cache, "3" * 64, 30, 3000.0)
    assert cache.make_room(SHA, 40) == ["2" * 64]
    assert not cache.path("2" * 64).exists() and cache.path("1" * 64).exists() and cache.path("3" * 64).exists()
    in_use.add("3" * 64)
    with pytest.raises(FetchError, match="in use"):
        cache.make_room(SHA, 50)
    with pytest.raises(FetchError, match="budget"):
        cache.make_room(SHA, 111)


def test_a_part_file_counts_for_what_it_holds_once(tmp_path: Path) -> None:
    cache = MirrorCache(tmp_path, 100)
    put(cache, "2" * 64, 50, 1.0)
    cache.part(SHA).write_bytes(b"y" * 40)  # 40 of the new file's 50 are here already
    assert cache.make_room(SHA, 50) == []


def test_an_abandoned_partial_fetch_makes_room_too_a_fetch_in_progress_never(tmp_path: Path) -> None:
    in_use = {"4" * 64}
    cache = MirrorCache(tmp_path, 100, in_use=lambda: in_use)
    cache.part("3" * 64).write_bytes(b"y" * 50)  # abandoned
    cache.part("4" * 64).write_bytes(b"y" * 40)  # a replica starts from it: fetching now
    assert cache.make_room(SHA, 50) == ["3" * 64]
    assert not cache.part("3" * 64).exists() and cache.part("4" * 64).exists()


def test_the_cache_reports_its_verified_files_by_name(tmp_path: Path) -> None:
    cache = MirrorCache(tmp_path, 100)
    put(cache, SHA, 10, 1.0, name="llama-guard")
    cache.part("c" * 64).write_bytes(b"half")
    report = cache.storage_report()
    assert [m["name"] for m in report["models"]] == ["llama-guard"], "a fetch in progress is not held"
    from llmgw.placement.holdings import Holdings
    from llmgw.domain.observed import NodeInfo
    held = Holdings({"n1": NodeInfo("n1", storage=(report,)), "n2": NodeInfo("n2")}).of("mirror://llama-guard")
    assert held.nodes == frozenset({"n1"})


def test_placement_prefers_the_node_whose_cache_holds_the_file_never_one_still_fetching(tmp_path: Path) -> None:
    """S9 with the mirror: a verified copy in a node's mirror cache counts as holding the weights; a `.part` does
    not (the two other nodes are alike; without the cache, "a" would win the tie by name)."""
    from dataclasses import replace

    from llmgw.domain.model import ModelDef
    from llmgw.placement import place
    from llmgw.testing.builders import cpu_node, fleet

    held, fetching = MirrorCache(tmp_path / "held", 100), MirrorCache(tmp_path / "fetching", 100)
    put(held, SHA, 10, 1.0, name="tiny.gguf")
    fetching.dir.mkdir(parents=True)
    fetching.part(SHA).write_bytes(b"half")
    (fetching.dir / f"{SHA}.name").write_text("tiny.gguf", encoding="utf-8")
    tiny = ModelDef.from_doc({"name": "tiny", "engine": "llama.cpp", "source": "mirror://tiny.gguf",
                              "profile": {"cpu": True, "memory_gib": 0.01}})
    nodes = fleet(cpu_node("a"), replace(cpu_node("b"), storage=(fetching.storage_report(),)),
                  replace(cpu_node("z"), storage=(held.storage_report(),)))
    assert place(tiny, nodes, []).choice.node == "z"  # type: ignore[union-attr]
    del nodes["z"]
    assert place(tiny, nodes, []).choice.node == "a"  # type: ignore[union-attr]  # b's fetch in progress: no holder


# --- the leader's start --------------------------------------------------------------------------------


def start(source: str) -> dict[str, object]:
    return {"type": "start_replica", "replica_id": "m-r1", "model": {"name": "m", "engine": "sim", "source": source},
            "gpus": []}


def test_a_start_from_the_mirror_says_where_to_fetch_the_file_the_leader_first() -> None:
    catalog = {"guard.gguf": (SHA, 1234)}.get
    bases = member_bases("http://leader:1", {"a:1": "http://standby-a:1", "l:1": "http://leader:1", "b:1": None},
                         "l:1")
    assert bases == ["http://leader:1", "http://standby-a:1"]
    message = with_mirror(start("mirror://guard.gguf"), catalog, bases)
    assert message is not None
    read = pa.read_down(message)
    assert isinstance(read, pa.StartReplica) and read.mirror == pa.MirrorSource(
        "guard.gguf", SHA, 1234, (f"http://leader:1/mirror/blobs/{SHA}", f"http://standby-a:1/mirror/blobs/{SHA}"))
    assert with_mirror(start("mirror://guard.gguf"), catalog, []) is None, "no URL known yet: not now"
    absent = with_mirror(start("mirror://other"), catalog, bases)
    assert absent is not None and "mirror" not in absent, "the agent refuses it: not in the mirror"
    assert with_mirror(start("sim://x"), catalog, bases) == start("sim://x")
    assert blob_urls(["http://a/"] * 3, SHA) == [f"http://a/mirror/blobs/{SHA}"]


# --- the progress shown --------------------------------------------------------------------------------


def test_a_replica_fetching_shows_its_bytes_and_an_eta() -> None:
    from llmgw.reconcile import decide
    from llmgw.domain.state import Placement

    model = ModelDef.from_doc({"name": "m", "engine": "llama.cpp", "source": "mirror://m.gguf"})
    obs = ReplicaObs("m-r1", "m", "n1", "starting", since=100.0, phase="fetching", weights_bytes=1000,
                     bytes_done=250, fetch_expected_s=40.0)
    assert ReplicaObs.from_doc(obs.to_doc(), "n1") == obs
    state = ClusterState(models={"m": model}, placements={"m-r1": Placement("m-r1", "m", "n1", (), model.launch_hash(), 100.0)})
    from llmgw.domain.observed import NodeInfo
    observed = Observed(nodes={"n1": NodeInfo("n1")}, replicas={"m-r1": obs}, since=0.0)
    progress = decide(state, observed, 110.0).views["m"].activation
    assert progress is not None and progress.phase == "fetching"
    assert (progress.bytes_done, progress.bytes_total) == (250, 1000)
    assert progress.expected_s is not None and progress.expected_s > 40.0
    assert "(25%)" in progress.words(110.0) and "left" in progress.words(110.0)
    # What `ctl status`, the API and the console's model page show of it.
    from llmgw.console.models import phase_html
    from llmgw.domain import summary

    plan = decide(state, observed, 110.0)
    status = summary.model_status(state, observed, "m", plan.views["m"], 110.0)
    assert status["activation"]["phase"] == "fetching" and status["activation"]["bytes_done"] == 250
    html = phase_html(status)
    assert 'data-bytes-done="250"' in html and "(25%)" in html


# --- the supervisor starts the engine from the cached file ------------------------------------------------


async def test_the_engine_gets_the_cached_file_even_outside_the_storage_dirs(tmp_path: Path) -> None:
    """The fetched file is handed to the engine in place of mirror://NAME (checked as any local file: here a
    file that is no GGUF is refused by its header, not for lying outside --storage)."""
    import httpx
    import trio

    from llmgw.agent.supervisor import Supervisor

    cached = tmp_path / "cache" / SHA
    cached.parent.mkdir()
    cached.write_bytes(b"not a gguf at all")
    asked: list[pa.MirrorSource] = []

    async def fetcher(source: pa.MirrorSource, on_bytes: object) -> Path:
        asked.append(source)
        return cached

    mirror = pa.MirrorSource("m.gguf", SHA, 17, ("http://127.0.0.1:1/mirror/blobs/" + SHA,))
    doc = {"name": "m", "engine": "llama.cpp", "source": "mirror://m.gguf"}
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        supervisor = Supervisor(nursery, node="n1", host="127.0.0.1", engine_dir=tmp_path / "engines",
                                on_change=lambda: None, http=http, roots=[str(tmp_path / "models")], fetcher=fetcher)
        supervisor.start("m-r1", doc, [], mirror=mirror)
        assert supervisor.mirror_in_use() == {SHA}
        while supervisor.replicas()[0].state == "starting":
            await trio.sleep(0.01)
        [obs] = supervisor.replicas()
        assert asked == [mirror]
        assert obs.state == "failed" and "outside" not in obs.error and str(cached) in obs.error, obs.error
        supervisor.start("m-r2", doc, [])  # no `mirror`: the leader's catalog lacks the name
        [_, absent] = sorted(supervisor.replicas(), key=lambda r: r.replica_id)
        while absent.state == "starting":
            await trio.sleep(0.01)
            [_, absent] = sorted(supervisor.replicas(), key=lambda r: r.replica_id)
        assert "mirror file m.gguf is not in the mirror" in absent.error
        supervisor.close()
        nursery.cancel_scope.cancel()
