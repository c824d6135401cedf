"""Llama teachers -> the window hybrid: exactness against transformers (a Hugging Face
directory and a GGUF with Q8_0/Q4_0/Q4_1/F32 tensors, both made here), the windowed path
against the slow reference, the GGUF tokenizer against transformers' own GGUF conversion,
the ChatML template, and refusals that write nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agent.importers import CheckpointError, HybridOptions, import_checkpoint
from agent.runtime.generation import EagerRunner
from agent.runtime.window import naive_forward
from tests.importers.llama_helpers import SMOLLM_TEMPLATE, llama_checkpoint, llama_gguf

TOL = 1e-4
TEXT = ("The library opens at nine; in 2024 it had 1,337 visitors and 12345678 books. Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e "
        "\U0001f600 x=3.14159\n\tdef f(a, b):\n        return a ** 2 + b  # done\n\n")
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 42 times!<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    return root, llama_checkpoint(root / "ckpt")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    model = llama_gguf(root / "tiny.gguf")
    return root / "tiny.gguf", model


def _ids(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (2, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("branch", [False, True], ids=["branch-off", "branch-on"])
def test_hf_llama_equals_transformers_when_the_window_covers_the_sequence(hf_dir, tmp_path, branch):
    root, ref = hf_dir
    lm = import_checkpoint(root / "ckpt", tmp_path / "m", name="m", hybrid=HybridOptions(window=64, sinks=2, gla_branch=branch, chunk_size=16))
    ids = _ids(60, lm.config.vocab_size)
    with torch.no_grad():
        ours, _ = lm.model(ids)
        theirs = ref(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=TOL, atol=TOL)
    # and so does a decode that goes through the ring: prefill in pieces, then token by token
    runner = EagerRunner(lm.model, segment_len=16)
    with torch.inference_mode():
        last, state = runner.prefill(ids[0, :37].tolist())
        outs = [last]
        for t in ids[0, 37:-1].tolist():
            last, state = runner.step(torch.tensor([t]), state)
            outs.append(last)
    torch.testing.assert_close(torch.cat(outs), theirs[0, 36:-1], rtol=TOL, atol=TOL)


def test_untied_hf_llama_keeps_its_head(tmp_path):
    ref = llama_checkpoint(tmp_path / "ckpt", seed=1, tied=False)
    lm = import_checkpoint(tmp_path / "ckpt", tmp_path / "m", name="m", hybrid=HybridOptions(window=32, sinks=0, gla_branch=False))
    assert not lm.config.tie_embeddings and lm.model.lm_head is not None
    ids = _ids(30, lm.config.vocab_size, 1)
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids)[0], ref(ids).logits, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("combine", ["softmax", "gated"])
def test_windowed_import_equals_the_masked_reference(hf_dir, tmp_path, combine):
    root, _ = hf_dir
    lm = import_checkpoint(root / "ckpt", tmp_path / "m", name="m",
                           hybrid=HybridOptions(window=8, sinks=2, combine=combine, chunk_size=16))
    with torch.no_grad():
        for block in lm.model.blocks:  # the branch well away from its (almost-off) init
            block.attn.gla_branch.mix.fill_(0.3)
            block.attn.gla_branch.q_map.add_(torch.randn(block.attn.gla_branch.q_map.shape, generator=torch.Generator().manual_seed(2)))
        ids = _ids(50, lm.config.vocab_size, 2)
        torch.testing.assert_close(lm.model(ids)[0], naive_forward(lm.model, ids), rtol=TOL, atol=TOL)


def test_gguf_equals_transformers_reading_the_same_file(gguf_file, tmp_path):
    from transformers import LlamaForCausalLM

    path, _ = gguf_file
    lm = import_checkpoint(path, tmp_path / "m", name="m", hybrid=HybridOptions(window=64, sinks=4, chunk_size=16))
    ref = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    assert lm.config.architecture() == "window/L2/H4x16/KV2/W64/S4/gla-hedgehog32-softmax"
    assert lm.card["gguf_quants"] == "Q4_1 x8, Q8_0 x5, F32 x5, Q4_0 x2" and lm.config.tie_embeddings
    ids = _ids(60, lm.config.vocab_size, 3)
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids)[0], ref(ids).logits, rtol=TOL, atol=TOL)


def test_gguf_tokenizer_matches_transformers_and_round_trips(gguf_file, tmp_path):
    from transformers import AutoTokenizer

    path, _ = gguf_file
    lm = import_checkpoint(path, tmp_path / "m", name="m")
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = lm.tokenizer
    for text in (TEXT * 8, CHATML, TEXT + CHATML + TEXT):
        assert tok.encode_markup(text) == theirs.encode(text, add_special_tokens=False)
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") != [2]  # typed by a user, a special token is plain text
    assert tok.encode_markup("<|im_end|>") == [2]


def test_gguf_template_is_chatml_with_its_default_system_prompt(gguf_file, tmp_path):
    path, _ = gguf_file
    lm = import_checkpoint(path, tmp_path / "m", name="m")
    t, tok = lm.template, lm.tokenizer
    assert t.roles_text["user"] == ("<|im_start|>user\n", "<|im_end|>\n") and t.reply_open == "<|im_start|>assistant\n"
    assert t.stop_tokens == ("<|im_end|>",) and t.bos == ""
    assert t.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    # an empty system prompt reads as the template's own rendering of a chat without one
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    rendered = ImmutableSandboxedEnvironment().from_string(SMOLLM_TEMPLATE).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ours = t.message(tok, "system", "", first=True) + t.message(tok, "user", "Hi") + t.reply_prefix(tok)
    assert ours == tok.encode_markup(rendered)
    assert tok.decode(t.message(tok, "system", "Be brief.", first=True), skip_special=False) == "<|im_start|>system\nBe brief.<|im_end|>\n"


@pytest.mark.parametrize("case", ["other-arch", "unsupported-quant", "not-gguf", "rope-scaling", "sentencepiece"])
def test_refusals_are_one_line_and_write_nothing(tmp_path, case):
    out = tmp_path / "out"
    if case == "other-arch":
        src = tmp_path / "q.gguf"
        llama_gguf(src, arch="qwen2")
        needle = "'qwen2' GGUF; laplace imports the llama architecture only"
    elif case == "unsupported-quant":
        src = tmp_path / "q.gguf"
        llama_gguf(src, quant="Q5_0")
        needle = "is Q5_0; laplace reads F32, F16, BF16, Q8_0, Q4_0, Q4_1 GGUFs only"
    elif case == "not-gguf":
        src = tmp_path / "x.gguf"
        src.write_bytes(b"not a gguf at all")
        needle = "is a file but not a GGUF"
    elif case == "rope-scaling":
        src = tmp_path / "ckpt"
        llama_checkpoint(src)
        cfg = json.loads((src / "config.json").read_text())
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
        (src / "config.json").write_text(json.dumps(cfg))
        needle = "rope scaling 'llama3' is not supported"
    else:
        src = tmp_path / "q.gguf"
        llama_gguf(src, tok_model="llama")
        needle = "'llama' tokenizer; laplace rebuilds byte-level BPE (gpt2) GGUF tokenizers only"
    with pytest.raises(CheckpointError) as err:
        import_checkpoint(src, out, name="m")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("LAPLACE_TEST_GGUF"), reason="set LAPLACE_TEST_GGUF to a Llama GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
def test_a_real_gguf_equals_transformers(tmp_path):
    """SmolLM2-135M-Instruct (98 MB): 300 tokens of stdlib docstrings through the window
    hybrid with W >= T equal transformers' LlamaForCausalLM on the same file within 1e-4,
    and the tokenizer equals transformers' GGUF tokenizer on text, digits and ChatML."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from recipes.smollm2_hybrid.text import stdlib_text

    path = Path(os.environ["LAPLACE_TEST_GGUF"])
    lm = import_checkpoint(path, tmp_path / "m", name="m", hybrid=HybridOptions(window=512, sinks=4))
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = stdlib_text(8000)
    for piece in (text[:4000], TEXT + CHATML, text[4000:8000]):
        assert lm.tokenizer.encode_markup(piece) == theirs.encode(piece, add_special_tokens=False)
        assert lm.tokenizer.decode(lm.tokenizer.encode(piece)) == piece
    ref = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([lm.tokenizer.encode(text)[:300]])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids)[0], ref(ids).logits, rtol=TOL, atol=TOL)


def test_default_system_is_kept_only_where_a_template_has_one():
    from agent.runtime.templates import SegmentTemplate

    plain = SegmentTemplate(roles_text={"system": ("<s>", "</s>")}, reply_open="")
    assert "default_system" not in plain.to_json()  # older imported templates keep their bytes and fingerprints
    smol = SegmentTemplate(roles_text={"system": ("<s>", "</s>")}, reply_open="", default_system="Be kind.")
    assert SegmentTemplate.from_dict(json.loads(smol.to_json())) == smol
