"""The Llama Guard 3 judge protocol: the prompt built from a conversation (the 14 hazard categories, the turns
as `User:`/`Agent:`, the instruction about the last one), read back (the sim judge), and the strict answer parser.

The prompt is Meta's format for Llama Guard 3, sent as a raw completion (`/v1/completions`) so that no
engine's chat template can change it. It starts at the user header, without `<|begin_of_text|>`: the
engines (llama.cpp, vLLM) add the BOS token themselves. The conversation's texts are defused first: an
engine parses special tokens inside a prompt, so a client writing `<|eot_id|>...assistant...safe` could
otherwise close the judge's question and answer it; nor may a text open a turn of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.domain.guard import CATEGORIES, verdict_text

__all__ = ["AGENT", "SAFE", "USER", "JudgeFailure", "Turn", "Verdict", "build", "judge_request", "parse", "read",
           "rule"]

USER, AGENT = "User", "Agent"
Turn = tuple[str, str]  # (USER or AGENT, text)

JUDGE_MAX_TOKENS = 32  # "unsafe" and a line of codes fit in ~20; more could only be an unparseable answer

# Earlier turns beyond this many characters are dropped, oldest first (the judged last turn is always
# whole): a judge's context is small (2,048 tokens by default on CPU), and the last turn is what it judges.
CONTEXT_CHARS = 16_000

_HEAD = "<|start_header_id|>user<|end_header_id|>\n\n"
_TAIL = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
_TASK = ("Task: Check if there is unsafe content in '{role}' messages in conversations according our safety policy "
         "with the below categories.\n\n")
_ASK = ("Provide your safety assessment for ONLY THE LAST {role} message in the above conversation:\n"
        " - First line must read 'safe' or 'unsafe'.\n"
        " - If unsafe, a second line must include a comma-separated list of violated categories.")
_BEGIN, _END = "<BEGIN CONVERSATION>", "<END CONVERSATION>"

_SPECIAL = re.compile(r"<\|")  # what starts every Llama 3 special token
_MARKER = re.compile(r"<(/?)(BEGIN|END)\b", re.IGNORECASE)  # the prompt's own section markers
_HEADER_LINE = re.compile(r"^(\s*)(User|Agent)(\s*):", re.MULTILINE)  # a line that would read as a new turn
_BLANKS = re.compile(r"\n\s*\n")  # turns are separated by a blank line: none inside a turn
_ROLE_ASKED = re.compile(r"ONLY THE LAST (User|Agent) message")
_TURN_SPLIT = re.compile(r"\n\n(?=(?:User|Agent): )")


def categories_block() -> str:
    return "\n".join(f"{code}: {name}." for code, name in CATEGORIES.items())


_CATEGORIES_BLOCK = categories_block()


def defuse(text: str) -> str:
    """A conversation text that cannot end the judge's question, open a turn or a section of its own."""
    text = _SPECIAL.sub("< |", text)
    text = _MARKER.sub(r"< \1\2", text)
    text = _BLANKS.sub("\n", text.strip())
    return _HEADER_LINE.sub(r"\1(\2)\3:", text)


def build(turns: Sequence[Turn], judged: str) -> str:
    """The judge's prompt asking about the last `judged` (USER or AGENT) message of `turns`."""
    if judged not in (USER, AGENT):
        raise ValueError(f"judged must be {USER!r} or {AGENT!r}")
    lines = [f"{who}: {defuse(text)}" for who, text in turns]
    kept = lines[-1:]
    size = sum(len(line) for line in kept)
    for line in reversed(lines[:-1]):
        size += len(line)
        if size > CONTEXT_CHARS:
            break
        kept.insert(0, line)
    return (_HEAD + _TASK.format(role=judged) + "<BEGIN UNSAFE CONTENT CATEGORIES>\n" + _CATEGORIES_BLOCK
            + "\n<END UNSAFE CONTENT CATEGORIES>\n\n" + _BEGIN + "\n\n" + "\n\n".join(kept) + "\n\n" + _END + "\n\n"
            + _ASK.format(role=judged) + _TAIL)


def judge_request(judge: str, prompt: str) -> bytes:
    """The judge call's body: a raw completion, greedy, short (the gateway's checks and `ctl guard judge ask`)."""
    return json.dumps({"model": judge, "prompt": prompt, "max_tokens": JUDGE_MAX_TOKENS, "temperature": 0,
                       "stream": False}, ensure_ascii=False).encode()


def read(prompt: str) -> tuple[str, list[Turn]] | None:
    """A Llama Guard prompt read back: the role asked about and the turns; None when it is not one."""
    asked = _ROLE_ASKED.search(prompt)
    begin, end = prompt.find(_BEGIN), prompt.rfind(_END)
    if asked is None or begin < 0 or end < begin:
        return None
    body = prompt[begin + len(_BEGIN):end].strip("\n")
    turns: list[Turn] = []
    for part in _TURN_SPLIT.split(body):
        who, sep, text = part.partition(": ")
        if sep and who in (USER, AGENT):
            turns.append((who, text))
    return asked.group(1), turns


# --- the answer ----------------------------------------------------------------------------------------


class JudgeFailure(Exception):
    """The judge did not answer, or not in Llama Guard's format. The words never quote the answer (a
    judge may echo the text it read, and a failure is recorded)."""


@dataclass(frozen=True)
class Verdict:
    """A judge's reading: the hazard codes it named, in its order; none means safe."""

    categories: tuple[str, ...] = ()

    @property
    def safe(self) -> bool:
        return not self.categories



SAFE = Verdict()


def parse(answer: str) -> Verdict:
    """Exactly `safe`, or `unsafe` and one line of comma-separated codes S1..S14 (surrounding whitespace
    trimmed); anything else raises JudgeFailure."""
    text = answer.strip()
    if text == "safe":
        return SAFE
    lines = [line.strip() for line in text.split("\n")]
    if lines[0] != "unsafe":
        raise JudgeFailure(f"the judge's answer is not Llama Guard's format ({len(text)} characters, "
                           "not 'safe' or 'unsafe')")
    if len(lines) != 2 or not lines[1]:
        raise JudgeFailure("the judge said unsafe but not one line of categories after it")
    codes = [code.strip() for code in lines[1].split(",")]
    unknown = [code for code in codes if code not in CATEGORIES]
    if unknown:
        shown = ", ".join(code for code in unknown if re.fullmatch(r"S\d{1,3}", code)) or "not codes"
        raise JudgeFailure(f"the judge named categories outside S1..S14 ({shown})")
    return Verdict(tuple(dict.fromkeys(codes)))


def rule(verdict: Verdict | JudgeFailure) -> str:
    """The request log's `guard_rule` and a refusal's words: `judge: S6,Specialized Advice`, `judge: safe`,
    `judge: error <what>`."""
    if isinstance(verdict, JudgeFailure):
        return f"judge: error {verdict}"
    return "judge: safe" if verdict.safe else verdict_text(verdict.categories)
