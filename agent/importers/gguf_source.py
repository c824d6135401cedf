"""Reading a llama.cpp GGUF file: a Llama's shape, its weights and its tokenizer.

`read_gguf(path)` returns the neutral form `llama.py` converts: the shape, the tensors
(read one at a time as the converter takes them) dequantized to fp32 under Hugging Face's names (q and k rows un-permuted: llama.cpp's
converter interleaves each head's two RoPE halves, `reshape(H, 2, D/2, in).swapaxes(1, 2)`,
and we undo it as transformers' GGUF loader does), a `tokenizers` tokenizer built from the
vocabulary, merges and token types, and the chat template and special tokens.

Only the Llama architecture and the quant types below are read; anything else is one
`CheckpointError` line naming what was found. Nothing is written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from agent.importers.llama import LlamaShape, check_rope_scaling
from agent.importers.source import CheckpointError, TokenizerFiles
from agent.runtime.tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"
SUPPORTED_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

# llama.cpp's pre-tokenizer types we rebuild (the split a vocabulary's merges were learned
# on). "smollm" is llama.cpp's: each digit alone, then GPT-2's regex; "gpt-2" the regex alone.
PRE_TOKENIZERS = ("smollm", "gpt-2")

_NAMES = {  # GGUF tensor -> Hugging Face Llama tensor ({i}: the layer)
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


@dataclass
class GGUFModel:
    shape: LlamaShape
    tensors: GGUFTensors  # Hugging Face names, fp32, each read when taken
    tokenizer: Tokenizer
    files: TokenizerFiles  # special tokens, eos id and chat template, as a checkpoint directory gives them
    quants: dict[str, int]  # quant type -> how many tensors had it (for the card)
    name: str


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _reader(path: Path) -> Any:
    try:
        import gguf
    except ImportError:  # pragma: no cover - a dependency; only a broken install lacks it
        raise CheckpointError("reading a GGUF needs the gguf package: pip install gguf") from None
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise CheckpointError(f"{path} is not a readable GGUF file ({exc}); download it again") from None


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_shape(reader: Any, path: Path) -> LlamaShape:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path.name} is a {arch!r} GGUF; laplace imports the llama architecture only")

    def need(key: str) -> Any:
        v = _field(reader, f"llama.{key}")
        if v is None:
            raise CheckpointError(f"{path.name} has no llama.{key}; the GGUF is incomplete")
        return v

    heads = int(need("attention.head_count"))
    d = int(need("embedding_length"))
    head_dim = int(_field(reader, "llama.attention.key_length", d // heads))
    if int(_field(reader, "llama.rope.dimension_count", head_dim)) != head_dim:
        raise CheckpointError(f"{path.name} rotates only part of each head (partial RoPE); not supported")
    check_rope_scaling({"rope_type": _field(reader, "llama.rope.scaling.type", "default")})
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    return LlamaShape(
        vocab_size=int(_field(reader, "llama.vocab_size", len(tokens))), d_model=d, n_layers=int(need("block_count")),
        n_heads=heads, n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)), head_dim=head_dim,
        ffn_dim=int(need("feed_forward_length")), rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        norm_eps=float(np.float32(need("attention.layer_norm_rms_epsilon"))),  # stored as f32: 1e-5 reads 9.99999975e-06
        tied=not any(t.name == "output.weight" for t in reader.tensors),
    )


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row permutation of q or k [out, in] (n_heads: q or kv heads)."""
    out, inp = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _hf_name(name: str, n_layers: int) -> str | None:
    if name in _NAMES:
        return _NAMES[name]
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layers:
        key = ".".join(["blk", "{i}", *parts[2:]])
        if key in _NAMES:
            return _NAMES[key].format(i=parts[1])
    return None


