"""The cluster secret's file (`llmgw/store/secret.py`): made once, 0600 from the first byte,
the one given stored on a fresh state dir, another cluster's state dir refused, never logged;
and the refusal log's rate (`llmgw/store/wire.py`)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from llmgw.cli._up_run import raft_host
from llmgw.store.secret import FILE_NAME, SecretError, load_or_create, parse, raft_password, read_file
from llmgw.store.wire import RefusalLog

GIVEN = "given-secret-0123456789abcdef"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_fresh_state_dir_makes_a_secret_and_keeps_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llmgw.store")
    old_umask = os.umask(0)  # a careless umask must not make the file readable, even briefly
    try:
        made = load_or_create(tmp_path, None)
    finally:
        os.umask(old_umask)
    path = tmp_path / FILE_NAME
    assert mode(path) == 0o600
    assert len(made) >= 43 and path.read_text() == made + "\n"
    assert not (tmp_path / (FILE_NAME + ".tmp")).exists()
    assert load_or_create(tmp_path, None) == made, "a later start reads the same secret"
    assert load_or_create(tmp_path, made) == made, "the same secret given is accepted"
    assert "cluster.secret" in caplog.text and made not in caplog.text


def test_a_fresh_state_dir_stores_the_secret_given(tmp_path: Path) -> None:
    assert load_or_create(tmp_path, GIVEN) == GIVEN
    assert read_file(tmp_path / FILE_NAME) == GIVEN and mode(tmp_path / FILE_NAME) == 0o600
    assert load_or_create(tmp_path, None) == GIVEN


def test_a_state_dir_of_another_cluster_is_refused_in_one_line(tmp_path: Path) -> None:
    stored = load_or_create(tmp_path, None)
    with pytest.raises(SecretError) as e:
        load_or_create(tmp_path, GIVEN)
    message = str(e.value)
    assert message.startswith(f"the state dir {tmp_path} belongs to another cluster")
    assert "\n" not in message and GIVEN not in message and stored not in message
    assert read_file(tmp_path / FILE_NAME) == stored, "the stored secret is left as it was"


def test_a_stored_secret_readable_by_others_is_made_private(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    load_or_create(tmp_path, GIVEN)
    (tmp_path / FILE_NAME).chmod(0o644)
    assert load_or_create(tmp_path, None) == GIVEN
    assert mode(tmp_path / FILE_NAME) == 0o600
    assert "could be read by other users" in caplog.text


@pytest.mark.parametrize("text, why", [
    ("", "at least 16 characters"),
    ("short", "at least 16 characters"),
    ("two words of secret text here", "one word"),
])
def test_an_unusable_secret_is_refused_naming_its_source(text: str, why: str) -> None:
    with pytest.raises(SecretError, match=why) as e:
        parse(text, "secret.txt")
    assert str(e.value).startswith("secret.txt: ")


def test_a_secret_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="cannot read the cluster secret .*missing: No such file"):
        read_file(tmp_path / "missing")
    (tmp_path / FILE_NAME).write_bytes(b"\xff\xfe")
    with pytest.raises(SecretError, match="does not hold a cluster secret"):
        load_or_create(tmp_path, None)


def test_the_raft_password_is_derived_not_the_secret() -> None:
    assert raft_password(GIVEN) != GIVEN and GIVEN not in raft_password(GIVEN)
    assert raft_password(GIVEN) == raft_password(GIVEN) != raft_password(GIVEN + "x")


def test_refusals_are_logged_once_per_host_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    refusals = RefusalLog(60.0, clock=lambda: now[0])
    assert refusals.refused("10.0.0.7", "refused 10.0.0.7")
    assert not refusals.refused("10.0.0.7", "refused 10.0.0.7")
    assert refusals.refused("10.0.0.8", "refused 10.0.0.8"), "another host has its own interval"
    assert refusals.refused("10.0.0.7", "not in the group", reason="group"), "and another reason"
    now[0] += 59.9
    assert not refusals.refused("10.0.0.7", "refused 10.0.0.7")
    now[0] += 0.1
    assert refusals.refused("10.0.0.7", "refused 10.0.0.7")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused 10.0.0.7", "refused 10.0.0.8", "not in the group",
                     "refused 10.0.0.7 (2 more refused since the last warning)"]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize("host, raft", [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"),
                                        ("10.0.0.5", "10.0.0.5"), ("localhost", "localhost")])
def test_up_never_gives_raft_a_wildcard_address(host: str, raft: str) -> None:
    assert raft_host(host) == raft
