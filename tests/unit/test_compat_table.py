"""docs/api.md's compatibility table (issue 23, point 7) stays true to the suite: every test it names exists,
and every endpoint the gateway serves has a row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from llmgw.gateway.checks import ENDPOINTS

ROOT = Path(__file__).resolve().parents[2]


def table() -> list[list[str]]:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("### Compatibility\n", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:]]


def defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_table_names_exists() -> None:
    rows = table()
    assert len(rows) >= 10
    for row in rows:
        assert len(row) == 5, row
        names = re.findall(r"(tests/[\w/]+\.py)::(\w+)", row[4])
        assert names, f"no test named for {row[0]}"
        for file, test in names:
            assert test in defined(ROOT / file), f"{file}::{test} (named for {row[0]}) does not exist"


def test_every_endpoint_has_a_row() -> None:
    firsts = " ".join(row[0] for row in table())
    for path in ENDPOINTS:
        assert path in firsts, f"{path} has no row in docs/api.md's compatibility table"
