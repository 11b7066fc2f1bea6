"""The refusals our HTTP APIs answer with: one exception type per API family, and its shape.
Owns the OpenAI error document (`/v1`), the admin error document (`/api/v1`) and `first_error`.

Exception tree (each carries `status`, `code`, `message` and extra response `headers`):

    ApiError                 a refusal an HTTP API answers with; never raised itself
    ├── OpenAIError          `/v1` (gateway, simulator): {"error": {"message", "type", "param", "code"}}
    └── AdminError           `/api/v1` (admin API): {"error": {"code", "message"}}

`doc()` returns the body as a JSON-ready dict; each server encodes it its own
way (the raw ASGI apps compactly, see `llmgw.wire.asgi.dumps`). Imports nothing
beyond the standard library, so any role or engine may use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["NOT_RETRYABLE", "AdminError", "ApiError", "OpenAIError", "describe", "first_error", "openai_error_type"]

Headers = list[tuple[bytes, bytes]]

# `/v1` answers that the same request, sent again soon, cannot change: they carry
# `x-should-retry: false`, which the official OpenAI SDKs obey over their own status
# rule (they retry every 5xx), so a client hears "parked" at once, not after its retries.
NOT_RETRYABLE = frozenset({"model_parked", "model_unplaceable", "model_scheduled_off", "system_stopped",
                           "guard_refused"})


class ApiError(Exception, ABC):
    """A refusal: the HTTP status, a stable `code` for programs and words for people."""

    def __init__(self, status: int, code: str | None, message: str, *, headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers: Headers = headers or []

    @abstractmethod
    def doc(self) -> dict[str, Any]:
        """The response body, as a JSON-ready dict."""


class OpenAIError(ApiError):
    """A `/v1` refusal in OpenAI's shape; `param` names the offending request field.

    `should_retry` becomes the `x-should-retry` header (None: no header, the client's
    own rule); it defaults to False for the codes in `NOT_RETRYABLE`. `extra`: members of the
    body beside `error` (503 `model_activating` has its `activation`)."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        *,
        param: str | None = None,
        headers: Headers | None = None,
        should_retry: bool | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status, code, message, headers=headers)
        self.param = param
        self.extra = extra
        if should_retry is None and code in NOT_RETRYABLE:
            should_retry = False
        self.should_retry = should_retry
        if should_retry is not None:
            self.headers = [*self.headers, (b"x-should-retry", b"true" if should_retry else b"false")]

    def doc(self) -> dict[str, Any]:
        kind = openai_error_type(self.status)
        doc = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return {**doc, **self.extra} if self.extra else doc


class AdminError(ApiError):
    """An admin API refusal; `code` is always set (`ctl` decodes it)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, code, message)

    def doc(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


def openai_error_type(status: int) -> str:
    """OpenAI's `type` for a status: 401 `authentication_error`, 403 `permission_error`,
    503/504 `service_unavailable`, other 5xx `server_error`, other 4xx `invalid_request_error`."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status in (503, 504):
        return "service_unavailable"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of a (nested) exception group: what to tell the operator."""
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


def describe(error: BaseException) -> str:
    """An error in words for a log line: its message, or its type when it has none."""
    return str(error) or type(error).__name__
