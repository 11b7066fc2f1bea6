"""Reading one request's record back from a gateway's request log, as control does (`logquery.PATH`)."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from llmgw.wire import logquery


async def record_of(gateway: httpx.AsyncClient, request_id: str, admin_key: str) -> dict[str, Any]:
    """The record, once the writer has written it (the writer runs off the request path, every flush)."""
    while True:
        r = await gateway.get(f"{logquery.PATH}/{request_id}", headers={"authorization": f"Bearer {admin_key}"})
        assert r.status_code == 200, r.text
        doc: dict[str, Any] | None = r.json()["request"]
        if doc is not None:
            return doc
        await trio.sleep(0.1)
