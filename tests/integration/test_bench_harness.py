"""The gateway benchmark's harness cannot rot unseen: its raw upstream answers chat requests and streams as
valid HTTP/1.1 over real loopback (checked by h11, a strict parser), its wrk report parser reads wrk's output,
and the TLS bench's gateway serves a certificate its client verifies, kept alive across requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest

from tests.support.figures import BENCH, load_bench


upstream_mod, probe, wrk = load_bench("_upstream"), load_bench("_probe"), load_bench("_wrk")


@pytest.fixture
def upstream() -> Iterator[str]:
    """The raw upstream on an asyncio loop in a thread: its URL."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(upstream_mod.serve("127.0.0.1", 0, chunks=4, gap_s=0.0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        async def close() -> None:
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def test_chat_answers_on_a_kept_alive_connection(upstream: str) -> None:
    client = probe.Client(upstream, "sk-any", timeout_s=5)
    try:
        first_sock = None
        for _ in range(3):  # the same connection each time: keep-alive
            status, _first, _end, body = client.post("/v1/chat/completions", CHAT)
            first_sock = first_sock or client.sock
            assert client.sock is first_sock
            assert status == 200
            doc = json.loads(body)
            assert doc["object"] == "chat.completion" and doc["model"] == "m1"
            assert doc["usage"] == {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}
    finally:
        client.close()


