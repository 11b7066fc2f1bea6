"""The simulator's prefix cache: which leading blocks of prompts a replica holds, so a prompt that starts as an
earlier one did is prefilled only past what they share. Owns `PrefixCache`; the app (app.py) reads one prompt
at a time at `--prefill-tokens-per-s`, as a GPU's compute does.

Modelled on vLLM's automatic prefix caching: a prompt is cut into blocks of `BLOCK_WORDS` words (a word is the
sim's token); each full block is known by a hash of itself and every block before it, so a hit is always a
prefix; the cache keeps at most `capacity` blocks and forgets the least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b

__all__ = ["BLOCK_WORDS", "PrefixCache"]

BLOCK_WORDS = 16


class PrefixCache:
    """One replica's cache of prompt blocks; `prompt_tokens` and `cached_tokens` count what it was asked and
    what it had (their ratio is its hit rate)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a prefix cache holds at least one block")
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def admit(self, words: list[str]) -> int:
        """How many of the prompt's leading `words` were cached; its blocks are cached (most recent) after."""
        blocks = self._blocks
        cached = 0
        hit = True
        previous = b""
        for start in range(0, len(words) - BLOCK_WORDS + 1, BLOCK_WORDS):
            text = "\x1f".join(words[start : start + BLOCK_WORDS]).encode("utf-8", "surrogatepass")
            previous = blake2b(previous + text, digest_size=16).digest()
            if hit and previous in blocks:
                cached += BLOCK_WORDS
                blocks.move_to_end(previous)
                continue
            hit = False
            blocks[previous] = None
            blocks.move_to_end(previous)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
        self.prompt_tokens += len(words)
        self.cached_tokens += cached
        return cached
