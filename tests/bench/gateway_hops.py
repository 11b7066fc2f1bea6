"""Where a stream's first chunk spends its time, hop by hop: the client, the gateway and the upstream each note their
moments on the clock every process shares (CLOCK_MONOTONIC, `time.perf_counter_ns`), and each request's time to
first chunk is cut at them. Direct: the client to the upstream, the upstream, back to the client. Through the
gateway: the client to the gateway, the gateway's request half, on to the upstream, the upstream, back to the
gateway, its answer half, on to the client. A hop is a write in one process to the read in the next: the loopback,
and the wake-up (or the wait for a vCPU) of the process that reads.

Run: `.venv/bin/python tests/bench/gateway_hops.py [--samples 300] [--gap-ms 1]`. The gateway child records its
sockets as `gateway.py --path-samples` does (_path.py), the upstream its requests and answers (`_upstream.py
--trace`), the client its send and its first chunk; every record costs a little, so each figure here is a little
larger than unrecorded (use `gateway.py` for the figures themselves, this for where they go). Prints the medians
of each hop over `--samples` requests at c=1, after as many unrecorded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _path  # noqa: E402
from gateway import KEY_ENV, PATH, STREAM, Procs, _gateway_args, _written  # noqa: E402

HERE = Path(__file__).resolve().parent
DIRECT = ("client -> upstream", "upstream", "upstream -> client")
THROUGH = ("client -> gateway", "gateway: request", "gateway -> upstream", "upstream", "upstream -> gateway",
           "gateway: answer", "gateway -> client")


class Client:
    """c=1 over one kept-alive connection: the same streamed request each time, noting (ns) just before its bytes
    are sent and when the first bytes of the answer's body arrive."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = json.dumps(STREAM).encode()
        self.request = (f"POST {PATH} HTTP/1.1\r\nhost: {parts.hostname}\r\nauthorization: Bearer {key}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body

    def ask(self) -> tuple[int, int]:
        sent = time.perf_counter_ns()
        self.sock.sendall(self.request)
        data, first = b"", 0
        while not data.endswith(b"\r\n0\r\n\r\n"):
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError("the server closed the connection mid-answer")
            data += got
            if not first and b"\r\n\r\n" in data and data.partition(b"\r\n\r\n")[2]:
                first = time.perf_counter_ns()  # the first read that holds some of the body
        if not data.startswith(b"HTTP/1.1 200 ") or b"data: [DONE]" not in data:
            raise RuntimeError(f"a streamed request was answered {data[:200]!r}")
        return sent, first

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def _signal_and_read(proc: object, sig: int, out: Path) -> list[list[object]]:
    out.unlink(missing_ok=True)
    proc.send_signal(sig)  # type: ignore[attr-defined]
    if not _written(out):
        raise RuntimeError(f"{out} was not written")
    return list(json.loads(out.read_text()))


def hops(samples: int, gap_ms: float) -> dict[str, dict[str, float]]:
    """The median of each hop (µs) over `samples` requests, direct and through the gateway, and their TTFC."""
    key = "sk-hops-" + os.urandom(8).hex()
    procs = Procs()
    with tempfile.TemporaryDirectory() as tmp:
        up_out, gw_out = Path(tmp) / "upstream.json", Path(tmp) / "gateway.json"
        try:
            up, upstream = procs.start([sys.executable, str(HERE / "_upstream.py"), "--port", "0", "--gap-ms",
                                        str(gap_ms), "--trace", str(up_out)])
            env = {**os.environ, KEY_ENV: key}
            gw, url = procs.start(_gateway_args(upstream, Path(tmp) / "log", trace=gw_out), env)
            out: dict[str, dict[str, float]] = {}
            for name, target in (("direct", upstream), ("through the gateway", url)):
                with Client(target, key) as client:
                    for _ in range(samples):
                        client.ask()
                    up.send_signal(signal.SIGUSR1)
                    gw.send_signal(signal.SIGUSR1)
                    time.sleep(0.2)  # (each clears on its own loop)
                    asked = [client.ask() for _ in range(samples)]
                noted = _signal_and_read(up, signal.SIGUSR2, up_out)
                came = [int(ns) for ns, kind in noted if kind == "in"]  # type: ignore[call-overload]
                left = [int(ns) for ns, kind in noted if kind == "out"]  # type: ignore[call-overload]
                if len(came) != samples or len(left) != samples:
                    raise RuntimeError(f"the upstream saw {len(came)} requests and answered {len(left)}, "
                                       f"not {samples}")
                if name == "direct":
                    cuts = [(s, c, o, f) for (s, f), c, o in zip(asked, came, left)]
                    labels = DIRECT
                else:
                    events = _signal_and_read(gw, signal.SIGUSR2, gw_out)
                    times = _path.request_times(events, int(urlsplit(url).port or 0),
                                                int(urlsplit(upstream).port or 0))
                    if len(times) != samples:
                        raise RuntimeError(f"the gateway's events hold {len(times)} requests, not {samples}")
                    cuts = [(s, g0, g1, c, o, g2, g3, f)
                            for (s, f), (g0, g1, g2, g3), c, o in zip(asked, times, came, left)]
                    labels = THROUGH
                row = {label: statistics.median((cut[k + 1] - cut[k]) / 1000 for cut in cuts)
                       for k, label in enumerate(labels)}
                row["time to first chunk"] = statistics.median((cut[-1] - cut[0]) / 1000 for cut in cuts)
                out[name] = row
            return out
        finally:
            procs.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=1.0, help="the upstream's pause between two chunks")
    args = parser.parse_args()
    got = hops(args.samples, args.gap_ms)
    print(f"a stream's first chunk, hop by hop: medians of {args.samples} requests at c=1 (µs), upstream chunks "
          f"{args.gap_ms:g} ms apart, every process recording; {os.cpu_count()} CPUs")
    for name, row in got.items():
        print(f"\n{name}:")
        print("| hop | µs |\n|---|---|")
        for label, us in row.items():
            print(f"| {label} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
