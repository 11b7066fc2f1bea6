"""What ctl prints for the API's answers: cells, tables, the control planes, the models table,
one model, the settings; the status and plan pages are `fleet.py`, the guardrails `guard.py`.
Pure functions of the JSON; unknown is `-`, never 0."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llmgw.domain.health import flap_words
from llmgw.domain.model import PREFIX_CHARS, ModelDef, Routing
from llmgw.domain.schedule import span_words

REASON_WIDTH = 100  # tables cut long reasons; `ctl model show` prints them whole
NO_MODELS = "no models defined — `llmgw ctl model serve --file examples/catalog.toml` adds some"


def clean(text: str) -> str:
    """Server text shown on a terminal: no control characters, one line."""
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)


def cell(value: Any) -> str:
    """One table cell: `-` for unknown or absent (None, "", missing), never 0 or blank."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return clean(str(value))


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


def dig(doc: Any, *keys: str) -> Any:
    """doc[k1][k2]..., or None where the JSON is not shaped so."""
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_field(doc: Any, key: str) -> str:
    """doc[key] as JSON on one line, `-` when absent (a present `null` prints as null)."""
    return clean(json_text(doc[key])) if isinstance(doc, Mapping) and key in doc else "-"


# --- quantities: which number means "unknown" depends on the field ------------------


def _failures(status: Any) -> str:
    """"5 (ready for 3 s at most, then failed: 5 times)": the row, and its flaps when it has any."""
    count, flaps, longest = dig(status, "failures_in_row"), dig(status, "flaps"), dig(status, "flap_ready_s")
    if isinstance(flaps, int) and flaps and isinstance(longest, (int, float)):
        return f"{_known_count(count)} ({flap_words(flaps, float(longest))})"
    return _known_count(count)


def _known_count(value: Any) -> str:
    """A count the API may not know: it says so with a negative number (S4)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return "-"
    return cell(value)


def _reported(value: Any) -> Any:
    """A quantity that is never really zero (CPUs, memory): 0 means not reported."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return value


def _ratio(ready: Any, desired: Any) -> str:
    return f"{_known_count(ready)}/{_known_count(desired)}"


def _replicas(value: Any) -> str:
    return f"{_known_count(dig(value, 'min'))}..{_known_count(dig(value, 'max'))}"


def _gib(value: Any) -> str | None:
    n = _reported(value)
    return None if n is None else f"{n / 2**30:.1f} GiB"