def test_stream_is_chunked_sse_ending_in_done(upstream: str) -> None:
    client = probe.Client(upstream, "sk-any", timeout_s=5)
    try:
        for _ in range(2):  # a stream leaves the connection usable for the next request
            status, first, end, body = client.post(
                "/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
            assert status == 200 and 0 < first <= end
            events = [e for e in body.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            docs = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
            assert [d["object"] for d in docs] == ["chat.completion.chunk"] * 5
            assert docs[-2]["choices"][0]["finish_reason"] == "stop"
            assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 4
        assert probe.ttfc_samples(upstream + "/v1/chat/completions", "sk-any", {**CHAT, "stream": True}, 3)
    finally:
        client.close()


@pytest.mark.parametrize("mode", [(), ("--http",), ("--front",)], ids=["bytes", "http", "front"])
def test_the_relay_floors_carry_answers_on_connection_after_connection(upstream: str, mode: tuple[str, ...]) -> None:
    """tests/bench/_relay.py (the floors under gateway.py's stream figures), copying bytes, reading HTTP, or as llmgw's
    own server under a minimal app: streamed and whole answers, one after another on a kept-alive connection, arrive
    whole; a connection that its client closes ends, and the relay serves the next one (it died with the first close
    once)."""
    from tests.support.processes import stop_all

    relay = subprocess.Popen([sys.executable, str(BENCH / "_relay.py"), *mode, upstream], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert relay.stdout is not None
        line = relay.stdout.readline()
        assert line.startswith("READY "), line
        url = line.split()[1]
        client = probe.Client(url, "sk-any", timeout_s=5)
        try:
            for _ in range(2):
                status, _, _, body = client.post("/v1/chat/completions", {**CHAT, "stream": True})
                assert status == 200 and body.decode().rstrip().endswith("data: [DONE]")
                status, _, _, body = client.post("/v1/chat/completions", CHAT)
                assert status == 200 and json.loads(body)["object"] == "chat.completion"
        finally:
            client.close()
        for _ in range(3):  # each on a connection of its own, closed after
            samples = probe.ttfc_samples(url + "/v1/chat/completions", "sk-any", {**CHAT, "stream": True}, 2)
            assert len(samples) == 2 and all(s > 0 for s in samples)
        assert relay.poll() is None, "the relay is still serving"
    finally:
        stop_all([relay])
        if relay.stdout is not None:
            relay.stdout.close()


def test_pipelined_and_chunked_requests_and_connection_close(upstream: str) -> None:
    """Two requests in one write (the second with a chunked body, asking to close): two answers in order."""
    port = int(upstream.rsplit(":", 1)[1])
    body = json.dumps(CHAT).encode()
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
           + b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n"
           + b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):  # the server closes after the second answer
            data += chunk
    conn = h11.Connection(h11.CLIENT)
    conn.receive_data(data)  # both answers: h11 keeps what the first does not use for the next cycle
    answers = []
    for _ in range(2):
        conn.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
        conn.send(h11.EndOfMessage())
        status, got = 0, b""
        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
            assert event is not h11.NEED_DATA
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                got += bytes(event.data)
        answers.append((status, json.loads(got)["model"]))
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
    assert answers == [(200, "m1"), (200, "m1")]
    assert conn.their_state is h11.MUST_CLOSE


WRK_SAMPLE = """Running 2s test @ http://127.0.0.1:18777/v1/chat/completions
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.50ms    1.69ms  17.14ms   87.35%
    Req/Sec    27.30k     6.73k   38.68k    80.00%
  Latency Distribution
     50%  846.00us
     75%    1.82ms
     90%    3.74ms
     99%    8.15ms
  54304 requests in 2.00s, 17.87MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  27086.38
Transfer/sec:      8.91MB
"""


def test_wrk_report_is_parsed() -> None:
    run = wrk.parse(WRK_SAMPLE)
    assert (run.requests, run.seconds, run.rps) == (54304, 2.0, 27086.38)
    assert run.p50_ms == pytest.approx(0.846) and run.p99_ms == pytest.approx(8.15)
    assert run.errors == 7
    clean = wrk.parse(WRK_SAMPLE.replace("  Socket errors: connect 0, read 2, write 0, timeout 1\n", "")
                      .replace("  Non-2xx or 3xx responses: 4\n", ""))
    assert clean.errors == 0
    with pytest.raises(ValueError):
        wrk.parse("unable to connect to 127.0.0.1:1 Connection refused")


def test_wrk_script_posts_the_body_with_the_key() -> None:
    script = wrk.lua_script({"model": "m", "note": "it's \"quoted\""}, "sk-llmgw-abc")
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Authorization"] = "Bearer sk-llmgw-abc"' in script
    body_line = next(line for line in script.splitlines() if line.startswith("wrk.body = [==["))
    assert json.loads(body_line.removeprefix("wrk.body = [==[").removesuffix("]==]")) == {
        "model": "m", "note": "it's \"quoted\""}


def test_the_metrics_bench_runs() -> None:
    """tests/bench/metrics.py (docs/performance.md, "Metrics": what counting costs the request path, what a
    scrape costs) on a toy size, so it cannot rot unseen; no timing is judged here."""
    import gc

    bench = load_bench("metrics")
    switch = sys.getswitchinterval()
    try:
        cost = bench.gateway_cost(requests=50, rounds=1)
        assert set(cost) == {"off_us", "on_us", "count_us"} and all(v > 0 for v in cost.values())
        scrape = bench.scrape_cost(nodes=4, models=6, rounds=1)
        assert scrape["control_kib"] > 0 and scrape["gateway_kib"] > 0 and scrape["pause_ms"] >= 0
    finally:  # the bench sets both as the gateway does: not for the rest of this process
        gc.unfreeze()
        sys.setswitchinterval(switch)


def test_the_names_bench_runs() -> None:
    """tests/bench/names.py (what resolving a model name, an alias or a group costs a request) on a toy size."""
    result = load_bench("names").measure(models=20, calls=50, rounds=1)
    assert len(result) == 6 and all(v > 0 for v in result.values())


def test_the_normalise_bench_runs() -> None:
    """tests/bench/normalise.py (what completing answers to OpenAI's schemas costs) on a toy size."""
    result = load_bench("normalise").measure(calls=20, rounds=1)
    assert len(result) == 6 and all(mine > 0 and base > 0 for mine, base in result.values())


async def test_the_affinity_bench_runs() -> None:
    """tests/bench/affinity.py (docs/performance.md, "Prefix affinity") on a toy size: both scenarios, both
    routings, and the decision cost; no figure is judged here but that the prefix cache was asked."""
    bench = load_bench("affinity")
    opts = bench._options(["--requests", "24", "--clients", "4", "--replicas", "2", "--prefill-tokens-per-s", "1e6"])
    rows = await bench.workloads(opts)
    assert [(r[0], r[2]) for r in rows[1:]] == [(s.name, routing) for s in bench.SCENARIOS
                                                for routing in ("least-outstanding", "affinity")]
    assert float(rows[2][3].rstrip("%")) > 0  # the high scenario's affinity run hit the cache
    cost = await bench.decision_cost(replicas=8, decisions=50)
    assert set(cost) == {"off", "on", "key"} and all(v > 0 for v in cost.values())


def test_the_fairness_bench_runs() -> None:
    """tests/bench/fairness.py (a flooding key against a steady one, FIFO against the fair queue) on a toy size,
    so it cannot rot unseen; its ratio is not judged here (a loaded machine moves it)."""
    import gc

    bench = load_bench("fairness")
    switch = sys.getswitchinterval()
    try:
        runs = bench.measure(seconds=0.5, slots=1, service_s=0.04, jitter=0.5)
    finally:  # the gateway sets both when it serves: not for the rest of this process
        gc.unfreeze()
        sys.setswitchinterval(switch)
    assert list(runs) == ["unloaded", "FIFO (today)", "fair queue"]
    for run in runs.values():
        assert run.b_ms and run.other == 0
    assert runs["FIFO (today)"].a_ok and runs["fair queue"].a_ok


def test_the_tls_bench_gateway_verifies_and_keeps_its_connection_alive(upstream: str, tmp_path: Path) -> None:
    """tests/bench/gateway_tls.py's TLS gateway (gateway.py's child with --tls, a throwaway CA): its certificate
    verifies for 127.0.0.1, its requests share one connection (one handshake), also with pauses between them (the
    connection's watcher stops its read of the TLS stream while the client is quiet), and the plain one answers."""
    from llmgw.domain.keys import new_key

    tls_bench = load_bench("gateway_tls")
    bench = tls_bench.bench
    key = new_key()
    procs = bench.Procs()
    try:
        env = {**os.environ, bench.KEY_ENV: key, "PYTHONPATH": str(bench.ROOT)}
        _proc, url = procs.start(bench._gateway_args(upstream, tmp_path / "log-tls", tls=True), env)
        assert url.startswith("https://127.0.0.1:")
        tls_bench.check_tls(url, tls_bench.tls_ca(tmp_path / "log-tls"), key, requests=3)
        tls_bench.check_tls(url, tls_bench.tls_ca(tmp_path / "log-tls"), key, requests=3, pause_s=0.2)
        _proc, plain = procs.start(bench._gateway_args(upstream, tmp_path / "log-plain"), env)
        assert plain.startswith("http://") and probe.check(plain + bench.PATH, key, bench.CHAT)["usage"]
    finally:
        procs.stop_all()
        for proc in procs.all:  # the bench leaves its children's pipes to the process's exit
            assert proc.stdout is not None
            proc.stdout.close()
    script = tls_bench.close_script(tmp_path, key).read_text()
    assert script.startswith(wrk.lua_script(bench.CHAT, key)) and 'wrk.headers["Connection"] = "close"' in script


def test_the_tls_bench_table_sets_tls_beside_plain() -> None:
    tls_bench = load_bench("gateway_tls")
    targets = tls_bench._targets("http://u", 1, {"plain": (2, "http://p"), "TLS": (3, "https://t")},
                                 {True: Path("ka.lua"), False: Path("close.lua")}, "k", [1])
    for (_c, row), t in targets.items():  # two rounds: direct 0.1 ms; TLS 1.5x plain; closing 2x more
        base = {"direct": 0.1, "plain, keep-alive": 0.5, "TLS, keep-alive": 0.75}.get(row)
        base = base or {"plain, Connection: close": 1.0, "TLS, Connection: close": 1.5}[row]
        t.load = [wrk.WrkRun(1000, 1.0, 1000 / base, base, 2 * base, 0)] * 2
        t.cpu_ms = [base] * 2
    rows = tls_bench.table(targets)
    assert [r[1] for r in rows[1:]] == [
        "direct (upstream), keep-alive", "plain, keep-alive", "TLS, keep-alive", "TLS / plain, keep-alive",
        "plain, Connection: close", "TLS, Connection: close", "TLS / plain, Connection: close",
        "TLS: close / keep-alive"]
    assert rows[2][4] == "0.40" and rows[4][2] == "x1.50 (+0.25)" and rows[4][7] == "x0.67"
    assert rows[2][6] == "0.50" and rows[8][6] == "x2.00 (+0.75)"  # c / req/s: each request's whole turn
    assert rows[8][8] == "x2.00 (+0.750)"  # a connection per request: twice the CPU


def test_the_routing_bench_runs() -> None:
    """tests/bench/routing.py (one routing decision at 64 replicas, affinity and priorities on, issue 22 point 7)
    on a toy size: every kind measured; the 20 µs goal is the bench's to print, not a timed test's."""
    result = load_bench("routing").measure(replicas=8, decisions=50, keys=5, rounds=1, waiting=20)
    assert set(result) == {"before", "free", "full"} and all(v > 0 for v in result.values())


def test_the_header_fuzz_runs(tmp_path: Path) -> None:
    """tests/bench/fuzz_headers.py (mutated real weights headers through the mirror's inspection) on a toy
    budget: every corpus is fuzzed, nothing is broken, and the table has its columns."""
    import random

    bench = load_bench("fuzz_headers")
    found = bench.corpora(tmp_path)
    assert {"tiny-llama", "tiny-reranker", "tiny-lora", "safetensors"} <= set(found)
    for corpus in found.values():
        row, broken = bench.fuzz(corpus, 0.05, random.Random(1))
        assert broken == [] and len(row) == 10 and int(row[2]) >= 1


def test_the_mirror_fetch_bench_runs() -> None:
    """A 1 MiB GGUF uploaded with `ctl mirror add`, fetched from a control plane on loopback, verified, and `cp`'d,
    and a 1 MiB file's sha256 timed: the table has each row."""
    bench = load_bench("mirror_fetch")
    result = bench.measure(1)
    assert result["mib"] == 1 and result["verify_mib"] == 1
    assert min(result["upload_s"], result["fetch_s"], result["verify_s"], result["cp_s"], result["verify_big_s"]) > 0
    out = bench.table(result)
    assert all(row in out for row in ("x cp", "upload (ctl mirror add", "fetch (HTTP", "verify a 1 MiB file"))


def test_the_activation_bench_runs(tmp_path: Path) -> None:
    """tests/bench/activation.py (issue 26 point 3) on a toy size: one cold start under `llmgw up`, its stages read
    from the agent's log; and one sim engine started by hand."""
    bench = load_bench("activation")
    [trial] = bench.run_up(1, tmp_path)
    assert trial["total"] > 0 and trial["ask_start"] > 0 and trial["start_ready"] > 0
    assert trial["total"] >= trial["ask_start"] + trial["start_ready"] - 50  # the stages lie within the whole
    [hand] = bench.by_hand(1, tmp_path)
    assert hand > 0


async def test_the_wake_bench_runs() -> None:
    """tests/bench/wake.py (fast wake: a request's wait for a slept model against a cold start, on the sim) on a
    toy size, so it cannot rot unseen; only that the slept path woke rather than started cold is judged."""
    bench = load_bench("wake")
    found = await bench.measure(cold_s=1.0, wake_s=0.01, rounds=1, idle_s=0.5)
    assert len(found["cold"]) == len(found["slept"]) == 1
    assert found["slept"][0] < found["cold"][0]
    assert bench.table(found, 1.0, 0.01)[2][4].endswith("x faster")


async def test_the_status_bench_runs() -> None:
    """tests/bench/status.py (`GET /api/v1/status` default and full, built and kept, against the route before pages)
    on a toy fleet: every row measured, the default page smaller than the whole document; no time is judged here."""
    bench = load_bench("status")
    rows = await bench.measure(nodes=30, models=4, repeat=2)
    assert [name.split(": ")[1] for name, *_ in rows] == [
        "before (built, every row)", "default, built", "default, kept", "full=1, built", "full=1, kept"]
    sizes = {name.split(": ")[1]: size for name, _, _, size in rows}
    assert sizes["default, built"] < sizes["full=1, built"] and "vs before" in bench.table(rows)


def test_the_path_timing_pairs_each_requests_four_socket_events() -> None:
    """tests/bench/_path.py: a request's two halves from the gateway's socket events; other connections' events,
    later writes of the same answer and a request never answered count for nothing."""
    own_time = load_bench("_path").own_time
    gateway, engine = 9000, 7000  # the gateway's port (local on a client's connection); the engine's (peer)
    events = [
        [0, "recv", gateway, 5555, 300],  # a request's bytes
        [4_000, "recv", 41000, 7001, 80],  # another engine's connection: not this one
        [10_000, "send", 40000, engine, 350],  # the engine's request written
        [11_000, "recv", gateway, 5556, 0],  # another client's connection ends
        [50_000, "recv", 40000, engine, 600],  # the engine's first bytes
        [80_000, "send", gateway, 5555, 700],  # the client's first write
        [90_000, "send", gateway, 5555, 100],  # the rest of the stream
        [100_000, "recv", gateway, 5555, 300],  # the next request, never answered
    ]
    own = own_time(events, gateway, engine)
    assert (own.requests, own.request_us, own.answer_us, own.total_us) == (1, 10.0, 30.0, 40.0)
    with pytest.raises(ValueError):
        own_time(events[:3], gateway, engine)


def test_the_traced_bench_gateway_times_every_streamed_request(upstream: str, tmp_path: Path) -> None:
    """gateway.py's child with --trace (what `--path-samples` runs): its socket events, written on SIGUSR2, give
    each streamed request's two halves."""
    import signal

    from llmgw.domain.keys import new_key

    bench, own_time = load_bench("gateway"), load_bench("_path").own_time
    key, out, procs = new_key(), tmp_path / "path.json", bench.Procs()
    try:
        env = {**os.environ, bench.KEY_ENV: key, "PYTHONPATH": str(bench.ROOT)}
        proc, url = procs.start(bench._gateway_args(upstream, tmp_path / "log", trace=out), env)
        assert len(probe.ttfc_samples(url + bench.PATH, key, bench.STREAM, 8)) == 8
        proc.send_signal(signal.SIGUSR2)
        assert bench._written(out), "the child writes its events on its own loop, once signalled"
        own = own_time(json.loads(out.read_text()), int(url.rsplit(":", 1)[1]), int(upstream.rsplit(":", 1)[1]))
    finally:
        procs.stop_all()
        for proc in procs.all:
            assert proc.stdout is not None
            proc.stdout.close()
    assert own.requests == 8 and own.request_us > 0 and own.answer_us > 0


def test_the_paired_first_chunk_bench_runs_two_gateways_side_by_side() -> None:
    """tests/bench/gateway_ab.py (docs/performance.md, "The stream's first chunk": two trees' gateways on one
    upstream, requests in turn) on a toy size, this tree given twice (its A/A check); no timing is judged here."""
    ab = load_bench("gateway_ab")
    p50s = ab.one_set([BENCH.parents[1], BENCH.parents[1]], samples=6, gap_ms=0.0, reverse=True, warm=2)
    assert len(p50s) == 2 and all(p > 0 for p in p50s)


def test_the_paired_bench_puts_the_floors_in_its_rotation() -> None:
    """`gateway_ab.py --floors`: the upstream itself and the relay's three modes answer each streamed request whole in
    the same rotation as the gateway (a floor that answered wrongly would raise); no timing is judged here."""
    ab = load_bench("gateway_ab")
    p50s = ab.one_set([BENCH.parents[1]], samples=4, gap_ms=0.0, reverse=False, warm=2, floors=tuple(ab.FLOORS))
    assert len(p50s) == 1 + len(ab.FLOORS) == 5 and all(p > 0 for p in p50s)


def test_the_hop_by_hop_bench_cuts_every_first_chunk_at_each_process() -> None:
    """tests/bench/gateway_hops.py (docs/performance.md, "The stream's first chunk": the client, the gateway and
    the upstream each note their moments on one clock) on a toy size: every hop is found for every request, none
    negative (each is a write in one process to the read in the next); no timing is judged here."""
    bench = load_bench("gateway_hops")
    got = bench.hops(samples=6, gap_ms=0.0)
    assert list(got) == ["direct", "through the gateway"]
    assert list(got["direct"]) == [*bench.DIRECT, "time to first chunk"]
    assert list(got["through the gateway"]) == [*bench.THROUGH, "time to first chunk"]
    for row in got.values():
        assert row["time to first chunk"] > 0 and all(us >= 0 for us in row.values())
