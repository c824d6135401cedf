"""Small random Llama teachers, made in the test: a transformers LlamaForCausalLM saved as a
Hugging Face directory, and the same kind of model written as a llama.cpp GGUF (q/k rows
permuted as llama.cpp's converter does, tensors in F32, Q8_0, Q4_0 and Q4_1) with a BPE
vocabulary trained here on a few lines of text. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.importers.helpers import perturb_

SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The library opens at nine in the morning and closes at six in the evening.",
    "Children come after school to read picture books; in 2024 there were 1,337 visitors.",
    "def main(argv):\n    return 42  # the answer\n",
    "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9, \u65e5\u672c\u8a9e, emoji \U0001f600 and 3.14159.",
]
LLAMA_SHAPE = dict(vocab_size=0, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=512)


def bpe_tokenizer(vocab_size: int = 400):
    """A byte-level BPE trained on CORPUS with SmolLM2's pre-tokenizer (digits split) and
    its three special tokens first (ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def hf_llama(seed: int = 0, *, tied: bool = True, vocab_size: int = 400):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**LLAMA_SHAPE, "vocab_size": vocab_size}, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    perturb_(model, seed, scale=0.05)
    return model


def llama_checkpoint(root: Path, *, seed: int = 0, tied: bool = True):
    """A random LlamaForCausalLM saved with save_pretrained, with a ChatML tokenizer; returns it."""
    tok = bpe_tokenizer()
    model = hf_llama(seed, tied=tied, vocab_size=tok.get_vocab_size())
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": SMOLLM_TEMPLATE}))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return model


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (what the importer undoes)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def llama_gguf(path: Path, *, seed: int = 0, arch: str = "llama", quant: str | None = None, pre: str = "smollm",
               tok_model: str = "gpt2"):
    """Write a random Llama as a GGUF; returns the transformers model it was made from.
    Quant types by role (as llama.cpp mixes them): embeddings Q8_0, attention Q4_1,
    the GLU Q4_0 / Q8_0, norms F32 -- or every matrix in `quant` when given."""
    import gguf
    from gguf.quants import quantize

    Q = gguf.GGMLQuantizationType
    tok = bpe_tokenizer()
    model = hf_llama(seed, vocab_size=tok.get_vocab_size())
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.head_dim)
    w.add_vocab_size(c.vocab_size)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    w.add_tokenizer_model(tok_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in SPECIALS else 1 for t, _ in vocab])
    w.add_token_merges([" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(SMOLLM_TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    def put(name: str, arr: np.ndarray, kind: str) -> None:
        qt = getattr(Q, quant if quant and arr.ndim == 2 else kind)
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, arr.astype(np.float32 if qt == Q.F32 else np.float16))
        elif qt.name in ("Q8_0", "Q4_0", "Q4_1"):
            w.add_tensor(name, quantize(arr, qt), raw_dtype=qt)
        else:  # a type the importer must refuse: the right number of bytes, any content
            block, size = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor(name, np.zeros((arr.shape[0], arr.shape[1] // block * size), dtype=np.uint8), raw_dtype=qt)

    put("token_embd.weight", sd["model.embed_tokens.weight"], "Q8_0")
    put("output_norm.weight", sd["model.norm.weight"], "F32")
    for i in range(c.num_hidden_layers):
        for hf, ours in GGUF_NAMES.items():
            suffix = ".weight"
            arr = sd[f"model.layers.{i}.{hf}{suffix}"]
            if ours == "attn_q":
                arr = _permute(arr, c.num_attention_heads)
            elif ours == "attn_k":
                arr = _permute(arr, c.num_key_value_heads)
            kind = "F32" if arr.ndim == 1 else "Q4_1" if ours.startswith("attn") else "Q4_0" if ours == "ffn_up" else "Q8_0"
            put(f"blk.{i}.{ours}.weight", arr, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
