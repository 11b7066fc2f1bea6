"""LiteLLM's proxy for the gateway benchmark: its own virtualenv (`.bench/litellm-venv`, made when missing,
never the project's), a config that points one model at the bench upstream, and its start under a deadline.

Run as LiteLLM's docs run it: `litellm --config config.yaml`, uvicorn, one worker (its default), a master key,
no database, `LITELLM_LOCAL_MODEL_COST_MAP=True` (no fetch of the price list at start).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# The newest 1.x whose `[proxy]` extra installs from PyPI here (1.108.8 and later pin
# litellm-enterprise / litellm-proxy-extras releases the index did not have).
PIN = "1.108.7"
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".bench" / "litellm-venv"
START_TIMEOUT_S = 180.0  # imports alone take ~10-30 s on a busy 2-core machine
MASTER_KEY = "sk-litellm-bench-master"


def installed() -> bool:
    return (VENV / ".pin").is_file() and (VENV / ".pin").read_text().strip() == PIN and (VENV / "bin" / "litellm").exists()


def ensure_venv() -> Path:
    """The venv's `litellm` executable; creates the venv and installs the pin first when missing (idempotent)."""
    if installed():
        return VENV / "bin" / "litellm"
    print(f"setting up LiteLLM {PIN} in {VENV} (once; a few minutes) ...", file=sys.stderr, flush=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log = VENV.parent / "litellm-pip.log"
    with log.open("w") as out:
        done = subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", f"litellm[proxy]=={PIN}"],
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(line for line in log.read_text().splitlines(keepends=True)[-5:]
                       if not line.startswith("WARNING: Location"))
        raise SystemExit(f"could not install litellm[proxy]=={PIN} into {VENV} (no network, or the index lacks "
                         f"a dependency); pip's log: {log}\n{tail}\nrun with --no-litellm to skip LiteLLM")
    (VENV / ".pin").write_text(PIN + "\n")
    return VENV / "bin" / "litellm"


def config(upstream: str, model: str) -> str:
    """LiteLLM's config.yaml: `model` served by the OpenAI-compatible upstream at `upstream`."""
    return (f"model_list:\n  - model_name: {model}\n    litellm_params:\n      model: openai/{model}\n"
            f"      api_base: {upstream}/v1\n      api_key: sk-upstream-unused\n"
            f"general_settings:\n  master_key: {MASTER_KEY}\n")


def start(upstream: str, model: str, port: int, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The proxy and its URL, listening once this returns; SystemExit when it does not start in time."""
    exe = ensure_venv()
    cfg = workdir / "litellm.yaml"
    cfg.write_text(config(upstream, model))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LITELLM_", "VIRTUAL_ENV"))}
    env.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": MASTER_KEY,
                "LITELLM_LOG": "ERROR", "NO_PROXY": "*", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PATH": f"{exe.parent}:{env.get('PATH', '')}"})
    log = workdir / "litellm.log"
    out = log.open("wb")
    proc = subprocess.Popen([str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
                            cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"LiteLLM's proxy exited ({proc.returncode}) at start; its log:\n{_tail(log)}")
        if _alive(port):
            return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"LiteLLM's proxy did not answer within {START_TIMEOUT_S:.0f} s; its log:\n{_tail(log)}")


def _alive(port: int) -> bool:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health/liveliness")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends the proxy and anything it started (its own session's process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
