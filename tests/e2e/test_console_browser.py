"""The console in a real browser: Playwright's sync API driving Debian's chromium against a real
`llmgw up` with a simulated fleet attached (30 nodes of 8 H100s on two fabrics, 2 nodes of MIG
instances). Every page is reached by its link and shows facts of that cluster; every Do action is
done end to end and its effect read back with `llmgw ctl`; a viewer is refused an action, a tampered
CSRF token is refused, signing out ends the session, and the key is never in a URL or a page.

Screenshots of each page are kept in $LLMGW_SCREENSHOTS (default: a temporary directory); the copies
in docs/console/ come from a run with LLMGW_SCREENSHOTS=docs/console. The sync API runs outside trio:
these are plain functions. One `up`, one fleet and one browser serve the whole module.

`up --tls`: the simulated nodes join as machines do (a join token each, made by `sim-fleet` with the
admin key) and authenticate with their certificates, which only a TLS admin API can see. That `up`'s CA
is its own: `ctl`, httpx and the fleets are given its bundle (credentials.json's ca_file), the browser
takes its certificate as it is (`ignore_https_errors`).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from llmgw.domain.settings import SETTINGS
from tests.support.browser import chromium, screenshot  # skips this module without chromium
from tests.support.processes import UpProcess, stop_all, until

pytestmark = pytest.mark.slow


SIM_NODES, MIG_NODES = 30, 2
PAGES = ("Overview", "Nodes", "Models", "Requests", "Guardrails", "Settings", "Do")
REFRESH_WAIT_MS = 20_000  # console_refresh_s is 5 s: a few refreshes, on 2 shared cores
CATALOG = """
[[models]]
name = "demo"
engine = "sim"
source = "sim://demo"
replicas = { min = 1, max = 1 }

