"""One measurement: llama-bench's command and JSON, a child's peak RSS and timeout, the laplace
child on the bundled demo model (tiny sizes, nothing timed for real), and the Mamba-2 rows'
shapes and checkpoint."""

from __future__ import annotations

import json
import sys

import pytest

from agent.bench import llamacpp_mamba as mamba
from agent.bench import llamacpp_measure as lm
from agent.runtime.checkpoint import PACKAGED_MODELS

P = lm.Protocol(threads=2, prompt=512, gen=128, depth=512)


def _test(n_prompt: int, n_gen: int, n_depth: int, ts: float) -> dict:
    return {"model_filename": "m.gguf", "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "avg_ts": ts,
            "samples_ts": [ts]}


def test_llama_bench_command_is_one_round_of_the_protocol():
    cmd = lm.llama_bench_command(lm.Path("/t/llama-bench"), lm.Path("/m.gguf"), P)
    assert cmd == ["/t/llama-bench", "-m", "/m.gguf", "-t", "2", "-p", "512", "-n", "128", "-d", "512", "-r", "1",
                   "-o", "json"]


def test_parse_llama_bench_takes_pp_and_tg_at_the_depth():
    out = "some log line\n" + json.dumps([_test(512, 0, 512, 949.0), _test(0, 128, 512, 70.9), _test(0, 128, 0, 99.0)])
    assert lm.parse_llama_bench(out, P) == (949.0, 70.9)
    with pytest.raises(lm.MeasureError, match="lacks the pp512 / tg128 @ d512"):
        lm.parse_llama_bench(json.dumps([_test(512, 0, 512, 949.0)]), P)
    with pytest.raises(lm.MeasureError, match="no JSON"):
        lm.parse_llama_bench("error: failed to load model", P)


def test_run_child_reads_the_childs_own_peak_and_stops_a_hung_one():
    code = "x = bytearray(64 * 1024 * 1024); import time; time.sleep(0.3); print('done')"
    run = lm.run_child([sys.executable, "-c", code], env=lm.child_env(1), timeout=60, what="a child")
    assert run.stdout.strip() == "done" and run.peak_kb > 64 * 1024
    with pytest.raises(lm.MeasureError, match="ran past 0 s"):
        lm.run_child([sys.executable, "-c", "import time; time.sleep(30)"], env=lm.child_env(1), timeout=0.3, what="a child")
    with pytest.raises(lm.MeasureError, match=r"a child failed \(exit 4\)"):
        lm.run_child([sys.executable, "-c", "import sys; sys.exit(4)"], env=lm.child_env(1), timeout=60, what="a child")


def test_others_cpu_share():
    # 10 s of wall time on 2 CPUs; 12 CPU-seconds busy, 8 of them our child's: others used 4 of 20.
    assert lm.others_cpu_share((0.0, 100.0, 5.0), (10.0, 112.0, 13.0), cpus=2) == pytest.approx(0.2)
    assert lm.others_cpu_share((0.0, 100.0, 5.0), (10.0, 105.0, 13.0), cpus=2) == 0.0


def test_protocol_is_checked():
    with pytest.raises(ValueError, match="gen must be at least 1"):
        lm.Protocol(gen=0)
    assert lm.Protocol(depth=0).depth == 0


@pytest.mark.parametrize("depth", [0, 16], ids=["no-depth", "depth"])
def test_laplace_child_on_the_demo_model(depth):
    """The real child process, through the runtime's public API, at toy sizes."""
    p = lm.Protocol(threads=1, prompt=16, gen=4, depth=depth)
    m = lm.measure_laplace(PACKAGED_MODELS / "demo", "fp32", p, timeout=120)
    assert m.prefill_tok_s > 0 and m.decode_tok_s > 0 and m.peak_rss_MB > 10


