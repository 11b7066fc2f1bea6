"""The control plane's layers, read from the source with `ast` (every import, those inside functions too;
`if TYPE_CHECKING:` imports are left out: they never run, and a type named across a layer is no
dependency of the code that runs):

- no import circle among llmgw's modules;
- control never imports console or gateway; the request-log query types both need are in `llmgw.wire`;
- console, notify and metrics read the control plane through its context and operations, never through a
  route module (`control.api`), and never hold the store's own types;
- in the control plane only `control/api/` imports Quart (the console, a web UI of its own, mounts itself);
- the cluster's summary and its conditions are computed in one place (`control/context.py`), so the status
  route, the console, the metrics and the notifier cannot disagree.

Each rule is shown to fail on a synthetic case (`test_each_rule_fails_when_broken`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_purity import imports, module_name

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "llmgw"


def sources() -> dict[str, tuple[str, bool]]:
    """Module name -> (source, is_package) for every module of llmgw."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" not in path.parts:
            name, is_package = module_name(path)
            out[name] = (path.read_text(encoding="utf-8"), is_package)
    return out


def _runtime_imports(source: str, module: str, is_package: bool) -> list[str]:
    """Every import that can run: at module level or in a function, but not under `if TYPE_CHECKING:`."""
    everything = imports(source, module, is_package=is_package)
    checked_only = _type_checking_lines(source)
    return [i.name for i in everything if i.line not in checked_only]


def _type_checking_lines(source: str) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and ((isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING") or
                                         (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def graph(modules: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the llmgw modules it imports (an imported name resolved to the module that defines it)."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for m, (source, is_package) in modules.items():
        for name in _runtime_imports(source, m, is_package):
            if name.split(".")[0] == "llmgw" and (target := resolve(name)) and target != m:
                edges[m].add(target)
    return edges


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@dataclass(frozen=True)
class Rule:
    what: str
    importers: tuple[str, ...]  # the packages the rule is about
    forbidden: tuple[str, ...]  # what they must not import
    except_importers: tuple[str, ...] = ()

    def breaches(self, edges: Mapping[str, Iterable[str]]) -> list[str]:
        return sorted(f"{m} imports {t}" for m, targets in edges.items()
                      if _in(m, *self.importers) and not _in(m, *self.except_importers)
                      for t in targets if _in(t, *self.forbidden))


RULES = (
    Rule("control never imports console or gateway", ("llmgw.control",), ("llmgw.console", "llmgw.gateway")),
    Rule("console, notify and metrics never import a route module", ("llmgw.console", "llmgw.notify", "llmgw.metrics"),
         ("llmgw.control.api",)),
    Rule("console, notify and metrics never hold the store's own types", ("llmgw.console", "llmgw.notify",
                                                                          "llmgw.metrics"), ("llmgw.store",)),
    Rule("the gateway never imports the control plane", ("llmgw.gateway",), ("llmgw.control", "llmgw.console")),
)


def external_breaches(modules: Mapping[str, tuple[str, bool]], package: str, allowed: str,
                      libraries: tuple[str, ...]) -> list[str]:
    """Modules of `package` outside `allowed` that import one of `libraries`."""
    out = []
    for m, (source, is_package) in modules.items():
        if _in(m, package) and not _in(m, allowed):
            out += [f"{m} imports {n}" for n in _runtime_imports(source, m, is_package) if n.split(".")[0] in libraries]
    return sorted(out)


# Calls that compute the summary or its conditions: only the context may make them.
SUMMARY_CALLS = frozenset({"summarize", "conditions", "build"})


def summary_builders(modules: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Modules outside the pure core and `control/context.py` that call `summary.summarize`/`build` or
    `conditions(...)` themselves."""
    out = []
    for m, (source, _) in modules.items():
        if _in(m, "llmgw.domain", "llmgw.control.context"):
            continue
        tree = ast.parse(source)
        local = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and n.module in ("llmgw.domain.summary", "llmgw.domain.conditions") for a in n.names}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            named = (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "summary"
                     and f.attr in SUMMARY_CALLS) or (isinstance(f, ast.Name) and f.id in local
                                                      and f.id in SUMMARY_CALLS)
            if named:
                out.append(f"{m}:{node.lineno} {ast.unparse(f)}(...)")
    return out


MODULES = sources()
EDGES = graph(MODULES)


def test_no_import_circle() -> None:
    assert circles(EDGES) == []


@pytest.mark.parametrize("rule", RULES, ids=[r.what for r in RULES])
def test_layers_hold(rule: Rule) -> None:
    assert rule.breaches(EDGES) == []


def test_only_the_api_imports_quart_in_the_control_plane() -> None:
    assert external_breaches(MODULES, "llmgw.control", "llmgw.control.api", ("quart", "quart_trio", "werkzeug")) == []


def test_the_summary_is_computed_in_one_place() -> None:
    assert summary_builders(MODULES) == []


# --- each rule fails when broken -------------------------------------------------------------


def _modules(**sources_by_name: str) -> dict[str, tuple[str, bool]]:
    return {name.replace("__", "."): (text, False) for name, text in sources_by_name.items()}


def test_each_rule_fails_when_broken() -> None:
    circle = _modules(llmgw__a="from llmgw import b\n", llmgw__b="def f():\n    from llmgw.a import x\n",
                      llmgw__c="from llmgw import a\n")
    assert circles(graph(circle)) == [["llmgw.a", "llmgw.b"]]
    # A TYPE_CHECKING import is no dependency: no circle.
    typed = _modules(llmgw__a="from llmgw import b\n",
                     llmgw__b="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmgw.a import x\n")
    assert circles(graph(typed)) == []

    def breaches(what: str, modules: dict[str, tuple[str, bool]]) -> list[str]:
        rule = next(r for r in RULES if r.what == what)
        return rule.breaches(graph(modules))

    world = _modules(llmgw__console__page="from llmgw.control.api.route import Route\n",
                     llmgw__control__api__route="X = 1\n", llmgw__control__ops__x="from llmgw.console import page\n",
                     llmgw__console="", llmgw__notify__watch="from llmgw.store import CommitUnknown\n",
                     llmgw__store="", llmgw__gateway__app="from llmgw.control.context import Context\n",
                     llmgw__control__context="")
    assert breaches("control never imports console or gateway", world) == [
        "llmgw.control.ops.x imports llmgw.console.page"]
    assert breaches("console, notify and metrics never import a route module", world) == [
        "llmgw.console.page imports llmgw.control.api.route"]
    assert breaches("console, notify and metrics never hold the store's own types", world) == [
        "llmgw.notify.watch imports llmgw.store"]
    assert breaches("the gateway never imports the control plane", world) == [
        "llmgw.gateway.app imports llmgw.control.context"]
    quart = _modules(llmgw__control__members="from quart import Response\n",
                     llmgw__control__api__route="from quart import request\n")
    assert external_breaches(quart, "llmgw.control", "llmgw.control.api", ("quart",)) == [
        "llmgw.control.members imports quart.Response"]
    rebuilt = _modules(llmgw__console__overview="from llmgw.domain import summary\ns = summary.summarize(1, 2)\n",
                       llmgw__metrics__control="from llmgw.domain.conditions import conditions\nc = conditions(s)\n",
                       llmgw__control__context="from llmgw.domain import summary\ns = summary.summarize(1, 2)\n")
    assert summary_builders(rebuilt) == ["llmgw.console.overview:2 summary.summarize(...)",
                                         "llmgw.metrics.control:2 conditions(...)"]
