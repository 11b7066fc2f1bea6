"""`ctl upgrade FILE` and `ctl upgrade --rollback`: a rolling upgrade of the cluster's machines to a release file,
judged by the file's sha256 (never by a version string), over the admin API alone (docs/operations.md, "Upgrade").

The file is uploaded to every control plane; then the standbys, the leader (it hands leadership over first), the
gateways and the agents, one at a time, are each asked to restart into it and waited for (`upgrade_machine_s`)
until they report the new hash and are back. A machine that already runs it is skipped, said so. The first that
fails stops the run with its reason; the rest are left as they were."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError, UsageError
from llmgw.cli.ctl.render import cell, dig
from llmgw.cli.ctl.session import Session, SessionParam, api_path
from llmgw.domain.timeouts import TIMEOUTS, Timeouts


def register(app: cyclopts.App) -> None:
    app.command(upgrade)


@dataclass
class Step:
    """One machine of the run: its kind (member, gateway, node), name, and what became of it."""

    kind: str
    name: str
    url: str | None = None  # a member's admin URL
    sha256: str | None = None  # what it runs, as it said before the run
    role: str | None = None  # a member's: leader or standby


@dataclass
class Progress:
    """What the operator sees: one line per machine with a counter and a bar, or JSON lines with --json."""

    session: Session
    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)

    def event(self, event: str, **fields: Any) -> None:
        if self.session.as_json:
            self.session.out(json.dumps({"event": event, **fields}, sort_keys=True))

    def step(self, step: Step, outcome: str, words: str, **extra: Any) -> None:
        self.done += 1
        self.event("machine", kind=step.kind, machine=step.name, outcome=outcome, index=self.done, total=self.total,
                   words=words, **extra)
        if not self.session.as_json:
            width = 20
            filled = width * self.done // max(self.total, 1)
            self.session.out(f"[{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total} "
                             f"{step.kind} {step.name}: {words}")

    def say(self, words: str) -> None:
        if self.session.as_json:
            self.event("note", words=words)
        else:
            self.session.out(words)


def upgrade(file: Annotated[Path | None, Parameter(help="The release file (a zipapp, `make zipapp`) to run "
                                                        "everywhere.")] = None, /, *,
            rollback: Annotated[bool, Parameter(negative="", help=(
                "Instead of a file: return each gateway and agent to the release file it ran before, kept beside "
                "the one it runs now. Control planes only with --members too."))] = False,
            members: Annotated[bool, Parameter(negative="", help=(
                "With --rollback: the control planes too (possible only while the group's store level has not "
                "risen: docs/operations.md, \"Mixed versions\")."))] = False,
            session: SessionParam) -> int:
    """Upgrade the cluster, machine by machine, to a release file: standbys, then the leader (it hands leadership
    over first), then gateways, then agents one at a time; engines keep serving. Judged by the file's sha256: a
    machine that already runs it is skipped. Each machine gets `upgrade_machine_s` (5 minutes) to be back; the
    first that fails stops the run, the rest left as they were."""
    if (file is None) != rollback:
        raise UsageError("give the release FILE to upgrade to, or --rollback (not both)")
    if members and not rollback:
        raise UsageError("--members goes with --rollback (an upgrade always includes the control planes)")
    t = _timeouts()
    sha = _sha_of(file) if file is not None else None
    plan = _plan(session)
    steps = [*(plan["members"] if not rollback or members else []), *plan["gateways"], *plan["nodes"]]
    progress = Progress(session, len(steps))
    progress.event("start", sha256=sha, rollback=rollback, machines=[f"{s.kind} {s.name}" for s in steps])
    if file is not None and sha is not None and any(s.sha256 != sha for s in steps):
        progress.say(f"release {sha[:12]} ({file.name}): {len(steps)} machine(s) to check")
        for m in plan["members"]:
            if m.url is None:
                raise CtlError(f"control plane {m.name} has not announced its admin URL (is it running?): the run "
                               f"did not start; nothing was changed")
            session.upload(m.url + api_path("releases", sha), file, t.upgrade_transfer_s)
        progress.say(f"uploaded to {len(plan['members'])} control plane(s)")
    for step in steps:
        if sha is not None and step.sha256 == sha:
            progress.step(step, "skipped", f"already runs {sha[:12]}: skipped")
            continue
        try:
            words = _MACHINES[step.kind](session, step, sha, t)
        except CtlError as e:
            left = len(steps) - progress.done - 1
            progress.step(step, "failed", e.message)
            raise CtlError(f"{step.kind} {step.name}: {e.message}. The run stopped here; the {left} machine(s) after "
                           f"it were left as they were") from None
        progress.step(step, "upgraded", words)
    progress.event("done", sha256=sha, seconds=round(time.monotonic() - progress.started, 1))
    if not session.as_json:
        progress.say(f"done in {time.monotonic() - progress.started:.0f} s")
    return EXIT_OK


def _timeouts() -> Timeouts:
    spec = os.environ.get("LLMGW_TIMEOUTS", "")  # tests and diagnosis, as the roles take it
    try:
        return TIMEOUTS.overridden(spec) if spec else TIMEOUTS
    except ValueError as e:
        raise UsageError(f"LLMGW_TIMEOUTS: {e}") from None


def _sha_of(file: Path) -> str:
    if not file.is_file():
        raise UsageError(f"{file}: no such file")
    if not zipfile.is_zipfile(file):
        raise UsageError(f"{file} is not a zipapp (a zip archive, as `make zipapp` builds): nothing was changed")
    digest = hashlib.sha256()  # as llmgw/release.py hashes the file a machine runs (ctl imports no role code)
    try:
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError as e:
        raise UsageError(f"cannot read {file}: {e.strerror or e}") from None


def _plan(session: Session) -> dict[str, list[Step]]:
    """The machines in the run's order: standbys, the leader; connected gateways (each worker of a gateway run
    with --workers is one: NAME-wI); connected agents."""
    _, table = session.request("GET", api_path("cluster", "members"))
    rows = [r for r in dig(table, "members") or [] if isinstance(r, Mapping)]
    missing = [str(r.get("id")) for r in rows if r.get("state") == "missing"]
    if missing:
        raise CtlError(f"control plane(s) {', '.join(missing)} do not answer: bring them back before upgrading "
                       f"(nothing was changed)")
    ordered = [r for r in rows if r.get("role") != "leader"] + [r for r in rows if r.get("role") == "leader"]
    members = [Step("member", str(r.get("id")), _str(r.get("admin_url")), _str(r.get("release_sha256")),
                    _str(r.get("role"))) for r in ordered]
    _, doc = session.request("GET", api_path("nodes"))
    nodes = [Step("node", str(n.get("node")), sha256=_str(n.get("release_sha256")))
             for n in dig(doc, "nodes") or [] if isinstance(n, Mapping) and n.get("state") == "connected"]
    _, listed = session.request("GET", api_path("gateways"))
    gateways = [Step("gateway", str(g.get("name")), sha256=_str(g.get("release_sha256")))
                for g in dig(listed, "gateways") or []
                if isinstance(g, Mapping) and g.get("connected") and not g.get("in_process")]  # `up`'s goes with it
    return {"members": members, "gateways": gateways, "nodes": nodes}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# --- each kind of machine: ask, then wait until it runs the release and is back -------------------------------


def _member(session: Session, step: Step, sha: str | None, t: Timeouts) -> str:
    assert step.url is not None
    self_url = step.url + api_path("cluster", "self")
    _, before = session.request("GET", self_url)
    _, asked = session.request("POST", step.url + api_path("cluster", "self", "upgrade"),
                               body={"sha256": sha} if sha else {"rollback": True}, send_body=True)
    if dig(asked, "unchanged"):
        return f"already runs {str(sha)[:12]}"
    target = _str(dig(asked, "to"))
    started = time.monotonic()
    last = ["no answer yet"]

    def back() -> str | None:
        try:
            _, doc = session.request("GET", self_url)
        except CtlError as e:  # stopping, or not listening yet
            last[0] = e.message
            return None
        if dig(doc, "started_at") == dig(before, "started_at"):
            last[0] = "not restarted yet"
        elif dig(doc, "release_sha256") != target:
            last[0] = f"restarted, but runs {cell(dig(doc, 'release_sha256'))} (reason: {cell(dig(doc, 'release_reason'))})"
        elif not (dig(doc, "ready") and dig(doc, "leader")):
            last[0] = "restarted, not caught up yet"
        else:
            return (f"runs {str(target)[:12]}, back in {time.monotonic() - started:.1f} s as "
                    f"{cell(dig(doc, 'role'))}, leader {cell(dig(doc, 'leader'))}")
        return None

    return _wait_for(t, back, lambda: last[0])


def _node(session: Session, step: Step, sha: str | None, t: Timeouts) -> str:
    started = time.monotonic()
    last = ["not connected yet"]

    def connected() -> str | None:  # after a control plane's restart, its agents reconnect first
        found = _find_node(session, step.name, last)
        if found is not None and found.get("state") == "connected":
            if found.get("release_sha256") is None:  # an agent run from the package, or older than ctl upgrade
                raise CtlError(f"its agent runs no release file ctl upgrade can replace "
                               f"({cell(found.get('release_reason'))}): upgrade it on its machine")
            return "connected"
        last[0] = f"state {cell(found.get('state') if found else None)}, waiting for it to connect"
        return None

    _wait_for(t, connected, lambda: last[0])
    _, asked = session.request("POST", api_path("nodes", step.name, "upgrade"),
                               body={"sha256": sha} if sha else {"rollback": True}, send_body=True)
    before = dig(asked, "connected_at")
    last[0] = "not back yet"

    def back() -> str | None:
        node = _find_node(session, step.name, last)
        if node is None:
            return None
        if node.get("upgrade_refused"):
            raise CtlError(f"its agent refused: {node.get('upgrade_refused')}")
        runs = node.get("release_sha256")
        if node.get("state") != "connected" or node.get("connected_at") in (None, before):
            last[0] = f"state {cell(node.get('state'))}, not on a new stream yet"
        elif (sha is not None and runs != sha) or (sha is None and runs == step.sha256):
            last[0] = f"back, but runs {cell(runs)} ({cell(node.get('release_reason'))})"
        elif node.get("replicas") is None:
            last[0] = "back, its replicas not reported yet"
        else:
            return (f"runs {str(runs)[:12]}, back in {time.monotonic() - started:.1f} s with "
                    f"{len(node.get('replicas') or [])} replica(s)")
        return None

    return _wait_for(t, back, lambda: last[0])


def _find_node(session: Session, name: str, last: list[str]) -> Mapping[str, Any] | None:
    """The node as the leader lists it; None (why in `last`) when unknown or the API does not answer now."""
    try:
        _, doc = session.request("GET", api_path("nodes"))
    except CtlError as e:  # a leader changing hands: asked again
        last[0] = e.message
        return None
    node = next((n for n in dig(doc, "nodes") or [] if isinstance(n, Mapping) and n.get("node") == name), None)
    if node is None:
        last[0] = "no longer known to the leader"
    return node


def _wait_for(t: Timeouts, back: Callable[[], str | None], last: Callable[[], str]) -> str:
    deadline = time.monotonic() + t.upgrade_machine_s
    while True:
        time.sleep(t.ctl_poll_s)
        done = back()
        if done is not None:
            return done
        if time.monotonic() > deadline:
            raise CtlError(f"not back within {t.upgrade_machine_s:g} s ({last()}); its log says why "
                           f"(`llmgw service status` on its machine)")


def _gateway(session: Session, step: Step, sha: str | None, t: Timeouts) -> str:
    """A gateway (or one worker of a gateway run with --workers): asked over its stream to fetch the release from
    the leader and restart in place into it (drained, its listening socket handed over: no client refused);
    back once it follows the leader again from a new start, on the release."""
    started = time.monotonic()
    last = ["not connected yet"]

    def connected() -> Mapping[str, Any] | None:  # after the leader's restart, its gateways follow the new one
        found = _find_gateway(session, step.name, last)
        if found is not None and found.get("connected"):
            if found.get("release_sha256") is None:  # run from the package, or older than ctl upgrade
                raise CtlError("it runs no release file ctl upgrade can replace: upgrade it on its machine")
            if not found.get("restartable"):
                raise CtlError("it cannot restart in place (an older version, or a gateway inside another "
                               "process): upgrade it on its machine (`llmgw service restart gateway`)")
            return found
        last[0] = "not connected to the leader yet, waiting for it to follow"
        return None

    _wait_for(t, lambda: "connected" if connected() is not None else None, lambda: last[0])
    _, asked = session.request("POST", api_path("gateways", step.name, "upgrade"),
                               body={"sha256": sha} if sha else {"rollback": True}, send_body=True)
    before = dig(asked, "started_at")
    last[0] = "not back yet"

    def back() -> str | None:
        gw = _find_gateway(session, step.name, last)
        if gw is None:
            return None
        if gw.get("upgrade_refused"):
            raise CtlError(f"it refused: {gw.get('upgrade_refused')}")
        runs = gw.get("release_sha256")
        if not gw.get("connected") or gw.get("started_at") in (None, before):
            last[0] = f"{'connected' if gw.get('connected') else 'not connected'}, not restarted yet"
        elif (sha is not None and runs != sha) or (sha is None and runs == step.sha256):
            last[0] = f"restarted, but runs {cell(runs)}"
        else:
            return (f"runs {str(runs)[:12]}, following again in {time.monotonic() - started:.1f} s "
                    f"(pid {cell(gw.get('pid'))})")
        return None

    return _wait_for(t, back, lambda: last[0])


def _find_gateway(session: Session, name: str, last: list[str]) -> Mapping[str, Any] | None:
    """The gateway as the leader lists it; None (why in `last`) when unknown or the API does not answer now."""
    try:
        _, doc = session.request("GET", api_path("gateways"))
    except CtlError as e:  # a leader changing hands: asked again
        last[0] = e.message
        return None
    gw = next((g for g in dig(doc, "gateways") or [] if isinstance(g, Mapping) and g.get("name") == name), None)
    if gw is None:
        last[0] = "not listed by the leader (yet)"
    return gw


_MACHINES: dict[str, Callable[[Session, Step, str | None, Timeouts], str]] = {
    "member": _member, "gateway": _gateway, "node": _node}
