"""recipes/answer/mean.py: the factor mean along one run, and the soup of runs from one base."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.delta import DeltaError, delta_weights, read_delta, write_delta
from recipes.answer.mean import main, mean_lora, soup_lora


def _lora(path, seed: int, rank: int, keys=("l0.v", "l0.o"), shape=(12, 10)):
    g = torch.Generator().manual_seed(seed)
    out, inp = shape
    t = {}
    for k in keys:
        t[k + ".lora_A"] = torch.randn(rank, inp, generator=g)
        t[k + ".lora_B"] = torch.randn(out, rank, generator=g)
    write_delta(path, t, "lora")
    return path


def test_soup_is_the_mean_of_the_changes_exactly(tmp_path):
    a = _lora(tmp_path / "a.safetensors", 0, 4)
    b = _lora(tmp_path / "b.safetensors", 1, 3, keys=("l0.v", "l1.q"))
    soup = delta_weights(soup_lora([a, b]), "lora")
    wa, wb = delta_weights(read_delta(a)[0], "lora"), delta_weights(read_delta(b)[0], "lora")
    assert sorted(soup) == ["l0.o", "l0.v", "l1.q"]
    torch.testing.assert_close(soup["l0.v"], (wa["l0.v"] + wb["l0.v"]) / 2)
    torch.testing.assert_close(soup["l0.o"], wa["l0.o"] / 2)  # the run without it changes it by zero
    torch.testing.assert_close(soup["l1.q"], wb["l1.q"] / 2)


def test_soup_rank_keeps_the_best_approximation(tmp_path):
    paths = [_lora(tmp_path / f"{i}.safetensors", i, 4) for i in range(3)]
    full = delta_weights(soup_lora(paths), "lora")["l0.v"].double()
    cut = soup_lora(paths, rank=5)
    assert cut["l0.v.lora_A"].shape == (5, 10) and cut["l0.v.lora_B"].shape == (12, 5)
    u, s, vh = torch.linalg.svd(full)
    best = (u[:, :5] * s[:5]) @ vh[:5]
    torch.testing.assert_close(delta_weights(cut, "lora")["l0.v"].double(), best, atol=1e-4, rtol=1e-4)
    assert soup_lora(paths, rank=100)["l0.v.lora_A"].shape[0] == 12  # no cut below the summed rank


def test_factor_mean_refuses_other_ranks_and_soup_refuses_other_shapes(tmp_path):
    a = _lora(tmp_path / "a.safetensors", 0, 4)
    b = _lora(tmp_path / "b.safetensors", 1, 3)
    with pytest.raises(DeltaError, match="another rank"):
        mean_lora([a, b])
    c = _lora(tmp_path / "c.safetensors", 2, 4, shape=(12, 11))
    with pytest.raises(DeltaError, match="different shapes"):
        soup_lora([a, c])


def test_cli_half_writes_float16_factors(tmp_path, capsys):
    a = _lora(tmp_path / "a.safetensors", 0, 4)
    b = _lora(tmp_path / "b.safetensors", 1, 4)
    out = tmp_path / "soup.safetensors"
    main(["--soup", "--half", "--rank", "6", str(a), str(b), "--out", str(out)])
    tensors, fmt = read_delta(out)
    assert fmt == "lora" and {t.dtype for t in tensors.values()} == {torch.float16}
    assert tensors["l0.v.lora_A"].shape == (6, 10)
    assert "the mean of the deltas of 2 deltas" in capsys.readouterr().out


def test_rank_per_target_cuts_only_the_named_targets_and_one_delta_is_enough(tmp_path, capsys):
    a = _lora(tmp_path / "a.safetensors", 0, 6, keys=("blocks.0.attn.v_proj.weight", "blocks.0.ffn.w1.weight"))
    out = tmp_path / "cut.safetensors"
    main(["--soup", "--rank", "w1=2", str(a), "--out", str(out)])
    cut, full = read_delta(out)[0], read_delta(a)[0]
    assert "the delta cut to rank w1=2" in capsys.readouterr().out
    assert cut["blocks.0.ffn.w1.weight.lora_A"].shape == (2, 10)
    assert cut["blocks.0.attn.v_proj.weight.lora_A"].shape == (6, 10)  # not named: kept whole
    torch.testing.assert_close(delta_weights(cut, "lora")["blocks.0.attn.v_proj.weight"],
                               delta_weights(full, "lora")["blocks.0.attn.v_proj.weight"])
    w = delta_weights(full, "lora")["blocks.0.ffn.w1.weight"].double()
    u, s, vh = torch.linalg.svd(w)
    torch.testing.assert_close(delta_weights(cut, "lora")["blocks.0.ffn.w1.weight"].double(), (u[:, :2] * s[:2]) @ vh[:2],
                               atol=1e-4, rtol=1e-4)
    main(["--soup", "--rank", "3,w1=2", str(a), "--out", str(out)])  # a rank for the rest as well
    assert read_delta(out)[0]["blocks.0.attn.v_proj.weight.lora_A"].shape == (3, 10)


@pytest.mark.parametrize("argv, message", [
    (["--rank", "w9=2"], "names 'w9', which no delta adapts"),
    (["--rank", "w1=0"], "give a rank R >= 1"),
    (["--rank", "=4"], "give a rank R >= 1"),
    ([], "give at least two deltas to mix (or one with --rank"),
])
def test_rank_refuses_what_it_cannot_cut_in_one_line(tmp_path, argv, message):
    a = _lora(tmp_path / "a.safetensors", 0, 4, keys=("blocks.0.ffn.w1.weight",))
    with pytest.raises(SystemExit) as e:
        main(["--soup", *argv, str(a), "--out", str(tmp_path / "x.safetensors")])
    assert message in str(e.value)
    assert not (tmp_path / "x.safetensors").exists()


def test_sum_adds_the_changes_of_deltas_on_other_targets(tmp_path):
    a = _lora(tmp_path / "a.safetensors", 0, 4, keys=("l0.v",))
    b = _lora(tmp_path / "b.safetensors", 1, 3, keys=("l0.q", "l0.v"))
    out = tmp_path / "sum.safetensors"
    main(["--sum", str(a), str(b), "--out", str(out)])
    got = delta_weights(read_delta(out)[0], "lora")
    wa, wb = delta_weights(read_delta(a)[0], "lora"), delta_weights(read_delta(b)[0], "lora")
    torch.testing.assert_close(got["l0.q"], wb["l0.q"])  # not halved, as --soup would
    torch.testing.assert_close(got["l0.v"], wa["l0.v"] + wb["l0.v"])
