"""Tiny llama-architecture GGUF models with random weights, so tests can drive a real
llama.cpp without downloading a model.

The weights are random, so the text is gibberish, but two tricks keep it well-behaved:
hidden dimension 0 is a constant "bias" channel (every token embedding sets it to 1 and no
layer writes to it), and the output layer gives control and byte tokens a large negative
weight on that channel. Generation therefore only ever picks whole-word pieces: the answer is
always valid text and never stops early on an end-of-sequence token."""

import hashlib
import itertools
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

# Bumped whenever the weights or metadata written below change, so caches rebuild.
FORMAT = 1

SPECIALS = ["<unk>", "<s>", "</s>"]
BOS, EOS, UNK = 1, 2, 0
SUPPRESSED = -200.0  # weight on the bias channel for tokens that must never be generated


@dataclass(frozen=True)
class TinyModel:
    name: str
    dim: int
    layers: int
    heads: int
    ffn: int
    words: int = 256
    context: int = 512

    @property
    def file_name(self) -> str:
        digest = hashlib.sha256(repr((FORMAT, asdict(self))).encode()).hexdigest()[:12]
        return f"{self.name}-{digest}.gguf"


# About 5 MB and about 100 MB of float16 weights: the larger takes measurably longer to load.
SMALL = TinyModel("tiny-5mb", dim=256, layers=3, heads=4, ffn=768)
LARGE = TinyModel("tiny-100mb", dim=512, layers=14, heads=8, ffn=1536)
# The small one with room for an agent's prompt (Claude Code's is about 16,000 tokens).
LONG = TinyModel("tiny-long", dim=256, layers=3, heads=4, ffn=768, context=65536)


def word_pieces(count: int) -> list[str]:
    """Pronounceable two-syllable words, SentencePiece style ("▁" marks a leading space)."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = ["".join(pair) for pair in itertools.product(syllables, repeat=2)]
    return ["\u2581" + w for w in words[:: len(words) // count][:count]]


def vocabulary(words: int) -> tuple[list[str], list[int]]:
    """Specials, the 256 byte-fallback tokens (any input text tokenizes), then words."""
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + word_pieces(words)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * words
    return tokens, [int(t) for t in types]


def weights(spec: TinyModel, vocab: int) -> dict[str, np.ndarray]:
    """Random float16 matrices (float32 norms), shaped (out, in) as gguf-py expects."""
    rng = np.random.default_rng(int(hashlib.sha256(spec.name.encode()).hexdigest()[:8], 16))

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return rng.normal(0.0, scale / np.sqrt(cols), (rows, cols)).astype(np.float32)

    d, f = spec.dim, spec.ffn
    embed = rng.normal(0.0, 0.5, (vocab, d)).astype(np.float32)
    embed[:, 0] = 1.0
    output = matrix(vocab, d, 1.0)
    output[: len(SPECIALS) + 256, 0] = SUPPRESSED
    tensors = {"token_embd.weight": embed, "output_norm.weight": np.ones(d, np.float32)}
    tensors["output.weight"] = output
    for i in range(spec.layers):
        attn_out, ffn_down = matrix(d, d, 0.5), matrix(d, f, 0.5)
        attn_out[0], ffn_down[0] = 0.0, 0.0  # nothing writes to the bias channel
        tensors |= {
            f"blk.{i}.attn_norm.weight": np.ones(d, np.float32),
            f"blk.{i}.attn_q.weight": matrix(d, d, 1.0),
            f"blk.{i}.attn_k.weight": matrix(d, d, 1.0),
            f"blk.{i}.attn_v.weight": matrix(d, d, 1.0),
            f"blk.{i}.attn_output.weight": attn_out,
            f"blk.{i}.ffn_norm.weight": np.ones(d, np.float32),
            f"blk.{i}.ffn_gate.weight": matrix(f, d, 1.0),
            f"blk.{i}.ffn_up.weight": matrix(f, d, 1.0),
            f"blk.{i}.ffn_down.weight": ffn_down,
        }
    return {k: v if v.ndim == 1 else v.astype(np.float16) for k, v in tensors.items()}


def write(spec: TinyModel, path: Path) -> None:
    tokens, types = vocabulary(spec.words)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(spec.name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.dim)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.heads)
    writer.add_rope_dimension_count(spec.dim // spec.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_pooling_type(gguf.PoolingType.MEAN)  # one vector per input when embedding
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_add_bos_token(True)
    for name, tensor in weights(spec, len(tokens)).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def build(spec: TinyModel, directory: Path) -> Path:
    """The model's file in `directory`, written once: later calls reuse it."""
    path = directory / spec.file_name
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.part")
        write(spec, partial)
        partial.rename(path)  # atomic: a crash mid-write never leaves a truncated model
    return path
