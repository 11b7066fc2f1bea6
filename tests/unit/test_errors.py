"""The one error module: each API family's shape, and the first error of a group."""

from __future__ import annotations

import pytest

from llmgw.errors import AdminError, ApiError, OpenAIError, describe, first_error


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (404, "invalid_request_error"),
        (413, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "service_unavailable"),
        (504, "service_unavailable"),
    ],
)
def test_openai_shape_has_the_type_openai_gives_the_status(status: int, kind: str) -> None:
    error = OpenAIError(status, "some_code", "words", param="model")
    assert error.doc() == {"error": {"message": "words", "type": kind, "param": "model", "code": "some_code"}}


def test_openai_shape_keeps_its_key_order_and_nulls() -> None:
    # SDKs do not care about order, but the bytes on the wire stay what they were.
    doc = OpenAIError(400, None, "words").doc()
    assert list(doc["error"]) == ["message", "type", "param", "code"]
    assert doc["error"]["param"] is None and doc["error"]["code"] is None


def test_admin_shape_is_code_and_message_only() -> None:
    error = AdminError(404, "model_not_found", "no model named 'x'")
    assert error.doc() == {"error": {"code": "model_not_found", "message": "no model named 'x'"}}
    assert error.status == 404 and error.headers == []


def test_both_families_are_api_errors_with_their_headers() -> None:
    refusal = OpenAIError(405, "method_not_allowed", "use POST", headers=[(b"allow", b"POST")])
    assert isinstance(refusal, ApiError) and isinstance(AdminError(400, "x", "y"), ApiError)
    assert refusal.headers == [(b"allow", b"POST")]
    assert str(refusal) == "use POST"


def test_first_error_is_the_first_leaf_of_nested_groups() -> None:
    leaf = OSError(98, "Address already in use")
    group = ExceptionGroup("outer", [ExceptionGroup("inner", [leaf, ValueError("later")]), KeyError("x")])
    assert first_error(group) is leaf
    assert first_error(BaseExceptionGroup("flat", [KeyboardInterrupt()])).__class__ is KeyboardInterrupt


def test_describe_names_the_type_of_a_silent_error() -> None:
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(OSError("refused")) == "refused"


@pytest.mark.parametrize("code", ["model_parked", "model_unplaceable", "system_stopped", "guard_refused"])
def test_answers_a_retry_cannot_fix_say_so_to_the_sdk(code: str) -> None:
    error = OpenAIError(503, code, "words", headers=[(b"www-authenticate", b"Bearer")])
    assert error.should_retry is False
    assert error.headers == [(b"www-authenticate", b"Bearer"), (b"x-should-retry", b"false")]


def test_other_answers_leave_the_sdk_its_own_rule_unless_told() -> None:
    assert OpenAIError(503, "overloaded", "words").headers == []
    assert OpenAIError(502, "upstream_error", "words", should_retry=True).headers == [(b"x-should-retry", b"true")]
    assert OpenAIError(503, "model_parked", "words", should_retry=True).headers == [(b"x-should-retry", b"true")]
