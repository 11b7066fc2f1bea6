"""The benchmarks' load generator: `wrk` (Debian's C load generator) driven by a Lua script that POSTs one
JSON body with a bearer key, and a parser for its `--latency` report.

Why wrk: a Python load generator on the same 2 cores costs more per request than the gateway it measures
(wrk -t1 drives ~27,000 req/s from one thread against the raw upstream here).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

WRK = "wrk"
_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


@dataclass
class WrkRun:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int  # socket errors (connect, read, write, timeout) and non-2xx answers


def available() -> str | None:
    """wrk's path, or None when it is not installed."""
    return shutil.which(WRK)


def version() -> str:
    out = subprocess.run([WRK, "--version"], capture_output=True, text=True).stdout
    return out.split("Copyright")[0].strip() or "wrk"


def lua_script(body: dict[str, object], key: str) -> str:
    """A wrk script: every request a POST of `body` as JSON with `authorization: Bearer key`."""
    text = json.dumps(body, separators=(",", ":"))
    if "]==]" in text:
        raise ValueError("a body with ]==] does not fit a Lua long string")
    # A Lua long string: no escapes to translate between JSON's rules and Lua's.
    return (f"wrk.method = \"POST\"\nwrk.body = [==[{text}]==]\n"
            f"wrk.headers[\"Content-Type\"] = \"application/json\"\n"
            f"wrk.headers[\"Authorization\"] = \"Bearer {key}\"\n")


def write_script(directory: Path, name: str, body: dict[str, object], key: str) -> Path:
    path = directory / f"{name}.lua"
    path.write_text(lua_script(body, key))
    return path


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)  # wrk prints e.g. "-nanus" when nothing completed
    return float(found.group(1)) * _UNIT_MS[found.group(2)] if found else float("nan")


def parse(out: str) -> WrkRun:
    """The figures of one `wrk --latency` report; ValueError when it is not one."""
    done = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50, p99 = re.search(r"\b50%\s+(\S+)", out), re.search(r"\b99%\s+(\S+)", out)
    if not (done and rps and p50 and p99):
        raise ValueError(f"not a wrk --latency report: {out[:300]!r}")
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = (sum(int(g) for g in sock.groups()) if sock else 0) + (int(non2xx.group(1)) if non2xx else 0)
    seconds = float(done.group(2)) * _UNIT_MS[done.group(3)] / 1000
    return WrkRun(int(done.group(1)), seconds, float(rps.group(1)), _ms(p50.group(1)), _ms(p99.group(1)), errors)


def run(url: str, script: Path, *, connections: int, seconds: float, timeout_s: float = 10.0) -> WrkRun:
    """One wrk run with one thread (one thread keeps wrk's own CPU to a single core)."""
    cmd = [WRK, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", f"--timeout={timeout_s:g}s",
           "--latency", "-s", str(script), url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + timeout_s + 30)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return parse(done.stdout)
