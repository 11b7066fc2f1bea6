"""The one table of timeouts (`llmgw/domain/timeouts.py`): its values, `scaled`, the
operations doc that lists it, and a source scan that keeps timeouts from growing elsewhere."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from pathlib import Path

import pytest

from llmgw.domain.timeouts import TIMEOUTS, Timeouts

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "llmgw"
OPERATIONS = REPO / "docs" / "operations.md"

# Files the scan leaves out, each with its reason.
NOT_SCANNED = {
    "llmgw/domain/timeouts.py": "the table itself",
}
# The test harness's own waits (how long a test waits for a process) are not llmgw's timeouts.
NOT_SCANNED_DIRS = ("llmgw/testing/",)
# (file, source text of the flagged node): literal waits that are not tunables. Keep it tiny.
EXEMPT: set[tuple[str, str]] = {
    # How long a signal already delivered may take to reach trio's receiver while it is drained.
    ("llmgw/cli/_lifecycle.py", "_DRAIN_SIGNALS_S = 0.05"),
    # A lock holder writes its pid right after taking the lock: the reader gives it 20 × 10 ms.
    ("llmgw/statedir.py", "time.sleep(0.01)"),
}

_TIMED_CALLS = {"sleep", "move_on_after", "fail_after"}  # trio's (and time.sleep): a relative wait
_TIMED_KEYWORDS = {"timeout", "connect", "read", "write", "pool", "keepalive_expiry"}  # httpx's among them


def _timed_name(name: str) -> bool:
    """A name that holds seconds: `*_s` / `*_S`, or anything naming a timeout."""
    return name.lower().endswith("_s") or "timeout" in name.lower()


def _number(node: ast.AST | None) -> bool:
    """A number written in the source: `5`, `0.5`, `-1`, `2 * 60`."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    return False


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def literal_timeouts(source: str) -> list[tuple[int, str]]:
    """(line, source text) of each timeout written as a number outside the table: a module- or
    class-level `X_S = 5.0`, `sleep(0.1)` / `move_on_after(1)` / `fail_after(2)`, a keyword
    such as `timeout=2.0` or `graceful_s=1.0`, and a parameter default such as `poll_s=1.0`."""
    tree = ast.parse(source)
    found: list[ast.AST] = []
    defaults: list[tuple[int, str]] = []  # a bare default says nothing: its parameter's name goes with it

    def constants(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                constants(stmt.body)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
            value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
            # Upper case: a constant. A dataclass field's default (a model definition's
            # `idle_timeout_s`) belongs to what it defines, with its own docs.
            if _number(value) and any(isinstance(t, ast.Name) and t.id.isupper() and _timed_name(t.id) for t in targets):
                found.append(stmt)

    constants(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if _call_name(node) in _TIMED_CALLS and node.args and _number(node.args[0]):
                found.append(node)
            found.extend(
                kw for kw in node.keywords
                if kw.arg is not None and (kw.arg in _TIMED_KEYWORDS or _timed_name(kw.arg)) and _number(kw.value)
            )
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            pairs = [*zip(positional[len(positional) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            defaults.extend(
                (default.lineno, f"{arg.arg}={ast.get_source_segment(source, default)}")
                for arg, default in pairs if _timed_name(arg.arg) and _number(default)
            )
    return sorted({*((n.lineno, ast.get_source_segment(source, n) or "?") for n in found), *defaults})


def _scanned() -> list[Path]:
    paths = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel not in NOT_SCANNED and not rel.startswith(NOT_SCANNED_DIRS):
            paths.append(path)
    return paths


# --- the table ------------------------------------------------------------------------------------


def test_every_default_is_a_positive_number_of_seconds_with_an_area_and_help() -> None:
    for name, area, default, help in Timeouts.table():
        assert default > 0 and math.isfinite(default), name
        assert area and help and "|" not in help, name  # `|` would split the doc's table cell
        assert name.endswith("_s"), f"{name}: a timeout's name says its unit"


def test_scaled_scales_every_field_and_leaves_the_default_alone() -> None:
    fast = TIMEOUTS.scaled(0.01)
    for f in dataclasses.fields(Timeouts):
        assert getattr(fast, f.name) == pytest.approx(getattr(TIMEOUTS, f.name) * 0.01), f.name
    assert TIMEOUTS == Timeouts()


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "5"])
def test_a_value_that_is_not_a_positive_number_of_seconds_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="lost_node_grace_s must be a positive number of seconds"):
        dataclasses.replace(TIMEOUTS, lost_node_grace_s=bad)


def test_scaling_to_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        TIMEOUTS.scaled(0)


def test_overrides_for_processes_name_fields_and_seconds() -> None:
    """LLMGW_TIMEOUTS, as `llmgw control` and `llmgw agent` read it."""
    fast = TIMEOUTS.overridden(" stream_heartbeat_s=0.25, lost_node_grace_s=1 ,")
    assert (fast.stream_heartbeat_s, fast.stream_silence_s, fast.lost_node_grace_s) == (0.25, 0.75, 1.0)
    assert fast.start_resend_s == TIMEOUTS.start_resend_s
    assert TIMEOUTS.stream_silence_s == 3 * TIMEOUTS.stream_heartbeat_s, "a silent peer is gone in three beats"
    for bad, why in (("stream_heartbeat=1", "NAME=SECONDS"), ("stream_heartbeat_s", "NAME=SECONDS"),
                     ("stream_heartbeat_s=soon", "not a number"), ("stream_heartbeat_s=0", "positive")):
        with pytest.raises(ValueError, match=why):
            TIMEOUTS.overridden(bad)


# --- no timeout lives outside the table -------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "HEARTBEAT_S = 5.0",
        "START_TIMEOUT_S: float = 600.0",
        "DRAIN_TIMEOUT = 2 * 5",
        "class Hub:\n    RESEND_S = 15.0",
        "async def f():\n    await trio.sleep(0.1)",
        "def f():\n    time.sleep(1)",
        "with trio.move_on_after(1.0):\n    pass",
        "with trio.fail_after(3):\n    pass",
        "httpx.AsyncClient(timeout=2.0)",
        "httpx.Timeout(connect=5, read=None, write=30, pool=30)",
        "hypercorn_config(host, port, graceful_s=1.0)",
        "def watch_parent(poll_s: float = 1.0):\n    pass",
        "def g(*, timeout=30):\n    pass",
    ],
)
def test_the_scan_finds_a_timeout_written_as_a_number(source: str) -> None:
    assert literal_timeouts(source), source


