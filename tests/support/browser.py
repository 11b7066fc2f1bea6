"""Debian's chromium through Playwright, for the console's browser tests (tests/e2e/test_console_*.py). Importing
this skips the importing test module when the playwright package or chromium is missing (`LLMGW_REQUIRE_TOOLS`
turns that skip into a failure, as for every system tool)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package (the test extra) is not installed")
CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed (.ci/system-packages.sh installs it)", allow_module_level=True)


@contextmanager
def chromium() -> Iterator[Any]:
    """One headless chromium, closed at the end of the block."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            yield b
        finally:
            b.close()

