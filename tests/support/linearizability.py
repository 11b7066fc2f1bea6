"""A linearizability checker (Wing & Gong's search with memoization, checked one partition at a time)
and a key-value model for it: the fault campaign uses it to judge each key's history. Stdlib only.

How to read a history: each `Operation` has a call time and a return time; an operation whose outcome
the client never learned (a timed-out write) has `return_time=None`. Such an operation is pending
forever: it may take effect at any moment after its call, or never. The history is linearizable when
every completed operation, and any subset of the pending ones, can be put in one order that respects
real time (a before b when a returned before b was called) and that the model accepts step by step.

The search: calls and returns go into one time-ordered doubly linked list. From the head, each call is
tried in turn; when the model accepts it, the operation is unlinked (both its events) and the search
restarts from the head; meeting a return means that operation had to take effect already and nothing
fits, so the search backtracks (re-links the last operation and tries the one after it). A set of
(linearized operations as an int bitset, model state) pairs already reached cuts every repeated
branch. Models that split (a register per key) are checked per partition: a history is linearizable
exactly when each key's sub-history is (Herlihy & Wing's locality), which keeps each search small.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Literal, TypeVar

S = TypeVar("S", bound=Hashable)  # model state: hashed by the memo, so it must be immutable
I = TypeVar("I")  # an operation's input
O = TypeVar("O")  # an operation's output


class Unknown(Enum):
    """The output `step` receives for an operation that never returned: it may have had any result."""

    UNKNOWN = "unknown"

    def __repr__(self) -> str:
        return "?"


UNKNOWN = Unknown.UNKNOWN


@dataclass(frozen=True, slots=True)
class Operation(Generic[I, O]):
    """One client call. `return_time=None`: the outcome is unknown (timed out, connection lost); its
    `output` is then ignored. A retry under the same idempotency key is the same operation: the first
    try's call time, the last try's return (or None)."""

    client_id: int | str
    input: I
    call_time: float
    output: O
    return_time: float | None

    def __post_init__(self) -> None:
        if not math.isfinite(self.call_time):
            raise ValueError(f"call_time must be finite, not {self.call_time}")
        if self.return_time is not None and not (self.call_time <= self.return_time < math.inf):
            raise ValueError(
                f"return_time {self.return_time} must be finite and not before call_time {self.call_time} "
                "(use None for an operation whose outcome is unknown)"
            )

    @property
    def pending(self) -> bool:
        return self.return_time is None


def single_partition(history: Sequence[Operation[I, O]]) -> Mapping[str, Sequence[Operation[I, O]]]:
    """The default partition: the whole history is checked as one."""
    return {"history": history}


def never(input: object) -> bool:
    return False


def describe_plainly(input: object, output: object) -> str:
    return f"{input!r} -> {output!r}"


@dataclass(frozen=True)
class Model(Generic[S, I, O]):
    """A sequential specification. `step(state, input, output)` says whether `input` may return
    `output` in `state` (output is `UNKNOWN` for a pending operation) and the state after it; it must
    not change `state`. `partition` splits a history into independent labelled sub-histories (it may
    drop operations that constrain nothing); `describe` and `describe_state` word the explanations.
    `read_only(input)` may say that an input never changes any state (a read): the search then
    never tries such an operation in a second place, which is a large saving when reads overlap."""

    init: Callable[[], S]
    step: Callable[[S, I, O | Unknown], tuple[bool, S]]
    partition: Callable[[Sequence[Operation[I, O]]], Mapping[str, Sequence[Operation[I, O]]]] = single_partition
    describe: Callable[[I, O | Unknown], str] = describe_plainly
    describe_state: Callable[[S], str] = repr
    read_only: Callable[[I], bool] = never


class Verdict(Enum):
    OK = "ok"
    ILLEGAL = "illegal"
    UNKNOWN = "unknown"  # the timeout ran out before a verdict


@dataclass(frozen=True)
class CheckResult(Generic[I, O]):
    """The verdict and, for an illegal history, where it breaks: in `partition`, the longest prefix of
    operations that linearizes (`prefix`, in linearization order) and then `stuck`, an operation
    that had returned and could not take effect after that prefix, whatever came next."""

    verdict: Verdict
    explanation: str
    partition: str | None = None
    prefix: tuple[Operation[I, O], ...] = ()
    stuck: Operation[I, O] | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    def __str__(self) -> str:
        return self.explanation


def check(
    model: Model[S, I, O],
    history: Iterable[Operation[I, O]],
    timeout: float | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> CheckResult[I, O]:
    """Whether `history` is linearizable under `model`. Gives `Verdict.UNKNOWN` when `timeout`
    seconds (read on `clock`) pass first; the first illegal partition ends the check."""
    ops = list(history)
    deadline = None if timeout is None else clock() + timeout
    parts = model.partition(ops)
    for n, (label, part) in enumerate(parts.items()):
        found = _Search(model, part, deadline, clock).run()
        if found is None:
            return CheckResult(
                Verdict.UNKNOWN,
                f"unknown: gave up after {timeout:g} s in {label} ({n} of {len(parts)} partitions checked "
                "before it, none illegal)",
                partition=label,
            )
        if isinstance(found, _Stuck):
            return _illegal(model, label, part, found)
    return CheckResult(Verdict.OK, f"linearizable: {len(ops)} operations in {len(parts)} partitions")


# --- the search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stuck(Generic[S]):
    prefix: tuple[int, ...]  # operation indices, in linearization order
    stuck: int
    state: S  # the state after the prefix


_NIL = -1


class _Search(Generic[S, I, O]):
    """One partition's search. Nodes 1..2n are the calls and returns in time order (a call before a
    return at the same instant: touching operations count as concurrent); node 0 is the head."""

    def __init__(
        self, model: Model[S, I, O], ops: Sequence[Operation[I, O]], deadline: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.model, self.ops, self.deadline, self.clock = model, ops, deadline, clock
        events = sorted(
            [(op.call_time, 0, i) for i, op in enumerate(ops)]
            + [(math.inf if op.return_time is None else op.return_time, 1, i) for i, op in enumerate(ops)]
        )
        size = len(events) + 1
        self.next: list[int] = [*range(1, size), _NIL]
        self.prev: list[int] = [_NIL, *range(size - 1)]
        self.node_op = [_NIL] * size
        self.is_call = [False] * size
        self.call_node = [0] * len(ops)
        self.return_node = [0] * len(ops)
        for node, (_, kind, i) in enumerate(events, start=1):
            self.node_op[node] = i
            self.is_call[node] = kind == 0
            (self.call_node if kind == 0 else self.return_node)[i] = node

    def _unlink(self, node: int) -> None:
        nxt, prv = self.next, self.prev
        nxt[prv[node]] = nxt[node]
        if nxt[node] != _NIL:
            prv[nxt[node]] = prv[node]

    def _relink(self, node: int) -> None:
        # The node still holds its old neighbours; undone in the reverse order of the unlinks.
        nxt, prv = self.next, self.prev
        nxt[prv[node]] = node
        if nxt[node] != _NIL:
            prv[nxt[node]] = node

    def _fitting_read(
        self, state: S, inputs: list[I], outputs: list[O | Unknown], read_only: list[bool]
    ) -> int:
        """The first read-only operation that may take effect now and fits `state`, else the head's
        next. Reads go first, and are never tried elsewhere: a read that fits here fits here in any
        order that works from this prefix (it changes no state, and whatever had to precede it
        already did), so when nothing works after it, nothing works from the prefix either."""
        node = self.next[0]
        while node != _NIL and self.is_call[node]:
            i = self.node_op[node]
            if read_only[i] and self.model.step(state, inputs[i], outputs[i])[0]:
                return node
            node = self.next[node]
        return self.next[0]

    def run(self) -> _Stuck[S] | bool | None:
        """True when linearizable, a `_Stuck` when not, None when the deadline passed."""
        step, ops = self.model.step, self.ops
        inputs = [op.input for op in ops]
        outputs: list[O | Unknown] = [UNKNOWN if op.return_time is None else op.output for op in ops]
        completed = [op.return_time is not None for op in ops]
        read_only = [self.model.read_only(op.input) for op in ops]
        remaining = sum(completed)  # pending operations may stay out of the linearization
        state = self.model.init()
        linearized = 0  # bit i set: operation i is in the current prefix
        seen: set[tuple[int, S]] = set()
        stack: list[tuple[int, S]] = []  # (operation, state before it)
        best: _Stuck[S] | None = None
        node, fresh = self.next[0], True
        rounds = 0
        while remaining:
            rounds += 1
            if self.deadline is not None and rounds & 1023 == 0 and self.clock() > self.deadline:
                return None
            if fresh:  # a new prefix: a read that fits goes first (see `_fitting_read`)
                fresh = False
                node = self._fitting_read(state, inputs, outputs, read_only)
            i = self.node_op[node]
            if self.is_call[node]:
                ok, after = step(state, inputs[i], outputs[i])
                if ok and (key := (linearized | (1 << i), after)) not in seen:
                    seen.add(key)
                    stack.append((i, state))
                    state, linearized = after, key[0]
                    remaining -= completed[i]
                    self._unlink(node)
                    self._unlink(self.return_node[i])
                    fresh = True
                    continue
                if not (ok and read_only[i]):
                    node = self.next[node]
                    continue
                # A read that fits, placed here before and failed: so does this prefix (below).
            elif best is None or len(stack) > len(best.prefix):
                # A return: operation i had to take effect by now, and no call before it fits.
                best = _Stuck(tuple(j for j, _ in stack), i, state)
            while True:
                if not stack:
                    return best
                i, state = stack.pop()
                linearized &= ~(1 << i)
                remaining += completed[i]
                self._relink(self.return_node[i])
                self._relink(self.call_node[i])
                if not read_only[i]:
                    break  # try what comes after it; a read's failure is its prefix's (above)
            node = self.next[self.call_node[i]]
        return True


# --- explanations --------------------------------------------------------------------------------

_SHOWN = 12  # prefix lines in an explanation; the full prefix is in CheckResult.prefix


def describe_operation(model: Model[S, I, O], op: Operation[I, O]) -> str:
    output: O | Unknown = UNKNOWN if op.return_time is None else op.output
    span = f"[{op.call_time:g}, {'never returned' if op.return_time is None else f'{op.return_time:g}'}]"
    return f"client {op.client_id}: {model.describe(op.input, output)} {span}"


def _count(n: int) -> str:
    return f"{n} operation{'' if n == 1 else 's'}"


def _illegal(
    model: Model[S, I, O], label: str, part: Sequence[Operation[I, O]], found: _Stuck[S]
) -> CheckResult[I, O]:
    prefix = tuple(part[i] for i in found.prefix)
    stuck = part[found.stuck]
    fits, _ = model.step(found.state, stuck.input, stuck.output)
    lines = [f"not linearizable: {label} ({_count(len(part))})",
             f"longest linearizable prefix found: {_count(len(prefix))}"]
    if len(prefix) > _SHOWN:
        lines.append(f"  ... {len(prefix) - _SHOWN} earlier")
    lines += [f"  {n}. {describe_operation(model, op)}"
              for n, op in enumerate(prefix, start=1)][-_SHOWN:]
    lines.append(f"state after it: {model.describe_state(found.state)}")
    why = ("its result does not fit that state" if not fits
           else "its result fits that state, but no order of the operations after it works from there")
    lines.append(f"cannot place next: {describe_operation(model, stuck)}: it had to take effect before it "
                 f"returned, and {why}")
    return CheckResult(Verdict.ILLEGAL, "\n".join(lines), partition=label, prefix=prefix, stuck=stuck)


# --- the key-value model -------------------------------------------------------------------------

KvOutput = str | None  # what a get returns (None: no such key); puts and deletes return None
KvState = frozenset[tuple[str, str]]  # (key, value) pairs: one pair at most per key


@dataclass(frozen=True, slots=True)
class KvInput:
    """`put(key, value)` is the store's write: acknowledged (a return time) or of unknown outcome
    (none). Give each write a unique value (the command id does): a read then names the write it saw,
    which makes the search short and the explanation exact."""

    op: Literal["put", "get", "delete"]
    key: str
    value: str | None = None

    def __post_init__(self) -> None:
        if (self.op == "put") != (self.value is not None):
            raise ValueError(f"{self.op} takes {'a value' if self.op == 'put' else 'no value'}")


def put(key: str, value: str) -> KvInput:
    return KvInput("put", key, value)


def get(key: str) -> KvInput:
    return KvInput("get", key)


def delete(key: str) -> KvInput:
    return KvInput("delete", key)


def _kv_step(state: KvState, input: KvInput, output: KvOutput | Unknown) -> tuple[bool, KvState]:
    if input.op == "get":
        current = next((v for k, v in state if k == input.key), None)
        return output is UNKNOWN or output == current, state
    rest = frozenset(pair for pair in state if pair[0] != input.key)
    return True, (rest | {(input.key, input.value)} if input.value is not None else rest)


def _kv_partition(history: Sequence[Operation[KvInput, KvOutput]]) -> Mapping[str, Sequence[Operation[KvInput, KvOutput]]]:
    """One sub-history per key, less the pending operations that cannot matter: a read nobody saw,
    and a write of unknown outcome whose value no completed read returned. Had such a write taken
    effect, no read came after it before the next write or delete (that read would have returned
    its value), so leaving it out changes no read; kept, each one would double the search."""
    seen: set[tuple[str, KvOutput]] = {(op.input.key, op.output) for op in history
                                         if op.input.op == "get" and op.return_time is not None}
    parts: dict[str, list[Operation[KvInput, KvOutput]]] = {}
    for op in history:
        if op.return_time is None and (op.input.op == "get" or (
                op.input.op == "put" and (op.input.key, op.input.value) not in seen)):
            continue
        parts.setdefault(f"key {op.input.key!r}", []).append(op)
    return parts


def _kv_describe(input: KvInput, output: KvOutput | Unknown) -> str:
    if input.op == "put":
        return f"put({input.key!r}, {input.value!r})" + (" (outcome unknown)" if output is UNKNOWN else "")
    if input.op == "delete":
        return f"delete({input.key!r})" + (" (outcome unknown)" if output is UNKNOWN else "")
    return f"get({input.key!r}) -> {output!r}"


def _kv_describe_state(state: KvState) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in sorted(state)) + "}"


def _kv_read_only(input: KvInput) -> bool:
    return input.op == "get"


def _kv_init() -> KvState:
    return frozenset()


KV_MODEL: Model[KvState, KvInput, KvOutput] = Model(
    init=_kv_init, step=_kv_step, partition=_kv_partition, describe=_kv_describe,
    describe_state=_kv_describe_state, read_only=_kv_read_only,
)


# --- histories from a real dict (for tests and the benchmark) ------------------------------------


@dataclass(frozen=True)
class Planned:
    """One call to simulate: the client waits `gap`, calls, and hears back `duration` later; the call
    takes effect at `at` (0..1) of the way through. Outcome "unknown": it took effect but the client
    never heard; "lost": it never took effect and the client never heard."""

    client_id: int
    input: KvInput
    gap: float = 0.0
    duration: float = 1.0
    at: float = 0.5
    outcome: Literal["ok", "unknown", "lost"] = "ok"


def run_on_dict(plan: Iterable[Planned]) -> list[Operation[KvInput, KvOutput]]:
    """The history a sequential dict produces when each call takes effect at its planned point: a
    linearizable history by construction (in the plan's order)."""
    free_at: dict[int, float] = {}  # a client makes one call at a time
    timed: list[tuple[float, int, float, float, Planned]] = []
    for n, p in enumerate(plan):
        call = free_at.get(p.client_id, 0.0) + p.gap
        free_at[p.client_id] = call + p.duration
        timed.append((call + p.at * p.duration, n, call, call + p.duration, p))
    store: dict[str, str] = {}
    done: list[tuple[int, Operation[KvInput, KvOutput]]] = []
    for _, n, call, ret, p in sorted(timed, key=lambda t: (t[0], t[1])):
        output: KvOutput = None
        if p.outcome != "lost":
            if p.input.op == "get":
                output = store.get(p.input.key)
            elif p.input.op == "put" and p.input.value is not None:
                store[p.input.key] = p.input.value
            else:
                store.pop(p.input.key, None)
        done.append((n, Operation(p.client_id, p.input, call, output, ret if p.outcome == "ok" else None)))
    return [op for _, op in sorted(done, key=lambda d: d[0])]


def random_plan(
    rng: random.Random, n_ops: int, *, keys: int = 1, clients: int = 4, unknown: float = 0.0, reads: float = 0.5
) -> list[Planned]:
    """`n_ops` calls over `keys` keys from `clients` clients; each write has a unique value; a share
    `unknown` of the calls never hear back (half of those took effect)."""
    plan = []
    for n in range(n_ops):
        key = f"k{rng.randrange(keys)}"
        roll = rng.random()
        inp = get(key) if roll < reads else delete(key) if roll < reads + 0.05 else put(key, f"v{n}")
        outcome: Literal["ok", "unknown", "lost"] = "ok"
        if rng.random() < unknown:
            outcome = "unknown" if rng.random() < 0.5 else "lost"
        plan.append(Planned(rng.randrange(clients), inp, gap=rng.uniform(0, 1), duration=rng.uniform(0.1, 3),
                            at=rng.random(), outcome=outcome))
    return plan

