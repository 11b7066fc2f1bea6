"""Serving a mirror file through the admin API of a real control plane (docs/mirror.md "Serving a file"): the preview
changes nothing, the commit stores the definition with `source: mirror://NAME`, a Llama Guard file becomes the judge
the policies ask for (and `guard judge enable` finds the mirror's file), `ctl model serve --from-mirror`."""

from __future__ import annotations

import functools
import io

import httpx
import pytest
import trio

from llmgw.cli.ctl.app import run_ctl
from llmgw.control.service import ControlHandle
from tests.integration.test_mirror_admin import ADMIN, GGUF, api, control, upload  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


async def ctl(control: ControlHandle, *argv: str) -> tuple[int, str, str]:  # noqa: F811
    out, err = io.StringIO(), io.StringIO()
    env = {"LLMGW_URL": control.admin_url, "LLMGW_KEY": ADMIN}
    code = await trio.to_thread.run_sync(functools.partial(run_ctl, list(argv), env=env, stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


async def test_the_preview_changes_nothing_and_the_commit_stores_the_definition(
        api: httpx.AsyncClient) -> None:  # noqa: F811
    assert (await upload(api, "tiny-chat", GGUF)).status_code == 201
    before = (await api.get("/api/v1/models")).json()
    r = await api.post("/api/v1/mirror/tiny-chat/serve", json={"commit": False})
    assert r.status_code == 200, r.text
    preview = r.json()
    assert preview["name"] == "tiny-chat" and preview["judge"] is False and preview["committed"] is False
    d = preview["definition"]
    assert d["engine"] == "llama.cpp" and d["role"] == "chat" and d["source"] == "mirror://tiny-chat"
    assert d["profile"]["cpu"] is True  # no node, no GPU
    assert preview["estimate"]["bytes"] > len(GGUF) and preview["estimate"]["source"] == "gguf"
    assert preview["plan"]["fits"] is False and preview["plan"]["reason"]
    assert (await api.get("/api/v1/models")).json() == before
    r = await api.post("/api/v1/mirror/tiny-chat/serve", json={"commit": True, "name": "chat-1", "mode": "on-demand"})
    assert r.status_code == 201, r.text
    assert r.json()["committed"] is True and r.json()["model"]["source"] == "mirror://tiny-chat"
    stored = (await api.get("/api/v1/models/chat-1")).json()["model"]
    assert stored["source"] == "mirror://tiny-chat" and stored["mode"] == "on-demand"
    used = (await api.get("/api/v1/mirror/tiny-chat")).json()["file"]["used_by"]
    assert used == ["model chat-1"]
    # refused as a model put is: a bad override, and a file not in the mirror
    bad = await api.post("/api/v1/mirror/tiny-chat/serve", json={"commit": True, "mode": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_model"
    assert (await api.post("/api/v1/mirror/nope/serve", json={"commit": False})).status_code == 404


async def test_a_llama_guard_file_becomes_the_judge_the_policies_ask_for(api: httpx.AsyncClient) -> None:  # noqa: F811
    assert (await api.put("/api/v1/guard/policies/default", json={"judge": "llama-guard"})).status_code in (200, 201)
    assert (await upload(api, "Llama-Guard-3-1B", GGUF)).status_code == 201
    r = await api.post("/api/v1/mirror/Llama-Guard-3-1B/serve", json={"commit": False})
    assert r.status_code == 200, r.text
    assert r.json()["judge"] is True and r.json()["name"] == "llama-guard"
    assert r.json()["definition"]["role"] == "guard" and r.json()["definition"]["profile"]["cpu"] is True
    refused = await api.post("/api/v1/mirror/Llama-Guard-3-1B/serve", json={"commit": False, "role": "chat"})
    assert refused.status_code == 400 and "served as a judge only" in refused.json()["error"]["message"]
    # `guard judge enable`, with no file on any node, finds the mirror's
    r = await api.post("/api/v1/guard/judges/enable", json={})
    assert r.status_code == 201, r.text
    assert r.json()["mirror_file"] == "Llama-Guard-3-1B" and r.json()["model"]["source"] == "mirror://Llama-Guard-3-1B"
    # serving the file again: the same judge, unchanged
    r = await api.post("/api/v1/mirror/Llama-Guard-3-1B/serve", json={"commit": True})
    assert r.status_code == 200 and r.json()["name"] == "llama-guard" and r.json()["model"]["role"] == "guard"


async def test_ctl_model_serve_from_mirror_shows_the_preview_and_commits_with_yes(
        api: httpx.AsyncClient, control: ControlHandle) -> None:  # noqa: F811
    assert (await upload(api, "tiny", GGUF)).status_code == 201
    code, out, err = await ctl(control, "mirror", "show", "tiny")
    assert code == 0 and "serve it  llmgw ctl model serve --from-mirror tiny" in out, err
    code, out, err = await ctl(control, "model", "serve", "--from-mirror", "tiny")
    assert code == 0, err
    assert "model tiny (role chat) from mirror file tiny" in out and "engine    llama.cpp" in out
    assert "would run nowhere now" in out and "nothing stored" in err
    assert (await api.get("/api/v1/models/tiny")).status_code == 404
    code, out, err = await ctl(control, "model", "serve", "--from-mirror", "tiny", "--name", "t2", "--max", "2",
                               "--yes")
    assert code == 0, err
    assert "created model t2 (source mirror://tiny)" in out
    stored = (await api.get("/api/v1/models/t2")).json()["model"]
    assert stored["source"] == "mirror://tiny" and stored["replicas"]["max"] == 2
    code, _, err = await ctl(control, "model", "serve", "--from-mirror", "tiny", "--source", "/x")
    assert code != 0 and "--source" in err
