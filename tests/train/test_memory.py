"""Training memory (issue 36, part 0): `laplace finetune` on the default model was killed at
24.3 GB. Per-block recompute keeps a fraction of the activations for backward with the same
gradients; the defaults fit 4 GB by arithmetic (the measured number is `laplace bench
finetune-memory`); a run that would not fit is refused before it starts, in one line; the
optimizer split names the model's own matrices."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from agent.runtime.config import PRESETS, LaplaceConfig
from agent.runtime.model import build_model
from agent.train.config import TrainConfig, TrainConfigError
from agent.train.loop import Trainer
from agent.train.memory import default_micro_batch, enable_recompute, estimate_peak_bytes
from agent.train.optim import split_parameters

WINDOW = LaplaceConfig(name="w", vocab_size=264, d_model=32, n_layers=3, n_heads=4, head_k_dim=8, head_v_dim=8, ffn_dim=48,
                       chunk_size=8, norm_eps=1e-5, mixer="window", window=16, sinks=2, gla_branch=True, n_kv_heads=2)


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits, _ = model(ids[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def _saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes autograd keeps for backward during one forward (inside a checkpointed block the
    checkpoint's own hooks take the tensors, so this counts what really stays)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _loss(model, ids)
    return total


def test_recompute_gives_the_same_loss_and_gradients_and_keeps_the_state_dict() -> None:
    ids = torch.randint(0, 264, (2, 41), generator=torch.Generator().manual_seed(0))
    plain = build_model(WINDOW, seed=1).train()
    again = build_model(WINDOW, seed=1).train()
    keys = list(again.state_dict())
    assert enable_recompute(again) == WINDOW.n_layers
    assert list(again.state_dict()) == keys  # checkpoints load into the plain model
    a, b = _loss(plain, ids), _loss(again, ids)
    a.backward()
    b.backward()
    assert torch.allclose(a, b)
    for (n, p), q in zip(plain.named_parameters(), again.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-5), n


def test_recompute_keeps_a_fraction_of_the_activations() -> None:
    """The regression: without recompute every layer's window scores stay for backward."""
    ids = torch.randint(0, 264, (2, 65), generator=torch.Generator().manual_seed(0))
    plain = build_model(WINDOW, seed=1).train()
    lean = build_model(WINDOW, seed=1).train()
    enable_recompute(lean)
    assert _saved_bytes(lean, ids) * 4 < _saved_bytes(plain, ids)


def _default_model_estimate(*, micro: int, recompute: bool, seq_len: int = 1024):
    c = PRESETS["smollm2-135m-window"]
    model = build_model(c, device="meta")
    n = sum(p.numel() for p in model.parameters())
    muon = split_parameters(model).muon_numel
    return estimate_peak_bytes(c, n_params=n, trainable=n, muon=muon, seq_len=seq_len, micro=micro, recompute=recompute)


def test_default_options_on_the_default_model_fit_4_gb_and_the_old_ones_did_not() -> None:
    old = _default_model_estimate(micro=4, recompute=False)  # the run killed at 24.3 GB
    assert old.total > 16 * 2**30
    micro = default_micro_batch(4, lambda m: _default_model_estimate(micro=m, recompute=True))
    assert micro == 1
    assert _default_model_estimate(micro=micro, recompute=True).total < 4 * 2**30


def test_a_tiny_model_still_trains_the_whole_step_in_one_pass(tmp_path: Path, text_dir: Path) -> None:
    t = Trainer(TrainConfig(data=(str(text_dir),), out=str(tmp_path / "o"), base="tiny", steps=1, seq_len=32, batch_tokens=128))
    t.run()
    assert t.micro == 4


def test_a_run_that_does_not_fit_is_refused_before_reading_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAPLACE_TRAIN_MEMORY_GB", "0.05")
    cfg = TrainConfig(data=(str(tmp_path / "missing.txt"),), out=str(tmp_path / "o"), base="tiny", steps=1, seq_len=512,
                      batch_tokens=2048, micro_batch=4, recompute=False)
    with pytest.raises(TrainConfigError, match=r"needs ~.* GB .* but 0\.0 GB is available; way out: drop --no-recompute, or --micro-batch 1"):
        Trainer(cfg).run()  # the data file does not exist: the memory check came first
    assert not (tmp_path / "o").exists()


