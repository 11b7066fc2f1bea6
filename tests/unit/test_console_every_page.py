"""What holds for every console page at once: every form that POSTs carries this session's CSRF token; no page,
script or stylesheet loads anything from another host (no CDN: fleets are often air-gapped), which the
Content-Security-Policy also forbids; the static files are package data (the zipapp carries them); and every
screenshot the browser tests take is in docs/console/ and shown in docs/console.md."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx

from console_world import World, csrf_of, sign_in
from llmgw.domain import commands
from llmgw.domain.guard import GuardPolicy
from llmgw.testing.builders import model, node, store_with

ROOT = Path(__file__).parents[2]
PAGES = ("/", "/nodes", "/nodes/n1", "/models", "/models/broken", "/requests", "/guardrails", "/mirror", "/settings",
         "/do")
# The confirmation and result pages of the Do menu are forms too: (path, the first POST's fields).
STEPS = (("/do/system", {"to": "stop"}), ("/do/guards", {"to": "off"}), ("/do/retry", {"name": "broken"}),
         ("/do/judge", {"source": "/models/Llama-Guard-3-1B.Q4_K_M.gguf"}),
         ("/do/serve", {"name": "x", "engine": "sim", "source": "sim://x"}), ("/do/serve", {"name": "x"}))
EXTERNAL = re.compile(r"""(?:src|href|action|formaction)\s*=\s*["']?\s*(?:https?:)?//"""
                      r"""|@import|url\(\s*["']?(?:https?:)?//|fetch\(\s*["']https?:|XMLHttpRequest""", re.I)


def world() -> World:
    store = store_with([model("chat").sim(), model("broken").sim()])
    for _ in range(5):
        store.submit_nowait(commands.start_failed("broken", "broken-r1", "ImportError: torch", 1.0))
    store.submit_nowait(commands.set_policy(GuardPolicy("strict", "guard-1"), 0.0))
    return World(store, [node("n1").gpus(2, "h100-80g").fabric("ib-a").engines("sim").build()], views={})


async def every_page(c: httpx.AsyncClient) -> dict[str, httpx.Response]:
    shown = {path: await c.get(path) for path in PAGES}
    csrf = csrf_of(shown["/do"].text)
    for path, fields in STEPS:
        shown[f"POST {path} {sorted(fields)}"] = await c.post(path, data={**fields, "csrf": csrf})
    return shown


async def test_every_form_that_posts_carries_the_sessions_csrf_token() -> None:
    async with world().client() as c:
        await sign_in(c)
        shown = await every_page(c)
    token = csrf_of(shown["/"].text)
    posting = 0
    for where, r in shown.items():
        assert r.status_code == 200, (where, r.text[:500])
        for form in re.findall(r"<form\b[^>]*>.*?</form>", r.text, re.S):
            if not re.search(r'method="post"', form, re.I):
                assert re.search(r'method="get"', form, re.I), (where, form[:200])  # no form without a method
                continue
            posting += 1
            assert f'<input type="hidden" name="csrf" value="{token}">' in form, (where, form[:300])
    assert posting >= 20  # sign-out on every page, the Do forms, the confirmations, retry on a parked model


async def test_no_page_script_or_stylesheet_loads_from_another_host() -> None:
    async with world().client() as c:
        signin = await c.get("/signin")
        await sign_in(c)
        shown = await every_page(c)
        static = [await c.get(f"/console/static/{name}") for name in ("console.js", "console.css")]
    for r in [signin, *shown.values(), *static]:
        assert r.status_code == 200, r.url
        found = EXTERNAL.search(r.text)
        assert found is None, (str(r.url), r.text[max(0, found.start() - 80):found.end() + 80])
    for r in [signin, *shown.values()]:
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, r.url
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', shown["/"].text)
    styles = re.findall(r'<link[^>]*href="([^"]+)"', shown["/"].text)
    assert scripts == ["/console/static/console.js"] and styles == ["/console/static/console.css"]


def test_the_static_files_are_package_data_so_the_zipapp_carries_them() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["llmgw"]
    package = ROOT / "llmgw"
    shipped = [p.relative_to(package).as_posix() for p in (package / "console").rglob("*")
               if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert shipped, "no static file found"
    for path in shipped:
        assert any(fnmatch.fnmatch(path, g) for g in globs), f"{path} is not in package-data {globs}"


def test_every_screenshot_the_browser_tests_take_is_shown_in_the_docs() -> None:
    taken = set(re.findall(r'\.shot\("([^"]+)"\)', (ROOT / "tests/e2e/test_console_browser.py").read_text()))
    layout = (ROOT / "tests/e2e/test_console_layout.py").read_text()  # glance-PAGE-WIDTH, each page at each width
    pages = re.findall(r'\("(\w+)", "/[^"]*"\)', layout.split("PAGES = ", 1)[1].split("\n", 1)[0])
    widths = re.search(r"SHOT_WIDTHS = \(([\d, ]+)\)", layout)
    assert pages and widths, "test_console_layout.py names its pages and widths otherwise"
    taken |= {f"glance-{p}-{w.strip()}" for p in pages for w in widths.group(1).split(",")}
    doc = (ROOT / "docs/console.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\(console/([^)]+)\.png\)", doc))
    assert len(taken) >= 7 and taken == shown, (taken ^ shown)
    for name in shown:
        assert (ROOT / "docs/console" / f"{name}.png").stat().st_size > 1000, name
    for page in ("Overview", "Nodes", "Models", "Requests", "Guardrails", "Settings", "Do"):
        assert f"| {page} (`/" in doc, page  # what each page answers