class GGUFTensors(Mapping[str, torch.Tensor]):
    """The GGUF's tensors under their Hugging Face names, each read from the file,
    dequantized to fp32 and un-permuted only when asked for, and only once (`pop`, as the
    converter takes them): a conversion holds the model it builds plus one tensor, never
    the whole fp32 model twice.

    Bytes come by plain reads, not through the reader's memory map: pages of a mapping a
    process has touched count in its resident set until it unmaps them (see
    `agent.runtime.weights`), so reading an F32 GGUF through it would hold the file once
    more."""

    lazy = True  # `llama.hybrid_weights` takes from it as it is instead of copying it first

    def __init__(self, path: Path, shape: LlamaShape, infos: dict[str, Any]) -> None:
        self.path, self.shape, self._infos = path, shape, infos

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._read(self._infos[name])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._infos))

    def __len__(self) -> int:
        return len(self._infos)

    def pop(self, name: str, *default: Any) -> Any:
        """The tensor, read now and forgotten here (a second pop is a KeyError)."""
        if name not in self._infos:
            if default:
                return default[0]
            raise KeyError(name)
        return self._read(self._infos.pop(name))

    def _read(self, t: Any) -> torch.Tensor:
        from gguf.quants import dequantize

        raw = bytearray(int(t.n_bytes))
        try:
            with open(self.path, "rb") as f:
                f.seek(int(t.data_offset))
                if f.readinto(raw) != len(raw):
                    raise CheckpointError(f"{self.path.name} ends inside tensor {t.name}; download it again")
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path} ({exc.strerror or exc})") from None
        # The same dtype and shape as the reader's own view of these bytes (t.data, untouched).
        stored = np.frombuffer(raw, dtype=t.data.dtype).reshape(t.data.shape)
        w = np.asarray(dequantize(stored, t.tensor_type), dtype=np.float32)
        w = w.reshape(tuple(int(x) for x in reversed(t.shape.tolist())))  # GGUF lists dims innermost first
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, self.shape.n_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, self.shape.n_kv_heads)
        return torch.from_numpy(np.ascontiguousarray(w))  # an F32 tensor keeps the buffer it was read into: no copy


def gguf_tensors(reader: Any, shape: LlamaShape, path: Path) -> tuple[GGUFTensors, dict[str, int]]:
    """Every tensor under its Hugging Face name, read lazily (`GGUFTensors`); an
    unsupported quant type or an unknown tensor is refused before any is read."""
    quants: dict[str, int] = {}
    infos: dict[str, Any] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in SUPPORTED_QUANTS:
            raise CheckpointError(f"{path.name}: tensor {t.name} is {kind}; laplace reads {', '.join(SUPPORTED_QUANTS)} GGUFs only")
        hf = _hf_name(t.name, shape.n_layers)
        if hf is None:
            raise CheckpointError(f"{path.name} has a tensor a plain Llama does not ({t.name}); not supported")
        infos[hf] = t
        quants[kind] = quants.get(kind, 0) + 1
    return GGUFTensors(path, shape, infos), quants


def gguf_tokenizer(reader: Any, path: Path) -> tuple[Tokenizer, TokenizerFiles]:
    """A byte-level BPE `tokenizers` tokenizer from the GGUF vocabulary, with control tokens
    as special tokens and the pre-tokenizer its pre type names; and the side files' facts."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise CheckpointError(f"{path.name} has a {model!r} tokenizer; laplace rebuilds byte-level BPE (gpt2) GGUF tokenizers only")
    pre = _field(reader, "tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{path.name} has pre-tokenizer {pre!r}; laplace rebuilds {', '.join(PRE_TOKENIZERS)} only")
    tokens = list(_field(reader, "tokenizer.ggml.tokens") or [])
    types = list(_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges") or []]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if not tokens or len(vocab) != len(tokens) or len(types) != len(tokens):
        raise CheckpointError(f"{path.name} has an inconsistent vocabulary (duplicate tokens or missing types); download it again")
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) if pre == "smollm" else byte_level
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED])

    def token(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    eos_id = _field(reader, "tokenizer.ggml.eos_token_id")
    config = {"eos_token": token("eos_token_id")}
    if _field(reader, "tokenizer.ggml.add_bos_token", False):  # only a BOS the model is fed goes into the template
        config["bos_token"] = token("bos_token_id")
    template = _field(reader, "tokenizer.chat_template")
    files = TokenizerFiles(path, config, {"eos_token_id": int(eos_id)} if eos_id is not None else {},
                           template if isinstance(template, str) and template.strip() else None)
    return Tokenizer(hf), files


def read_gguf(path: str | Path) -> GGUFModel:
    p = Path(path)
    reader = _reader(p)
    shape = gguf_shape(reader, p)
    tok, files = gguf_tokenizer(reader, p)
    tensors, quants = gguf_tensors(reader, shape, p)
    name = str(_field(reader, "general.name", p.stem))
    return GGUFModel(shape, tensors, tok, files, quants, name)