def _seconds(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return f"{cell(value)} s"


def _activation(status: Any) -> str | None:
    """A starting model's progress in words (`loading the 13.0 GiB checkpoint for 12 s, about 84 s left`)."""
    words = dig(status, "activation", "words")
    return words if isinstance(words, str) and words else None


def _window(model: Mapping[str, Any], status: Any) -> str | None:
    """The activation window in force, and why when a large checkpoint stretched the definition's."""
    own, used = dig(model, "activation_window_s"), dig(status, "window_s")
    if isinstance(used, (int, float)) and isinstance(own, (int, float)) and used > own:
        return f"{used:.0f} s (the checkpoint's load estimate; the definition says {_seconds(own)})"
    return _seconds(own)


def _short(value: Any, width: int = REASON_WIDTH) -> Any:
    if isinstance(value, str) and len(value) > width:
        return value[: width - 1] + "…"
    return value


# --- a model's state, as every page shows it ---------------------------------------------


def _state(status: Mapping[str, Any] | None) -> Any:
    state = dig(status, "state")
    if dig(status, "parked") is True and state != "parked":
        return f"{state or '-'} (parked)"
    return state


def _reason(status: Mapping[str, Any] | None) -> Any:
    reason = dig(status, "reason")
    if not reason and dig(status, "parked") is True:
        reason = dig(status, "last_error")
    return reason


# --- the control planes ---------------------------------------------------------------


def _ago(age: Any) -> str | None:
    if isinstance(age, bool) or not isinstance(age, (int, float)):
        return None
    return f"{age:.1f} s ago"


def _hash(value: Any) -> str | None:
    """A state hash cut to what tells two apart at a glance (`--json` has it whole)."""
    return value[:19] if isinstance(value, str) and value.startswith("sha256:") else value


def render_members(doc: Mapping[str, Any]) -> str:
    """`ctl members`: who leads, and each member's role, state, indexes, lag, contact and hash."""
    leader = dig(doc, "leader")
    head = [f"leader: {cell(leader)}" + (f" ({cell(dig(doc, 'leader_url'))})" if leader else ""),
            f"asked: {cell(dig(doc, 'self'))}"]
    out = ["   ".join(head)]
    if dig(doc, "member_change"):
        out.append(f"membership change in progress: {cell(dig(doc, 'member_change'))}")
    members = dig(doc, "members")
    out.append("")
    if isinstance(members, list) and members:
        out.append(table(
            ["MEMBER", "ADMIN URL", "ROLE", "STATE", "COMMIT", "APPLIED", "LAG", "LAST CONTACT", "STATE HASH",
             "REASON"],
            ([dig(m, "id"), dig(m, "admin_url"), dig(m, "role"), dig(m, "state"), _known_count(dig(m, "commit_index")),
              _known_count(dig(m, "applied_index")), _known_count(dig(m, "lag")), _ago(dig(m, "last_contact_age_s")),
              _hash(dig(m, "state_hash")), _short(dig(m, "reason"))] for m in members)))
    else:
        out.append("no members listed")
    if isinstance(dig(doc, "floating_address"), Mapping):
        out += ["", _floating_line(dig(doc, "floating_address"))]
    if "gateways" in doc:
        out += ["", "GATEWAYS"] + _gateways(doc)
    if "agents" in doc:
        out += ["", "AGENTS"]
        agents = dig(doc, "agents")
        if isinstance(agents, list) and agents:
            out.append(table(["NODE", "CONNECTED", "REPLICAS", "LAST CONTACT"],
                             ([dig(a, "node"), dig(a, "connected"), _known_count(dig(a, "replicas")),
                               _ago(dig(a, "last_contact_age_s"))] for a in agents)))
        elif isinstance(agents, list):
            out.append("no agent has attached to the leader")
        else:
            out.append(f"unknown: {cell(dig(doc, 'followers_reason'))}")
    warnings = dig(doc, "warnings")
    if isinstance(warnings, list) and warnings:
        out += ["", "WARNINGS"] + [f"  ! {clean(str(w))}" for w in warnings]
    return "\n".join(out)


def _floating_line(f: Mapping[str, Any]) -> str:
    """`floating address: ADDR on the leader`, `... NOT on the leader: why`, `not configured`, or unknown."""
    if dig(f, "configured") is False:
        return "floating address: not configured"
    state = dig(f, "state")
    shown = "NOT on the leader" if state == "not on the leader" else cell(state)
    text = f"floating address: {cell(dig(f, 'address'))} {shown}"
    return text + (f": {clean(str(dig(f, 'reason')))}" if dig(f, "reason") else "")


def _gateways(doc: Mapping[str, Any]) -> list[str]:
    """The gateways the leader lists (each with its last contact), or why they are unknown."""
    gateways = dig(doc, "gateways")
    if isinstance(gateways, list) and gateways:
        return [table(["GATEWAY", "ADDRESS", "CONNECTED", "LAST CONTACT"],
                      ([dig(g, "name"), dig(g, "address"), dig(g, "connected"), _ago(dig(g, "last_contact_age_s"))]
                       for g in gateways))]
    if isinstance(gateways, list):
        return ["no gateway follows the leader"]
    return [f"unknown: {cell(dig(doc, 'followers_reason'))}"]


# --- models ---------------------------------------------------------------------------


def render_models(doc: Mapping[str, Any]) -> str:
    models = dig(doc, "models")
    if not isinstance(models, list) or not models:
        return NO_MODELS
    return table(
        ["NAME", "ENGINE", "ROLE", "MODE", "REPLICAS", "READY/DESIRED", "STATE", "REASON"],
        (
            _adapter_row(m) if dig(m, "base") else [
                dig(m, "name"),
                dig(m, "engine"),
                dig(m, "role"),
                dig(m, "mode"),
                _replicas(dig(m, "replicas")),
                _ratio(dig(m, "status", "ready"), dig(m, "status", "desired")),
                _state(dig(m, "status")),
                _short(_reason(dig(m, "status"))),
            ]
            for m in _adapters_under_bases(models)
        ),
    )


def _adapters_under_bases(models: list[Any]) -> list[Any]:
    """The models in the API's order, each LoRA adapter moved under its base (an adapter whose base is not
    listed stays where it is)."""
    names = {dig(m, "name") for m in models}
    under: dict[Any, list[Any]] = {}
    for m in models:
        if dig(m, "base") in names:
            under.setdefault(dig(m, "base"), []).append(m)
    out = []
    for m in models:
        if dig(m, "base") in names:
            continue
        out.append(m)
        out.extend(under.get(dig(m, "name"), []))
    return out


def _adapter_row(m: Any) -> list[Any]:
    """A LoRA adapter, indented under its base: where it is loaded (`loaded` replicas of those asked)."""
    on = dig(m, "status", "adapter_on")
    states = list(on.values()) if isinstance(on, dict) else []
    loaded = [rid for rid, state in (on.items() if isinstance(on, dict) else ()) if state == "loaded"]
    reason = _reason(dig(m, "status")) or ("loaded on " + ", ".join(map(str, loaded)) if loaded else "")
    return [f"  └ {cell(dig(m, 'name'))}", dig(m, "engine"), dig(m, "role"), "adapter", "-",
            f"{len(loaded)} loaded / {len(states)}", _state(dig(m, "status")), _short(reason)]


def _sleep_level(level: Any) -> str:
    """A model's `sleep_level` (fast wake), shown only when set."""
    kept = {1: "weights kept in CPU RAM", 2: "weights discarded"}.get(level, "")
    return f"sleeps when idle, level {level}" + (f" ({kept}); a request wakes it" if kept else "")


def render_model(model: Mapping[str, Any]) -> str:
    status = dig(model, "status") or {}
    rows: list[tuple[str, Any]] = [
        ("name", dig(model, "name")),
        ("engine", dig(model, "engine")),
        ("role", dig(model, "role")),
        ("source", dig(model, "source")),
        ("mode", dig(model, "mode")),
        ("replicas", _replicas(dig(model, "replicas"))),
        ("idle timeout", _seconds(dig(model, "idle_timeout_s"))),
        ("activation window", _window(model, status)),
        ("args", _args(dig(model, "args"))),
        ("profile", _profile(dig(model, "profile") or {}, dig(model, "engine"))),
        ("request limits", _limits(dig(model, "limits"))),
        ("upstream timeouts", _timeouts(dig(model, "timeouts"))),
        ("routing", _routing(model)),
        # Shown only on a model with schedule rules: each rule, then which rules now and the next change.
        *[("schedules", _rules(rules)) for rules in [dig(model, "schedules")] if isinstance(rules, list) and rules],
        *[("schedule now", dig(ruled, "words")) for ruled in [dig(status, "schedule")] if isinstance(ruled, Mapping)],
        *([("adapter of", dig(model, "base"))] if dig(model, "base") else []),
        *([("fast wake", _sleep_level(dig(model, "sleep_level")))] if dig(model, "sleep_level") else []),
        *[("adapters", ", ".join(map(str, names))) for names in [dig(status, "adapters")]
          if isinstance(names, list) and names],
        # Shown only when set (the API leaves them out otherwise): in the order the gateway tries them.
        *[(label, ", ".join(map(str, names))) for label, key in (("fallbacks", "fallbacks"), ("aliases", "aliases"))
          if isinstance(names := dig(model, key), list) and names],
        ("memory", _memory(dig(model, "estimate"))),
        ("state", _state(status)),
        ("ready/desired", _ratio(dig(status, "ready"), dig(status, "desired"))),
        ("starting", _known_count(dig(status, "starting"))),
        ("activation", _activation(status)),
        ("reason", dig(status, "reason")),
        ("parked", dig(status, "parked")),
        ("failures in a row", _failures(status)),
        ("last error", dig(status, "last_error")),
    ]
    width = max(len(k) for k, _ in rows)
    out = [f"{k + ':':<{width + 1}}  {cell(v)}" for k, v in rows]
    on = dig(status, "adapter_on")
    if dig(model, "base"):  # a LoRA adapter: its state on each replica of its base
        out += ["", f"ON THE REPLICAS OF {cell(dig(model, 'base'))}"]
        out.append(table(["REPLICA", "ADAPTER"], ([rid, _short(state)] for rid, state in sorted(on.items())))
                   if isinstance(on, dict) and on else "none asked yet")
        return "\n".join(out)
    replicas = dig(status, "replicas")
    out += ["", "REPLICAS"]
    if isinstance(replicas, list) and replicas:
        out.append(
            table(
                ["REPLICA", "NODE", "STATE", "URL", "ERROR"],
                (
                    [dig(r, "replica_id"), dig(r, "node"), dig(r, "state"), dig(r, "url"), _short(dig(r, "error"))]
                    for r in replicas
                ),
            )
        )
    else:
        out.append("none")
    breakers = dig(status, "breakers")
    if isinstance(breakers, list) and breakers:
        # A gateway's circuit breaker keeps the replica out of its rotation (docs/operations.md).
        out += ["", "OUT OF ROTATION (circuit breaker open)"]
        now = time.time()
        out.append(table(["REPLICA", "GATEWAY", "OPEN FOR", "REASON"],
                         ([dig(b, "replica_id"), dig(b, "gateway"),
                           _open_for(dig(b, "since"), now, dig(b, "half_open")), _short(dig(b, "reason"))]
                          for b in breakers)))
    return "\n".join(out)


def _rules(rules: list[Any]) -> str:
    """A model's schedule rules, numbered as `schedule now` names them: "1) 0 8 * * mon-fri until 0 18 * *
    mon-fri: 2..4; 2) ..."."""
    out = []
    for i, r in enumerate(rules, 1):
        span = dig(r, "duration_s")
        end = f"until {cell(dig(r, 'end'))}" if dig(r, "end") else \
            f"for {span_words(span) if isinstance(span, (int, float)) else cell(span)}"
        out.append(f"{i}) {cell(dig(r, 'start'))} {end}: {cell(dig(r, 'min'))}..{cell(dig(r, 'max'))}")
    return "; ".join(out)


def _open_for(since: Any, now: float, half_open: Any) -> str | None:
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        return None
    return f"{max(0.0, now - since):.0f} s" + (" (probing)" if half_open is True else "")


def _memory(estimate: Any) -> str | None:
    """'14.2 GiB (gguf: weights …)', 'at least 4.1 GiB (…)' or 'unknown (why)'; None when not sent."""
    if not isinstance(estimate, Mapping):
        return None
    size, detail = dig(estimate, "bytes"), clean(str(dig(estimate, "detail") or ""))
    if not isinstance(size, int) or isinstance(size, bool):
        return f"unknown ({detail})" if detail else "unknown"
    words = ("" if dig(estimate, "complete") is not False else "at least ") + f"{size / (1 << 30):.1f} GiB"
    return f"{words} ({detail})" if detail else words


def _args(args: Any) -> str | None:
    if not isinstance(args, list):
        return None
    if not args:
        return "none"
    return " ".join(a if isinstance(a, str) and a and " " not in a else json_text(a) for a in args)


def _limits(limits: Any) -> str | None:
    """'max_tokens <= 4096, n: no limit' (and ', 4 slots per replica' when the model sets them); 'none' when
    nothing is set; None (shown '-') when not sent."""
    if not isinstance(limits, Mapping):
        return None
    bits = {"max_tokens": limits.get("max_tokens"), "n": limits.get("max_n")}
    slots = limits.get("concurrency_per_replica")
    if all(v is None for v in bits.values()) and slots is None:
        return "none"
    shown = ", ".join(f"{k}: no limit" if v is None else f"{k} <= {cell(v)}" for k, v in bits.items())
    return shown if slots is None else f"{shown}, {cell(slots)} slots per replica"


def _routing(model: Mapping[str, Any]) -> str | None:
    """The affinity in force and what it reads: 'prefix affinity on the first 4096 characters (the default for
    chat models)', 'affinity off: the least loaded replica'; None (shown '-') when the role is not sent. A
    definition without `routing` has the defaults (docs/api.md), which depend on the role (ModelDef.affinity_chars)."""
    role, routing = dig(model, "role"), dig(model, "routing") or {}
    if not isinstance(role, str) or not isinstance(routing, Mapping):
        return None
    affinity, chars = routing.get("affinity"), routing.get("prefix_chars", PREFIX_CHARS)
    if not isinstance(chars, int) or (affinity is not None and not isinstance(affinity, str)):
        return None
    used = ModelDef(name="", engine="", role=role, source="",
                    routing=Routing(affinity=affinity, prefix_chars=chars)).affinity_chars()
    notes = [f"the default for {cell(role)} models"] if affinity is None else []
    if not used and chars != PREFIX_CHARS:
        notes.append(f"prefix_chars {chars} unused")
    shown = f"prefix affinity on the first {used} characters" if used else "affinity off: the least loaded replica"
    return f"{shown} ({'; '.join(notes)})" if notes else shown


def _timeouts(timeouts: Any) -> str | None:
    """'connect: default, first byte 30 s, between chunks 10 s' (default: the gateway's own, docs/operations.md)."""
    if not isinstance(timeouts, Mapping):
        return None
    bits = {"connect": timeouts.get("connect_s"), "first byte": timeouts.get("first_byte_s"),
            "between chunks": timeouts.get("chunk_s")}
    if all(v is None for v in bits.values()):
        return "the gateway's defaults"
    return ", ".join(f"{k}: default" if v is None else f"{k} {_seconds(v)}" for k, v in bits.items())


def _profile(p: Mapping[str, Any], engine: Any) -> str | None:
    if engine == "sim" and isinstance(p, Mapping) and p.get("cpu") is True:
        # A sim model on CPU is a small process that placement gives nothing: its stored
        # profile (gpus=1 ... cpu=true) would read as if it took a GPU. One with a GPU profile
        # takes GPUs like any engine, and reads like one.
        return "simulated (no GPU, CPU or memory reserved)"
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


# --- settings -------------------------------------------------------------------------


def render_setting(key: str, doc: Mapping[str, Any]) -> str:
    is_set = {True: "set", False: "not set, the default applies"}.get(dig(doc, "set"), "-")
    return f"{key} = {json_field(doc, 'value')}   (default {json_field(doc, 'default')}; {is_set})"


def render_settings(doc: Mapping[str, Any]) -> str:
    settings = dig(doc, "settings")
    if not isinstance(settings, Mapping) or not settings:
        return "no settings"
    return table(
        ["KEY", "VALUE", "SET", "DEFAULT", "HELP"],
        (
            [
                key,
                json_text(s["value"]) if isinstance(s, Mapping) and "value" in s else None,
                dig(s, "set"),
                json_text(s["default"]) if isinstance(s, Mapping) and "default" in s else None,
                dig(s, "help"),
            ]
            for key, s in sorted(settings.items())
        ),
    )
