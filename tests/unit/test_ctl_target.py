"""`llmgw ctl` finds the admin API and its key: flags beat the environment, which beats
the credentials file; the file's key never goes to another URL; what is missing is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctl_fakes import STATUS, URL, FakeApi, ctl


def write_credentials(state_dir: Path, **overrides: str) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "gateway_url": "http://gw.test:8080/v1",
        "admin_url": "http://creds.test:8081",
        "client_key": "client-creds",
        "admin_key": "adm-creds",
        **overrides,
    }
    path = state_dir / "credentials.json"
    path.write_text(json.dumps(doc))
    return path


def seen(api: FakeApi) -> tuple[str, str]:
    request = api.requests[-1]
    return f"{request.url.scheme}://{request.url.netloc.decode()}", request.headers["authorization"]


def test_credentials_json_gives_admin_url_and_admin_key(tmp_path: Path) -> None:
    write_credentials(tmp_path / "st")
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["--state-dir", str(tmp_path / "st"), "status"], api, env={})
    assert r.rc == 0, r.err
    assert seen(api) == ("http://creds.test:8081", "Bearer adm-creds")


def test_default_state_dir_is_dot_llmgw_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_credentials(tmp_path / ".llmgw")
    monkeypatch.chdir(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    assert ctl(["status"], api, env={}).rc == 0
    assert seen(api) == ("http://creds.test:8081", "Bearer adm-creds")


def test_environment_beats_credentials_json(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(
        ["--state-dir", str(tmp_path), "status"], api, env={"LLMGW_URL": "http://env.test:9", "LLMGW_KEY": "adm-env"}
    )
    assert r.rc == 0, r.err
    assert seen(api) == ("http://env.test:9", "Bearer adm-env")


def test_flags_beat_environment(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    env = {"LLMGW_URL": "http://env.test:9", "LLMGW_KEY": "adm-env"}
    r = ctl(["--state-dir", str(tmp_path), "--url", "http://flag.test:7/", "--key", "adm-flag", "status"], api, env=env)
    assert r.rc == 0, r.err
    assert seen(api) == ("http://flag.test:7", "Bearer adm-flag")


def test_the_files_key_never_goes_to_another_url(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["--state-dir", str(tmp_path), "--url", "http://other-cluster.test:7", "status"], api,
            env={"LLMGW_KEY": ""})
    assert r.rc == 2
    assert "no admin key for http://other-cluster.test:7" in r.err and "--key" in r.err
    assert api.requests == [], "nothing, least of all the key, was sent"


def test_the_files_key_goes_with_its_own_url_given_as_a_flag(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    creds = json.loads((tmp_path / "credentials.json").read_text())
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["--state-dir", str(tmp_path), "--url", creds["admin_url"] + "/", "status"], api, env={"LLMGW_KEY": ""})
    assert r.rc == 0, r.err
    assert seen(api) == (creds["admin_url"], "Bearer adm-creds")


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "http://flag.test:7", "--key", "k", "--json", "status"],
        ["status", "--url", "http://flag.test:7", "--key", "k", "--json"],
        ["--json", "status", "--key", "k", "--url", "http://flag.test:7"],
    ],
)
def test_global_options_go_before_or_after_the_command(argv: list[str], tmp_path: Path) -> None:
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(argv + ["--state-dir", str(tmp_path)], api, env={})
    assert r.rc == 0, r.err
    assert seen(api) == ("http://flag.test:7", "Bearer k")
    assert json.loads(r.out) == STATUS


def test_nothing_gives_a_url_or_key_says_what_is_missing(tmp_path: Path) -> None:
    api = FakeApi()
    r = ctl(["--state-dir", str(tmp_path / "none"), "status"], api, env={})
    assert r.rc == 2
    assert r.err.startswith("error: no admin URL and no admin key")
    assert "--url" in r.err and "LLMGW_URL" in r.err and str(tmp_path / "none" / "credentials.json") in r.err
    assert "does not exist" in r.err
    assert api.requests == [] and r.out == ""


def test_only_the_key_missing_names_only_the_key(tmp_path: Path) -> None:
    r = ctl(["--state-dir", str(tmp_path), "status"], env={"LLMGW_URL": URL})
    assert r.rc == 2
    assert r.err.startswith("error: no admin key:")


def test_credentials_without_admin_entries_are_said_to_lack_them(tmp_path: Path) -> None:
    write_credentials(tmp_path, admin_url="", admin_key="")
    r = ctl(["--state-dir", str(tmp_path), "status"], env={})
    assert r.rc == 2
    assert "exists but has no admin_url/admin_key" in r.err


def test_broken_credentials_json_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "credentials.json").write_text("{not json")
    r = ctl(["--state-dir", str(tmp_path), "status"], env={})
    assert r.rc == 2
    assert "credentials.json is not valid JSON" in r.err


def test_a_url_without_http_scheme_is_a_usage_error() -> None:
    r = ctl(["status"], env={"LLMGW_URL": "127.0.0.1:8081", "LLMGW_KEY": "k"})
    assert r.rc == 2
    assert "'127.0.0.1:8081' (from LLMGW_URL) is not an http:// or https:// URL" in r.err
