"""Tiny GGUF files written offline for tests: a 2-layer random-weight llama llama.cpp loads
(~0.5 MB), one with an unknown architecture, truncated ones, one whose header lies, and a tiny
BERT cross-encoder (a reranker).

API (stable; the llama.cpp integration tests and the storage benchmark use it):

- `write_tiny_llama(path, *, arch="llama", seed=0, pad_bytes=0) -> Path`: a loadable 2-layer llama
  with its own SentencePiece-style vocabulary (printable pieces; control tokens marked
  CONTROL and non-printable byte tokens UNUSED, so whatever it generates is printable
  text). `arch="notarealarch"` (any name) writes the same file under an architecture
  llama.cpp does not know: the engine must refuse it at start.
- `write_tiny_reranker(path, *, seed=0) -> Path`: a loadable 2-layer random-weight BERT with
  llama.cpp's classification head (`cls`, `cls.output`) and a WordPiece vocabulary ([CLS] 2,
  [SEP] 3): llama.cpp started with rank pooling (`--reranking`) serves `/v1/rerank` from it.
- `truncate(path, keep_bytes) -> Path`: cut a file to its first `keep_bytes` bytes.
- `write_lying_header(path, *, seed=0) -> Path`: a complete-looking tiny llama whose
  header declares more tensor data (a larger `output.weight`) than the file holds.
- `write_tiny_lora(path, *, rank=4, seed=1) -> Path`: a LoRA adapter GGUF for the tiny llama
  (`general.type = adapter`, `adapter.type = lora`, `.lora_a`/`.lora_b` for each layer's
  attn_q and attn_output), strong enough that llama.cpp's answers change when it is applied.
- `minimal_gguf(arch="llama", *, tensors=1, elements=32) -> bytes`: a valid GGUF (v3) with
  `tensors` small F32 tensors, written with the standard library only (fast: the
  benchmark writes hundreds of them).

`write_tiny_llama`, `write_tiny_reranker` and `write_lying_header` need the `gguf` package (the `test` extra).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["minimal_gguf", "truncate", "write_lying_header", "write_tiny_llama", "write_tiny_lora",
           "write_tiny_reranker"]

N_EMBD = 64
N_FF = 128
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_CTX = 2048
N_VOCAB = 512

# token_type values (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _UNUSED, _BYTE = 1, 2, 3, 5, 6
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part hello world model llama tiny test cluster node gpu"
).split()


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(_BYTE if 0x20 <= b < 0x7F or b == 0x0A else _UNUSED)
    pieces = ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)] + [f"\u2581{w}" for w in _WORDS]
    for piece in pieces:
        if len(tokens) >= N_VOCAB:
            break
        tokens.append(piece)
        types.append(_NORMAL)
    n = 0
    while len(tokens) < N_VOCAB:  # fill up with printable two-letter pieces
        piece = "\u2581" + chr(0x61 + n // 26) + chr(0x61 + n % 26)
        n += 1
        if piece not in tokens:
            tokens.append(piece)
            types.append(_NORMAL)
    scores = [0.0 if t != _NORMAL else -float(i) for i, t in enumerate(types)]
    return tokens, scores, types


def _tensors(seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)

    def w(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    kv = N_EMBD // N_HEAD * N_HEAD_KV
    out: dict[str, Any] = {"token_embd.weight": w(N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        out |= {
            f"blk.{i}.attn_norm.weight": ones(N_EMBD),
            f"blk.{i}.attn_q.weight": w(N_EMBD, N_EMBD),
            f"blk.{i}.attn_k.weight": w(kv, N_EMBD),
            f"blk.{i}.attn_v.weight": w(kv, N_EMBD),
            f"blk.{i}.attn_output.weight": w(N_EMBD, N_EMBD),
            f"blk.{i}.ffn_norm.weight": ones(N_EMBD),
            f"blk.{i}.ffn_gate.weight": w(N_FF, N_EMBD),
            f"blk.{i}.ffn_down.weight": w(N_EMBD, N_FF),
            f"blk.{i}.ffn_up.weight": w(N_FF, N_EMBD),
        }
    out["output_norm.weight"] = ones(N_EMBD)
    out["output.weight"] = w(N_VOCAB, N_EMBD)
    return out


def _writer(path: Path, arch: str) -> Any:
    import gguf

    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_name(f"tiny-{arch}")
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    wr.add_context_length(N_CTX)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(N_LAYER)
    wr.add_feed_forward_length(N_FF)
    wr.add_rope_dimension_count(N_EMBD // N_HEAD)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_HEAD_KV)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_vocab_size(N_VOCAB)
    tokens, scores, types = _vocab()
    wr.add_tokenizer_model("llama")
    wr.add_token_list(tokens)
    wr.add_token_scores(scores)
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_unk_token_id(0)
    wr.add_add_bos_token(True)
    wr.add_chat_template(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    return wr


def write_tiny_llama(path: str | os.PathLike[str], *, arch: str = "llama", seed: int = 0, pad_bytes: int = 0) -> Path:
    """Write the tiny random-weight llama (or the same under `arch`) to `path`; `pad_bytes` more in a metadata
    string llama.cpp ignores (`llmgw.test.padding`), for a file as large as a test needs that still loads."""
    p = Path(path)
    wr = _writer(p, arch)
    if pad_bytes:
        wr.add_string("llmgw.test.padding", "x" * pad_bytes)
    for name, array in _tensors(seed).items():
        wr.add_tensor(name, array)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return p


def write_tiny_lora(path: str | os.PathLike[str], *, rank: int = 4, seed: int = 1) -> Path:
    """A LoRA adapter of the tiny llama, as llama.cpp's convert_lora_to_gguf writes one: for a base weight of
    shape (out, in), `lora_a` is (rank, in) and `lora_b` (out, rank) (numpy order; GGUF's dims reversed)."""
    import gguf
    import numpy as np

    p = Path(path)
    rng = np.random.default_rng(seed)
    wr = gguf.GGUFWriter(str(p), "llama")
    wr.add_string("general.type", "adapter")
    wr.add_string("adapter.type", "lora")
    wr.add_float32("adapter.lora.alpha", float(rank))
    for i in range(N_LAYER):
        for name in ("attn_q", "attn_output"):
            wr.add_tensor(f"blk.{i}.{name}.weight.lora_a", (rng.standard_normal((rank, N_EMBD)) * 0.5).astype(np.float32))
            wr.add_tensor(f"blk.{i}.{name}.weight.lora_b", (rng.standard_normal((N_EMBD, rank)) * 0.5).astype(np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return p


def write_lying_header(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A tiny llama whose header says `output.weight` has twice the rows the file holds."""
    import numpy as np

    p = Path(path)
    wr = _writer(p, "llama")
    arrays = _tensors(seed)
    for name, array in arrays.items():
        if name == "output.weight":
            wr.add_tensor_info(name, (2 * N_VOCAB, N_EMBD), np.dtype(np.float32), 2 * array.nbytes)
        else:
            wr.add_tensor(name, array)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_ti_data_to_file()
    wr.close()
    # The data, written as the writer would (each tensor padded to the alignment), with only
    # the real rows of output.weight behind its doubled declaration.
    align = 32
    with p.open("ab") as f:
        f.write(b"\0" * (-f.tell() % align))
        for array in arrays.values():
            f.write(array.tobytes())
            f.write(b"\0" * (-array.nbytes % align))
    return p


def truncate(path: str | os.PathLike[str], keep_bytes: int) -> Path:
    """Cut the file at `path` to its first `keep_bytes` bytes (a download cut short)."""
    p = Path(path)
    os.truncate(p, keep_bytes)
    return p


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def minimal_gguf(arch: str = "llama", *, tensors: int = 1, elements: int = 32) -> bytes:
    """A valid GGUF v3: general.architecture, general.name and `tensors` F32 tensors of
    `elements` each, with the default alignment (32)."""
    kv = [("general.architecture", arch), ("general.name", f"minimal-{arch}")]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kv)))
    for key, value in kv:
        out += _string(key) + struct.pack("<I", 8) + _string(value)
    nbytes = elements * 4
    stride = -(-nbytes // 32) * 32
    for i in range(tensors):
        out += _string(f"t{i}.weight") + struct.pack("<IQIQ", 1, elements, 0, i * stride)
    out += b"\0" * (-len(out) % 32)
    for i in range(tensors):
        out += struct.pack(f"<{elements}f", *([float(i)] * elements)) + b"\0" * (stride - nbytes)
    return bytes(out)


# --- a tiny reranker: BERT with a classification head (llama.cpp's rank pooling) ---------------------------

_RERANK_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_RERANK_CTX = 512
_TOKEN_TYPES = 2


def _reranker_vocab() -> tuple[list[str], list[int]]:
    """A WordPiece vocabulary as llama.cpp's GGUF holds it (whole words with a leading U+2581, pieces bare)."""
    tokens = list(_RERANK_SPECIAL)
    types = [_CONTROL] * len(tokens)
    types[1] = _UNKNOWN
    pieces = [f"\u2581{w}" for w in _WORDS] + [f"\u2581{chr(c)}" for c in range(0x21, 0x7F)]
    pieces += [chr(c) for c in range(0x21, 0x7F)]
    for piece in pieces:
        if piece not in tokens:
            tokens.append(piece)
            types.append(_NORMAL)
    return tokens, types


def write_tiny_reranker(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A loadable 2-layer random-weight BERT cross-encoder (`cls` and `cls.output` heads) that llama.cpp serves
    `/v1/rerank` from when started with rank pooling (`--reranking`)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, types = _reranker_vocab()
    n_vocab = len(tokens)

    def w(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> Any:
        return np.zeros(n, dtype=np.float32)

    p = Path(path)
    wr = gguf.GGUFWriter(str(p), "bert")
    wr.add_name("tiny-reranker")
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    wr.add_context_length(_RERANK_CTX)
    wr.add_embedding_length(N_EMBD)
    wr.add_block_count(N_LAYER)
    wr.add_feed_forward_length(N_FF)
    wr.add_head_count(N_HEAD)
    wr.add_layer_norm_eps(1e-12)
    wr.add_causal_attention(False)
    wr.add_pooling_type(gguf.PoolingType.RANK)
    wr.add_tokenizer_model("bert")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_type_count(_TOKEN_TYPES)
    wr.add_unk_token_id(1)
    wr.add_pad_token_id(0)
    wr.add_bos_token_id(2)  # [CLS]
    wr.add_eos_token_id(3)  # [SEP]
    wr.add_sep_token_id(3)
    wr.add_mask_token_id(4)
    wr.add_add_bos_token(True)
    wr.add_add_eos_token(True)
    arrays: dict[str, Any] = {
        "token_embd.weight": w(n_vocab, N_EMBD),
        "token_types.weight": w(_TOKEN_TYPES, N_EMBD),
        "position_embd.weight": w(_RERANK_CTX, N_EMBD),
        "token_embd_norm.weight": ones(N_EMBD),
        "token_embd_norm.bias": zeros(N_EMBD),
    }
    for i in range(N_LAYER):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            arrays[f"blk.{i}.{name}.weight"] = w(N_EMBD, N_EMBD)
            arrays[f"blk.{i}.{name}.bias"] = zeros(N_EMBD)
        arrays |= {
            f"blk.{i}.attn_output_norm.weight": ones(N_EMBD), f"blk.{i}.attn_output_norm.bias": zeros(N_EMBD),
            f"blk.{i}.ffn_up.weight": w(N_FF, N_EMBD), f"blk.{i}.ffn_up.bias": zeros(N_FF),
            f"blk.{i}.ffn_down.weight": w(N_EMBD, N_FF), f"blk.{i}.ffn_down.bias": zeros(N_EMBD),
            f"blk.{i}.layer_output_norm.weight": ones(N_EMBD), f"blk.{i}.layer_output_norm.bias": zeros(N_EMBD),
        }
    arrays |= {"cls.weight": w(N_EMBD, N_EMBD), "cls.bias": zeros(N_EMBD),
               "cls.output.weight": (rng.standard_normal((1, N_EMBD))).astype(np.float32),
               "cls.output.bias": zeros(1)}
    for name, array in arrays.items():
        wr.add_tensor(name, array)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return p
