"""Import boundaries, read from the source with `ast` (every import, including
relative ones and those inside functions):

- `llmgw/domain`, `llmgw/placement`, `llmgw/reconcile` import only the standard
  library and each other;
- only `llmgw/store/` imports pysyncobj;
- `llmgw/cli/__init__.py` and the `llmgw/cli/ctl/` package load no server stack (quart,
  hypercorn, trio, rich) at module level, so `llmgw ctl` starts fast.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "llmgw"
PURE = ("llmgw.domain", "llmgw.placement", "llmgw.reconcile")
SERVER_STACK = ("quart", "hypercorn", "trio", "rich")
CTL_FILES = sorted(p.relative_to(REPO).as_posix() for p in (PACKAGE / "cli" / "ctl").rglob("*.py")
                   if "__pycache__" not in p.parts)
CLI_FILES = ("llmgw/cli/__init__.py", *CTL_FILES)


@dataclass(frozen=True)
class Import:
    line: int
    name: str  # absolute dotted name, e.g. "llmgw.domain.model.ModelDef" or "os.path"

    @property
    def top(self) -> str:
        return self.name.split(".")[0]


def module_name(path: Path) -> tuple[str, bool]:
    """("llmgw.domain.model", is_package) for a file under the repository."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports(source: str, module: str, *, is_package: bool = False, module_level_only: bool = False) -> list[Import]:
    """Every import in `source`, relative ones resolved against `module`.

    `from a import b` yields "a.b" (b may be a module). A dynamic import with a
    literal name counts too: `__import__("x")`, `importlib.import_module("x")`,
    `builtins.__import__("x")`, `import_module(name="x")`, and either function
    under an alias (`from importlib import import_module as load`). With
    `module_level_only`, imports inside function bodies and under
    `if TYPE_CHECKING:` are left out: they do not run when the module loads.
    """
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    loaders = _dynamic_import_names(tree)

    def visit(node: ast.AST) -> None:
        if module_level_only:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for stmt in node.orelse:
                    visit(stmt)
                return
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.append(Import(node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func, loaders):
            # Both functions take the module as `name`, by position or by keyword.
            named = [k.value for k in node.keywords if k.arg == "name"]
            first = node.args[0] if node.args else (named[0] if named else None)
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(Import(node.lineno, first.value))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_LOADERS = ("__import__", "import_module")


def _dynamic_import_names(tree: ast.AST) -> set[str]:
    """The names a module can call to import by name: the two functions, and their aliases."""
    names = set(_LOADERS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("importlib", "builtins"):
            names.update(a.asname for a in node.names if a.name in _LOADERS and a.asname)
    return names


def _is_dynamic_import(func: ast.expr, loaders: set[str]) -> bool:
    """`import_module(...)`, `alias(...)`, `importlib.import_module(...)`, `builtins.__import__(...)`."""
    return (isinstance(func, ast.Name) and func.id in loaders) or (
        isinstance(func, ast.Attribute) and func.attr in _LOADERS
    )


def impure(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Imports that leave the standard library and the pure packages."""
    bad = []
    for imp in imports(source, module, is_package=is_package):
        if imp.top in sys.stdlib_module_names:
            continue
        if any(imp.name == p or imp.name.startswith(p + ".") for p in PURE):
            continue
        bad.append(f"{module}:{imp.line}: imports {imp.name}")
    return bad


def py_files(*packages: str) -> list[Path]:
    files: list[Path] = []
    for package in packages:
        root = REPO / package.replace(".", "/")
        files.extend(sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts))
    return files


# --- the checker can fail ---------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import trio\n", "llmgw.domain.x", False),
        ("def later():\n    import httpx\n", "llmgw.placement.x", False),
        ("from .. import control\n", "llmgw.domain.x", False),
        ("from ..store import raft\n", "llmgw.reconcile.x", False),
        ("from . import gateway\n", "llmgw", True),
        ("import llmgw.cli\n", "llmgw.domain", True),
        ("import importlib\nimportlib.import_module('quart')\n", "llmgw.domain.x", False),
        ("from importlib import import_module\nimport_module('quart')\n", "llmgw.domain.x", False),
        ("from importlib import import_module as load\nload('quart')\n", "llmgw.domain.x", False),
        ("import importlib\nimportlib.import_module(name='quart')\n", "llmgw.domain.x", False),
        ("import builtins\nbuiltins.__import__('quart')\n", "llmgw.domain.x", False),
        ("from builtins import __import__ as imp\nimp(name='quart')\n", "llmgw.domain.x", False),
        ("def f():\n    return __import__('quart')\n", "llmgw.placement.x", False),
        ("class A:\n    def f(self):\n        from pysyncobj import SyncObj\n", "llmgw.domain.x", False),
    ],
)
def test_checker_flags_imports_from_outside(source: str, module: str, is_package: bool) -> None:
    assert impure(source, module, is_package=is_package)


def test_checker_accepts_stdlib_and_the_pure_packages() -> None:
    source = (
        "from __future__ import annotations\nimport os.path\nfrom typing import Any\n"
        "from . import model\nfrom .state import ClusterState\nfrom ..placement import plan\n"
        "import llmgw.reconcile.loop\ndef f():\n    import json\n"
    )
    assert impure(source, "llmgw.domain.x") == []


def test_module_level_only_skips_function_bodies_and_type_checking() -> None:
    source = (
        "import cyclopts\nif TYPE_CHECKING:\n    import trio\nelse:\n    import json\n"
        "def f():\n    import rich\nclass C:\n    import hypercorn\n"
    )
    names = [i.name for i in imports(source, "llmgw.cli.x", module_level_only=True)]
    assert names == ["cyclopts", "json", "hypercorn"]


# --- the rules ------------------------------------------------------------------


def test_domain_placement_reconcile_import_only_stdlib_and_each_other() -> None:
    files = py_files(*PURE)
    assert any(f.name != "__init__.py" for f in files), "no modules found: the check would pass vacuously"
    bad = []
    for path in files:
        module, is_package = module_name(path)
        bad += impure(path.read_text(encoding="utf-8"), module, is_package=is_package)
    assert bad == [], "pure packages import from outside:\n" + "\n".join(bad)


def test_the_file_helpers_every_role_and_ctl_import_are_standard_library_only() -> None:
    path = PACKAGE / "diskfiles.py"
    outside = [i.name for i in imports(path.read_text(encoding="utf-8"), "llmgw.diskfiles")
               if i.top not in sys.stdlib_module_names]
    assert outside == [], f"llmgw/diskfiles.py (imported by ctl) imports {outside}"


def test_only_the_store_imports_pysyncobj() -> None:
    bad = []
    for path in py_files("llmgw"):
        if path.is_relative_to(PACKAGE / "store"):
            continue
        module, is_package = module_name(path)
        for imp in imports(path.read_text(encoding="utf-8"), module, is_package=is_package):
            if imp.top == "pysyncobj":
                bad.append(f"{module}:{imp.line}: imports {imp.name}")
    assert bad == [], "only llmgw/store/ may import pysyncobj:\n" + "\n".join(bad)


@pytest.mark.parametrize("relpath", CLI_FILES)
def test_cli_entry_modules_import_no_server_stack_at_module_level(relpath: str) -> None:
    path = REPO / relpath
    module, is_package = module_name(path)
    found = imports(path.read_text(encoding="utf-8"), module, is_package=is_package, module_level_only=True)
    bad = [f"{relpath}:{i.line}: imports {i.name}" for i in found if i.top in SERVER_STACK]
    assert bad == [], "CLI start-up must stay light; import these inside the commands that need them:\n" + "\n".join(
        bad
    )


def test_importing_the_cli_loads_no_server_stack() -> None:
    # rich is left out here: cyclopts itself loads it. The ast check above keeps
    # our own modules from importing it at module level.
    code = (
        "import json, sys\n"
        "import llmgw.cli, llmgw.cli.ctl\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('quart', 'hypercorn', 'trio'))))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], "importing llmgw.cli loaded: " + proc.stdout
