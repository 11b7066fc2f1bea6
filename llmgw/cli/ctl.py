"""`llmgw ctl`: the operator's command line over the admin API (`/api/v1/...`).

Owns argument parsing, URL/key resolution, error wording and table rendering;
the cluster's facts all come from the API. Imports only the standard library,
cyclopts and httpx so that start-up stays fast.

Entry points: `ctl_app`, registered in the root app under a name
(`app.command("llmgw.cli.ctl:ctl_app", name="ctl")`), and `run_ctl(argv,
transport=..., env=..., stdout=..., stderr=...)`, the seam tests drive with
`httpx.MockTransport`.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TextIO

import cyclopts
import httpx
from cyclopts import Parameter

EXIT_OK = 0
EXIT_API = 1  # the API refused, or could not be reached or understood
EXIT_USAGE = 2  # the command line (or a file it names) is wrong

TIMEOUT_S = 30.0
REASON_WIDTH = 100  # tables cut long reasons; `ctl model show` prints them whole


class CtlError(Exception):
    """A failure to report as one `error: ...` line on stderr, with an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_API) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(CtlError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class Refused(CtlError):
    """The API understood the request and said no (`{"error": {"code", "message"}}`)."""


@dataclass(frozen=True)
class Io:
    """What ctl touches outside itself. None means the real thing (network, os.environ,
    sys.stdout/sys.stderr as they are when the command runs)."""

    transport: httpx.BaseTransport | None = None
    env: Mapping[str, str] | None = None
    stdout: TextIO | None = None
    stderr: TextIO | None = None


# --- where the admin API is, and with which key --------------------------------


@dataclass(frozen=True)
class Target:
    url: str
    key: str
    url_from: str  # words for messages: "--url", "LLMGW_URL", ".llmgw/credentials.json"
    key_from: str


def resolve_target(*, url: str | None, key: str | None, state_dir: Path, env: Mapping[str, str]) -> Target:
    """Each of URL and key: the flag, else the environment, else DIR/credentials.json.

    The file's admin key goes only to the file's own admin URL: `--url` pointing
    elsewhere never receives this cluster's key by accident.
    """
    creds_path = state_dir / "credentials.json"
    url_from = key_from = ""
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
    return Target(url=url.rstrip("/"), key=key, url_from=url_from, key_from=key_from)


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


# --- one command's conversation with the API -----------------------------------


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
                timeout=TIMEOUT_S,
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
                f"no answer within {TIMEOUT_S:g} s ({type(e).__name__})"
            ) from e
        except httpx.TransportError as e:
            raise CtlError(f"talking to {url} failed: {_why(e)}") from e
        return response.status_code, _decode(response, url)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


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
        code = _clean(str(err.get("code") or f"http_{status}"))
        message = _clean(str(err.get("message") or "(no message)"))
        raise Refused(f"{code}: {message}")
    raise CtlError(f"{url} answered status {status}: {_excerpt(text)}")


def _excerpt(text: str, limit: int = 200) -> str:
    text = _clean(text.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clean(text: str) -> str:
    """Server text shown on a terminal: no control characters, one line."""
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)


def _path(*parts: str) -> str:
    return "/api/v1/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)


# --- rendering -----------------------------------------------------------------


def cell(value: Any) -> str:
    """One table cell: `-` for unknown or absent (None, "", missing), never 0 or blank."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _clean(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Fixed-width columns, two spaces apart; the last column is not padded."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = []
    for row in [list(headers), *cells]:
        lines.append("  ".join(text.ljust(w) for text, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _short(value: Any, width: int = REASON_WIDTH) -> Any:
    if isinstance(value, str) and len(value) > width:
        return value[: width - 1] + "…"
    return value


def _ratio(ready: Any, desired: Any) -> str:
    return f"{_count(ready)}/{_count(desired)}"


def _count(value: Any) -> str:
    # Negative numbers are how the API says "unknown" in JSON (S4).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return "-"
    return cell(value)


def _positive(value: Any) -> Any:
    """A quantity that is never really zero (CPUs, memory): 0 means not reported."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return value


def _gib(value: Any) -> str | None:
    n = _positive(value)
    return None if n is None else f"{n / 2**30:.1f} GiB"