[[models]]
name = "broken"          # fails every start (the sim engine's --fail-start): parked after five
engine = "sim"
source = "sim://broken"
args = ["--fail-start"]
replicas = { min = 1, max = 1 }
"""


@dataclass
class Cluster:
    up: UpProcess
    admin_url: str
    gateway_url: str
    admin_key: str
    client_key: str
    ca_file: str  # the bundle `up --tls` names in credentials.json
    shots: Path
    fleets: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ctl(self, *args: str) -> Any:
        """`llmgw ctl --json ARGS` against this cluster's admin URL: its JSON answer."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        done = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--url", self.admin_url, "--key", self.admin_key,
                               "--ca-file", self.ca_file, "--json", *args], capture_output=True, text=True, timeout=30,
                              env=env)
        assert done.returncode == 0, f"ctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return json.loads(done.stdout)

    def setting(self, key: str) -> Any:
        doc = self.ctl("settings", key)
        return doc["value"] if isinstance(doc, dict) and "value" in doc else doc

    def api(self, path: str) -> Any:
        r = httpx.get(self.admin_url + path, headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=10,
                      verify=ssl.create_default_context(cafile=self.ca_file))
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("console")
    (root / "catalog.toml").write_text(CATALOG)
    up = UpProcess(root / "state", extra_args=["--catalog", str(root / "catalog.toml"), "--tls"]).start()
    creds = up.credentials
    shots = Path(os.environ.get("LLMGW_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    c = Cluster(up, creds["admin_url"], creds["gateway_url"], creds["admin_key"], creds["client_key"],
                creds["ca_file"], shots)
    env = {**os.environ, "LLMGW_KEY": c.admin_key}  # the operator's key: the fleet makes each node's join token
    log = (root / "fleet.log").open("ab")
    try:
        for flags in (["--nodes", str(SIM_NODES), "--class", "h100-80g", "--fabric", "ib-a", "--fabric", "ib-b",
                       "--storage-holds", "console-sim"],
                      ["--nodes", str(MIG_NODES), "--prefix", "mig", "--gpus-per-node", "2", "--class", "a100-80g",
                       "--mig", "3g.40gb", "--mig", "3g.40gb", "--fabric", "ib-c"]):
            c.fleets.append(subprocess.Popen([sys.executable, "-m", "llmgw", "sim-fleet", "--control", c.admin_url,
                                              "--ca-file", c.ca_file, *flags], env=env, stdout=log,
                                             stderr=subprocess.STDOUT))
        until("every simulated node connected", lambda: len(c.api("/api/v1/nodes")["nodes"])
              >= SIM_NODES + MIG_NODES + 1, 45, every=0.2)
        # A policy whose judge is not served: Guardrails and Do say what is wrong with it. It checks only the
        # model that never answers (and lets requests through if the judge cannot), so it blocks nothing.
        c.ctl("guard", "set", "safety", "--judge", "llama-guard", "--models", "broken", "--on-error", "open")
        yield c
    finally:
        stop_all(c.fleets)
        log.close()
        up.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


class Console:
    """One browser context signed in (or not) to the console; it records every URL the browser asked
    and every page's HTML it was shown, to check that the key is in none."""

    def __init__(self, browser: Any, cluster: Cluster) -> None:
        self.cluster = cluster
        self.context = browser.new_context(viewport={"width": 1280, "height": 800}, ignore_https_errors=True)
        self.urls: list[str] = []
        self.context.on("request", lambda r: self.urls.append(r.url))
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)

    def sign_in(self, key: str) -> Console:
        self.page.goto(self.cluster.admin_url + "/")
        assert self.page.url.endswith("/signin"), self.page.url  # not signed in: to the form
        self.page.get_by_label("Admin key").fill(key)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(self.cluster.admin_url + "/")
        return self

    def nav(self, name: str) -> Any:
        """Follow the nav link named `name`; the page's main element."""
        self.page.locator("header nav").get_by_role("link", name=name, exact=True).click()
        self.page.wait_for_load_state()
        assert self.page.locator("header nav a.active").inner_text() == name
        self.check_no_key()
        return self.page.locator("main")

    def testid(self, tid: str) -> Any:
        return self.page.get_by_test_id(tid)

    def shot(self, name: str) -> None:
        # The Overview whole (its chart, members and judges are below the fold); other pages as seen.
        png = screenshot(self.context, self.page, whole=name.startswith("overview"),
                         small=bool(os.environ.get("LLMGW_SCREENSHOTS")))  # copies to keep (docs/console): small
        (self.cluster.shots / f"{name}.png").write_bytes(png)

    def check_no_key(self) -> None:
        html = self.page.content()
        for key in (self.cluster.admin_key, self.cluster.client_key):
            assert key not in self.page.url and key not in html
            assert not [u for u in self.urls if key in u]

    def close(self) -> None:
        self.check_no_key()
        self.context.close()


@pytest.fixture
def admin(browser: Any, cluster: Cluster) -> Iterator[Console]:
    c = Console(browser, cluster).sign_in(cluster.admin_key)
    yield c
    c.close()


def do_action(c: Console, form_testid: str, *, expect: str = "done") -> Any:
    """On Do: press the form's button, then Confirm; the result section (its outcome checked)."""
    c.nav("Do")
    c.page.locator(f'[data-testid="{form_testid}"] button[type=submit]').click()
    c.page.wait_for_load_state()
    c.testid("confirm").click()
    c.page.wait_for_load_state()
    result = c.testid("action-result")
    assert result.get_attribute("data-outcome") == expect, result.inner_text()
    c.check_no_key()
    return result


