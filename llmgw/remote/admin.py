"""The admin API as `llmgw server add` speaks to it (the operator's side, with the admin key, as `llmgw ctl`
does): JSON in and out, an Idempotency-Key on each write, every answer that is not a 2xx an `AdminCallFailed`
with the API's code and words."""

from __future__ import annotations

import json
import ssl
import uuid
from typing import Any

import httpx


class AdminCallFailed(Exception):
    """The admin API refused (`status` and `code` from its answer) or was not reached (`status` 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def verify_with(ca_file: str | None) -> ssl.SSLContext | bool:
    """What an https admin URL is verified with: the cluster's bundle, or the system's trust store."""
    if ca_file is None:
        return True
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class AdminApi:
    def __init__(self, url: str, key: str, *, verify: ssl.SSLContext | bool, timeout_s: float,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.url, verify=verify, timeout=timeout_s, transport=transport,
                                         headers={"Authorization": f"Bearer {key}", "Accept": "application/json"})

    async def aclose(self) -> None:
        await self._client.aclose()

    async def get(self, path: str) -> Any:
        return await self._send("GET", path, None)

    async def post(self, path: str, body: Any) -> Any:
        return await self._send("POST", path, body)

    async def _send(self, method: str, path: str, body: Any) -> Any:
        headers = {"Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"} if method != "GET" else {}
        content = json.dumps(body).encode() if method != "GET" else None
        try:
            r = await self._client.request(method, path, content=content, headers=headers)
        except httpx.HTTPError as e:
            raise AdminCallFailed(0, "unreachable", f"the admin API at {self.url} was not reached "
                                             f"({str(e) or type(e).__name__})") from None
        try:
            doc = r.json()
        except ValueError:
            raise AdminCallFailed(r.status_code, f"http_{r.status_code}", f"{self.url}{path} answered no JSON "
                                                                   f"(is it the llmgw admin API?)") from None
        if 200 <= r.status_code < 300:
            return doc
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            raise AdminCallFailed(r.status_code, str(err.get("code") or f"http_{r.status_code}"),
                           str(err.get("message") or "(no message)"))
        raise AdminCallFailed(r.status_code, f"http_{r.status_code}", f"{self.url}{path} answered status {r.status_code}")