def _gpus(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    if not value:
        return "0"
    classes: dict[str, int] = {}
    for gpu in value:
        name = _get(gpu, "gpu_class") or _get(gpu, "name") or "?"
        classes[str(name)] = classes.get(str(name), 0) + 1
    return ", ".join(f"{n}x {c}" for c, n in classes.items())


def _names(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    if not value:
        return "none"
    return ",".join(str(_get(v, "name") or v) if isinstance(v, Mapping) else str(v) for v in value)


def _state(status: Mapping[str, Any] | None) -> Any:
    state = _get(status, "state")
    if _get(status, "parked") is True and state != "parked":
        return f"{state or '-'} (parked)"
    return state


def _reason(status: Mapping[str, Any] | None) -> Any:
    reason = _get(status, "reason")
    if not reason and _get(status, "parked") is True:
        reason = _get(status, "last_error")
    return reason


def render_status(doc: Mapping[str, Any]) -> str:
    cluster = _get(doc, "cluster") or {}
    stopped = _get(cluster, "stopped")
    serving = {True: "STOPPED (serving.stopped is set; `llmgw ctl settings serving.stopped false` serves again)", False: "serving"}
    parts = [
        f"leader: {cell(_get(cluster, 'leader'))}",
        f"revision: {cell(_get(cluster, 'revision'))}",
        serving.get(stopped, "serving: -") if isinstance(stopped, bool) else "serving: -",
    ]
    out = ["   ".join(parts)]

    members = _get(cluster, "members")
    if isinstance(members, list) and members:
        out += ["", "CONTROL PLANES"]
        rows = ([_get(m, "id"), _get(m, "role"), _get(m, "state")] for m in members)
        out.append(table(["MEMBER", "ROLE", "STATE"], rows))

    nodes = _get(doc, "nodes")
    out += ["", "NODES"]
    if isinstance(nodes, list) and nodes:
        out.append(
            table(
                ["NODE", "HOSTNAME", "CONNECTED", "CPUS", "MEMORY", "GPUS", "ENGINES"],
                (
                    [
                        _get(n, "node"),
                        _get(n, "hostname"),
                        _get(n, "connected"),
                        _positive(_get(n, "cpus")),
                        _gib(_get(n, "memory_total")),
                        _gpus(_get(n, "gpus")),
                        _names(_get(n, "engines")),
                    ]
                    for n in nodes
                ),
            )
        )
    else:
        out.append("no nodes have reported")

    models = _get(doc, "models")
    out += ["", "MODELS"]
    if isinstance(models, list) and models:
        out.append(
            table(
                ["NAME", "ENGINE", "ROLE", "READY/DESIRED", "STATE", "REASON"],
                (
                    [
                        _get(m, "name"),
                        _get(m, "engine"),
                        _get(m, "role"),
                        _ratio(_get(m, "ready"), _get(m, "desired")),
                        _state(m),
                        _short(_reason(m)),
                    ]
                    for m in models
                ),
            )
        )
    else:
        out.append("no models defined — `llmgw ctl model serve --file examples/catalog.toml` adds some")

    warnings = _get(doc, "warnings")
    if isinstance(warnings, list) and warnings:
        out += ["", "WARNINGS"]
        out += [f"  ! {_clean(str(w))}" for w in warnings]
    webhooks = _get(doc, "notify", "webhooks")
    said = isinstance(warnings, list) and any("webhook" in str(w) for w in warnings)
    if webhooks == 0 and not said:  # S10: say so, and how to set one
        out += [
            "",
            "notifications: no webhook set; lost nodes and parked models reach nobody."
            " Set one: llmgw ctl settings notify.webhooks '[\"https://...\"]'",
        ]
    return "\n".join(out)


def render_models(doc: Mapping[str, Any]) -> str:
    models = _get(doc, "models")
    if not isinstance(models, list) or not models:
        return "no models defined — `llmgw ctl model serve --file examples/catalog.toml` adds some"
    return table(
        ["NAME", "ENGINE", "ROLE", "MODE", "REPLICAS", "READY/DESIRED", "STATE", "REASON"],
        (
            [
                _get(m, "name"),
                _get(m, "engine"),
                _get(m, "role"),
                _get(m, "mode"),
                _replicas(_get(m, "replicas")),
                _ratio(_get(m, "status", "ready"), _get(m, "status", "desired")),
                _state(_get(m, "status")),
                _short(_reason(_get(m, "status"))),
            ]
            for m in models
        ),
    )


def _replicas(value: Any) -> str:
    return f"{_count(_get(value, 'min'))}..{_count(_get(value, 'max'))}"


def render_model(model: Mapping[str, Any]) -> str:
    status = _get(model, "status") or {}
    profile = _get(model, "profile") or {}
    rows: list[tuple[str, Any]] = [
        ("name", _get(model, "name")),
        ("engine", _get(model, "engine")),
        ("role", _get(model, "role")),
        ("source", _get(model, "source")),
        ("mode", _get(model, "mode")),
        ("replicas", _replicas(_get(model, "replicas"))),
        ("idle timeout", _seconds(_get(model, "idle_timeout_s"))),
        ("activation window", _seconds(_get(model, "activation_window_s"))),
        ("args", _args(_get(model, "args"))),
        ("profile", _profile(profile)),
        ("state", _state(status)),
        ("ready/desired", _ratio(_get(status, "ready"), _get(status, "desired"))),
        ("starting", _count(_get(status, "starting"))),
        ("reason", _get(status, "reason")),
        ("parked", _get(status, "parked")),
        ("failures in a row", _count(_get(status, "failures_in_row"))),
        ("last error", _get(status, "last_error")),
    ]
    width = max(len(k) for k, _ in rows)
    out = [f"{k + ':':<{width + 1}}  {cell(v)}" for k, v in rows]
    replicas = _get(status, "replicas")
    out += ["", "REPLICAS"]
    if isinstance(replicas, list) and replicas:
        out.append(
            table(
                ["REPLICA", "NODE", "STATE", "URL", "ERROR"],
                (
                    [_get(r, "replica_id"), _get(r, "node"), _get(r, "state"), _get(r, "url"), _short(_get(r, "error"))]
                    for r in replicas
                ),
            )
        )
    else:
        out.append("none")
    return "\n".join(out)


def _seconds(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return f"{cell(value)} s"


def _args(args: Any) -> str | None:
    if not isinstance(args, list):
        return None
    if not args:
        return "none"
    return " ".join(a if isinstance(a, str) and a and " " not in a else _json_text(a) for a in args)


def _profile(p: Mapping[str, Any]) -> str | None:
    if not isinstance(p, Mapping) or not p:
        return None
    bits = [f"{k}={cell(p.get(k))}" for k in ("gpus", "tp", "pp", "nodes")]
    classes = p.get("classes")
    if isinstance(classes, list):
        bits.append("classes=" + (",".join(map(str, classes)) if classes else "any"))
    else:
        bits.append("classes=-")
    mem = p.get("memory_gib")
    bits.append("memory=" + ("estimated" if mem == 0 else "-" if mem is None else f"{cell(mem)} GiB"))
    bits.append(f"cpu={cell(p.get('cpu'))}")
    return " ".join(bits)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _json_field(doc: Any, key: str) -> str:
    return _clean(_json_text(doc[key])) if isinstance(doc, Mapping) and key in doc else "-"


def render_setting(key: str, doc: Mapping[str, Any]) -> str:
    is_set = {True: "set", False: "not set, the default applies"}.get(_get(doc, "set"), "-")
    return f"{key} = {_json_field(doc, 'value')}   (default {_json_field(doc, 'default')}; {is_set})"


def render_settings(doc: Mapping[str, Any]) -> str:
    settings = _get(doc, "settings")
    if not isinstance(settings, Mapping) or not settings:
        return "no settings"
    return table(
        ["KEY", "VALUE", "SET", "DEFAULT", "HELP"],
        (
            [
                key,
                _json_text(s["value"]) if isinstance(s, Mapping) and "value" in s else None,
                _get(s, "set"),
                _json_text(s["default"]) if isinstance(s, Mapping) and "default" in s else None,
                _get(s, "help"),
            ]
            for key, s in sorted(settings.items())
        ),
    )


def parse_setting_value(text: str) -> Any:
    """VALUE as JSON (`true`, `5`, `["https://..."]`), else the plain string."""

    def no_constants(name: str) -> Any:
        raise ValueError(name)  # NaN/Infinity are not JSON; keep them as text

    try:
        return json.loads(text, parse_constant=no_constants)
    except ValueError:
        return text


# --- model definitions from files or flags -------------------------------------


def definitions_from_file(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(definitions, whether the file is a catalog): `[[models]]` tables, or one
    top-level model table."""
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not valid TOML: {e}") from None
    if "models" in doc:
        models = doc["models"]
        if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
            raise UsageError(f"{path}: `models` must be [[models]] tables")
        if not models:
            raise UsageError(f"{path} has an empty models list")
        return models, True
    if "name" in doc:
        return [doc], False
    raise UsageError(f"{path} has no [[models]] tables and is not a model table (no `name = ...`)")


def definition_from_flags(
    *,
    name: str | None,
    engine: str | None,
    source: str | None,
    role: str | None,
    mode: str | None,
    min_: int | None,
    max_: int | None,
    gpus: int | None,
    cpu: bool,
    args: Sequence[str] | None,
) -> dict[str, Any]:
    missing = [flag for flag, v in (("--name", name), ("--engine", engine), ("--source", source)) if not v]
    if missing:
        raise UsageError(f"model serve needs --file FILE, or {', '.join(missing)} (with --name, --engine and --source)")
    doc: dict[str, Any] = {"name": name, "engine": engine, "source": source}
    if role is not None:
        doc["role"] = role
    if mode is not None:
        doc["mode"] = mode
    replicas = {k: v for k, v in (("min", min_), ("max", max_)) if v is not None}
    if replicas:
        doc["replicas"] = replicas
    profile: dict[str, Any] = {}
    if gpus is not None:
        profile.update(gpus=gpus, tp=gpus)  # tensor-parallel across the replica's GPUs
    if cpu:
        profile["cpu"] = True
    if profile:
        doc["profile"] = profile
    if args:
        doc["args"] = list(args)
    return doc


# --- the commands ----------------------------------------------------------------

SessionParam = Annotated[Session, Parameter(parse=False)]

_commands = cyclopts.App(name="ctl", help="The operator's command line over the admin API.")
_model = cyclopts.App(name="model", help="Show, serve, remove or retry one model.")
_commands.command(_model)


@_commands.command
def status(*, session: SessionParam) -> int:
    """The cluster summary: leader, nodes, models and warnings."""
    _, doc = session.request("GET", _path("status"))
    session.show(doc, render_status)
    return EXIT_OK


@_commands.command
def models(*, session: SessionParam) -> int:
    """Every model in the catalog with its health."""
    _, doc = session.request("GET", _path("models"))
    session.show(doc, render_models)
    return EXIT_OK


@_model.command(name="show")
def model_show(name: str, /, *, session: SessionParam) -> int:
    """One model: its definition, health and replicas.

    Parameters
    ----------
    name
        The model's name.
    """
    _, doc = session.request("GET", _path("models", name))
    session.show(doc, lambda d: render_model(_get(d, "model") or {}))
    return EXIT_OK


@_model.command(name="serve")
def model_serve(
    *,
    file: Annotated[Path | None, Parameter(name="--file")] = None,
    name: Annotated[str | None, Parameter(name="--name")] = None,
    engine: Annotated[str | None, Parameter(name="--engine")] = None,
    source: Annotated[str | None, Parameter(name="--source")] = None,
    role: Annotated[str | None, Parameter(name="--role")] = None,
    mode: Annotated[str | None, Parameter(name="--mode")] = None,
    min_: Annotated[int | None, Parameter(name="--min")] = None,
    max_: Annotated[int | None, Parameter(name="--max")] = None,
    gpus: Annotated[int | None, Parameter(name="--gpus")] = None,
    cpu: Annotated[bool, Parameter(name="--cpu", negative="", show_default=False)] = False,
    arg: Annotated[list[str] | None, Parameter(name="--arg", allow_leading_hyphen=True, negative_iterable="")] = None,
    session: SessionParam,
) -> int:
    """Add a model, or replace the one of that name.

    Parameters
    ----------
    file
        TOML with [[models]] tables (like examples/catalog.toml), or one model table.
    name
        Model name (without --file).
    engine
        sim, llama.cpp or vllm.
    source
        A path on storage, mirror://NAME, hf://ORG/REPO or sim://NAME.
    role
        chat, embedding or guard.
    mode
        always or on-demand.
    min_
        Fewest replicas.
    max_
        Most replicas.
    gpus
        GPUs per replica, tensor-parallel across them (tp = gpus).
    cpu
        May run with no GPU.
    arg
        An extra engine argument; repeat for more (--arg=--ctx-size --arg=4096).
    """
    flags_given = any(v is not None for v in (name, engine, source, role, mode, min_, max_, gpus, arg)) or cpu
    if file is not None:
        if flags_given:
            raise UsageError("model serve takes --file FILE or the model flags, not both")
        definitions, catalog = definitions_from_file(file)
    else:
        catalog = False
        definitions = [
            definition_from_flags(
                name=name,
                engine=engine,
                source=source,
                role=role,
                mode=mode,
                min_=min_,
                max_=max_,
                gpus=gpus,
                cpu=cpu,
                args=arg,
            )
        ]
    answers: list[Any] = []
    failed = 0
    for definition in definitions:
        label = cell(definition.get("name"))
        try:
            code, doc = session.request("POST", _path("models"), body=definition, send_body=True)
        except Refused as e:
            if len(definitions) == 1:
                raise
            failed += 1  # the others may still be fine; a transport error stops them all
            session.note(f"error: {label}: {e.message}")
            continue
        answers.append(doc)
        if not session.as_json:
            verb = "created" if code == 201 else "replaced" if code == 200 else f"sent (status {code})"
            session.out(f"{verb} model {cell(_get(doc, 'model', 'name') or label)}")
    if session.as_json:
        session.print_json(answers if catalog else answers[0])
    if failed:
        raise CtlError(f"{failed} of {len(definitions)} models were not served")
    return EXIT_OK


@_model.command(name="remove")
def model_remove(name: str, /, *, session: SessionParam) -> int:
    """Remove a model; its replicas are stopped.

    Parameters
    ----------
    name
        The model's name.
    """
    _, doc = session.request("DELETE", _path("models", name))
    session.show(doc, lambda d: f"removed model {cell(_get(d, 'removed') or name)}")
    return EXIT_OK


@_model.command(name="retry")
def model_retry(name: str, /, *, session: SessionParam) -> int:
    """Un-park a model so that it is placed again.

    Parameters
    ----------
    name
        The model's name.
    """
    _, doc = session.request("POST", _path("models", name, "retry"))
    session.show(doc, lambda d: f"retrying model {cell(_get(d, 'retried') or name)}: its failure count is cleared")
    return EXIT_OK


@_commands.command
def settings(key: str | None = None, value: str | None = None, /, *, session: SessionParam) -> int:
    """List the settings, show one (KEY), or set one (KEY VALUE).

    Parameters
    ----------
    key
        A setting such as serving.stopped or notify.webhooks.
    value
        JSON (true, 5, '["https://hooks.example/x"]'), else taken as a plain string.
    """
    if key is None:
        _, doc = session.request("GET", _path("settings"))
        session.show(doc, render_settings)
    elif value is None:
        _, doc = session.request("GET", _path("settings", key))
        session.show(doc, lambda d: render_setting(key, d))
    else:
        _, doc = session.request("PUT", _path("settings", key), body=parse_setting_value(value), send_body=True)
        session.show(doc, lambda d: f"{key} = {_json_field(d, 'value')}")
    return EXIT_OK


# --- global options and dispatch -----------------------------------------------

# `ctl_app` is the meta app of `_commands`: it takes the global options wherever
# they appear (`ctl --json status` and `ctl status --json`), then runs the command.
ctl_app = _commands.meta
ctl_app.help = _commands.help


@ctl_app.default
def ctl(
    *tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)],
    url: Annotated[str | None, Parameter(name="--url")] = None,
    key: Annotated[str | None, Parameter(name="--key")] = None,
    state_dir: Annotated[Path, Parameter(name="--state-dir")] = Path(".llmgw"),
    as_json: Annotated[bool, Parameter(name="--json", negative="", show_default=False)] = False,
    io: Annotated[Io | None, Parameter(parse=False)] = None,
) -> int:
    """The operator's command line over the admin API.

    Parameters
    ----------
    url
        Admin API base URL, e.g. http://127.0.0.1:8081 (else LLMGW_URL, else DIR/credentials.json).
    key
        Admin key (else LLMGW_KEY, else DIR/credentials.json).
    state_dir
        Directory holding credentials.json, as written by `llmgw up`.
    as_json
        Print the API's JSON as it came, for scripts.
    """
    io = io or Io()
    command, bound, ignored = _commands.parse_args(tokens, **_consoles(io))
    if "session" not in ignored:  # help, version
        result = command(*bound.args, **bound.kwargs)
        return result if isinstance(result, int) else EXIT_OK
    session = Session(url=url, key=key, state_dir=state_dir, as_json=as_json, io=io)
    try:
        return int(command(*bound.args, **bound.kwargs, session=session))
    except CtlError as e:
        session.note(f"error: {e.message}")
        return e.exit_code
    finally:
        session.close()


def _consoles(io: Io) -> dict[str, Any]:
    """Where cyclopts should print help and usage errors, when not to the real streams."""
    if io.stdout is None and io.stderr is None:
        return {}
    from rich.console import Console  # cyclopts already loaded it; only tests get here

    consoles: dict[str, Any] = {}
    if io.stdout is not None:
        consoles["console"] = Console(file=io.stdout, width=100)
    if io.stderr is not None:
        consoles["error_console"] = Console(file=io.stderr, width=100)
    return consoles


def run_ctl(
    argv: Sequence[str],
    *,
    transport: httpx.BaseTransport | None = None,
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run `llmgw ctl ARGV...` and return its exit code, never exiting the process.

    A usage error cyclopts finds is printed by cyclopts and returns 2.
    """
    io = Io(transport=transport, env=env, stdout=stdout, stderr=stderr)
    try:
        command, bound, ignored = ctl_app.parse_args(list(argv), **_consoles(io))
        extra = {"io": io} if "io" in ignored else {}
        result = command(*bound.args, **bound.kwargs, **extra)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    return result if isinstance(result, int) else EXIT_OK
