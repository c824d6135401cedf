"""LoRA adapters (`--tune lora`), weight deltas (agent/runtime/delta.py) and `--pack rows`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent.runtime.checkpoint import load_model, load_model_dir
from agent.runtime.delta import DeltaError, apply_delta, read_delta, undo_delta, write_delta
from agent.runtime.model import build_model
from agent.train.config import TrainConfig, TrainConfigError
from agent.train.data import IGNORE_INDEX, Document, pack
from agent.train.lora import LoRALinear, attach_lora, lora_delta, merged_state_dict
from agent.train.loop import LORA_DELTA_FILE, train
from tests.runtime.test_window import window_config


def _models(seed: int = 0):
    """(plain window model, a copy of it with adapters whose B is random, the adapters)."""
    plain = build_model(window_config(), seed=seed).eval()
    tuned = build_model(window_config(), seed=seed).eval()
    adapters = attach_lora(tuned, rank=4, alpha=8.0, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for ad in adapters.values():
            ad.lora_B.copy_(torch.randn(ad.lora_B.shape, generator=gen) * 0.1)
    return plain, tuned, adapters


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, model.new_state(ids.shape[0]))[0]


IDS = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(3))


def test_adapters_start_as_the_base_model_and_freeze_it() -> None:
    plain = build_model(window_config(), seed=0).eval()
    tuned = build_model(window_config(), seed=0).eval()
    adapters = attach_lora(tuned, rank=4, alpha=8.0)
    assert torch.equal(_logits(plain, IDS), _logits(tuned, IDS))  # B starts at zero
    trainable = {n for n, p in tuned.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    names = {n.rsplit(".", 1)[-1] for n in adapters}
    assert names == {"v_proj", "o_proj", "w1", "w2", "w3"}  # q/k stay as the teacher's by default
    assert not isinstance(tuned.blocks[0].attn.q_proj, LoRALinear)


def test_merged_weights_give_the_unmerged_forward() -> None:
    plain, tuned, adapters = _models()
    assert not torch.allclose(_logits(plain, IDS), _logits(tuned, IDS), atol=1e-3)
    merged = build_model(window_config(), device="meta")
    merged.load_state_dict(merged_state_dict(tuned, adapters), strict=True, assign=True)
    torch.testing.assert_close(_logits(merged.eval(), IDS), _logits(tuned, IDS), atol=1e-5, rtol=1e-5)


def test_delta_file_applies_to_the_base_and_changes_outputs(tmp_path: Path) -> None:
    plain, tuned, adapters = _models()
    before = _logits(plain, IDS)
    path = write_delta(tmp_path / "d.safetensors", lora_delta(adapters), "lora")
    tensors, fmt = read_delta(path)
    assert fmt == "lora" and all(k.endswith(("weight.lora_A", "weight.lora_B")) for k in tensors)
    changed = apply_delta(plain, tensors, fmt)
    assert "blocks.0.attn.o_proj.weight" in changed and "blocks.0.attn.q_proj.weight" not in changed
    after = _logits(plain, IDS)
    assert not torch.allclose(before, after, atol=1e-3)
    torch.testing.assert_close(after, _logits(tuned, IDS), atol=1e-5, rtol=1e-5)


def test_add_delta_and_strict_refusals(tmp_path: Path) -> None:
    model = build_model(window_config(), seed=0).eval()
    w = model.state_dict()["blocks.1.ffn.w2.weight"].clone()
    d = torch.full_like(w, 0.5)
    apply_delta(model, {"blocks.1.ffn.w2.weight": d}, "add")
    torch.testing.assert_close(model.state_dict()["blocks.1.ffn.w2.weight"], w + 0.5)
    with pytest.raises(DeltaError, match="no such weight"):
        apply_delta(model, {"blocks.9.ffn.w2.weight": d}, "add")
    with pytest.raises(DeltaError, match="does not fit"):
        apply_delta(model, {"blocks.1.ffn.w2.weight": d.T}, "add")
    with pytest.raises(DeltaError, match="pairs"):
        apply_delta(model, {"blocks.1.ffn.w2.weight.lora_A": torch.zeros(2, 48)}, "lora")
    with pytest.raises(DeltaError, match="format"):
        apply_delta(model, {}, "scale")
    # A refused delta changed nothing, even where its other keys were fine.
    before = model.state_dict()["blocks.1.ffn.w2.weight"].clone()
    with pytest.raises(DeltaError):
        apply_delta(model, {"blocks.1.ffn.w2.weight": d, "nope.weight": d}, "add")
    assert torch.equal(model.state_dict()["blocks.1.ffn.w2.weight"], before)
    path = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(path))  # no format in its header
    with pytest.raises(DeltaError, match="format"):
        read_delta(path)


@pytest.mark.parametrize("fmt", ["add", "lora", "replace"])
def test_undo_delta_takes_a_delta_out_again(tmp_path: Path, fmt: str) -> None:
    model = build_model(window_config(), seed=0).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    key = "blocks.1.ffn.w2.weight"
    gen = torch.Generator().manual_seed(1)
    tensors = ({key: torch.randn(before[key].shape, generator=gen)} if fmt != "lora" else
               {key + ".lora_A": torch.randn(3, before[key].shape[1], generator=gen),
                key + ".lora_B": torch.randn(before[key].shape[0], 3, generator=gen)})
    undo = read_delta(write_delta(tmp_path / "undo.safetensors", undo_delta(model, tensors, fmt), fmt), (fmt,))
    apply_delta(model, tensors, fmt)
    assert not torch.allclose(model.state_dict()[key], before[key], atol=1e-3)
    apply_delta(model, *undo)
    for k, v in model.state_dict().items():  # a replaced weight comes back exactly; an added one up to rounding
        assert torch.equal(v, before[k]) if fmt == "replace" else torch.allclose(v, before[k], atol=1e-6, rtol=0), k


def test_read_delta_names_a_truncated_file_and_a_format_it_was_not_asked_for(tmp_path: Path) -> None:
    path = write_delta(tmp_path / "d.safetensors", {"blocks.0.ffn.w2.weight": torch.ones(4, 4)}, "add")
    with pytest.raises(DeltaError, match=r"metadata format 'add' is not one of replace"):
        read_delta(path, ("replace",))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DeltaError, match="not a readable safetensors file") as err:
        read_delta(path)
    assert str(path) in str(err.value)


def test_pack_rows_starts_every_document_on_a_row() -> None:
    docs = [Document(list(range(1, 6)), [True] * 5), Document(list(range(10, 13)), [False, True, True]),
            Document(list(range(20, 30)), [True] * 10)]
    p = pack(docs, 8, 0, align=True)
    starts = [r[0] for r in p.tokens.tolist()]
    assert starts[:3] == [1, 10, 20]  # a document never shares a row with the end of another
    _, labels = p.rows(torch.arange(len(p)))
    trained = labels[labels != IGNORE_INDEX].tolist()
    assert 0 not in trained  # padding is never a target
    assert 1 not in trained and 20 not in trained  # nor a document's first token (after the padding)
    assert sorted(trained) == sorted([2, 3, 4, 5, 11, 12] + list(range(21, 30)))
    stream = pack(docs, 8, 0)
    assert stream.tokens[1, 0] != 10  # the default keeps streaming across documents


def test_lora_options_are_checked() -> None:
    base = dict(data=("x",), out="o", steps=1, tune="lora")
    with pytest.raises(TrainConfigError, match="lora-targets"):
        TrainConfig(**base, lora_targets="q_proj,nope")
    with pytest.raises(TrainConfigError, match="lora-rank"):
        TrainConfig(**base, lora_rank=0)
    with pytest.raises(TrainConfigError, match="single process"):
        TrainConfig(**base, distributed=True)
    with pytest.raises(TrainConfigError, match="pack"):
        TrainConfig(data=("x",), out="o", steps=1, pack="tight")


def test_finetune_lora_writes_a_small_delta_beside_the_merged_model(tmp_path: Path, chat_file: Path) -> None:
    out = tmp_path / "run"
    s = train(TrainConfig(data=(str(chat_file),), out=str(out), steps=4, seq_len=32, batch_tokens=128, lr=1e-2, warmup=1,
                          tune="lora", lora_rank=2, lora_targets="o_proj,w2", pack="rows"))
    assert s["completed"] and s["tune"] == "lora" and s["muon_parameters"] == 0
    tuned = load_model(str(out))  # the merged model loads as any model directory
    base = load_model("tiny")
    tensors, fmt = read_delta(out / LORA_DELTA_FILE)
    assert fmt == "lora" and len(tensors) == 2 * 2 * base.config.n_layers
    apply_delta(base.model, tensors, fmt)  # base + delta == the merged model, weight for weight
    for k, v in tuned.model.state_dict().items():
        torch.testing.assert_close(base.model.state_dict()[k], v, atol=1e-6, rtol=1e-6)
    plain = load_model("tiny").model.state_dict()
    assert torch.equal(plain["blocks.0.attn.q_proj.weight"], tuned.model.state_dict()["blocks.0.attn.q_proj.weight"])
    assert not torch.equal(plain["blocks.0.attn.o_proj.weight"], tuned.model.state_dict()["blocks.0.attn.o_proj.weight"])
    assert json.loads((out / "config.json").read_text())["card"]["lora"]["rank"] == 2


def test_finetune_lora_resumes_exactly(tmp_path: Path, chat_file: Path) -> None:
    cfg = dict(data=(str(chat_file),), steps=4, seq_len=32, batch_tokens=64, lr=1e-2, warmup=1, tune="lora", lora_rank=2)
    train(TrainConfig(out=str(tmp_path / "whole"), **cfg))
    train(TrainConfig(out=str(tmp_path / "half"), stop_after=2, **cfg))
    train(TrainConfig(out=str(tmp_path / "half"), resume=str(tmp_path / "half"), **cfg))
    whole, _ = read_delta(tmp_path / "whole" / LORA_DELTA_FILE)
    half, _ = read_delta(tmp_path / "half" / LORA_DELTA_FILE)
    for k in whole:
        torch.testing.assert_close(half[k], whole[k], atol=1e-6, rtol=1e-5)
    assert load_model_dir(tmp_path / "half").card["finetune_steps"] == 4


def test_init_lora_starts_from_an_earlier_delta_and_adds_targets(tmp_path: Path, chat_file: Path) -> None:
    cfg = dict(data=(str(chat_file),), seq_len=32, batch_tokens=64, lr=1e-2, warmup=1, tune="lora", lora_rank=2)
    train(TrainConfig(out=str(tmp_path / "first"), steps=2, lora_targets="o_proj,w2", **cfg))
    first, _ = read_delta(tmp_path / "first" / LORA_DELTA_FILE)
    lines: list[str] = []
    train(TrainConfig(out=str(tmp_path / "more"), steps=1, lora_targets="q_proj,o_proj,w2", init_lora=str(tmp_path / "first" / LORA_DELTA_FILE), **cfg),
          on_log=lines.append)
    assert any("adapters from" in line and "start fresh" in line for line in lines)
    more, _ = read_delta(tmp_path / "more" / LORA_DELTA_FILE)
    assert set(first) < set(more) and any(".q_proj." in k for k in more)
    # one step moved the loaded adapters a little from where the first run left them, not back to a fresh start
    k = next(k for k in first if k.endswith("o_proj.weight.lora_B"))
    assert (more[k] - first[k]).abs().max() < first[k].abs().max()
    with pytest.raises(TrainConfigError, match="does not"):  # the delta adapts w2, which this run does not
        train(TrainConfig(out=str(tmp_path / "fewer"), steps=1, lora_targets="o_proj", init_lora=str(tmp_path / "first" / LORA_DELTA_FILE), **cfg))
    with pytest.raises(TrainConfigError, match="rank"):
        train(TrainConfig(out=str(tmp_path / "wide"), steps=1, lora_targets="o_proj,w2", init_lora=str(tmp_path / "first" / LORA_DELTA_FILE),
                          **{**cfg, "lora_rank": 4}))
    with pytest.raises(TrainConfigError, match="tune lora"):
        TrainConfig(data=("x",), out="o", steps=1, init_lora="d.safetensors")


def test_lora_ranks_give_targets_their_own_rank_end_to_end(tmp_path: Path, chat_file: Path) -> None:
    cfg = dict(data=(str(chat_file),), seq_len=32, batch_tokens=64, lr=1e-2, warmup=1, tune="lora", lora_rank=2)
    train(TrainConfig(out=str(tmp_path / "first"), steps=1, lora_targets="o_proj,w2", **cfg))
    lines: list[str] = []
    # q/k adapters of their own rank added to an earlier run's rank-2 ones, which load as they were
    train(TrainConfig(out=str(tmp_path / "qk"), steps=2, lora_targets="q_proj,k_proj,o_proj,w2", lora_ranks="q_proj=6, k_proj=3",
                      init_lora=str(tmp_path / "first" / LORA_DELTA_FILE), **cfg), on_log=lines.append)
    assert any("rank 2, q_proj=6, k_proj=3 on" in line for line in lines)
    tensors, fmt = read_delta(tmp_path / "qk" / LORA_DELTA_FILE)
    rank = {k.split(".")[-3]: v.shape[0] for k, v in tensors.items() if k.endswith(".lora_A")}
    assert rank == {"q_proj": 6, "k_proj": 3, "o_proj": 2, "w2": 2}
    base, tuned = load_model("tiny"), load_model(str(tmp_path / "qk"))
    apply_delta(base.model, tensors, fmt)  # the runtime applies mixed ranks: base + delta == the merged model
    for k, v in tuned.model.state_dict().items():
        torch.testing.assert_close(base.model.state_dict()[k], v, atol=1e-6, rtol=1e-6)
    assert json.loads((tmp_path / "qk" / "config.json").read_text())["card"]["lora"]["ranks"] == rank
    for ranks, said in (("q_proj=0", "TARGET=RANK"), ("q_proj", "TARGET=RANK"), ("w1=4", "does not adapt")):
        with pytest.raises(TrainConfigError, match=said):
            TrainConfig(data=("x",), out="o", steps=1, tune="lora", lora_targets="q_proj,o_proj", lora_ranks=ranks)
    with pytest.raises(TrainConfigError, match="tune lora"):
        TrainConfig(data=("x",), out="o", steps=1, lora_ranks="q_proj=4")
