"""CPU per request by stage, from a cProfile of the gateway: each function's own time goes to the stage its
module belongs to (front end, app logic, upstream client, request log, access log, trio/sockets/other).

Shared code has no stage of its own: h11 serves both the front end and the upstream client, and builtins
(json, bytes, socket calls) serve everyone. Their time goes to their callers' stages, in proportion to the
time each caller spent in them (pstats keeps a per-caller figure), recursively: h11 under pool.py is the
upstream client's, h11 under front.py is the front end's, a `send()` under trio is trio's.
"""

from __future__ import annotations

import pstats
import sys
import sysconfig

FRONT, APP, UPSTREAM, REQLOG, ACCESS, OTHER = (
    "front end (server)", "app logic", "upstream client", "request log", "access log (logging)",
    "trio, sockets, other")
STAGES = (FRONT, APP, UPSTREAM, REQLOG, ACCESS, OTHER)
# Stages whose CPU is the handler's (everything but the HTTP server and the event loop).
HANDLER = (APP, UPSTREAM, REQLOG)

_OWN = (  # path fragment -> stage; first match wins
    ("llmgw/wire/front.py", FRONT), ("llmgw/gateway/front", FRONT), ("llmgw/wire/asgi", FRONT), ("/hypercorn/", FRONT), ("/wsproto/", FRONT),
    ("/httptools/", FRONT),
    ("llmgw/gateway/pool", UPSTREAM), ("llmgw/gateway/upstream", UPSTREAM), ("/httpx/", UPSTREAM),
    ("/httpcore/", UPSTREAM),
    ("llmgw/gateway/requestlog", REQLOG),
    ("llmgw/logs", ACCESS), ("/logging/", ACCESS),
    ("llmgw/", APP),
    ("/trio/", OTHER), ("/outcome/", OTHER), ("/sniffio/", OTHER), ("socket.py", OTHER), ("selectors.py", OTHER),
)
IDLE = frozenset({"<method 'poll' of 'select.epoll' objects>", "<method 'select' of 'select.epoll' objects>",
                  "<method 'poll' of 'select.poll' objects>", "<built-in method select.select>"})
_STDLIB = sysconfig.get_paths()["stdlib"]

Func = tuple[str, int, str]


def _own_stage(func: Func) -> str | None:
    """The stage a function's module belongs to, or None for shared code (h11, builtins, stdlib helpers)."""
    path = func[0].replace("\\", "/")
    for fragment, stage in _OWN:
        if fragment in path:
            return stage
    if path == "~" or "/h11/" in path or "/json/" in path or (path.startswith(_STDLIB) and "site-packages" not in path):
        return None
    return OTHER


def by_stage(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of own time per stage over the whole profile."""
    table = stats.stats  # type: ignore[attr-defined]  # func -> (cc, nc, tt, ct, callers)
    shares: dict[Func, dict[str, float]] = {}

    def share(func: Func, depth: int) -> dict[str, float]:
        """The fractions of `func`'s time that belong to each stage."""
        if func in shares:
            return shares[func]
        own = _own_stage(func)
        if own is not None or depth > 40 or func not in table:
            result = {own or OTHER: 1.0}
        else:
            shares[func] = {OTHER: 1.0}  # a cycle back to here counts as other
            callers = table[func][4]
            weights = {c: (v[3] or v[2] or float(v[1])) for c, v in callers.items()}
            total = sum(weights.values())
            result = {}
            for caller, w in weights.items() if total > 0 else ():
                for stage, f in share(caller, depth + 1).items():
                    result[stage] = result.get(stage, 0.0) + f * w / total
            result = result or {OTHER: 1.0}
        shares[func] = result
        return result

    out = dict.fromkeys(STAGES, 0.0)
    for func, (_cc, _nc, tt, _ct, _callers) in table.items():
        if func[2] in IDLE:
            continue  # the event loop waiting for work: wall time, not CPU
        for stage, f in share(func, 0).items():
            out[stage] += tt * f
    return out


def main() -> None:
    """`python tests/bench/_stages.py PROFILE [REQUESTS]`: a saved profile's stages (per request when given)."""
    stats = pstats.Stats(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for stage, seconds in by_stage(stats).items():
        print(f"{stage:<24}{seconds * 1000 / n:>10.3f} ms")


if __name__ == "__main__":
    main()