def test_laplace_child_reports_greedy_tokens_and_refuses_unknown_weights(tmp_path):
    from agent.bench import laplace_child

    spec = {"model": str(PACKAGED_MODELS / "demo"), "weights": "int8", "threads": 1, "prompt": 8, "gen": 3, "depth": 8}
    res = laplace_child.measure(spec)
    assert len(res["tokens"]) == 3 and res["peak_kb"] > 0 and res["torch_threads"] == 1
    with pytest.raises(SystemExit, match="weights must be one of fp32, bf16, int8"):
        laplace_child.measure({**spec, "weights": "q4"})
    assert laplace_child.main([]) == 2


def test_the_native_child_runs_without_torch_and_decodes_as_the_torch_child(tmp_path):
    """The torch-free engine's child (`engine: native`) on a small window model: no torch in
    its process, and the same greedy tokens as the torch child from the same ids (fp32)."""
    import subprocess

    from agent.runtime import native
    from agent.runtime.checkpoint import LoadedModel, save_model_dir
    from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
    from tests.runtime.test_window import window_model

    if native.library() is None:
        pytest.skip(native.status())
    d = save_model_dir(LoadedModel(window_model(vocab_size=264, combine="softmax"), byte_level_tokenizer(), ChatTemplate(),
                                   name="w"), tmp_path / "w", card={"name": "w"})
    p = lm.Protocol(threads=1, prompt=12, gen=6, depth=9)
    res = {}
    for engine in ("torch", "native"):
        run = subprocess.run(lm.laplace_command(d, "fp32", p, engine), capture_output=True, text=True, timeout=120,
                             env=lm.child_env(1))
        assert run.returncode == 0, run.stderr
        res[engine] = lm.parse_laplace_child(run.stdout, p)
    assert res["native"]["torch_imported"] is False
    assert res["native"]["tokens"] == res["torch"]["tokens"] and len(res["torch"]["tokens"]) == 6
    run = subprocess.run(lm.laplace_command(d, "int8", p, "native"), capture_output=True, text=True, timeout=120,
                         env=lm.child_env(1))  # no int8 load has written the cache: a one-line refusal
    assert run.returncode != 0 and "the native engine cannot run this: no int8 cache" in run.stderr


def test_parse_shape():
    assert mamba.parse_shape(None) == mamba.SHAPES["mamba2-130m"]
    assert mamba.parse_shape("tiny") == mamba.SHAPES["tiny"]
    s = mamba.parse_shape("mamba2-130m,d_model=1024,layers=48")
    assert (s["hidden_size"], s["num_hidden_layers"], s["num_heads"]) == (1024, 48, 32)  # heads follow d_model
    with pytest.raises(ValueError, match="unknown shape"):
        mamba.parse_shape("mamba3")
    with pytest.raises(ValueError, match="num_heads x head_dim"):
        mamba.parse_shape("tiny,num_heads=3")
    assert mamba.shape_key(mamba.SHAPES["tiny"], 0) != mamba.shape_key(mamba.SHAPES["tiny"], 1)


def test_random_checkpoint_imports_and_runs_like_transformers(tmp_path):
    pytest.importorskip("transformers")
    import torch
    from transformers import Mamba2ForCausalLM

    from agent.runtime.checkpoint import load_model_dir
    from agent.runtime.generation import EagerRunner

    hf = mamba.build_random_checkpoint(tmp_path / "hf", mamba.SHAPES["tiny"], seed=0)
    model_dir = mamba.import_checkpoint_dir(hf, tmp_path / "models" / "t", "bench-tiny")
    view = mamba.gguf_source_view(hf, tmp_path / "view")  # what llama.cpp's converter sees: no tokenizer
    assert sorted(p.name for p in view.iterdir()) == ["config.json", "model.safetensors"]
    ids = list(range(3, 43))
    ref = Mamba2ForCausalLM.from_pretrained(hf).eval()
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0, -1]
        got, _ = EagerRunner(load_model_dir(model_dir).model).prefill(ids)
    assert torch.allclose(got[0], want, atol=1e-4)
