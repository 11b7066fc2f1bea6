"""The gateway's guard checks: which policies apply to a request (cached per table and model), the judge
asked through the router and the upstream pool like any model, the verdict cache, budgets, refusals.

A request no policy applies to pays one identity check and one dict lookup (`Guard.plan`). A prompt is
judged before the request goes to its engine; an answer under a response-checking policy is held whole
(a stream too: it loses its incremental delivery) and judged before the client gets any of it.

Budgets: each check runs under a trio cancel scope of the policy's `budget_s`, from the ask to the parsed
answer (waiting for a judge replica included). A judge replica's first answer since it became ready (a
replica id at an address not yet answered from) gets `COLD_FACTOR` times the budget: a cold llama.cpp
judge warms its caches on the first prompt. The wider deadline is set once the router names the replica.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from llmgw.domain.guard import GuardPolicy, enabled, policies_for
from llmgw.domain.priority import RANK
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import OpenAIError
from llmgw.gateway import upstream
from llmgw.gateway.pool import LimitsReader, Pool, Ticket
from llmgw.gateway.router import NoEndpoint, Router
from llmgw.guard.cache import VerdictCache, cache_key
from llmgw.guard.prompt import AGENT, USER, JudgeFailure, Turn, Verdict, build, judge_request, parse, rule
from llmgw.guard.texts import PROMPT_ONLY, UNJUDGED, answer_text, conversation, stream_text
from llmgw.interfaces import RequestFacts as Facts  # the request id read, `guard_rule` written

__all__ = ["COLD_FACTOR", "Checks", "Guard", "GuardStats", "HeldResponse"]

_log = logging.getLogger("llmgw.gateway.guard")

SYSTEM = RANK["system"]  # a judge's turn at a busy replica: the platform's own calls come first
COLD_FACTOR = 3.0  # a judge replica's first answer may take this many times the policy's budget
_ANSWERED_MAX = 4096  # replicas remembered as warm; past it the set starts again (a few first calls widened)
_RULE_SEP = " | "


@dataclass
class JudgeFailureSeen:
    judge: str
    policy: str
    words: str
    at: float  # unix seconds


@dataclass
class GuardStats:
    """This gateway's guard counters and each judge's last failure to answer (for `ctl guard judge
    status`: `on_failure`, when set, hands each failure on as (judge model, words))."""

    judge_calls: int = 0
    cache_hits: int = 0
    refusals: int = 0
    failures: int = 0
    last_failure: dict[str, JudgeFailureSeen] = field(default_factory=dict)
    on_failure: Callable[[str, str], None] | None = None
    # (judge, hazard S1..S14 | "safe" | "error") -> verdicts given (llmgw_guard_verdicts_total)
    verdicts: dict[tuple[str, str], int] = field(default_factory=dict)

    def counted(self, judge: str, outcome: Verdict | JudgeFailure) -> None:
        hazards = ("error",) if isinstance(outcome, JudgeFailure) else outcome.categories or ("safe",)
        for hazard in hazards:
            self.verdicts[judge, hazard] = self.verdicts.get((judge, hazard), 0) + 1

    def failed(self, judge: str, policy: str, words: str) -> None:
        self.failures += 1
        self.last_failure[judge] = JudgeFailureSeen(judge, policy, words, time.time())
        if self.on_failure is not None:
            try:
                self.on_failure(judge, words)
            except Exception:  # reporting must never fail a request
                _log.exception("reporting a failure of judge %s failed", judge)

    def last_failures(self) -> dict[str, dict[str, Any]]:
        """Judge model -> {"policy", "words", "at"}: its last failure to answer, as this gateway saw it."""
        return {j: {"policy": f.policy, "words": f.words, "at": f.at} for j, f in self.last_failure.items()}


class Guard:
    """One gateway process's guard: policy lookups, the verdict cache, the warm judge replicas, stats."""

    def __init__(self, router: Router, pool: Pool, timeouts: Timeouts = TIMEOUTS, stats: GuardStats | None = None,
                 cache: VerdictCache | None = None) -> None:
        self.router = router
        self.pool = pool
        self.stats = stats if stats is not None else GuardStats()
        self.cache = cache if cache is not None else VerdictCache(timeouts.guard_verdict_ttl_s)
        self._limits = LimitsReader()
        self._seen: ClusterState | None = None
        self._on = True
        self._policies: dict[str, tuple[GuardPolicy, ...]] = {}
        self._answered: set[tuple[str, str]] = set()  # (replica id, url) that answered a judge call
        self._settings: Any = None

    def plan(self, state: ClusterState, model: str, kind: str, body: dict[str, Any], ex: Facts) -> Checks | None:
        """This request's checks; None (the hot path) when guards are off or no policy applies."""
        if state is not self._seen:  # a new table: read again (guard.enabled is live, policies too)
            self._seen, self._on, self._policies = state, enabled(state), {}
            self._settings = state.settings
        if not self._on:
            return None
        policies = self._policies.get(model)
        if policies is None:
            policies = self._policies[model] = policies_for(state, model)
        if not policies or kind in UNJUDGED:
            return None
        return Checks(self, policies, kind, body, ex)

    async def verdict(self, policy: GuardPolicy, prompt: str, request_id: str) -> Verdict | JudgeFailure:
        """The verdict of the policy's judge on `prompt`: from the cache, or asked within the budget."""
        key = cache_key(policy.name, policy.judge, prompt)
        cached = self.cache.get(key, trio.current_time())
        if cached is not None:
            self.stats.cache_hits += 1
            return cached
        try:
            verdict = parse(await self.ask(policy.judge, prompt, policy.budget_s, request_id))
        except JudgeFailure as failure:
            self.stats.failed(policy.judge, policy.name, str(failure))
            return failure
        self.cache.put(key, verdict, trio.current_time())
        return verdict

    async def ask(self, judge: str, prompt: str, budget_s: float, request_id: str) -> str:
        """The judge's raw answer to `prompt`, within `budget_s` (COLD_FACTOR times that for a replica's first
        answer); JudgeFailure when it has no ready replica, fails, or does not answer in time."""
        self.stats.judge_calls += 1
        started = trio.current_time()
        body = judge_request(judge, prompt)
        limits = self._limits(self._settings if self._settings is not None else {})
        cold = held = False
        with trio.move_on_at(started + budget_s) as budget:
            try:
                lease = self.router.acquire(judge, deadline=started + budget_s)
                async with lease as endpoint:
                    held = True
                    if (endpoint.replica_id, endpoint.url) not in self._answered:
                        cold = True
                        budget.deadline = started + budget_s * COLD_FACTOR
                    response, endpoint = await upstream.answer(self.pool, lease, endpoint, judge, "/v1/completions",
                                                               body, request_id, limits,
                                                               ticket=Ticket("", SYSTEM))  # the gateway's own call
                    try:
                        if response.status >= 400:
                            raise JudgeFailure(f"judge {judge!r} answered HTTP {response.status}")
                        raw = await response.read()
                    except upstream.UpstreamFailed as error:
                        raise JudgeFailure(f"judge {judge!r} failed mid-answer: {error}") from None
                    finally:
                        response.close()
                    self._warm(endpoint.replica_id, endpoint.url)
                    return answer_text(raw)
            except NoEndpoint as no_endpoint:
                if no_endpoint.code == "activation_timeout":
                    raise JudgeFailure(f"judge {judge!r} has no ready replica (waited the {budget_s:g} s budget)") \
                        from None
                raise JudgeFailure(f"judge {judge!r}: {no_endpoint.message}") from None
            except OpenAIError as error:
                raise JudgeFailure(f"judge {judge!r}: {error.message}") from None
        if not held:
            raise JudgeFailure(f"judge {judge!r} has no ready replica (waited the {budget_s:g} s budget)")
        if cold:
            raise JudgeFailure(f"judge {judge!r} did not answer within {budget_s * COLD_FACTOR:g} s (its replica's "
                               f"first answer: {COLD_FACTOR:g} times the {budget_s:g} s budget)")
        raise JudgeFailure(f"judge {judge!r} did not answer within the {budget_s:g} s budget")

    def _warm(self, replica_id: str, url: str) -> None:
        if len(self._answered) >= _ANSWERED_MAX:
            self._answered.clear()
        self._answered.add((replica_id, url))


