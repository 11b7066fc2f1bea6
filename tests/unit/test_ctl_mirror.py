"""`llmgw ctl mirror`: the progress line, the listing and a file's page, a directory refused, and `add` against a
fake API that holds part of the upload already (it continues at the offset the API gives, and again after a 409)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import httpx

from ctl_fakes import FakeApi, columns, ctl
from llmgw.cli.ctl.mirror import Bar, default_name, progress_line

FILE = {"name": "tiny", "sha256": "ab" * 32, "size": 3 * 1024 * 1024, "kind": "gguf",
        "metadata": {"architecture": "llama"}, "added_at": 1.0, "pinned": False, "used_by": ["model m"],
        "collectable": False, "members": {"holding": ["10.0.0.1:7000"], "missing": ["10.0.0.2:7000"]}}


def test_the_progress_line_says_bytes_share_and_rate() -> None:
    assert progress_line("uploading", 512 * 1024, 1024 * 1024, 2 * 1024 * 1024, width=10) == \
        "uploading [#####-----]  50%  0.5/1.0 MiB  2.0 MiB/s"
    out, now = io.StringIO(), [0.0]
    bar = Bar(out, 100, "x", clock=lambda: now[0], every=1.0)
    bar.update(10)
    bar.update(20)  # within `every` of the last drawing: not drawn
    now[0] = 2.0
    bar.update(100)
    bar.finish()
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("100%  0.0/0.0 MiB  0.0 MiB/s\n")


def test_names_and_a_directory_refused(tmp_path: Path) -> None:
    assert default_name(Path("/m/SmolLM2.Q4_K_M.gguf")) == "SmolLM2.Q4_K_M"
    assert default_name(Path("model-00001.safetensors")) == "model-00001"
    r = ctl(["mirror", "add", str(tmp_path)])
    assert r.rc == 2 and "is a directory" in r.err


def test_list_and_show() -> None:
    api = (FakeApi()
           .on("GET", "/api/v1/mirror", json_body={"files": [FILE], "budget_bytes": 100 << 30, "stored_bytes": 3 << 20,
                                                   "uploads": [], "members": []})
           .on("GET", "/api/v1/mirror/tiny", json_body={"file": FILE}))
    r = ctl(["mirror", "list"], api)
    assert r.rc == 0, r.err
    rows = columns(r.out, "NAME ")
    assert rows[1][:3] == ["tiny", "gguf", "3.0 MiB"]
    assert "stored 3.0 MiB of a 100.0 GiB budget" in r.out
    shown = ctl(["mirror", "show", "tiny"], api)
    assert "missing   10.0.0.2:7000" in shown.out and "architecture llama" in shown.out


def test_add_continues_at_the_offset_the_api_holds(tmp_path: Path) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB
    file = tmp_path / "f.gguf"
    file.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    sent: list[str] = []

    def piece(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["content-range"])
        start = int(request.headers["content-range"].split()[1].split("-")[0])
        if start == 1024 * 1024 and len(sent) == 1:  # the API says it holds another offset
            return httpx.Response(409, json={"error": {"code": "upload_offset_mismatch", "message": "m",
                                                       "offset": 1536 * 1024}})
        end = int(request.headers["content-range"].split("-")[1].split("/")[0])
        return httpx.Response(200, json={"id": "u", "offset": end + 1, "size": len(data)})

    api = (FakeApi()
           .on("POST", "/api/v1/mirror/uploads", json_body={"id": "u", "offset": 1024 * 1024, "size": len(data),
                                                            "name": "f"})
           .on("POST", "/api/v1/mirror/uploads/u/commit", 201, json_body={"file": {**FILE, "name": "f"},
                                                                          "added": True}))
    api.routes[("PUT", "/api/v1/mirror/uploads/u")] = piece
    r = ctl(["mirror", "add", str(file), "--piece-mib", "1"], api)
    assert r.rc == 0, r.err
    assert json.loads(api.requests[0].content) == {"name": "f", "size": len(data), "sha256": sha}
    assert sent == [f"bytes {1 << 20}-{(2 << 20) - 1}/{len(data)}", f"bytes {1536 << 10}-{(2 << 20) - 1}/{len(data)}"]
    assert "resuming the upload of f at 1.0 MiB of 2.0 MiB" in r.err and "100%" in r.err
    assert r.out.startswith("added f (gguf")
