"""Do → Add a machine runs `llmgw server add`'s own operation from the control plane: here with the remote
machine at the world's edge (`LocalShell`: this machine) and the admin API this very app (its ASGI transport),
so the checks are the real ones. A machine whose name the cluster knows is refused with the reason, after a
confirmation, and nothing is done: only the probe ran there, no token was made. Without a zipapp to install,
the console says so. (The operation against a real sshd: tests/integration/test_server_add_ssh.py.)"""

from __future__ import annotations

from pathlib import Path

import httpx

from console_world import World, csrf_of, hidden, rows, sign_in, text_of
from llmgw.console.do_add import ACCESS, RemoteAccess
from llmgw.testing.builders import node
from llmgw.testing.remote import LocalShell


async def test_an_add_is_confirmed_then_checked_and_a_known_name_is_refused_with_nothing_done(tmp_path: Path) -> None:
    world = World(nodes=[node("gpu-1").gpus(1, "h100-80g").build()])
    pyz = tmp_path / "llmgw.pyz"
    pyz.write_bytes(b"PK")
    shell = LocalShell()
    world.app.config[ACCESS] = RemoteAccess(lambda target: shell, pyz, httpx.ASGITransport(app=world.app))
    fields = {"target": "root@127.0.0.1", "role": "agent", "name": "gpu-1"}
    async with world.client() as c:
        await sign_in(c)
        menu = (await c.get("/do")).text
        assert 'data-testid="add-form"' in menu
        first = await c.post("/do/add", data={**fields, "csrf": csrf_of(menu)})
        assert "checks first (nothing changes if one fails)" in first.text and shell.ran == []
        tokens = world.store.snapshot().join_tokens
        done = await c.post("/do/add", data=hidden(first.text, "confirm-form"))
    assert 'data-outcome="refused"' in done.text, done.text
    said = text_of(done.text, "action-result")
    assert "name_known" in said and "gpu-1" in said and "nothing was changed" in said
    steps = [(r[0], r[1]) for r in rows(done.text, "add-events")]
    assert steps[:2] == [("cluster", "ok"), ("ssh", "ok")] and ("check", "problem") in steps
    assert len(shell.ran) == 1 and shell.ran[0][1] == "-c" and shell.copied == []
    assert world.store.snapshot().join_tokens == tokens


async def test_a_wrong_form_or_no_zipapp_is_said_in_words(tmp_path: Path) -> None:
    world = World()
    shell = LocalShell()
    world.app.config[ACCESS] = RemoteAccess(lambda target: shell, tmp_path / "llmgw.pyz")
    async with world.client() as c:
        await sign_in(c)
        csrf = csrf_of((await c.get("/do")).text)
        wrong = await c.post("/do/add", data={"target": "nobody", "role": "agent", "csrf": csrf})
        assert "give USER@HOST" in text_of(wrong.text, "action-result") and "no such file" in wrong.text
        world.app.config[ACCESS] = RemoteAccess(lambda target: shell, None)
        none = await c.post("/do/add", data={"target": "root@h", "role": "agent", "csrf": csrf})
        assert "does not run from the llmgw zipapp" in text_of(none.text, "action-result")
    assert shell.ran == []
