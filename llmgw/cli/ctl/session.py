"""One command's conversation with the admin API: the global options, the output
streams, one HTTP client, and turning every answer that is not a 2xx JSON into a CtlError.
Every write carries an Idempotency-Key, so a write whose outcome is unknown is retried once, safely."""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TextIO

import httpx
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError, Refused, UsageError
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

    def __init__(self, *, url: str | None, key: str | None, state_dir: Path, as_json: bool, io: Io,
                 ca_file: str | None = None) -> None:
        self.as_json = as_json
        self._ca_file = ca_file
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

    def show_answer(self, method: str, path: str, *, body: Any = None, send_body: bool = False,
                    render: Callable[[Any], str]) -> int:
        """`request`, then `show` the answer with `render`: the whole work of most commands.
        Returns EXIT_OK; an answer that is not a 2xx raises CtlError, as `request` does."""
        _, doc = self.request(method, path, body=body, send_body=send_body)
        self.show(doc, render)
        return EXIT_OK

    def target(self) -> Target:
        if self._target is None:
            env = self._io.env if self._io.env is not None else os.environ
            self._target = resolve_target(url=self._url, key=self._key, state_dir=self._state_dir, env=env,
                                          ca_file=self._ca_file)
        return self._target

    def request(self, method: str, path: str, *, body: Any = None, send_body: bool = False,
                timeout: float | None = None, wait_for_leader: bool = True) -> tuple[int, Any]:
        """(status, decoded JSON) of a 2xx answer; anything else raises CtlError. While the member asked knows
        no leader (503 `no_leader`, an election), it is asked again for up to `ctl_election_wait_s`, unless not
        `wait_for_leader` (`ctl status`, which then shows how the members see it at once).

        A write (any method but GET) carries a fresh Idempotency-Key. When its outcome is
        unknown (no answer in time, the connection lost after sending, or 503 commit_unknown)
        it is sent once more with the same key, which the API applies at most once; if that
        fails too, the error says plainly that the outcome is unknown."""
        target = self.target()
        self._http()
        headers: dict[str, str] = {}
        content: bytes | None = None
        if send_body:
            # Encoded here: httpx sends no body at all for `json=None`, and `null` is a value.
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        if method.upper() == "GET":
            return self._send(method, path, content, headers, timeout=timeout, wait_for_leader=wait_for_leader)
        key = str(uuid.uuid4())
        headers["Idempotency-Key"] = key
        try:
            return self._send(method, path, content, headers, timeout=timeout, wait_for_leader=wait_for_leader)
        except _Unknown as first:
            first_why = first.why
            self.note(f"note: {first.why}; sending the same {method} again (Idempotency-Key {key}: applied at most once)")
        try:
            return self._send(method, path, content, headers, retry=True, timeout=timeout,
                              wait_for_leader=wait_for_leader)
        except _Unknown as second:
            raise CtlError(
                f"the outcome of {method} {(path if path.startswith(('http://', 'https://')) else target.url + path)} is unknown: {first_why}; retried: {second.why}. The"
                f" change may or may not have been applied; read the state (e.g. `llmgw ctl status`) before"
                f" writing again"
                f" (Idempotency-Key {key})"
            ) from None

    def client(self) -> httpx.Client:
        """The HTTP client, for a command that drives its own requests (`ctl mirror add`'s pieces)."""
        return self._http()

    def _http(self) -> httpx.Client:
        if self._client is None:
            target = self.target()
            self._client = httpx.Client(
                base_url=target.url,
                verify=_verify(target.ca_file),
                transport=self._io.transport,
                timeout=TIMEOUTS.ctl_request_s,
                headers={"Authorization": f"Bearer {target.key}", "Accept": "application/json"},
            )
        return self._client

    def upload(self, url: str, file: Path, timeout_s: float) -> Any:
        """PUT a file's bytes, streamed, to `url` (a release to a member: `ctl upgrade`); the decoded 2xx answer,
        else CtlError. Not retried: the upload names its content by hash, so asking again is the caller's call."""
        client = self._http()

        def chunks() -> Any:
            with open(file, "rb") as f:
                while data := f.read(1 << 20):
                    yield data

        try:
            response = client.put(url, content=chunks(), timeout=timeout_s, headers={
                "Content-Type": "application/octet-stream", "Content-Length": str(file.stat().st_size),
                "Idempotency-Key": str(uuid.uuid4())})
        except httpx.HTTPError as e:
            raise CtlError(f"uploading {file} to {url} failed: {_why(e)}") from e
        except OSError as e:
            raise UsageError(f"cannot read {file}: {e.strerror or e}") from e
        return _decode(response, url)

    def _send(self, method: str, path: str, content: bytes | None, headers: dict[str, str], *,
              retry: bool = False, timeout: float | None = None, wait_for_leader: bool = True) -> tuple[int, Any]:
        """One request. Raises `_Unknown` when a write may or may not have reached the API; on a
        `retry`, also when this attempt says nothing of the first one (not sent, or a 5xx)."""
        assert self._client is not None
        target = self.target()
        url = (path if path.startswith(('http://', 'https://')) else target.url + path)
        write = "Idempotency-Key" in headers
        try:
            response = self._during_election(method, path, content, headers, timeout, wait_for_leader)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # nothing was sent
            why = _why(e) if isinstance(e, httpx.ConnectError) else f"no connection within {TIMEOUTS.ctl_request_s:g} s"
            if retry:
                raise _Unknown(f"then the server was not reachable ({why})") from e
            raise CtlError(f"the server at {target.url} (from {target.url_from}) is not reachable: {why}") from e
        except httpx.TimeoutException as e:
            if write:
                raise _Unknown(f"no answer within {TIMEOUTS.ctl_request_s:g} s ({type(e).__name__})") from e
            raise CtlError(
                f"the server at {target.url} (from {target.url_from}) is not reachable: "
                f"no answer within {TIMEOUTS.ctl_request_s:g} s ({type(e).__name__})"
            ) from e
        except httpx.TransportError as e:
            if write:
                raise _Unknown(f"the connection failed after the request was sent ({_why(e)})") from e
            raise CtlError(f"talking to {url} failed: {_why(e)}") from e
        if write and response.status_code == 503 and _error_code(response) == "commit_unknown":
            raise _Unknown("the API could not confirm the commit (commit_unknown)")
        if retry and response.status_code >= 500:
            raise _Unknown(f"then the API answered status {response.status_code}"
                           f" ({_error_code(response) or 'no error code'})")
        return response.status_code, _decode(response, url)

    def _during_election(self, method: str, path: str, content: bytes | None, headers: dict[str, str],
                         timeout: float | None, wait: bool) -> httpx.Response:
        """The answer, asked again every `ctl_poll_s` for up to `ctl_election_wait_s` while it is 503 `no_leader`:
        a standby that knows no leader forwards nothing, so asking again is safe for any request, and an
        election (a leader stepping down, members switching to TLS) takes about a second."""
        assert self._client is not None
        deadline: float | None = None
        while True:
            response = self._client.request(method, path, content=content, headers=headers,
                                            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
            if not wait or response.status_code != 503 or _error_code(response) != "no_leader":
                return response
            now = time.monotonic()
            if deadline is None:
                deadline = now + TIMEOUTS.ctl_election_wait_s
                self.note(f"note: no leader is elected now; asking again for up to {TIMEOUTS.ctl_election_wait_s:g} s")
            if now >= deadline:
                return response
            time.sleep(TIMEOUTS.ctl_poll_s)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


# How a command asks for the session: cyclopts leaves it out of the command line.
SessionParam = Annotated[Session, Parameter(parse=False)]


def api_path(*parts: str) -> str:
    """`/api/v1/PART/...`, each part escaped: a model named `a/b` is one segment."""
    return "/api/v1/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)


class _Unknown(Exception):
    """A write that may or may not have been applied; `why` says what happened."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _error_code(response: httpx.Response) -> str | None:
    try:
        doc = response.json()
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


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


def _verify(ca_file: str | None) -> Any:
    """What an https admin URL is verified with: the cluster's bundle, or the system's trust store."""
    if ca_file is None:
        return True
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"cannot use the CA file {ca_file}: {e}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
