"""Following the leader: the one loop behind every stream to a control plane (an agent's, a
remote gateway's). It finds the leader among the control URLs it was given, or where a refusal
points, stays with it while the stream lives, and looks again when it goes.

A round tries every configured URL in turn, at once: the loss of a leader costs one failed
connect, not a pause. A member that refuses because it does not lead names the leader's admin
URL (`leader_url`) when it knows it, and the loop goes there, hop after hop, but never to a URL
this chain of pointers already tried (two members pointing at each other) and at most
`MAX_HOPS` times a round. Only after a whole round failed does it pause, with backoff and jitter
(`Reconnect`, from the timeouts table): short while members answer that none leads (an election
is over in a second or two), longer while none answers. A welcomed stream resets the backoff.

The role gives what differs: the session to run on each URL (it opens the stream, says hello,
and calls `welcomed` once the leader took it), and its name, which names the logger
(`llmgw.<role>.follow`); the log words are the same for every role.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

import trio
from trio_websocket import ConnectionClosed, HandshakeError

from llmgw.domain.timeouts import Reconnect
from llmgw.errors import describe, first_error
from llmgw.wire import protocol

# Pointers followed in one round at most: enough for a leader that moved while we followed it;
# past that the cluster is changing under us, and the configured URLs (with a pause) come first.
MAX_HOPS = 4

# `welcomed(member, note)`: the session was welcomed by the leader (its Raft member id); `note`
# is the role's addition to the log line ("" for none).
Welcomed = Callable[[str, str], None]
# `session(control, welcomed)`: one stream to `control`, from connect to its end. It ends by
# raising: `Refused`, `Silent`, `ProtocolError`, or the transport's error.
Session = Callable[[str, Welcomed], Awaitable[None]]


class Refused(Exception):
    """A control plane answered but will not lead this stream; `leader_url` says where to go, if it knows."""

    def __init__(self, control: str, reason: str, leader: Any, leader_url: Any) -> None:
        super().__init__(f"control {control} refused the stream: {reason} (leader: {leader or 'unknown'})")
        self.leader_url = leader_url if isinstance(leader_url, str) and leader_url.startswith("http") else None

    @classmethod
    def of(cls, control: str, message: Mapping[str, Any]) -> Refused:
        """From a `refused` message as JSON: `reason`, and `leader` and `leader_url` where known."""
        return cls(control, str(message.get("reason", "")), message.get("leader"), message.get("leader_url"))


class Silent(Exception):
    """The control plane said nothing for `silence_s`: taken for gone (a stopped or vanished machine)."""

    def __init__(self, control: str, silence_s: float) -> None:
        super().__init__(f"no word from control {control} for {silence_s:g} s")


async def receive_within(receive: Callable[[], Awaitable[str | bytes]], control: str,
                         silence_s: float) -> str | bytes:
    """The next message from `control`; `Silent` when none comes within `silence_s`."""
    with trio.move_on_after(silence_s):
        return await receive()
    raise Silent(control, silence_s)


async def follow_leader(controls: Sequence[str], session: Session, *, role: str, reconnect: Reconnect,
                        lost: Callable[[], str] = lambda: "") -> NoReturn:
    """Run `session` on the leader among `controls`, again and again, until cancelled.

    `lost()` is called when a welcomed stream ends: the role forgets its leader there and says, in
    a few words for the log line, what it does meanwhile."""
    if not controls:
        raise ValueError(f"the {role} needs at least one control URL")
    log = logging.getLogger(f"llmgw.{role}.follow")
    backoff = _Backoff(reconnect)
    said: set[str] = set()  # failures logged since the last welcome: a repeat goes to the debug log
    turn = 0  # the next configured URL
    tried = hops = 0  # configured URLs tried and pointers followed in this round
    answered = False  # a member answered in this round (it refused: not the leader)
    chain: set[str] = set()  # the URLs this chain of pointers visited
    pointer: str | None = None
    while True:
        if pointer is not None:
            control, pointer = pointer, None
            hops += 1
        else:
            control, chain = controls[turn % len(controls)], set()
            turn, tried = turn + 1, tried + 1
        chain.add(_same(control))
        attempt = _Attempt(control, log)
        began = trio.current_time()
        await attempt.run(session)
        if attempt.welcomed:
            said.clear()
            backoff.reset()
            tried = hops = 0
            answered, chain = False, {_same(control)}
            log.warning("lost the leader at %s (%s): looking for the leader again%s", control, attempt.why or "closed",
                        _tail(lost()))
            if trio.current_time() - began < reconnect.settle_s:  # a leader that drops us at once: no busy loop
                await trio.sleep(_about(reconnect.first_s))
        elif attempt.why:
            log.log(logging.DEBUG if attempt.why in said else attempt.level, "%s", attempt.why)
            said.add(attempt.why)
        answered = answered or attempt.refused
        pointer = attempt.leader_url
        if pointer is not None and (_same(pointer) in chain or hops >= MAX_HOPS):
            log.debug("not following the pointer to %s: %s", pointer,
                      "already tried in this chain" if _same(pointer) in chain else f"{MAX_HOPS} hops this round")
            pointer = None
        if pointer is not None or attempt.welcomed or tried < len(controls):
            continue
        pause = backoff.next(election=answered)
        log.debug("no leader among %s: trying again in %.2f s", ", ".join(controls), pause)
        await trio.sleep(pause)
        tried = hops = 0
        answered = False


class _Attempt:
    """One session on one URL, and how it ended: welcomed or not, in words, a pointer."""

    def __init__(self, control: str, log: logging.Logger) -> None:
        self.control = control
        self.log = log
        self.welcomed = False
        self.refused = False  # the member answered: it does not lead
        self.leader_url: str | None = None
        self.why, self.level = "", logging.WARNING

    def welcome(self, member: str, note: str) -> None:
        self.welcomed = True
        self.log.info("following the leader at %s (member %s)%s", self.control, member, _tail(note))

    async def run(self, session: Session) -> None:
        control = self.control
        try:
            await session(control, self.welcome)
        # Nurseries wrap errors in groups (strict exception groups), hence except*.
        except* Refused as group:
            refused = first_error(group)
            assert isinstance(refused, Refused)
            self.why, self.level = str(refused), logging.INFO
            self.refused, self.leader_url = True, refused.leader_url
        except* HandshakeError as group:
            self.why = f"control {control} refused the stream: {_rejection(first_error(group))}"
        except* Silent as group:
            self.why = str(first_error(group))
        except* (ConnectionClosed, OSError, trio.BrokenResourceError, trio.TooSlowError) as group:
            self.why = f"stream to {control} lost: {describe(first_error(group))}"
        except* protocol.ProtocolError as group:
            self.why = f"control {control} spoke an unexpected protocol: {describe(first_error(group))}"


class _Backoff:
    """The pause after a failed round: from `first_s`, doubling up to `max_s` (`election_s` while
    members answer but none leads), each with jitter (x0.5 to x1.5) so that a fleet does not come
    back in step."""

    def __init__(self, reconnect: Reconnect) -> None:
        self.reconnect = reconnect
        self.delay = reconnect.first_s

    def reset(self) -> None:
        self.delay = self.reconnect.first_s

    def next(self, *, election: bool) -> float:
        r = self.reconnect
        longest = min(r.election_s, r.max_s) if election else r.max_s
        self.delay = min(self.delay, longest)
        pause = _about(self.delay)
        self.delay = min(self.delay * 2, longest)
        return pause


def _about(seconds: float) -> float:
    """`seconds`, give or take half."""
    return seconds * (0.5 + random.random())


def _same(url: str) -> str:
    """A URL as compared for the pointer chain: `http://h:p/` and `http://h:p` are one member."""
    return url.rstrip("/")


def _rejection(error: BaseException) -> str:
    """A refused WebSocket handshake in words: its status and the admin error's message, not the raw
    headers trio-websocket keeps."""
    status, body = getattr(error, "status_code", None), getattr(error, "body", None)
    if status is None:
        return describe(error)
    try:
        found = json.loads(body or b"{}").get("error", {})
        words = f"{found.get('code')}: {found.get('message')}" if isinstance(found, dict) and found else ""
    except (ValueError, AttributeError):
        words = ""
    return f"{status} {words or (body or b'')[:200].decode(errors='replace')}".strip()


def _tail(words: str) -> str:
    return f"; {words}" if words else ""
