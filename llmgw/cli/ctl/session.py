"""One command's conversation with the admin API: the global options, the output
streams, one HTTP client, and turning every answer that is not a 2xx JSON into a CtlError."""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TextIO

import httpx
from cyclopts import Parameter

from llmgw.cli.ctl.errors import CtlError, Refused
from llmgw.cli.ctl.render import clean
from llmgw.cli.ctl.target import Target, resolve_target
from llmgw.domain.timeouts import TIMEOUTS


@dataclass(frozen=True)
class Io:
    """What ctl touches outside itself. None means the real thing (network, os.environ,
    sys.stdout/sys.stderr as they are when the command runs)."""

    transport: httpx.BaseTransport | None = None
    env: Mapping[str, str] | None = None
    stdout: TextIO | None = None
    stderr: TextIO | None = None


class Session:
    """Global options, the output streams and a lazily opened HTTP client."""

    def __init__(self, *, url: str | None, key: str | None, state_dir: Path, as_json: bool, io: Io) -> None:
        self.as_json = as_json
        self._url = url
        self._key = key
        self._state_dir = state_dir
        self._io = io
        self._client: httpx.Client | None = None
        self._target: Target | None = None

    @property
    def stdout(self) -> TextIO:
        return self._io.stdout or sys.stdout

    @property
    def stderr(self) -> TextIO:
        return self._io.stderr or sys.stderr

    def out(self, text: str = "") -> None:
        print(text, file=self.stdout)

    def note(self, text: str) -> None:
        print(text, file=self.stderr)

    def print_json(self, doc: Any) -> None:
        self.out(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False))

    def show(self, doc: Any, render: Callable[[Any], str]) -> None:
        """The API's JSON with --json, else the readable rendering of it."""
        if self.as_json:
            self.print_json(doc)
        else:
            self.out(render(doc))

    def target(self) -> Target:
        if self._target is None:
            env = self._io.env if self._io.env is not None else os.environ
            self._target = resolve_target(url=self._url, key=self._key, state_dir=self._state_dir, env=env)
        return self._target

    def request(self, method: str, path: str, *, body: Any = None, send_body: bool = False) -> tuple[int, Any]:
        """(status, decoded JSON) of a 2xx answer; anything else raises CtlError."""
        target = self.target()
        if self._client is None:
            self._client = httpx.Client(
                base_url=target.url,
                transport=self._io.transport,
                timeout=TIMEOUTS.ctl_request_s,
                headers={"Authorization": f"Bearer {target.key}", "Accept": "application/json"},
            )
        url = target.url + path
        try:
            if send_body:
                # Encoded here: httpx sends no body at all for `json=None`, and `null` is a value.
                content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
                response = self._client.request(
                    method, path, content=content, headers={"Content-Type": "application/json"}
                )
            else:
                response = self._client.request(method, path)
        except httpx.ConnectError as e:
            raise CtlError(f"the server at {target.url} (from {target.url_from}) is not reachable: {_why(e)}") from e
        except httpx.TimeoutException as e:
            raise CtlError(
                f"the server at {target.url} (from {target.url_from}) is not reachable: "
                f"no answer within {TIMEOUTS.ctl_request_s:g} s ({type(e).__name__})"
            ) from e
        except httpx.TransportError as e:
            raise CtlError(f"talking to {url} failed: {_why(e)}") from e
        return response.status_code, _decode(response, url)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


# How a command asks for the session: cyclopts leaves it out of the command line.
SessionParam = Annotated[Session, Parameter(parse=False)]


def api_path(*parts: str) -> str:
    """`/api/v1/PART/...`, each part escaped: a model named `a/b` is one segment."""
    return "/api/v1/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)


def _why(e: Exception) -> str:
    text = str(e) or type(e).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text


def _decode(response: httpx.Response, url: str) -> Any:
    status = response.status_code
    text = response.text
    content_type = response.headers.get("content-type", "").lower()
    if "text/html" in content_type or text.lstrip().startswith("<"):
        raise CtlError(
            f"{url} answered with an HTML page, not the llmgw admin API (status {status})"
            " — is --url pointing at the right service?"
        )
    if not text.strip():
        raise CtlError(
            f"{url} answered nothing (status {status}, empty body) — is --url pointing at the llmgw admin API?"
        )
    try:
        doc = json.loads(text)
    except ValueError:
        raise CtlError(f"{url} answered with invalid JSON (status {status}): {_excerpt(text)}") from None
    if 200 <= status < 300:
        return doc
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and ("code" in err or "message" in err):
        code = clean(str(err.get("code") or f"http_{status}"))
        message = clean(str(err.get("message") or "(no message)"))
        raise Refused(f"{code}: {message}")
    raise CtlError(f"{url} answered status {status}: {_excerpt(text)}")


def _excerpt(text: str, limit: int = 200) -> str:
    text = clean(text.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"
