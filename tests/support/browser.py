"""Debian's chromium through Playwright, for the console's browser tests (tests/e2e/test_console_*.py). Importing
this skips the importing test module when the playwright package or chromium is missing (`LLMGW_REQUIRE_TOOLS`
turns that skip into a failure, as for every system tool)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.small_png import RGBA_OF_PNG_JS, palette_png

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


def screenshot(context: Any, page: Any, *, whole: bool = False, small: bool = False) -> bytes:
    """The page as seen (`whole`: all of it, below the fold too) as PNG bytes; `small`: as a palette PNG
    (the copies kept in docs/). Chromium on a loaded machine sometimes answers "Unable to capture
    screenshot" (no frame in time): asked again, up to three times, before that fails the test. The
    picture is the test's by-product, not what it checks."""
    for attempt in range(3):
        try:
            png: bytes = page.screenshot(full_page=whole)
            break
        except sync_api.Error as e:
            if "Unable to capture screenshot" not in str(e) or attempt == 2:
                raise
    if small:
        blank = context.new_page()
        try:
            got = blank.evaluate(RGBA_OF_PNG_JS, base64.b64encode(png).decode())
        finally:
            blank.close()
        png = palette_png(base64.b64decode(got["rgba"]), got["width"], got["height"])
    return png