def test_sign_in_and_every_page_shows_the_clusters_facts(browser: Any, cluster: Cluster) -> None:
    c = Console(browser, cluster)
    c.page.goto(cluster.admin_url + "/nodes")
    assert c.page.url.endswith("/signin")
    c.shot("signin")
    c.page.get_by_label("Admin key").fill("sk-not-a-key-of-this-cluster")
    c.page.get_by_role("button", name="Sign in").click()
    assert "not an admin or viewer key" in c.testid("signin-error").inner_text()
    c.sign_in(cluster.admin_key)
    assert "(admin)" in c.testid("signed-in-as").inner_text()

    c.nav("Overview")
    capacity = c.testid("capacity-table").inner_text()
    assert "h100-80g" in capacity and "a100-80g-mig-3g.40gb" in capacity and str(SIM_NODES * 8) in capacity
    assert "ib-a" in c.testid("fabrics-table").inner_text()
    assert c.testid("no-webhook").is_visible()
    assert c.testid("leader").inner_text() != "unknown"

    c.nav("Nodes")
    table = c.testid("nodes-table").inner_text()
    assert "sim-0001" in table and "mig-0001" in table and "0/mig0" in table
    assert c.testid("pager").first.get_attribute("data-total") == str(SIM_NODES + MIG_NODES + 1)
    c.shot("nodes")
    header = c.testid("nodes-table").get_by_role("columnheader", name="Node", exact=True)
    header.click()
    header.click()  # a second click sorts the rows shown the other way, in the page (console.js)
    names = c.page.locator('[data-testid="nodes-table"] tbody tr td:first-child').all_inner_texts()
    assert len(names) == SIM_NODES + MIG_NODES + 1 and names == sorted(names, key=str.lower, reverse=True), names
    c.testid("nodes-q").fill("mig-")
    c.testid("nodes-apply").click()
    c.page.wait_for_load_state()
    rows = c.page.locator('[data-testid="nodes-table"] tbody tr')
    assert rows.count() == MIG_NODES and "sim-0001" not in c.testid("nodes-table").inner_text()
    c.page.get_by_role("link", name="mig-0002").click()
    assert "a100-80g-mig-3g.40gb" in c.testid("node-gpus").inner_text()

    c.nav("Models")
    models = c.testid("models-table").inner_text()
    assert "demo" in models and "broken" in models
    c.page.get_by_role("link", name="broken", exact=True).click()
    assert "--fail-start" in c.page.locator("main").inner_text()

    c.nav("Guardrails")
    assert c.testid("guards-state").get_attribute("data-enabled") == "true"
    assert "safety" in c.testid("guard-policies").inner_text()
    judges = c.page.locator('[data-testid="judges-table"] tr', has_text="llama-guard").inner_text()
    assert "missing" in judges, judges
    c.shot("guardrails")

    c.nav("Settings")
    settings = c.testid("settings-table").inner_text()
    assert SETTINGS["serving.stopped"].help in settings and SETTINGS["guard.enabled"].help in settings
    c.shot("settings")

    c.nav("Do")
    assert c.testid("serve-form").is_visible() and "The system is running" in c.testid("system-state").inner_text()
    c.close()


def test_a_request_through_the_gateway_shows_on_requests_without_a_reload(admin: Console, cluster: Cluster) -> None:
    admin.nav("Requests")
    admin.page.evaluate("window.__not_reloaded = true")
    r = httpx.post(cluster.gateway_url + "/chat/completions", headers={"Authorization": f"Bearer {cluster.client_key}"},
                   json={"model": "demo", "messages": [{"role": "user", "content": "hello console"}]}, timeout=30)
    assert r.status_code == 200, r.text
    request_id = r.headers["x-request-id"]
    # The page asks for its fresh content every few seconds: the request shows up in place.
    admin.page.locator('[data-testid="requests-table"]', has_text=request_id).wait_for(timeout=REFRESH_WAIT_MS)
    assert admin.page.evaluate("window.__not_reloaded") is True
    assert "local" in admin.testid("gateways-asked").inner_text()
    admin.testid("filter-model").fill("demo")
    admin.page.locator('[data-testid="requests-filter"] button[type=submit]').click()
    admin.page.wait_for_load_state()
    assert "model=demo" in admin.page.url and request_id in admin.testid("requests-table").inner_text()
    admin.shot("requests")
    assert any(row["id"] == request_id for row in cluster.ctl("requests")["requests"])


