"""Tokenizer, sampling and generation: determinism, stops, cancellation, batching."""

from __future__ import annotations

import threading

import pytest
import torch

from agent.runtime.checkpoint import load_model
from agent.runtime.device import DeviceUnavailableError, resolve_device
from agent.runtime.generation import EagerRunner, Generation, generate_batch
from agent.runtime.sampling import SamplingOptions, make_generator, sample
from agent.runtime.tokenizer import ChatTemplate, StreamDecoder, byte_level_tokenizer


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny")


@pytest.fixture(scope="module")
def runner(lm):
    return EagerRunner(lm.model, segment_len=32)


def prompt(lm, text="hello there"):
    return lm.template.message(lm.tokenizer, "user", text, first=True) + lm.template.reply_prefix(lm.tokenizer)


def test_byte_tokenizer_round_trips_unicode_and_refuses_injected_specials():
    tok = byte_level_tokenizer()
    text = "naïve ✓ <|end|> \x00 emoji 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.token_id("<|end|>") not in ids  # typed specials stay plain text
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    dec = StreamDecoder(tok)
    cut = tok.encode("✓")[:2]  # an incomplete character is held back until flushed
    assert [dec.push(i) for i in cut] == ["", ""] and dec.flush() == tok.decode(cut)


def test_chat_template_layout():
    tok = byte_level_tokenizer()
    ids = ChatTemplate().message(tok, "user", "hi", first=True)
    assert tok.decode(ids, skip_special=False) == "<|bos|><|user|>hi<|end|>\n"
    with pytest.raises(ValueError, match="unknown role"):
        ChatTemplate().message(tok, "robot", "x")


def test_sampling_is_seeded_and_temperature_zero_is_greedy():
    logits = torch.randn(3, 50)
    a = sample(logits, make_generator(7), temperature=1.0, top_k=10, top_p=0.9)
    b = sample(logits, make_generator(7), temperature=1.0, top_k=10, top_p=0.9)
    assert torch.equal(a, b)
    assert torch.equal(sample(logits, make_generator(1), temperature=0), logits.argmax(-1))


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 30)
    gen = make_generator(0)
    assert torch.equal(sample(logits, gen, temperature=2.0, top_k=1), logits.argmax(-1))
    assert torch.equal(sample(logits, gen, temperature=2.0, top_p=1e-6), logits.argmax(-1))


def test_repetition_penalty_demotes_seen_tokens():
    logits = torch.tensor([[5.0, 4.9, 0.0]])
    hist = torch.tensor([[0]])
    out = sample(logits, make_generator(0), temperature=0, repetition_penalty=2.0, history=hist)
    assert out.item() == 1


def test_sampling_options_validate():
    with pytest.raises(ValueError, match="top_p"):
        SamplingOptions(top_p=2.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingOptions(temperature=-1.0)


def _generate(lm, runner, opts, cancel_after=None):
    logits, state = runner.prefill(prompt(lm))
    cancel = threading.Event()
    gen = Generation(runner, state, logits, opts, stop_ids=lm.template.stop_ids(lm.tokenizer), tokenizer=lm.tokenizer, cancel=cancel)
    out = []
    for tok in gen:
        out.append(tok)
        if cancel_after is not None and len(out) == cancel_after:
            cancel.set()
    return gen, out


def test_same_seed_same_tokens_and_final_state_matches_replay(lm, runner):
    opts = SamplingOptions(temperature=0.9, seed=3, max_new_tokens=12)
    g1, t1 = _generate(lm, runner, opts)
    g2, t2 = _generate(lm, runner, opts)
    assert t1 == t2 and g1.stop_reason == "length" and len(t1) == 12
    state = g1.finish()
    # the state has read exactly prompt + generated tokens: same as a fresh prefill of both
    _, replay = runner.prefill(prompt(lm) + t1)
    torch.testing.assert_close(state.gla, replay.gla, rtol=1e-5, atol=1e-6)
    assert state.n_tokens == replay.n_tokens


def test_cancel_between_tokens_keeps_state_and_tokens_in_agreement(lm, runner):
    g, toks = _generate(lm, runner, SamplingOptions(temperature=0.9, seed=3, max_new_tokens=50), cancel_after=5)
    assert g.stop_reason == "cancelled" and len(toks) == 5
    state = g.finish()
    _, replay = runner.prefill(prompt(lm) + toks)
    torch.testing.assert_close(state.gla, replay.gla, rtol=1e-5, atol=1e-6)


def test_stop_token_ends_the_turn(lm, runner):
    end = lm.template.stop_ids(lm.tokenizer)[0]
    logits, state = runner.prefill(prompt(lm))
    logits = torch.full_like(logits, -1e9)
    logits[0, end] = 0  # the first sample must be the end token
    g = Generation(runner, state, logits, SamplingOptions(temperature=0), stop_ids=[end])
    assert list(g) == [] and g.stop_reason == "stop"


def test_stop_string_ends_generation_and_stays_in_reply(lm, runner):
    """Stop strings are matched in the streamed text (whole characters only, as the client
    sees it), and generation ends at the token that completes the first one."""
    g, free = _generate(lm, runner, SamplingOptions(temperature=0, max_new_tokens=20))
    text = g._sampler.text
    stop = text[3:5]
    g, toks = _generate(lm, runner, SamplingOptions(temperature=0, max_new_tokens=20, stop=(stop,)))
    assert g.stop_reason == "stop_string" and toks == free[:len(toks)]
    assert stop in g._sampler.text and stop not in g._sampler.text[:-len(g.piece) or None]


def test_padded_rows_never_change_real_rows(lm, runner):
    opts = SamplingOptions(temperature=0, max_new_tokens=8)
    a, b = prompt(lm, "first"), prompt(lm, "second prompt")
    solo = generate_batch(runner, [a], opts, widths=(4,))
    pair = generate_batch(runner, [a, b], opts, widths=(4,))
    assert pair[0] == solo[0]
    assert generate_batch(runner, [b], opts, widths=(1,)) == [pair[1]]
    with pytest.raises(ValueError, match="exceed the largest batch width"):
        generate_batch(runner, [a] * 3, opts, widths=(1, 2))


def test_device_resolution_names_what_is_missing():
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="CUDA"):
            resolve_device("cuda")
    with pytest.raises(DeviceUnavailableError, match="torch_neuronx|NeuronCore"):
        resolve_device("neuron")
    with pytest.raises(DeviceUnavailableError, match="unknown device"):
        resolve_device("tpu")


def test_default_segment_is_whole_chunks_for_any_chunk_size() -> None:
    """An imported model's chunk need not divide 512: the default segment rounds up."""
    from agent.runtime.config import PRESETS
    from agent.runtime.generation import DEFAULT_SEGMENT, EagerRunner
    from agent.runtime.model import build_model

    model = build_model(PRESETS["tiny"].replace(chunk_size=48))
    runner = EagerRunner(model)
    assert runner.segment_len % 48 == 0 and DEFAULT_SEGMENT <= runner.segment_len < DEFAULT_SEGMENT + 48
    assert EagerRunner(build_model(PRESETS["tiny"])).segment_len == DEFAULT_SEGMENT