@pytest.mark.parametrize(
    "source",
    [
        "HEARTBEAT_S = TIMEOUTS.stream_heartbeat_s",
        "MAX_BODY_BYTES = 1 << 20",
        "DRAIN_FACTOR = 4",
        "async def f(t):\n    await trio.sleep(t.engine_health_poll_s)",
        "with trio.move_on_at(deadline):\n    pass",
        "httpx.Timeout(connect=t.upstream_connect_s, read=None)",
        "def f(lines=5, limit=600):\n    pass",
        "def f():\n    X_S = 5.0",  # a local, not a module constant (a keyword or call would still be caught)
        "@dataclass\nclass M:\n    idle_timeout_s: float = 900.0",  # a definition's field, documented with it
    ],
)
def test_the_scan_lets_the_rest_through(source: str) -> None:
    assert literal_timeouts(source) == [], source


def test_no_module_writes_a_timeout_as_a_number() -> None:
    found = []
    for path in _scanned():
        rel = path.relative_to(REPO).as_posix()
        for line, text in literal_timeouts(path.read_text(encoding="utf-8")):
            if (rel, text) not in EXEMPT:
                found.append(f"{rel}:{line}: {text}")
    assert found == [], (
        "a timeout belongs in llmgw/domain/timeouts.py (and docs/operations.md); read it from the "
        "`Timeouts` the role's config carries:\n" + "\n".join(found)
    )


def test_the_scan_covers_the_roles() -> None:
    scanned = {p.relative_to(REPO).as_posix() for p in _scanned()}
    for rel in ("llmgw/agent/service.py", "llmgw/control/hub.py", "llmgw/gateway/app.py", "llmgw/wire/protocol.py",
                "llmgw/reconcile/__init__.py", "llmgw/engines/sim/process.py", "llmgw/cli/ctl/session.py"):
        assert rel in scanned
    assert all((PACKAGE.parent / rel).exists() for rel in NOT_SCANNED), "a file left out of the scan is gone: drop it"


# --- docs/operations.md lists the same table ------------------------------------------------------


def markdown_table() -> str:
    """The table as docs/operations.md shows it (paste this when the test below fails)."""
    rows = ["| name | area | default (s) | what it bounds |", "| --- | --- | --- | --- |"]
    rows += [f"| `{name}` | {area} | {default:g} | {help} |" for name, area, default, help in Timeouts.table()]
    return "\n".join(rows)


def _doc_rows(text: str) -> list[tuple[str, str, float, str]]:
    section = re.search(r"^## Timeouts and intervals\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "docs/operations.md has no '## Timeouts and intervals' section"
    rows = []
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 4 or cells[0] in ("name", "---"):
            continue
        rows.append((cells[0].strip("`"), cells[1], float(cells[2]), cells[3]))
    return rows


def test_the_operations_doc_lists_exactly_the_table() -> None:
    rows = _doc_rows(OPERATIONS.read_text(encoding="utf-8"))
    assert rows == Timeouts.table(), "docs/operations.md drifted from Timeouts; its table is:\n" + markdown_table()


def test_the_doc_check_sees_a_changed_default() -> None:
    text = OPERATIONS.read_text(encoding="utf-8").replace("| `lost_node_grace_s` | control | 30 |",
                                                         "| `lost_node_grace_s` | control | 31 |")
    assert _doc_rows(text) != Timeouts.table()


# --- a role reads the table it is given --------------------------------------------------------------


async def test_the_gateways_upstream_pool_takes_its_timeouts_from_the_table_it_is_given() -> None:
    import functools

    import trio

    from llmgw.gateway.pool import Pool
    from llmgw.gateway.upstream import UpstreamTimeout, send

    async def silent(stream: trio.SocketStream) -> None:  # takes the request, never answers
        await trio.sleep_forever()

    given = dataclasses.replace(TIMEOUTS, upstream_first_byte_s=0.25)
    pool = Pool(given)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        with pytest.raises(UpstreamTimeout, match="within 0.25 s"), trio.fail_after(5):
            await send(pool, url, "/v1/chat/completions", b"{}", "req-1", limit=1, queue=1)
        nursery.cancel_scope.cancel()
    assert pool.in_use(url) == 0  # the timed-out connection was closed, its slot freed
