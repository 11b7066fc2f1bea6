"""Options shared by the whole suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite golden files (tests/unit/testdata/...) with the actual output instead of comparing",
    )
