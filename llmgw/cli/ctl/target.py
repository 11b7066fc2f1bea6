"""Where the admin API is and which key it takes: each of URL and key from the flag,
else the environment, else the credentials file `llmgw up` wrote."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.cli.ctl.errors import UsageError


@dataclass(frozen=True)
class Target:
    url: str
    key: str
    url_from: str  # words for messages: "--url", "LLMGW_URL", ".llmgw/credentials.json"
    key_from: str
    # The CA bundle an https admin URL is verified with: --ca-file, else LLMGW_CA_FILE, else the one
    # credentials.json names (for its own URL), else DIR/tls/ca.pem (a control plane's own); None: the
    # system's trust store.
    ca_file: str | None = None


def resolve_target(*, url: str | None, key: str | None, state_dir: Path, env: Mapping[str, str],
                   ca_file: str | None = None) -> Target:
    """Each of URL and key: the flag, else the environment, else DIR/credentials.json.

    The file's admin key goes only to the file's own admin URL: `--url` pointing
    elsewhere never receives this cluster's key by accident.
    """
    creds_path = state_dir / "credentials.json"
    url_from = key_from = ""
    ca_file = ca_file or env.get("LLMGW_CA_FILE") or None
    if url:
        url_from = "--url"
    elif env.get("LLMGW_URL"):
        url, url_from = env["LLMGW_URL"], "LLMGW_URL"
    if key:
        key_from = "--key"
    elif env.get("LLMGW_KEY"):
        key, key_from = env["LLMGW_KEY"], "LLMGW_KEY"
    if not (url and key):
        creds = _read_credentials(creds_path)
        if creds is not None:
            if not url and isinstance(creds.get("admin_url"), str) and creds["admin_url"]:
                url, url_from = creds["admin_url"], str(creds_path)
            file_url = creds.get("admin_url")
            same_cluster = bool(url) and isinstance(file_url, str) and str(url).rstrip("/") == file_url.rstrip("/")
            if not key and same_cluster and isinstance(creds.get("admin_key"), str) and creds["admin_key"]:
                key, key_from = creds["admin_key"], str(creds_path)
            if not ca_file and same_cluster and isinstance(creds.get("ca_file"), str) and creds["ca_file"]:
                ca_file = creds["ca_file"]
    if not ca_file and (state_dir / "tls" / "ca.pem").is_file():
        ca_file = str(state_dir / "tls" / "ca.pem")
    missing = [what for what, value in (("admin URL", url), ("admin key", key)) if not value]
    if url and not key and url_from in ("--url", "LLMGW_URL") and creds_path.is_file():
        raise UsageError(
            f"no admin key for {url}: {creds_path} holds the key of another admin URL, which is not sent "
            f"elsewhere; pass --key KEY or set LLMGW_KEY"
        )
    if missing:
        found = "exists but has no admin_url/admin_key" if creds_path.is_file() else "does not exist"
        raise UsageError(
            f"no {' and no '.join(missing)}: pass --url URL and --key KEY, "
            f"or set LLMGW_URL and LLMGW_KEY, or point --state-dir at the directory "
            f"holding credentials.json ({creds_path} {found})"
        )
    assert url and key
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"the admin URL {url!r} (from {url_from}) is not an http:// or https:// URL")
    return Target(url=url.rstrip("/"), key=key, url_from=url_from, key_from=key_from, ca_file=ca_file)


def _read_credentials(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(doc, dict):
        raise UsageError(f"{path} should hold a JSON object with admin_url and admin_key")
    return doc
