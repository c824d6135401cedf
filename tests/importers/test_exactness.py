"""Imported checkpoints compute what their source computes: logits within 1e-4 (fp32).

Mamba-2 is checked against transformers' own Mamba2ForCausalLM (a test extra); Llamba
against a deliberately plain reference written here from the published description of
its mixer: one token at a time, no chunking, no shared code with the runtime.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from agent.importers import import_checkpoint
from agent.runtime.generation import EagerRunner
from tests.importers.helpers import LLAMBA_SHAPE, llamba_checkpoint

TOL = 1e-4


def _pieces_then_decode(lm, ids: list[int], split: int) -> torch.Tensor:
    """Logits at every position after `split`: prefill [0, split) in 16-token segments
    (saving and reloading the state between them), then one token at a time."""
    runner = EagerRunner(lm.model, segment_len=16)
    state = None
    out = []
    for start in range(0, split, 16):
        last, state = runner.prefill(ids[start: min(start + 16, split)], state)
        state = type(state).from_bytes(state.to_bytes(fingerprint=lm.fingerprint, architecture=lm.config.architecture()),
                                       config=lm.config, fingerprint=lm.fingerprint)
    out.append(last)
    for t in ids[split:-1]:
        last, state = runner.step(torch.tensor([t]), state)
        out.append(last)
    return torch.cat(out)  # predictions for positions split-1 .. T-2


# ---- Mamba-2: transformers is the reference --------------------------------------------

@pytest.fixture(scope="module")
def mamba2(tmp_path_factory):
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never fetch kernels: the reference runs its PyTorch path
    from tests.importers.helpers import mamba2_checkpoint

    root = tmp_path_factory.mktemp("m2")
    hf = mamba2_checkpoint(root / "src")
    lm = import_checkpoint(root / "src", root / "out", name="m2")
    return hf, lm


def test_mamba2_full_pass_matches_transformers(mamba2) -> None:
    hf, lm = mamba2
    ids = torch.randint(0, 264, (2, 77), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        got, _ = lm.model(ids)
    assert want.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    assert (got - want).abs().max().item() <= TOL


def test_mamba2_pieces_and_decode_match_transformers(mamba2) -> None:
    hf, lm = mamba2
    ids = torch.randint(0, 264, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    got = _pieces_then_decode(lm, ids, split=37)
    assert (got - want[36:-1]).abs().max().item() <= TOL


def test_mamba2_config_maps_the_family_switches(mamba2) -> None:
    _, lm = mamba2
    c = lm.config
    assert (c.mixer, c.n_heads, c.qk_heads, c.head_k_dim, c.head_v_dim, c.ffn_dim) == ("ssd", 8, 2, 16, 16, 0)
    assert c.v_times_dt and c.gate == "rmsnorm" and c.norm_groups == 2 and c.tie_embeddings and not c.qk_scale
    assert lm.model.lm_head is None
    assert lm.card["family"] == "mamba2"


# ---- Llamba: a plain reference from the description -------------------------------------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def llamba_reference(t: dict[str, torch.Tensor], ids: list[int], s: dict[str, int]) -> torch.Tensor:
    """Logits [T, vocab] of Llamba: in_proj -> (xBC, z, a); causal depthwise conv over xBC;
    decay exp(-softplus(a)) per value head; k = B, q = C (shared by groups), v = x, no scale;
    y = C h + D x; out_proj(y * silu(z + z_bias)); then a Llama GLU MLP."""
    d, di, n, hv, hq = s["d_model"], s["expand"] * s["d_model"], s["d_state"], s["n_v_heads"], s["n_qk_heads"]
    p_dim, per_group = di // hv, hv // hq
    x = t["backbone.embedding.weight"][ids]  # [T, d]
    T = len(ids)
    for i in range(s["n_layer"]):
        w = {k[len(f"backbone.layers.{i}."):]: v for k, v in t.items() if k.startswith(f"backbone.layers.{i}.")}
        u = _rms(x, w["input_layernorm.weight"], 1e-5)
        proj = u @ w["mixer.in_proj.weight"].T
        xbc, z, a = proj[:, : di + 2 * hq * n], proj[:, di + 2 * hq * n: 2 * di + 2 * hq * n], proj[:, 2 * di + 2 * hq * n:]
        cw, cb = w["mixer.conv1d.weight"][:, 0, :], w["mixer.conv1d.bias"]
        W = cw.shape[1]
        conv = torch.zeros_like(xbc)
        for tt in range(T):
            for j in range(W):
                src = tt - (W - 1) + j
                if src >= 0:
                    conv[tt] += cw[:, j] * xbc[src]
            conv[tt] += cb
        xs, B, C = conv[:, :di], conv[:, di: di + hq * n], conv[:, di + hq * n:]
        y = torch.zeros(T, di)
        for h in range(hv):
            g = h // per_group
            S = torch.zeros(n, p_dim)
            for tt in range(T):
                xv = xs[tt, h * p_dim:(h + 1) * p_dim]
                S = torch.exp(-F.softplus(a[tt, h])) * S + torch.outer(B[tt, g * n:(g + 1) * n], xv)
                y[tt, h * p_dim:(h + 1) * p_dim] = C[tt, g * n:(g + 1) * n] @ S + w["mixer.D"][h] * xv
        y = y * F.silu(z + w["mixer.z_bias"])
        x = x + y @ w["mixer.out_proj.weight"].T
        h2 = _rms(x, w["post_attention_layernorm.weight"], 1e-5)
        x = x + (F.silu(h2 @ w["mlp.gate_proj.weight"].T) * (h2 @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T
    return _rms(x, t["backbone.final_layernorm.weight"], 1e-5) @ t["lm_head.weight"].T


@pytest.fixture(scope="module")
def llamba(tmp_path_factory):
    root = tmp_path_factory.mktemp("llamba")
    tensors = llamba_checkpoint(root / "src")
    lm = import_checkpoint(root / "src", root / "out", name="llamba")
    return tensors, lm


def test_llamba_full_pass_matches_reference(llamba) -> None:
    tensors, lm = llamba
    ids = torch.randint(0, 264, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        want = llamba_reference(tensors, ids, LLAMBA_SHAPE)
        got, _ = lm.model(torch.tensor([ids]))
    assert want.abs().max() > 1.0
    assert (got[0] - want).abs().max().item() <= TOL


def test_llamba_pieces_and_decode_match_reference(llamba) -> None:
    tensors, lm = llamba
    ids = torch.randint(0, 264, (45,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.no_grad():
        want = llamba_reference(tensors, ids, LLAMBA_SHAPE)
    got = _pieces_then_decode(lm, ids, split=21)
    assert (got - want[20:-1]).abs().max().item() <= TOL


def test_llamba_reordered_rows_matter(tmp_path) -> None:
    """Feeding Llamba's in_proj rows in Mamba-2's order must break the match: the
    reference can tell a wrong conversion from a right one."""
    tensors = llamba_checkpoint(tmp_path / "src", seed=5)
    lm = import_checkpoint(tmp_path / "src", tmp_path / "out", name="l")
    blk = lm.model.blocks[0].attn
    c = lm.config
    with torch.no_grad():  # undo the reorder on layer 0 only
        blk.in_proj.weight.copy_(tensors["backbone.layers.0.mixer.in_proj.weight"])
    ids = list(range(30))
    with torch.no_grad():
        diff = (lm.model(torch.tensor([ids]))[0][0] - llamba_reference(tensors, ids, LLAMBA_SHAPE)).abs().max().item()
    assert diff > 1e-2, c