def test_upload_a_gguf_through_the_mirror_page_in_pieces_resumed_after_a_failed_one(
        admin: Console, cluster: Cluster, tmp_path: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_llama

    gguf = write_tiny_llama(tmp_path / "tiny-console.gguf")
    size = gguf.stat().st_size
    main = admin.nav("Mirror")
    assert main.get_by_test_id("mirror-budget").is_visible()
    puts: list[str] = []

    def second_piece_fails_once(route: Any) -> None:  # the network drops one piece: the script goes on
        if route.request.method == "PUT":
            puts.append(route.request.headers.get("content-range", ""))
            if len(puts) == 2:
                route.abort()
                return
        route.continue_()

    admin.page.route("**/mirror/uploads/**", second_piece_fails_once)
    # Pieces of 128 KiB (8 MiB on a real page): this small file goes in five; the bar's top value survives the
    # page's move to the list (sessionStorage).
    admin.page.evaluate("""() => {
        const form = document.getElementById("mirror-upload");
        form.setAttribute("data-piece-bytes", String(128 * 1024));
        const bar = form.querySelector("progress");
        new MutationObserver(() => sessionStorage.setItem("top", String(Math.max(
            bar.value, Number(sessionStorage.getItem("top") || 0))))).observe(bar, {attributes: true});
    }""")
    admin.testid("mirror-file").set_input_files(str(gguf))
    admin.testid("mirror-upload-name").fill("tiny-console")
    admin.testid("mirror-upload-start").click()
    admin.page.wait_for_url("**/mirror?added=tiny-console", timeout=30_000)
    assert admin.page.evaluate("sessionStorage.getItem('top')") == "100"
    assert "tiny-console" in admin.testid("mirror-added").inner_text()
    row = admin.page.locator('[data-testid="mirror-table"] tr', has_text="tiny-console").inner_text()
    assert "gguf" in row and "llama" in row, row
    assert puts[1] == puts[2] and len(puts) == -(-size // (128 * 1024)) + 1, puts  # the failed piece, again
    admin.shot("mirror")
    shown = cluster.ctl("mirror", "show", "tiny-console")
    assert shown["file"]["size"] == size and shown["file"]["kind"] == "gguf"


def test_serve_a_model_shows_the_plan_then_serves_it(admin: Console, cluster: Cluster) -> None:
    admin.nav("Do")
    admin.testid("serve-name").fill("console-sim")
    admin.testid("serve-engine").select_option("sim")
    admin.testid("serve-source").fill("sim://console-sim")
    admin.testid("serve-gpus").fill("2")
    admin.testid("serve-classes").fill("h100-80g")
    admin.testid("serve-plan").click()
    admin.page.wait_for_load_state()
    verdict = admin.testid("plan-verdict")
    assert verdict.get_attribute("data-fits") == "true" and "Fits now" in verdict.inner_text()
    assert "sim-0" in verdict.inner_text()
    admin.shot("do-serve-plan")
    with pytest.raises(AssertionError):  # only planned: nothing is defined yet
        cluster.ctl("model", "show", "console-sim")
    admin.testid("confirm").click()
    admin.page.wait_for_load_state()
    assert admin.testid("action-result").get_attribute("data-outcome") == "done"
    assert "console-sim" in admin.testid("action-result").inner_text()

    shown = cluster.ctl("model", "show", "console-sim")
    assert shown["model"]["profile"]["gpus"] == 2, shown
    admin.nav("Models")
    admin.page.locator('[data-testid="models-table"] tr', has_text="console-sim").filter(
        has_text="sim-0").wait_for(timeout=REFRESH_WAIT_MS)  # placed on a simulated node, shown live
    admin.shot("models")
    admin.nav("Overview")
    assert "2 of 240 usable used" in admin.testid("capacity-table").inner_text()
    admin.shot("overview")


def test_retry_a_parked_model(admin: Console, cluster: Cluster) -> None:
    def parked() -> bool:
        return bool(cluster.api("/api/v1/models/broken")["model"]["status"]["parked"])

    until("broken parked after its failed starts", parked, 45, every=0.2)
    admin.nav("Do")
    assert "--fail-start" in admin.testid("parked-table").inner_text()
    admin.shot("do")
    result = do_action(admin, "retry-broken")
    assert "broken retried" in result.inner_text()
    assert not parked(), "ctl still shows broken parked after the retry"
    status = cluster.ctl("model", "show", "broken")["model"]["status"]
    assert status["parked"] is False and status["failures_in_row"] < 5, status


def test_enable_the_judge_without_a_file_is_refused_in_words(admin: Console, cluster: Cluster) -> None:
    admin.nav("Do")
    said = admin.page.locator("#do-judge").inner_text()
    assert "llama-guard" in said and "no Llama Guard 3 1B file found" in said, said
    admin.testid("judge-submit").click()  # no name: the judge the policy asks for; no source: none found
    admin.page.wait_for_load_state()
    assert "Serve llama-guard as a judge" in admin.page.locator("main").inner_text()
    admin.testid("confirm").click()
    admin.page.wait_for_load_state()
    result = admin.testid("action-result")
    assert result.get_attribute("data-outcome") == "refused"
    assert "judge_source_required" in result.inner_text() and "Llama Guard 3 1B" in result.inner_text()
    assert "llama-guard" not in [m["name"] for m in cluster.ctl("models")["models"]]

    # With the file named in the form, the judge is served, and `ctl guard judge status` says so.
    admin.nav("Do")
    admin.testid("judge-source").fill("/sim/models/Llama-Guard-3-1B.Q4_K_M.gguf")  # in the sim nodes' storage dir
    admin.testid("judge-submit").click()
    admin.page.wait_for_load_state()
    admin.testid("confirm").click()
    admin.page.wait_for_load_state()
    result = admin.testid("action-result")
    try:
        assert result.get_attribute("data-outcome") == "done", result.inner_text()
        assert "judge llama-guard served from /sim/models/Llama-Guard-3-1B.Q4_K_M.gguf" in result.inner_text()
        judge = next(j for j in cluster.ctl("guard", "judge", "status")["judges"] if j["model"] == "llama-guard")
        assert judge["defined"] is True and judge["judge"] is True, judge
    finally:  # no such file on the fleet: the judge is not left to fail its starts during the later tests
        cluster.ctl("model", "remove", "llama-guard")


def test_stop_and_start_the_system(admin: Console, browser: Any, cluster: Cluster) -> None:
    watcher = Console(browser, cluster).sign_in(cluster.admin_key)  # an Overview left open
    watcher.page.evaluate("window.__not_reloaded = true")
    try:
        result = do_action(admin, "system-form")
        assert "the system is stopped" in result.inner_text()
        assert admin.testid("stopped-banner").is_visible()
        assert cluster.setting("serving.stopped") is True
        r = httpx.post(cluster.gateway_url + "/chat/completions", json={"model": "demo", "messages": []},
                       headers={"Authorization": f"Bearer {cluster.client_key}"}, timeout=30)
        assert r.status_code == 503 and "system_stopped" in r.text, r.text
        watcher.testid("stopped-banner").wait_for(timeout=REFRESH_WAIT_MS)  # shown where it is open, no reload
        assert watcher.page.evaluate("window.__not_reloaded") is True
        admin.nav("Overview")
        admin.shot("overview-stopped")

        result = do_action(admin, "system-form")
        assert "the system is started" in result.inner_text()
        assert admin.testid("stopped-banner").count() == 0
        assert cluster.setting("serving.stopped") is False
    finally:
        watcher.close()
        if cluster.setting("serving.stopped") is not False:
            cluster.ctl("settings", "serving.stopped", "false")


def test_guards_off_and_on(admin: Console, cluster: Cluster) -> None:
    result = do_action(admin, "guards-form")
    assert "guards are off" in result.inner_text()
    assert cluster.setting("guard.enabled") is False
    admin.nav("Guardrails")
    assert admin.testid("guards-state").get_attribute("data-enabled") == "false"

    # Turned on through the API, the open page shows it without a reload.
    admin.page.evaluate("window.__not_reloaded = true")
    cluster.ctl("guard", "on")
    admin.page.locator('[data-testid="guards-state"][data-enabled="true"]').wait_for(timeout=REFRESH_WAIT_MS)
    assert admin.page.evaluate("window.__not_reloaded") is True

    do_action(admin, "guards-form")  # off again from Do, then on from Do
    result = do_action(admin, "guards-form")
    assert "guards are on" in result.inner_text()
    assert cluster.setting("guard.enabled") is True


def test_a_viewer_sees_every_page_and_is_refused_an_action(browser: Any, cluster: Cluster) -> None:
    created = cluster.ctl("keys", "create", "console-viewer", "--role", "viewer")
    viewer_key = created["key"]
    c = Console(browser, cluster)
    try:
        c.sign_in(viewer_key)
        assert "(viewer)" in c.testid("signed-in-as").inner_text()
        for name in PAGES:
            c.nav(name)
            assert viewer_key not in c.page.content()
        c.nav("Nodes")
        assert "sim-0001" in c.testid("nodes-table").inner_text()
        c.nav("Do")
        assert c.testid("viewer-notice").is_visible()
        c.page.locator('[data-testid="system-form"] button').click()
        c.page.wait_for_load_state()
        reason = c.testid("refusal-reason").inner_text()
        assert "viewer key" in reason and created["id"] in reason
        c.shot("viewer-refused")
        assert cluster.setting("serving.stopped") is False
        assert viewer_key not in c.page.url and not [u for u in c.urls if viewer_key in u]
    finally:
        c.close()


def test_a_tampered_csrf_token_is_refused(admin: Console, cluster: Cluster) -> None:
    admin.nav("Do")
    admin.page.evaluate('document.querySelector(\'[data-testid="system-form"] input[name="csrf"]\').value = "tampered"')
    admin.page.locator('[data-testid="system-form"] button').click()
    admin.page.wait_for_load_state()
    assert "CSRF token" in admin.testid("refusal-reason").inner_text()
    # A raw POST with the session's cookie but without its token: refused, nothing done.
    for form in ({"to": "stop", "confirm": "yes", "token": "a" * 24},
                 {"to": "stop", "confirm": "yes", "token": "a" * 24, "csrf": "not-this-sessions-token"}):
        r = admin.context.request.post(cluster.admin_url + "/do/system", form=form)
        assert r.status == 403 and "CSRF token" in r.text(), r.text()
    assert cluster.setting("serving.stopped") is False


def test_sign_out_ends_the_session(browser: Any, cluster: Cluster) -> None:
    c = Console(browser, cluster).sign_in(cluster.admin_key)
    cookies = c.context.cookies()
    session = [k for k in cookies if k["name"] == "llmgw_session"]
    assert session and session[0]["httpOnly"] and session[0]["sameSite"] == "Strict"
    assert cluster.admin_key not in json.dumps(cookies)
    c.testid("signout").click()
    c.page.wait_for_url(cluster.admin_url + "/signin")
    assert c.page.get_by_label("Admin key").is_visible()
    c.close()

    again = Console(browser, cluster)  # the old cookie, in a fresh browser: no longer signed in
    again.context.add_cookies(session)
    again.page.goto(cluster.admin_url + "/models")
    assert again.page.url.endswith("/signin")
    assert again.context.request.get(cluster.admin_url + "/?fragment=1").status == 401
    again.close()
