"""The gateway's call to an engine: the request sent, and sent once more when an engine dropped a reused
kept-alive connection before answering. Owns that one retry rule.

llama.cpp's server closes an idle kept-alive connection on its own schedule; a request that
arrives on it just then gets no answer at all (seen in ~0.8% of requests at concurrency >= 2).
Sending it again is safe exactly then: the connection was reused (not opened for this request,
so the engine is up), no byte of an answer came back, and nothing has reached the client yet
(`send` returns before the gateway relays anything).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

__all__ = ["send"]

_log = logging.getLogger("llmgw.gateway.upstream")

# What a connection closed under a request looks like: EOF before the status line, or a reset.
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
_NO_ANSWER = "without sending a response"  # httpcore's words for EOF before any byte of the answer


class _Trace:
    """httpcore's `trace` extension for one send: did it open a connection, did an answer start?"""

    def __init__(self) -> None:
        self.opened = False
        self.answered = False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event.startswith(("connection.connect_tcp", "connection.connect_unix")):
            self.opened = True
        elif event.endswith("receive_response_headers.complete"):
            self.answered = True


async def send(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """`client.send(request, stream=True)`, once more if the first went out on a reused connection
    that the engine closed before answering. Every other failure is the caller's, as it was."""
    trace = _Trace()
    request.extensions["trace"] = trace
    try:
        return await client.send(request, stream=True)
    except _DROPPED as error:
        if trace.opened or trace.answered or (isinstance(error, httpx.RemoteProtocolError)
                                              and _NO_ANSWER not in str(error)):
            raise
        _log.info("engine at %s closed a kept-alive connection before answering; sending once more",
                  request.url.netloc.decode("ascii", "replace"))
    request.extensions.pop("trace", None)
    return await client.send(request, stream=True)