class Checks:
    """One request's guard checks under the policies that apply to its model."""

    __slots__ = ("guard", "policies", "kind", "body", "ex", "_turns", "_rules")

    def __init__(self, guard: Guard, policies: tuple[GuardPolicy, ...], kind: str, body: dict[str, Any],
                 ex: Facts) -> None:
        self.guard = guard
        self.policies = policies
        self.kind = kind
        self.body = body
        self.ex = ex
        self._turns: list[Turn] | None = None
        self._rules: list[str] = []

    @property
    def checks_response(self) -> bool:
        # A rerank's scores and a tokenize's ids are no text a model wrote: only their request is judged.
        return self.kind not in PROMPT_ONLY and any(p.checks_response for p in self.policies)

    def _conversation(self) -> list[Turn]:
        if self._turns is None:
            self._turns = conversation(self.kind, self.body)
        return self._turns

    async def check_prompt(self) -> None:
        """Judge the request's last User turn; raises `guard_refused` when a policy refuses it."""
        policies = [p for p in self.policies if p.checks_prompt]
        if policies:
            prompt = self.body.get("prompt")
            if isinstance(prompt, list) and not all(isinstance(p, str) for p in prompt):
                # Token ids (the spec allows them) carry no text a judge can read without the model's tokenizer.
                raise OpenAIError(400, "unsupported_parameter", "a guard policy judges this model's prompts, and "
                                  "token ids cannot be judged: send 'prompt' as text", param="prompt")
            await self._judge(policies, build(self._conversation(), USER))

    async def hold(self, response: upstream.Response, stream: bool) -> upstream.Response:
        """An engine's answer held whole and judged as the Agent turn after the conversation: the same
        answer to relay (`HeldResponse`), or `guard_refused` raised (nothing of it sent)."""
        policies = [p for p in self.policies if p.checks_response]
        if not policies or response.status >= 400:
            return response
        chunks: list[bytes] = []
        broke: upstream.UpstreamFailed | None = None
        try:
            while (chunk := await response.next_chunk()) is not None:
                chunks.append(chunk)
        except upstream.UpstreamFailed as error:
            broke = error  # met again by the relay after the held chunks, as if read there
        finally:
            response.close()
        held = HeldResponse(response.status, response.headers, chunks, broke)
        if broke is not None and not stream:
            return held  # a failed answer is not sent: nothing to judge
        raw = b"".join(chunks)
        text = stream_text(raw) if stream else answer_text(raw)
        await self._judge(policies, build([*self._conversation(), (AGENT, text)], AGENT))
        return held

    async def _judge(self, policies: Sequence[GuardPolicy], prompt: str) -> None:
        guard = self.guard
        outcomes: list[Verdict | JudgeFailure | None] = [None] * len(policies)

        async def one(i: int) -> None:
            outcomes[i] = await guard.verdict(policies[i], prompt, self.ex.request_id)

        if len(policies) == 1:
            await one(0)
        else:  # several judges: asked at once
            async with trio.open_nursery() as nursery:
                for i in range(len(policies)):
                    nursery.start_soon(one, i)
        refusal = None
        for policy, outcome in zip(policies, outcomes):
            assert outcome is not None
            guard.stats.counted(policy.judge, outcome)
            words = rule(outcome)
            self._rules.append(words)
            if refusal is None and (policy.on_error == "closed" if isinstance(outcome, JudgeFailure)
                                    else any(policy.refuses(c) for c in outcome.categories)):
                refusal = words
        self.ex.guard_rule = _merge(self._rules)
        if refusal is not None:
            guard.stats.refusals += 1
            raise OpenAIError(400, "guard_refused", refusal)


def _merge(rules: list[str]) -> str:
    """Every check's verdict once, in order; `judge: safe` only when all were safe."""
    kept = list(dict.fromkeys(r for r in rules if r != "judge: safe"))
    return _RULE_SEP.join(kept) if kept else "judge: safe"


class HeldResponse(upstream.Response):
    """An answer read whole (and judged) before relaying: its chunks replayed, then the failure that cut it."""

    __slots__ = ("_chunks", "_broke")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: list[bytes],
                 broke: upstream.UpstreamFailed | None) -> None:
        # No connection of its own: the held one went back to the pool when the answer was read.
        self.status = status
        self.headers = headers
        self._chunks = chunks[::-1]
        self._broke = broke

    async def next_chunk(self) -> bytes | None:
        if self._chunks:
            return self._chunks.pop()
        if self._broke is not None:
            broke, self._broke = self._broke, None
            raise broke
        return None

    def at_end(self) -> bool:
        return not self._chunks and self._broke is None

    def close(self, keep: bool = False) -> None:
        self._chunks = []

