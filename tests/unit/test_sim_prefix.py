"""The sim's prefix cache (llmgw/engines/sim/prefix.py): a prompt that starts as an earlier one did on the same
replica is prefilled only past what they share, so its first token comes sooner. Timed on trio's MockClock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.engines.sim import SimOptions, make_app
from llmgw.engines.sim.prefix import BLOCK_WORDS, PrefixCache


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_a_hit_is_the_shared_leading_whole_blocks() -> None:
    cache = PrefixCache(100)
    assert cache.admit(words(40)) == 0
    assert cache.admit(words(40)) == 32  # two whole blocks; the last 8 words are no block
    assert cache.admit([*words(20), *words(30, "x")]) == BLOCK_WORDS  # shares the first block only
    assert cache.admit(words(40, "other")) == 0
    assert (cache.prompt_tokens, cache.cached_tokens) == (170, 48)


def test_a_block_is_known_by_what_comes_before_it() -> None:
    cache = PrefixCache(100)
    cache.admit([*words(16, "a"), *words(16, "b")])
    assert cache.admit([*words(16, "c"), *words(16, "b")]) == 0  # the same second block after another first


def test_the_least_recently_used_blocks_go_first() -> None:
    cache = PrefixCache(4)
    cache.admit(words(32, "a"))  # 2 blocks
    cache.admit(words(32, "b"))  # 2 more: full
    assert cache.admit(words(32, "a")) == 32  # a is used again: b is now the oldest
    cache.admit(words(32, "c"))  # evicts b
    assert cache.admit(words(32, "b")) == 0
    with pytest.raises(ValueError):
        PrefixCache(0)


async def _first_byte_s(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    start = trio.current_time()
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        first = trio.current_time() - start
        await response.aread()
    return first


async def test_a_cached_prefix_shortens_the_time_to_first_token(autojump_clock: trio.testing.MockClock) -> None:
    opts = SimOptions(host="127.0.0.1", port=0, model="demo", prefill_tokens_per_s=100.0)
    app = make_app(opts)
    system = {"role": "system", "content": " ".join(words(200))}
    first = {"messages": [system, {"role": "user", "content": "hello there"}]}
    second = {"messages": [*first["messages"], {"role": "assistant", "content": "sim says: hello there"},
                           {"role": "user", "content": "and more"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        cold = await _first_byte_s(client, first)
        warm = await _first_byte_s(client, second)
    assert cold == pytest.approx(204 / 100)  # every word of the prompt, roles included
    assert warm == pytest.approx((212 - 192) / 100)  # only past the 12 cached blocks
    assert app.prefix is not None and app.prefix.cached_tokens == 192


async def test_without_a_prefill_speed_the_sim_answers_at_once(autojump_clock: trio.testing.MockClock) -> None:
    app = make_app(SimOptions(host="127.0.0.1", port=0, model="demo"))
    assert app.prefix is None
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        assert await _first_byte_s(client, {"messages": [{"role": "user", "content": "hi " * 500}]}) == 0
