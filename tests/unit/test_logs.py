"""One log format across roles: text by default, one JSON object per line on request,
each line naming its role and (in the gateway) the request id."""

from __future__ import annotations

import json
import threading
import time
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def emit(message: str, *args: object, role: str = "gateway", request_id: str = "") -> None:
    role_token = logs.role_var.set(role)
    rid_token = logs.request_id_var.set(request_id)
    try:
        logging.getLogger("llmgw.test").warning(message, *args)
    finally:
        logs.role_var.reset(role_token)
        logs.request_id_var.reset(rid_token)


def test_json_lines_carry_role_and_request_id(tmp_path: Path, restore_logging: None) -> None:
    log_file = tmp_path / "logs" / "llmgw.log"
    logs.setup(json_lines=True, log_file=log_file)
    emit("proxied %s", "demo", request_id="req-0123456789abcdef")
    emit("placed %s", "demo", role="control")
    logs.flush()
    lines = log_file.read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["role"] == "gateway" and first["request_id"] == "req-0123456789abcdef"
    assert first["msg"] == "proxied demo" and first["level"] == "warning" and first["logger"] == "llmgw.test"
    assert second["role"] == "control" and "request_id" not in second


def test_text_lines_name_role_and_request_id(tmp_path: Path, restore_logging: None) -> None:
    log_file = tmp_path / "llmgw.log"
    logs.setup(log_file=log_file)
    emit("proxied", request_id="req-00ff")
    emit("tick", role="agent")
    logs.flush()
    first, second = log_file.read_text().splitlines()
    assert " WARNING gateway [req-00ff] llmgw.test: proxied" in first
    assert " WARNING agent llmgw.test: tick" in second


def test_setup_replaces_handlers_instead_of_stacking(tmp_path: Path, restore_logging: None) -> None:
    logs.setup(log_file=tmp_path / "a.log")
    logs.setup(log_file=tmp_path / "a.log")
    emit("once")
    logs.flush()
    assert (tmp_path / "a.log").read_text().count("once") == 1


def test_lines_are_written_off_the_caller_so_a_stalled_log_never_blocks_it(tmp_path: Path,
                                                                        restore_logging: None) -> None:
    """A stderr pipe nobody reads: logging still returns at once, and what could not be queued is counted
    and reported once the writer catches up."""
    log_file = tmp_path / "a.log"
    logs.setup(log_file=log_file)
    (queued,) = logging.getLogger().handlers
    stalled = threading.Event()
    release = threading.Event()

    class Stall(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            stalled.set()
            release.wait(10)

    queued.handlers.insert(0, Stall())  # type: ignore[attr-defined]
    emit("first")
    assert stalled.wait(5)
    started = time.monotonic()
    for i in range(logs.QUEUE_RECORDS + 500):
        emit("line %d", i)
    assert time.monotonic() - started < 5  # it would block for ever if the caller wrote
    assert queued.dropped >= 500  # type: ignore[attr-defined]
    release.set()
    logs.flush()
    emit("after")
    logs.flush()
    text = log_file.read_text()
    assert "log lines dropped: the log could not keep up" in text
    assert text.rstrip().endswith("after")
