"""Small random checkpoints in the source formats, made in the test (nothing downloaded).

Every parameter is perturbed away from its init value (norm gains, D, decays, biases), so
a conversion that drops or misplaces any tensor changes the logits.
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import torch
from safetensors.torch import save_file

from agent.runtime.tokenizer import byte_level_tokenizer

# A Llama-3-style template over the byte tokenizer's special tokens: system role, trim,
# a generation prompt, and the BOS printed by the template itself.
JINJA = (
    "{{ bos_token }}{% for m in messages %}"
    "<|{{ m['role'] }}|>{{ m['content'] | trim }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_tokenizer(root: Path, *, chat_template: str | None = JINJA, eos: str = "<|end|>") -> None:
    tok = byte_level_tokenizer()
    tok.save(root / "tokenizer.json")
    cfg: dict = {"bos_token": "<|bos|>", "eos_token": {"content": eos}}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.token_id(eos)}))


def perturb_(module: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def mamba2_checkpoint(root: Path, *, n_groups: int = 2, tied: bool = True, seed: int = 0):
    """A random transformers Mamba2ForCausalLM saved with save_pretrained; returns the model."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(seed)
    cfg = Mamba2Config(vocab_size=272, hidden_size=64, state_size=16, num_heads=8, head_dim=16, expand=2,
                       n_groups=n_groups, num_hidden_layers=2, conv_kernel=4, chunk_size=16, tie_word_embeddings=tied)
    model = Mamba2ForCausalLM(cfg).eval()
    perturb_(model, seed)
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root)
    write_tokenizer(root)
    return model


LLAMBA_SHAPE = dict(d_model=48, n_layer=2, vocab=264, d_state=8, n_v_heads=6, n_qk_heads=2, expand=2, d_conv=4, ffn=96)


def llamba_tensors(seed: int = 0, **shape: int) -> dict[str, torch.Tensor]:
    """Random tensors under Llamba's names (cartesia's LlambaLMHeadModel layout)."""
    s = {**LLAMBA_SHAPE, **shape}
    d, di, n = s["d_model"], s["expand"] * s["d_model"], s["d_state"]
    conv_dim = di + 2 * s["n_qk_heads"] * n
    gen = torch.Generator().manual_seed(seed)

    def r(*size: int, scale: float = 0.1, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*size, generator=gen) * scale + mean

    t = {"backbone.embedding.weight": r(s["vocab"], d, scale=1.0), "backbone.final_layernorm.weight": r(d, mean=1.0),
         "lm_head.weight": r(s["vocab"], d)}
    for i in range(s["n_layer"]):
        p = f"backbone.layers.{i}."
        t |= {
            p + "input_layernorm.weight": r(d, mean=1.0), p + "post_attention_layernorm.weight": r(d, mean=1.0),
            p + "mixer.in_proj.weight": r(2 * di + 2 * s["n_qk_heads"] * n + s["n_v_heads"], d, scale=0.2),
            p + "mixer.z_bias": r(di), p + "mixer.conv1d.weight": r(conv_dim, 1, s["d_conv"], scale=0.4),
            p + "mixer.conv1d.bias": r(conv_dim), p + "mixer.D": r(s["n_v_heads"], mean=1.0),
            p + "mixer.out_proj.weight": r(d, di, scale=0.2),
            p + "mlp.gate_proj.weight": r(s["ffn"], d), p + "mlp.up_proj.weight": r(s["ffn"], d), p + "mlp.down_proj.weight": r(d, s["ffn"]),
        }
    return t


def llamba_checkpoint(root: Path, *, seed: int = 0, **shape: int) -> dict[str, torch.Tensor]:
    s = {**LLAMBA_SHAPE, **shape}
    tensors = llamba_tensors(seed, **shape)
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / "model.safetensors"))
    config = {
        "d_model": s["d_model"], "n_layer": s["n_layer"], "vocab_size": s["vocab"], "tie_embeddings": False,
        "pad_vocab_size_multiple": 8, "lm_head_bias": False, "norm_epsilon": 1e-5,
        "mlp_cfg": {"intermediate_size": s["ffn"], "bias": False, "act_fn": "silu"},
        "ssm_cfg": {"d_state": s["d_state"], "n_v_heads": s["n_v_heads"], "n_qk_heads": s["n_qk_heads"], "expand": s["expand"],
                    "chunk_size": 16, "activation": "identity", "bias": False},
    }
    (root / "config.json").write_text(json.dumps(config))
    write_tokenizer(root)
    return tensors


class RangeServer:
    """Serves one blob on 127.0.0.1 with HTTP Range support, and records what it was asked;
    `cut_after` drops the connection part-way once, `extra` bytes follow the blob (a body
    longer than the file pinned)."""

    def __init__(self, blob: bytes, *, cut_after: int | None = None, extra: bytes = b"") -> None:
        self.blob, self.cut_after, self.extra, self.ranges = blob, cut_after, extra, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                rng = self.headers.get("Range")
                server.ranges.append(rng)
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                body = server.blob[start:] + server.extra
                self.send_response(206 if rng else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.cut_after is not None:  # the connection drops part-way, once
                    body, server.cut_after = body[: server.cut_after], None
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/llm_fake-0.1-py3-none-any.whl"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
