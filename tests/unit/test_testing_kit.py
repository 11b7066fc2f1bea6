"""`llmgw.testing` ships with the package, for users' own tests (like `trio.testing`): it imports only
the standard library, llmgw and the product's own dependencies (pyproject's `[project] dependencies`),
never a test-only library (hypothesis, schemathesis, numpy, gguf, pytest) nor the suite's harness
(`tests.support`). Read from the source with test_purity.py's reader: every import, including relative
ones, those inside functions and those by name."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from test_purity import imports, module_name

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "llmgw" / "testing"

# Distributions whose import name is not their name with "-" as "_".
IMPORT_NAMES = {"nvidia-ml-py": "pynvml"}


def import_name(requirement: str) -> str:
    """The top-level module a requirement line installs: "prometheus-client==0.26.0" -> "prometheus_client"."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert match, requirement
    name = match.group(0).lower().replace("_", "-").replace(".", "-")
    return IMPORT_NAMES.get(name, name.replace("-", "_"))


def product_imports(pyproject: str) -> set[str]:
    """What the product may import: its dependencies' modules, and llmgw itself."""
    return {"llmgw", *(import_name(r) for r in tomllib.loads(pyproject)["project"]["dependencies"])}


def foreign(source: str, module: str, allowed: set[str], *, is_package: bool = False) -> list[str]:
    """Imports of `source` from neither the standard library nor `allowed` (top-level names)."""
    return [f"{module}:{imp.line}: imports {imp.name}" for imp in imports(source, module, is_package=is_package)
            if imp.top not in sys.stdlib_module_names and imp.top not in allowed]


ALLOWED = product_imports((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_products_dependencies_by_import_name() -> None:
    assert {"trio", "httpx", "quart", "quart_trio", "pysyncobj", "pynvml", "prometheus_client", "trio_websocket",
            "httptools", "llmgw"} <= ALLOWED
    assert not {"hypothesis", "schemathesis", "numpy", "gguf", "pytest", "tests"} & ALLOWED
    assert import_name("quart-trio==0.12.0") == "quart_trio"
    assert import_name("Trio_Websocket >= 0.12 ; python_version >= '3.11'") == "trio_websocket"


@pytest.mark.parametrize(
    "source",
    [
        "from hypothesis import strategies as st\n",
        "import schemathesis\n",
        "def tensors():\n    import numpy as np\n",
        "import importlib\nimportlib.import_module('gguf')\n",
        "import pytest\n",
        "from tests.support.processes import free_port\n",
        "from xllamacpp import Server\n",  # an extra, not a dependency
    ],
)
def test_the_check_flags_a_test_only_import(source: str) -> None:
    assert foreign(source, "llmgw.testing.x", ALLOWED)


def test_the_check_accepts_stdlib_llmgw_and_the_dependencies() -> None:
    source = ("from __future__ import annotations\nimport json\nimport trio\nfrom . import MemoryStore\n"
              "from llmgw.domain import commands\ndef f():\n    import pynvml\n    from prometheus_client import Gauge\n")
    assert foreign(source, "llmgw.testing.x", ALLOWED) == []


def test_the_testing_kit_imports_only_the_products_dependencies() -> None:
    files = sorted(p for p in KIT.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(files) > 3, "no modules found: the check would pass vacuously"
    bad = []
    for path in files:
        module, is_package = module_name(path)
        bad += foreign(path.read_text(encoding="utf-8"), module, ALLOWED, is_package=is_package)
    assert bad == [], ("llmgw/testing ships with the package: it may import only the product's dependencies "
                       "(the harness goes in tests/support):\n" + "\n".join(bad))
