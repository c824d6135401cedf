"""`laplace bench llamacpp`: the skip path, the arithmetic, the converter's extraction, and
the random checkpoint laplace imports and runs. None of it needs llama.cpp, except the one
slow test that runs the whole bench at the tiny shape when llama_cpp is importable."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.bench import llamacpp as lc
from agent.cli import app


def test_skipped_without_llama_cpp_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(lc, "llama_cpp_available", lambda: False)
    res = lc.bench_llamacpp(True)
    assert res["skipped"] is True and res["rows"] == []
    assert "pip install 'laplace[llamacpp]'" in res["reason"] and "20 minutes" in res["reason"]
    # From the CLI: exit 0, one clear line, JSON written and marked skipped.
    out = tmp_path / "b.json"
    cli = CliRunner().invoke(app, ["bench", "llamacpp", "--out", str(out)])
    assert cli.exit_code == 0, cli.output
    assert "pip install 'laplace[llamacpp]'" in cli.output
    assert "pip install 'laplace' " not in cli.output  # the summary line too, though rich reads [x] as markup
    assert json.loads(out.read_text())["results"]["llamacpp"]["skipped"] is True


def test_skipped_without_the_converter(monkeypatch, tmp_path):
    monkeypatch.setattr(lc, "llama_cpp_available", lambda: True)
    res = lc.bench_llamacpp(True, converter=tmp_path / "nowhere")
    assert res["skipped"] is True and "convert_hf_to_gguf.py" in res["reason"]

    def offline(into: Path) -> Path:
        raise lc.Skip(f"could not download the llama-cpp-python sdist (offline); {lc.CONVERTER_HINT}")

    monkeypatch.setattr(lc, "fetch_sdist", offline)
    res = lc.bench_llamacpp(True, cache=tmp_path / "cache")
    assert res["skipped"] is True and "pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36" in res["reason"]
    assert not (tmp_path / "cache" / "converter").exists()


def test_cli_shape_is_checked_and_for_llamacpp_only(monkeypatch):
    monkeypatch.setattr(lc, "llama_cpp_available", lambda: False)
    r = CliRunner().invoke(app, ["bench", "decode", "--shape", "tiny"])
    assert r.exit_code == 1 and "--shape applies to the llamacpp benchmark only" in r.output
    r = CliRunner().invoke(app, ["bench", "llamacpp", "--shape", "tiny,warp=9"])
    assert r.exit_code == 1 and "bad shape override" in r.output


def _sdist(path: Path, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_converter_extraction_is_pinned_and_takes_only_the_converter(tmp_path):
    root = lc._SDIST_ROOT
    files = {root + p: b"x" for p in lc._CONVERTER_CHECK}
    files |= {root + "conversion/llama.py": b"x", root + "gguf-py/gguf/quants.py": b"x",
              root + "ggml/src/ggml.c": b"big", root + "models/ggml-vocab-llama-bpe.gguf": b"big",
              "llama_cpp_python-0.3.36/llama_cpp/llama.py": b"x"}
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    digest = _sdist(sdist, files)
    with pytest.raises(lc.Skip, match="not the pinned"):
        lc.extract_converter(sdist, tmp_path / "conv")  # the real pin: this file is not it
    assert not (tmp_path / "conv").exists()
    conv = lc.extract_converter(sdist, tmp_path / "conv", sha256=digest)
    assert lc.converter_ok(conv)
    got = sorted(str(p.relative_to(conv)) for p in conv.rglob("*") if p.is_file())
    assert got == sorted([*lc._CONVERTER_CHECK, "conversion/llama.py", "gguf-py/gguf/quants.py"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no half-written directory left
    # An existing, complete converter is used as it is.
    assert lc.ensure_converter(converter=conv) == conv


def test_median_ratio_and_bandwidth_arithmetic():
    assert lc.median([3.0, 1.0, 2.0]) == 2.0
    assert lc.ratios([2.0, 3.0, 8.0], [1.0, 2.0, 4.0]) == [2.0, 1.5, 2.0]
    with pytest.raises(ValueError):
        lc.ratios([1.0], [1.0, 2.0])
    # 515 MB per token at 61.3 tokens/s against 42 GB/s: 75% of the bound.
    assert lc.share_of_bound(515e6, 61.3, 42e9) == pytest.approx(0.7517, abs=1e-4)
    assert lc.best_bandwidth({"read_Bps": 20e9, "copy_Bps": 30e9}, {"read_Bps": 25e9, "copy_Bps": 28e9}) == {
        "read_Bps": 25e9, "copy_Bps": 30e9}
    # Tied: the embedding is read whole, as the LM head. Untied: one row of it, and the head whole.
    tensors = {"embed": (1000 * 16, 1000), "layer": (500, 5), "norm": (16, 1)}
    assert lc.decode_bytes_per_token(tensors, embed="embed", head=None) == 16000 + 500 + 16
    tensors["head"] = (16000, 1000)
    assert lc.decode_bytes_per_token(tensors, embed="embed", head="head") == 16 + 500 + 16 + 16000
    assert lc.agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (4, None)
    assert lc.agreement([1, 2, 9, 4], [1, 2, 3, 4]) == (3, 2)


def test_apply_bound_fills_both_sides():
    pair = {"rows": [{"runtime": "laplace"}, {"runtime": "llama.cpp"}, {"runtime": "ratio"}],
            "raw": {"bytes_per_token": {"laplace": 100e6, "llama_cpp": 50e6}, "decode_tok_s": {"laplace": 20.0, "llama_cpp": 100.0}}}
    lc.apply_bound(pair, {"read_Bps": 10e9})
    assert [r.get("pct_of_bw_bound") for r in pair["rows"]] == [20.0, 50.0, None]


def test_others_cpu_share():
    # 10 s of wall time on 2 CPUs; 12 CPU-seconds busy, 8 of them our child's: others used 4 of 20.
    assert lc.others_cpu_share((0.0, 100.0, 5.0), (10.0, 112.0, 13.0)) == pytest.approx(0.2 * 2 / (os.cpu_count() or 1))
    assert lc.others_cpu_share((0.0, 100.0, 5.0), (10.0, 105.0, 13.0)) == 0.0


def test_compare_pair_medians_ratios_and_redone_rounds(monkeypatch, tmp_path):
    """compare_pair end to end on fake children: laplace runs at 10, 20, 30 tok/s, llama.cpp
    at 40, 40, 45; one round under load is run again and left out."""
    import numpy as np

    speeds = {"laplace": iter([10.0, 99.0, 20.0, 30.0]), "llama": iter([40.0, 99.0, 40.0, 45.0])}
    busy = iter([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])  # the second round's laplace run is disturbed

    def fake_child(code, spec, workdir, tag):
        side = "laplace" if code is lc.LAPLACE_CHILD else "llama"
        tps = next(speeds[side])
        np.save(spec["logits_out"], np.arange(8, dtype=np.float32) + (0.25 if side == "llama" else 0.0))
        res = {"vocab": 8, "prefill_s": {str(n): n / (10 * tps) for n in spec["lengths"]},
               "decode_s": spec["decode_tokens"] / tps, "tokens": [1, 2, 3, 4] if side == "laplace" else [1, 2, 5, 4],
               "rss": {"peak_kb": 1024 * (100 if side == "laplace" else 50)}, "others_cpu_share": next(busy)}
        if side == "laplace":
            res |= {"tensors": {"embed.weight": [800, 8], "blocks.0.w": [200, 2]}, "params": 250}
        else:
            res |= {"model_bytes": 500, "params": 250}
        return res

    monkeypatch.setattr(lc, "run_child", fake_child)
    pair = lc.compare_pair(tmp_path / "model", tmp_path / "m.gguf", gguf_label="F32", rounds=3, lengths=(8, 16),
                           decode_tokens=4, ids=list(range(8)) * 2, bandwidth={"read_Bps": 1000.0}, workdir=tmp_path,
                           redo_wait_s=0)
    lap, cpp, ratio = pair["rows"]
    assert pair["raw"]["rounds_redone"] == [{"round": 1, "others_cpu_share": 0.5}]
    assert lap["decode_tok_s"] == 20.0 and cpp["decode_tok_s"] == 40.0
    assert lap["prefill8_tok_s"] == 200.0 and cpp["prefill16_tok_s"] == 400.0
    assert pair["raw"]["per_round_ratios"]["decode_tok_s"] == [4.0, 2.0, 1.5]
    assert ratio["decode_tok_s"] == "2.00 (4.00 2.00 1.50)" and ratio["peak_rss_MB"].startswith("0.50")
    assert (ratio["greedy_top1"], ratio["first_divergence"], ratio["max_logit_diff"]) == ("3/4", 2, 0.25)
    # 1000 bytes per token (tied), 20 tok/s, 1000 B/s: 2000% of the bound; llama.cpp 500 B at 40 tok/s: the same.
    assert lap["MB_read_per_token"] == 0.0 and lap["pct_of_bw_bound"] == 2000.0 and cpp["pct_of_bw_bound"] == 2000.0


def test_q8_0_bytes():
    assert lc.q8_0_bytes(32) == 34
    assert lc.q8_0_bytes(768 * 1536) == 768 * 1536 // 32 * 34
    # Mamba-2-130M's tied embedding, as llama.cpp stores it in Q8_0: 41.0 MB instead of 154.5 MB in F32.
    assert lc.q8_0_bytes(50288 * 768) == 41_035_008
    with pytest.raises(ValueError):
        lc.q8_0_bytes(33)


def test_parse_shape():
    assert lc.parse_shape(None) == lc.SHAPES["mamba2-130m"]
    assert lc.parse_shape("tiny") == lc.SHAPES["tiny"]
    s = lc.parse_shape("mamba2-130m,d_model=1024,layers=48")
    assert (s["hidden_size"], s["num_hidden_layers"], s["num_heads"]) == (1024, 48, 32)  # heads follow d_model
    with pytest.raises(ValueError, match="unknown shape"):
        lc.parse_shape("mamba3")
    with pytest.raises(ValueError, match="num_heads x head_dim"):
        lc.parse_shape("tiny,num_heads=3")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("llamacpp")
    hf = lc.build_random_checkpoint(root / "hf", "tiny", seed=0)
    return hf, lc.import_checkpoint_dir(hf, root / "models", "bench-tiny")


def test_random_checkpoint_imports_and_runs_like_transformers(tiny_model, tmp_path):
    import torch
    from transformers import Mamba2ForCausalLM

    from agent.runtime.checkpoint import load_model_dir
    from agent.runtime.generation import EagerRunner

    hf, model_dir = tiny_model
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["tie_word_embeddings"] is True
    view = lc.gguf_source_view(hf, tmp_path / "view")  # what llama.cpp's converter sees: no tokenizer
    assert sorted(p.name for p in view.iterdir()) == ["config.json", "model.safetensors"]
    ids = lc.prompt_ids(cfg["vocab_size"], 40)
    ref = Mamba2ForCausalLM.from_pretrained(hf).eval()
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0, -1]
        got, _ = EagerRunner(load_model_dir(model_dir).model).prefill(ids)
    assert torch.allclose(got[0], want, atol=1e-4)


def test_laplace_child_times_and_counts_bytes(tiny_model, tmp_path):
    """The laplace side's child process, on its own: the protocol compare_pair reads."""
    _, model_dir = tiny_model
    ids = lc.prompt_ids(512, 128)
    base = {"ids": ids, "lengths": [64, 128], "decode_tokens": 5, "threads": 2, "model": str(model_dir)}
    fp32 = lc.run_child(lc.LAPLACE_CHILD, {**base, "weights": "fp32", "logits_out": str(tmp_path / "a.npy")}, tmp_path, "fp32")
    assert set(fp32["prefill_s"]) == {"64", "128"} and fp32["decode_s"] > 0 and len(fp32["tokens"]) == 5
    assert fp32["rss"]["peak_kb"] >= fp32["rss"]["loaded_kb"] > 0
    assert lc._laplace_bytes(fp32) == 4 * fp32["params"]  # tied: every fp32 weight, the embedding once
    int8 = lc.run_child(lc.LAPLACE_CHILD, {**base, "weights": "int8", "logits_out": str(tmp_path / "b.npy")}, tmp_path, "int8")
    assert "lm_head.weight" in int8["tensors"] and "embed.weight" not in int8["tensors"]  # the tied head is int8 too
    assert lc._laplace_bytes(int8) < 0.4 * lc._laplace_bytes(fp32)
    assert (tmp_path / "a.npy").is_file() and (tmp_path / "b.npy").is_file()


@pytest.mark.slow
def test_whole_bench_at_the_tiny_shape():
    pytest.importorskip("llama_cpp")
    try:
        lc.ensure_converter()
    except lc.Skip as exc:
        pytest.skip(str(exc))
    res = lc.bench_llamacpp(True, rounds=2, decode_tokens=16)
    assert not res.get("skipped")
    assert [r["runtime"] for r in res["rows"]] == ["laplace", "llama.cpp", "laplace", "llama.cpp", "llama.cpp / laplace",
                                                   "llama.cpp / laplace"]
    for r in res["rows"][:4]:
        assert r["decode_tok_s"] > 0 and r["prefill512_tok_s"] > 0 and r["peak_rss_MB"] > 0 and r["pct_of_bw_bound"] >= 0
    agree = res["pairs"]["fp32_vs_F32"]["agreement"]
    assert agree["identical"] == agree["of"] == 16 and agree["max_abs_logit_diff"] < 1e-3
    assert res["pairs"]["int8_vs_Q8_0"]["gguf_tensor_types"] == ["F32", "Q8_0"]
    assert set(res["quantization_drift"]) == {"fp32_logit_std", "laplace", "llama_cpp", "line"}