def test_cli_says_in_one_line_that_it_does_not_fit(tmp_path: Path, text_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli import app

    monkeypatch.setenv("LAPLACE_TRAIN_MEMORY_GB", "0.05")
    r = CliRunner().invoke(app, ["finetune", str(text_dir), "-m", "tiny", "--out", str(tmp_path / "o"), "--steps", "1",
                                 "--seq-len", "512", "--batch-tokens", "2048", "--no-recompute"])
    assert r.exit_code != 0
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "GB is available" in lines[0] and "--no-recompute" in lines[0], r.output


def test_the_split_names_the_default_models_matrices() -> None:
    text = split_parameters(build_model(PRESETS["smollm2-135m-window"], device="meta")).describe()
    muon, adamw = text.splitlines()
    assert "in 210 block matrices" in muon
    for role in ("attn.q_proj [576x576] x30", "attn.k_proj [192x576] x30", "attn.v_proj", "attn.o_proj", "ffn.w1 [1536x576] x30",
                 "ffn.w2", "ffn.w3"):
        assert role in muon, role
    for role in ("embed [49152x576]", "attn.gla_branch.q_map [9x64x64] x30", "attn.gla_branch.decay_weight", "attn_norm", "norm"):
        assert role in adamw, role
    assert "output gate" not in text and "conv" not in text  # roles this model does not have


def test_the_memory_bench_says_when_the_default_model_is_not_built(tmp_path: Path) -> None:
    from agent.bench import registry
    from agent.bench.memory import bench_finetune_memory

    assert "finetune-memory" in registry()
    r = bench_finetune_memory(True, models_dir=str(tmp_path))
    assert "not built" in r["skipped"] and r["rows"] == []


def test_recompute_off_survives_the_torchrun_argv() -> None:
    from agent.train.__main__ import config_to_argv, parse_config

    cfg = TrainConfig(data=("a",), out="o", base="tiny", steps=3, recompute=False, micro_batch=1)
    assert "--recompute" in config_to_argv(cfg)
    assert parse_config(config_to_argv(cfg))[0] == cfg


def test_lora_needs_less_than_full_tuning_and_a_copy_costs_the_weights() -> None:
    from agent.train.memory import estimate_run

    c = PRESETS["smollm2-135m-window"]
    model = build_model(c, device="meta")
    kw = dict(lora_rank=8, lora_targets=("v_proj", "o_proj", "w1", "w2", "w3"), seq_len=1024, micro=1, recompute=True)
    full = estimate_run(model, c, tune="all", muon=True, copied=False, **kw)
    lora = estimate_run(model, c, tune="lora", muon=True, copied=False, **kw)
    assert lora.grads == 4 * 1_981_440 and lora.total < full.total - 2**29  # no grads or optimizer state for frozen weights
    assert estimate_run(model, c, tune="all", muon=True, copied=True, **kw).weights == 2 * full.weights


def test_laplace_bench_passes_the_users_models_dir(tmp_path: Path) -> None:
    from agent.cli import app

    out = tmp_path / "b.json"
    r = CliRunner().invoke(app, ["bench", "finetune-memory", "--quick", "-o", str(out)])
    assert r.exit_code == 0, r.output
    import json

    from agent.settings import Settings

    res = json.loads(out.read_text())["results"]["finetune-memory"]
    assert str(Settings.from_env().models_dir) in res["skipped"]  # the test home has no default model built


def test_the_chunked_loss_equals_the_whole_logits_loss(tmp_path: Path, text_dir: Path, monkeypatch) -> None:
    """The training loss is taken LOSS_CHUNK positions at a time with the logits rebuilt in
    backward: the same sum and the same gradients as one cross-entropy over all logits."""
    monkeypatch.setattr("agent.train.loop.LOSS_CHUNK", 7)  # 30 positions: chunks of 7, 7, 7, 7, 2
    t = Trainer(TrainConfig(data=(str(text_dir),), out=str(tmp_path / "o"), base="tiny", steps=1, seq_len=32, batch_tokens=64))
    t._setup()
    inputs, labels = t.data.rows([0, 1])
    inputs, labels = inputs[:, :30], labels[:, :30].clone()
    labels[0, 3] = -100  # an ignored position inside a chunk
    chunked = t.loss_sum(inputs, labels)
    g_chunked = torch.autograd.grad(chunked, [p for p in t.model.parameters() if p.requires_grad])
    logits, _ = t.model(inputs)
    whole = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    g_whole = torch.autograd.grad(whole, [p for p in t.model.parameters() if p.requires_grad])
    assert torch.allclose(chunked, whole, rtol=1e-5)
    for a, b in zip(g_chunked, g_whole):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
