"""`laplace bench llamacpp`: laplace against llama.cpp on the same Mamba-2 checkpoint.

A random Mamba-2 checkpoint of a given shape (transformers' Mamba2ForCausalLM, fixed
seed; the default is Mamba-2-130M's shape) is converted by llama.cpp's own converter to
F32 and Q8_0 GGUFs and imported by laplace. Then, on the same token ids, batch 1 and the
same thread count, each runtime runs in its own child process (so peak RSS is that
process's own VmHWM), alternately (laplace, llama.cpp, laplace, ...), for a number of
rounds: prefill of 512 and 2,048 tokens, and a greedy continuation of 64 tokens from the
512-token prompt, timed as decode. laplace fp32 is paired with llama.cpp F32 and laplace
int8 (LAPLACE_DTYPE=int8: dynamic int8 Linears) with llama.cpp Q8_0. Reported: medians
and per-round ratios (llama.cpp / laplace; above 1 means llama.cpp is faster), peak RSS,
top-1 agreement over the continuation and the largest logit difference at the prompt's
last position, and decode's share of this machine's memory-bandwidth bound.

The bandwidth bound: a batch-1 decode step reads every weight once (the tied embedding
is read whole as the LM head; an untied embedding contributes one row), so
bytes_per_token x tokens/s / read bandwidth is the share of the bound reached. Bytes are
counted at each runtime's dtype: fp32 4 bytes per weight; laplace int8 1 byte per matmul
weight (every Linear and the tied LM head) plus 8 per output channel (scale, zero point),
the int8 embedding table one row, everything else (norms, conv) fp32; GGUF tensors at their stored size
(Q8_0: 34 bytes per block of 32 weights). The read bandwidth is measured in the same run
by summing a buffer far larger than the L3 cache, best of several, on the same threads.
The state the recurrence reads and writes per token (a few MB) is not counted.

llama.cpp is optional: `pip install 'laplace[llamacpp]'` builds llama-cpp-python from
source (~20 minutes, once). The converter is not in that wheel: it is taken from the
matching llama-cpp-python sdist (`pip download --no-deps --no-binary :all:`), checked
against a pinned sha256, and only convert_hf_to_gguf.py, its conversion/ package, gguf-py
and the GPT-NeoX vocabulary file are extracted into the user cache directory. Without
llama-cpp-python (or the converter, e.g. offline) the bench says how to get them and
returns a result marked skipped; it is not an error.

`compare_pair(laplace_dir, gguf_path, ...)` is the reusable part: any laplace model
directory against any GGUF, giving the same rows (the later "shipped default model vs its
teacher's GGUF" row calls it directly).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.importers.download import sha256_of as sha256_file

LLAMA_CPP_PYTHON = "0.3.36"
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI serves it (the sdist the wheel is built from).
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
INSTALL_HINT = (f"pip install 'laplace[llamacpp]' (llama-cpp-python=={LLAMA_CPP_PYTHON}, compiled from source: "
                "about 20 minutes, once)")
CONVERTER_HINT = (f"the converter comes from the llama-cpp-python {LLAMA_CPP_PYTHON} sdist: the bench runs "
                  f"`pip download --no-deps --no-binary :all: llama-cpp-python=={LLAMA_CPP_PYTHON}` (network), checks its "
                  "sha256 and extracts convert_hf_to_gguf.py, conversion/, gguf-py/ and the GPT-NeoX vocabulary into "
                  "the cache; offline, pass --sdist FILE to `python -m agent.bench.llamacpp_cli` once")

# What the converter needs from the sdist, relative to vendor/llama.cpp/.
_SDIST_ROOT = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
_CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/ggml-vocab-gpt-neox.gguf", "LICENSE")
_CONVERTER_CHECK = ("convert_hf_to_gguf.py", "conversion/__init__.py", "conversion/mamba.py", "gguf-py/gguf/__init__.py",
                    "models/ggml-vocab-gpt-neox.gguf")

# transformers Mamba2Config arguments. mamba2-130m is state-spaces/mamba2-130m's shape
# (its 50,277-token GPT-NeoX vocabulary padded to a multiple of 16).
SHAPES: dict[str, dict[str, int]] = {
    "mamba2-130m": dict(hidden_size=768, num_hidden_layers=24, vocab_size=50288, state_size=128, head_dim=64,
                        num_heads=24, n_groups=1, conv_kernel=4, expand=2),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, vocab_size=512, state_size=16, head_dim=16, num_heads=8,
                 n_groups=1, conv_kernel=4, expand=2),
}
_SHAPE_ALIASES = {"d_model": "hidden_size", "layers": "num_hidden_layers", "vocab": "vocab_size", "state": "state_size",
                  "heads": "num_heads", "groups": "n_groups", "conv": "conv_kernel"}

PREFILL_LENGTHS = (512, 2048)
AGREE_TOKENS = 64


class Skip(Exception):
    """llama.cpp or its converter is not available: the bench is skipped, not failed."""


# ---------------------------------------------------------------------------- arithmetic


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def ratios(numer: Sequence[float], denom: Sequence[float]) -> list[float]:
    """Per-round ratios numer[i] / denom[i] (rounds paired as they ran)."""
    if len(numer) != len(denom):
        raise ValueError("ratios need the same number of rounds on both sides")
    return [n / d for n, d in zip(numer, denom)]


def q8_0_bytes(n_weights: int) -> int:
    """GGUF Q8_0: blocks of 32 weights, each 32 int8 + one fp16 scale = 34 bytes."""
    if n_weights % 32:
        raise ValueError("Q8_0 rows hold whole blocks of 32 weights")
    return n_weights // 32 * 34


def decode_bytes_per_token(tensors: dict[str, tuple[int, int]], *, embed: str, head: str | None) -> int:
    """Weight bytes a batch-1 decode step reads. tensors: name -> (bytes, rows). Every
    tensor is read once, except an embedding with a separate LM head, of which one row is."""
    total = sum(b for b, _ in tensors.values())
    if head is not None and head in tensors and embed in tensors:
        b, rows = tensors[embed]
        total -= b - b // rows
    return total


def share_of_bound(bytes_per_token: float, tokens_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """Fraction of the memory-bandwidth bound: bytes actually streamed per second over the bandwidth."""
    return bytes_per_token * tokens_per_s / bandwidth_bytes_per_s


def agreement(a: Sequence[int], b: Sequence[int]) -> tuple[int, int | None]:
    """(identical tokens position by position, index of the first divergence or None)."""
    same = sum(int(x == y) for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return same, first


def parse_shape(spec: str | dict[str, int] | None) -> dict[str, int]:
    """A shape from SHAPES by name, optionally with overrides: "mamba2-130m", "tiny",
    "mamba2-130m,layers=48,d_model=1024" or "d_model=512,layers=8" (on mamba2-130m)."""
    if isinstance(spec, dict):
        return dict(spec)
    parts = [p.strip() for p in (spec or "mamba2-130m").split(",") if p.strip()]
    base = "mamba2-130m"
    if parts and "=" not in parts[0]:
        base = parts.pop(0)
    if base not in SHAPES:
        raise ValueError(f"unknown shape {base!r}; choose from {', '.join(SHAPES)} (then key=value overrides)")
    shape = dict(SHAPES[base])
    for p in parts:
        key, sep, value = p.partition("=")
        key = _SHAPE_ALIASES.get(key.strip(), key.strip())
        if not sep or key not in shape:
            raise ValueError(f"bad shape override {p!r}; keys: {', '.join(sorted(set(shape) | set(_SHAPE_ALIASES)))}")
        shape[key] = int(value)
    d_inner = shape["expand"] * shape["hidden_size"]
    if "head_dim" in shape and not any(p.split("=")[0].strip() in ("num_heads", "heads") for p in parts):
        shape["num_heads"] = d_inner // shape["head_dim"]
    if shape["num_heads"] * shape["head_dim"] != d_inner:
        raise ValueError(f"num_heads x head_dim must equal expand x d_model ({d_inner})")
    return shape


# ---------------------------------------------------------------------------- availability


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def default_cache_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("laplace", appauthor=False)) / f"llama.cpp-{LLAMA_CPP_PYTHON}"


def converter_ok(root: Path) -> bool:
    return all((root / p).exists() for p in _CONVERTER_CHECK)


def extract_converter(sdist: Path, dest: Path, *, sha256: str = SDIST_SHA256) -> Path:
    """Check the sdist's sha256, then extract only the converter's parts into `dest`
    (written beside it and renamed into place, so a failure leaves nothing)."""
    got = sha256_file(sdist)
    if got != sha256:
        raise Skip(f"{sdist} has sha256 {got}, not the pinned {sha256}; remove it and fetch it again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = []
            for m in tar:
                if not m.name.startswith(_SDIST_ROOT):
                    continue
                rel = m.name[len(_SDIST_ROOT):]
                if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in _CONVERTER_PARTS) and (m.isfile() or m.isdir()):
                    if "__pycache__" in rel or ".." in Path(rel).parts:
                        continue
                    m.name = rel
                    members.append(m)
            tar.extractall(tmp, members=members, filter="data")
        if not converter_ok(tmp):
            raise Skip(f"{sdist} does not hold llama.cpp's converter where expected ({_SDIST_ROOT})")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def fetch_sdist(into: Path) -> Path:
    """The pinned sdist via pip (the registry's own client); raises Skip when pip cannot get it."""
    into.mkdir(parents=True, exist_ok=True)
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not (into / name).is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(into)]
        print(f"  fetching llama.cpp's converter: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        try:
            out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Skip(f"could not download the llama-cpp-python sdist ({exc}); {CONVERTER_HINT}") from None
        if out.returncode != 0 or not (into / name).is_file():
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise Skip(f"could not download the llama-cpp-python sdist ({last}); {CONVERTER_HINT}")
    return into / name


def ensure_converter(*, converter: Path | None = None, sdist: Path | None = None, cache: Path | None = None) -> Path:
    """A llama.cpp source directory with the converter: `converter` if given, else the
    cache, filled from `sdist` or from pip download."""
    if converter is not None:
        if not converter_ok(converter):
            raise Skip(f"{converter} lacks part of the converter (needs {', '.join(_CONVERTER_CHECK)})")
        return converter
    cache = cache or default_cache_dir()
    conv = cache / "converter"
    if converter_ok(conv):
        return conv
    if sdist is not None:
        return extract_converter(sdist, conv)
    fetched = fetch_sdist(cache / "sdist")
    conv = extract_converter(fetched, conv)
    shutil.rmtree(fetched.parent, ignore_errors=True)  # 77 MB, of which the converter is 4
    return conv


def skipped(reason: str) -> dict[str, Any]:
    """The result of a skipped run; the summary line is escaped for rich (bench's report
    prints summaries as markup, where [llamacpp] would be a tag and vanish)."""
    from rich.markup import escape

    line = f"llamacpp skipped: {reason}"
    return {"skipped": True, "reason": reason, "rows": [], "summary": {"skipped": escape(line)}}


# ---------------------------------------------------------------------------- the checkpoint


def build_random_checkpoint(root: Path, shape: dict[str, int] | str | None = None, *, seed: int = 0) -> Path:
    """A random Mamba2ForCausalLM (tied embeddings) saved with save_pretrained at `root`,
    with a byte-level tokenizer.json for laplace's importer. Returns root."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from agent.runtime.tokenizer import byte_level_tokenizer

    s = parse_shape(shape)
    torch.manual_seed(seed)
    cfg = Mamba2Config(**s, chunk_size=256, tie_word_embeddings=True)
    model = Mamba2ForCausalLM(cfg).eval()
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root)
    tok = byte_level_tokenizer()
    if tok.vocab_size > s["vocab_size"]:
        raise ValueError(f"vocab_size must be at least {tok.vocab_size} (the byte-level tokenizer's)")
    tok.save(root / "tokenizer.json")
    return root


def gguf_source_view(hf: Path, view: Path) -> Path:
    """The checkpoint as llama.cpp's converter should see it: config and weights only.

    Without tokenizer files the converter writes the GPT-NeoX vocabulary it ships (as it
    does for state-spaces/mamba2-*, which have none); with a tokenizer.json it would take
    its BPE path, which refuses any pre-tokenizer whose hash it does not know. Token ids
    are fed to both runtimes directly, so the two vocabularies never meet."""
    view.mkdir(parents=True, exist_ok=True)
    for f in hf.iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors" or f.name.endswith(".safetensors.index.json"):
            (view / f.name).symlink_to(f.resolve())
    return view


def convert_to_gguf(converter: Path, src: Path, out: Path, outtype: str) -> Path:
    """llama.cpp's convert_hf_to_gguf.py (its vendored gguf-py), in this interpreter."""
    cmd = [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(src), "--outtype", outtype, "--outfile", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=str(converter))
    if res.returncode != 0 or not out.is_file():
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"llama.cpp's converter failed on {src} ({outtype}):\n{tail}")
    return out


def import_checkpoint_dir(hf: Path, models_dir: Path, name: str) -> Path:
    """`laplace import` semantics through the importer API; returns the model directory."""
    from agent.importers import import_checkpoint

    lm = import_checkpoint(hf, models_dir / name, name=name, plain_template=True, source_label=f"random {name}")
    assert lm.path is not None
    return Path(lm.path)


_GGUF_TENSORS = r"""
import json, sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1], "r")
print(json.dumps({t.name: [int(t.n_bytes), int(t.shape[-1]) if len(t.shape) > 1 else 1, t.tensor_type.name] for t in r.tensors}))
"""


def gguf_tensors(converter: Path | None, gguf: Path) -> dict[str, tuple[int, int, str]] | None:
    """name -> (bytes, rows, type) of a GGUF's tensors, read with the converter's gguf-py."""
    if converter is None:
        return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(converter / "gguf-py"), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-c", _GGUF_TENSORS, str(gguf)], check=False, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return None
    return {k: (v[0], v[1], v[2]) for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}


# ---------------------------------------------------------------------------- the children

_COMMON = r"""
import json, sys, time
import numpy as np

def kb(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])

spec = json.loads(open(sys.argv[1]).read())
ids, lengths, n_decode, threads = spec["ids"], spec["lengths"], spec["decode_tokens"], spec["threads"]
rss = {"start_kb": kb("VmRSS")}
"""

LAPLACE_CHILD = _COMMON + r"""
import torch
torch.set_num_threads(threads)
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.generation import EagerRunner
rss["imported_kb"] = kb("VmRSS")
lm = load_model_dir(spec["model"], quant="int8" if spec["weights"] == "int8" else None, decode_layout=True)  # as chat loads
rss["loaded_kb"] = kb("VmRSS")
model = lm.model
tensors = {}
for mname, m in model.named_modules():
    if isinstance(m, torch.ao.nn.quantized.dynamic.Linear):
        w = m.weight()
        tensors[mname + ".weight"] = (w.numel() + 8 * w.shape[0], w.shape[0])
        if m.bias() is not None:
            tensors[mname + ".bias"] = (4 * m.bias().numel(), 1)
for pname, p in [*model.named_parameters(), *model.named_buffers()]:
    if pname == "embed.weight" and "lm_head.weight" in tensors:
        continue  # an int8 table (its rows) beside the int8 head that reads it: one row a step
    tensors[pname] = (p.numel() * p.element_size(), p.shape[0] if p.dim() > 1 else 1)
runner = EagerRunner(model)
res = {"vocab": model.config.vocab_size, "tensors": tensors, "params": sum(p.numel() for p in model.parameters())}
with torch.inference_mode():
    logits, state = runner.prefill(ids[:64])  # warm thread pools and the allocator
    tok = logits.argmax(-1)
    for _ in range(4):
        logits = runner.step_(tok, state)
    rss["warm_kb"] = kb("VmRSS")
    prefill = {}
    for i, n in enumerate(lengths):
        t = time.perf_counter()
        logits, state = runner.prefill(ids[:n])
        prefill[str(n)] = time.perf_counter() - t
        rss[f"after_prefill_{n}_kb"] = kb("VmRSS")
        if i == 0:
            np.save(spec["logits_out"], logits[0].float().numpy())
            tok = logits.argmax(-1)
            tokens = []
            t = time.perf_counter()
            for _ in range(n_decode):
                tokens.append(int(tok))
                logits = runner.step_(tok, state)  # the decode loop's form: the state written in place
                tok = logits.argmax(-1)
            decode = time.perf_counter() - t
rss["peak_kb"] = kb("VmHWM")
res.update(prefill_s=prefill, decode_s=decode, tokens=tokens, rss=rss)
print(json.dumps(res))
"""

LLAMA_CHILD = _COMMON + r"""
import llama_cpp
from llama_cpp import Llama
rss["imported_kb"] = kb("VmRSS")
llm = Llama(model_path=spec["model"], n_threads=threads, n_threads_batch=threads, n_ctx=max(lengths) + n_decode + 64,
            n_batch=512, n_ubatch=512, logits_all=False, verbose=False)
rss["loaded_kb"] = kb("VmRSS")
n_vocab = llm.n_vocab()

def last_logits():
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))

res = {"vocab": n_vocab, "model_bytes": int(llama_cpp.llama_model_size(llm.model)),
       "params": int(llama_cpp.llama_model_n_params(llm.model))}
llm.reset()
llm.eval(ids[:64])
tok = int(last_logits().argmax())
for _ in range(4):
    llm.eval([tok])
rss["warm_kb"] = kb("VmRSS")
prefill = {}
for i, n in enumerate(lengths):
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids[:n])
    prefill[str(n)] = time.perf_counter() - t
    rss[f"after_prefill_{n}_kb"] = kb("VmRSS")
    if i == 0:
        np.save(spec["logits_out"], last_logits().copy())
        tok = int(last_logits().argmax())
        tokens = []
        t = time.perf_counter()
        for _ in range(n_decode):
            tokens.append(tok)
            llm.eval([tok])
            tok = int(last_logits().argmax())
        decode = time.perf_counter() - t
rss["peak_kb"] = kb("VmHWM")
res.update(prefill_s=prefill, decode_s=decode, tokens=tokens, rss=rss)
print(json.dumps(res))
"""

_BANDWIDTH_CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
n = int(sys.argv[2]) // 4
x = torch.ones(n)
y = torch.empty_like(x)
def best(fn, k=7):
    fn()
    times = []
    for _ in range(k):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)
read = min(best(lambda: x.sum()), best(lambda: torch.dot(x, x)))
copy = best(lambda: y.copy_(x))
print(json.dumps({"read_Bps": 4 * n / read, "copy_Bps": 2 * 4 * n / copy, "buffer_bytes": 4 * n}))
"""


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("LAPLACE_DTYPE", None)  # the child is told its weights explicitly
    return env


def run_child(code: str, spec: dict[str, Any], workdir: Path, tag: str) -> dict[str, Any]:
    spec_path = workdir / f"{tag}.json"
    spec_path.write_text(json.dumps(spec))
    before = _cpu_counters()
    out = subprocess.run([sys.executable, "-c", code, str(spec_path)], check=False, capture_output=True, text=True,
                         env=_child_env(spec["threads"]))
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-6:]) or "no output"
        raise RuntimeError(f"the {tag} run failed:\n{tail}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "others_cpu_share": others_cpu_share(before, _cpu_counters())}


def _cpu_counters() -> tuple[float, float, float]:
    """(wall s, CPU-seconds busy on the whole machine, CPU-seconds of this process's waited children)."""
    import resource

    busy = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        pass
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), busy, ru.ru_utime + ru.ru_stime


def others_cpu_share(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Share of the machine's CPU time that other processes used while a child ran (0: it
    had the machine to itself; 0.5 on 2 CPUs: one core's worth of someone else's work)."""
    wall, busy, ours = (a - b for a, b in zip(after, before))
    return max(0.0, (busy - ours) / (wall * (os.cpu_count() or 1))) if wall > 0 else 0.0


def measure_bandwidth(threads: int, nbytes: int = 2**30) -> dict[str, float]:
    """Read bandwidth (a sum and a dot product over a 1 GiB buffer, 32x this machine's L3;
    the faster, best of 7) and copy bandwidth (bytes read + written), in a child process
    on `threads` threads; bytes/s."""
    out = subprocess.run([sys.executable, "-c", _BANDWIDTH_CHILD, str(threads), str(nbytes)], capture_output=True, text=True,
                         env=_child_env(threads), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    """n token ids drawn uniformly below `vocab`, fixed by the seed."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


# ---------------------------------------------------------------------------- the comparison


def _laplace_bytes(res: dict[str, Any]) -> int:
    t = {k: (v[0], v[1]) for k, v in res["tensors"].items()}
    return decode_bytes_per_token(t, embed="embed.weight", head="lm_head.weight" if "lm_head.weight" in t else None)


def _gguf_bytes(tensors: dict[str, tuple[int, int, str]] | None, res: dict[str, Any]) -> tuple[int, str]:
    if tensors is None:  # no gguf-py at hand: the whole file's tensors (exact when the embedding is tied)
        return res["model_bytes"], "llama_model_size"
    t = {k: (v[0], v[1]) for k, v in tensors.items()}
    return decode_bytes_per_token(t, embed="token_embd.weight", head="output.weight" if "output.weight" in t else None), "gguf"


def compare_pair(laplace_dir: Path | str, gguf_path: Path | str, *, laplace_weights: str = "fp32", gguf_label: str = "",
                 rounds: int = 3, lengths: Sequence[int] = PREFILL_LENGTHS, decode_tokens: int = AGREE_TOKENS,
                 threads: int = 2, ids: Sequence[int] | None = None, bandwidth: dict[str, float] | None = None,
                 converter: Path | None = None, workdir: Path | None = None, max_others: float | None = 0.15,
                 max_redos: int | None = None, redo_wait_s: float = 15.0) -> dict[str, Any]:
    """One laplace model directory against one GGUF: `rounds` alternating rounds of child
    processes (laplace first), medians, per-round ratios (llama.cpp / laplace), agreement
    on the greedy continuation and the prompt's last logits. A round during which other
    processes took more than `max_others` of the machine's CPU is run again, after
    `redo_wait_s`, at most `max_redos` times (default 2 x rounds); then it is kept as it is. Returns {"rows": [laplace,
    llama.cpp, ratio], "raw": ...}. The tokens fed are `ids` (default: random ids below
    the smaller of the two vocabularies, read from the first round)."""
    import numpy as np

    laplace_dir, gguf_path = Path(laplace_dir), Path(gguf_path)
    gguf_label = gguf_label or gguf_path.stem
    lengths = sorted(lengths)
    own_tmp = workdir is None
    work = Path(tempfile.mkdtemp(prefix="laplace-llamacpp-")) if own_tmp else Path(workdir)
    try:
        if ids is None:
            from agent.runtime.checkpoint import read_config

            vocab = read_config(laplace_dir)[0].vocab_size
            ids = prompt_ids(vocab, max(lengths))  # llama.cpp's vocabulary is checked below
        ids = list(ids)[: max(lengths)]
        if len(ids) < max(lengths):
            raise ValueError(f"need {max(lengths)} prompt ids, got {len(ids)}")
        base = {"ids": ids, "lengths": list(lengths), "decode_tokens": decode_tokens, "threads": threads}
        lap_runs: list[dict[str, Any]] = []
        cpp_runs: list[dict[str, Any]] = []
        redone: list[dict[str, Any]] = []
        redos = 2 * rounds if max_redos is None else max_redos
        while len(lap_runs) < rounds:
            r = len(lap_runs)
            tag = f"{laplace_weights}-{gguf_label}-r{r}"
            lap = run_child(LAPLACE_CHILD, {**base, "model": str(laplace_dir), "weights": laplace_weights,
                                            "logits_out": str(work / f"laplace-{tag}.npy")}, work, f"laplace-{tag}")
            cpp = run_child(LLAMA_CHILD, {**base, "model": str(gguf_path), "logits_out": str(work / f"llama-{tag}.npy")},
                            work, f"llama-{tag}")
            busy = max(lap["others_cpu_share"], cpp["others_cpu_share"])
            if max_others is not None and busy > max_others and len(redone) < redos:
                redone.append({"round": r, "others_cpu_share": round(busy, 3)})
                print(f"  {laplace_weights} vs {gguf_label}: round {r + 1} ran while other processes took {busy:.0%} of the CPU; "
                      f"running it again in {redo_wait_s:.0f} s", file=sys.stderr, flush=True)
                time.sleep(redo_wait_s)
                continue
            lap_runs.append(lap)
            cpp_runs.append(cpp)
            print(f"  {laplace_weights} vs {gguf_label}: round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
        if max(ids) >= cpp_runs[0]["vocab"]:
            raise ValueError(f"prompt ids reach {max(ids)}, beyond llama.cpp's vocabulary of {cpp_runs[0]['vocab']}")
        tag0 = f"{laplace_weights}-{gguf_label}-r0"
        lap_logits = np.load(work / f"laplace-{tag0}.npy")
        cpp_logits = np.load(work / f"llama-{tag0}.npy")
        n = min(lap_logits.shape[0], cpp_logits.shape[0])  # GGUF vocabularies may be padded
        max_diff = float(np.abs(lap_logits[:n] - cpp_logits[:n]).max())
        agree_n = min(AGREE_TOKENS, decode_tokens)
        same, first = agreement(lap_runs[0]["tokens"][:agree_n], cpp_runs[0]["tokens"][:agree_n])
        stable = all(run["tokens"] == lap_runs[0]["tokens"] for run in lap_runs) and all(
            run["tokens"] == cpp_runs[0]["tokens"] for run in cpp_runs)
    finally:
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)

    if bandwidth is None:  # before and after: the machine is shared; the bound uses the faster
        bandwidth = best_bandwidth(measure_bandwidth(threads), measure_bandwidth(threads))
    gguf_t = gguf_tensors(converter, gguf_path)
    lap_bytes = _laplace_bytes(lap_runs[0])
    cpp_bytes, cpp_bytes_from = _gguf_bytes(gguf_t, cpp_runs[0])
    def side(runs: list[dict[str, Any]], runtime: str, weights: str, nbytes: int) -> tuple[dict[str, Any], dict[str, list[float]]]:
        per = {f"prefill{L}_tok_s": [L / run["prefill_s"][str(L)] for run in runs] for L in lengths}
        per["decode_tok_s"] = [decode_tokens / run["decode_s"] for run in runs]
        per["peak_rss_MB"] = [run["rss"]["peak_kb"] / 1024 for run in runs]
        row: dict[str, Any] = {"runtime": runtime, "weights": weights}
        row.update({k: round(median(v), 1) for k, v in per.items()})
        row["MB_read_per_token"] = round(nbytes / 1e6, 1)
        row["pct_of_bw_bound"] = None  # set by apply_bound
        return row, per

    lap_row, lap_per = side(lap_runs, "laplace", laplace_weights, lap_bytes)
    cpp_row, cpp_per = side(cpp_runs, "llama.cpp", gguf_label, cpp_bytes)
    ratio_row: dict[str, Any] = {"runtime": "llama.cpp / laplace", "weights": f"{gguf_label} / {laplace_weights}"}
    per_round: dict[str, list[float]] = {}
    for key in lap_per:
        rs = ratios(cpp_per[key], lap_per[key])
        per_round[key] = [round(x, 3) for x in rs]
        ratio_row[key] = f"{median(rs):.2f} ({' '.join(f'{x:.2f}' for x in rs)})"
    ratio_row["greedy_top1"] = f"{same}/{agree_n}"
    ratio_row["first_divergence"] = "-" if first is None else first
    ratio_row["max_logit_diff"] = max_diff
    pair = {
        "rows": [lap_row, cpp_row, ratio_row],
        "raw": {
            "decode_tok_s": {"laplace": median(lap_per["decode_tok_s"]), "llama_cpp": median(cpp_per["decode_tok_s"])},
            "laplace": lap_runs, "llama_cpp": cpp_runs, "per_round_ratios": per_round, "rounds_redone": redone,
            "agreement": {"identical": same, "of": agree_n, "first_divergence": first, "max_abs_logit_diff": max_diff,
                          "logits_compared": n, "tokens_stable_across_rounds": stable,
                          "laplace_tokens": lap_runs[0]["tokens"], "llama_cpp_tokens": cpp_runs[0]["tokens"]},
            "bytes_per_token": {"laplace": lap_bytes, "llama_cpp": cpp_bytes, "llama_cpp_counted_from": cpp_bytes_from},
            "gguf_tensor_types": sorted({v[2] for v in gguf_t.values()}) if gguf_t else None,
        },
    }
    return apply_bound(pair, bandwidth)


def best_bandwidth(*measured: dict[str, float]) -> dict[str, float]:
    """The fastest of several measurements (others' work on a shared machine only slows them)."""
    return {k: max(m[k] for m in measured) for k in measured[0]}


def apply_bound(pair: dict[str, Any], bandwidth: dict[str, float]) -> dict[str, Any]:
    """Fill each side's pct_of_bw_bound from its bytes per token and median decode speed."""
    raw = pair["raw"]
    for row, side in zip(pair["rows"][:2], ("laplace", "llama_cpp")):
        row["pct_of_bw_bound"] = round(100 * share_of_bound(raw["bytes_per_token"][side], raw["decode_tok_s"][side],
                                                            bandwidth["read_Bps"]), 1)
    raw["read_bandwidth_Bps"] = bandwidth["read_Bps"]
    return pair


def bench_llamacpp(quick: bool, *, shape: str | dict[str, int] | None = None, rounds: int = 3, decode_tokens: int = AGREE_TOKENS,
                   threads: int = 2, converter: Path | None = None, sdist: Path | None = None, cache: Path | None = None,
                   seed: int = 0, keep: Path | None = None, max_others: float | None = 0.15) -> dict[str, Any]:
    """The side-by-side bench; `quick` uses the tiny shape. Skipped (not failed) without
    llama-cpp-python or its converter. `keep` keeps the checkpoint, GGUFs and model there."""
    if not llama_cpp_available():
        return skipped(f"llama-cpp-python is not installed; {INSTALL_HINT}")
    missing = [m for m in ("transformers", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        return skipped(f"{', '.join(missing)} not installed (the checkpoint and the converter need them); {INSTALL_HINT}")
    try:
        conv = ensure_converter(converter=converter, sdist=sdist, cache=cache)
    except Skip as exc:
        return skipped(str(exc))
    shape_d = parse_shape(shape if shape is not None else ("tiny" if quick else "mamba2-130m"))
    work = Path(tempfile.mkdtemp(prefix="laplace-bench-llamacpp-", dir=keep)) if keep else Path(tempfile.mkdtemp(prefix="laplace-bench-llamacpp-"))
    try:
        t0 = time.perf_counter()
        hf = build_random_checkpoint(work / "hf", shape_d, seed=seed)
        view = gguf_source_view(hf, work / "hf-for-gguf")
        ggufs = {t: convert_to_gguf(conv, view, work / f"model-{t}.gguf", t) for t in ("f32", "q8_0")}
        model_dir = import_checkpoint_dir(hf, work / "models", "bench-mamba2")
        setup_s = time.perf_counter() - t0
        print(f"  checkpoint built, converted and imported in {setup_s:.0f} s", file=sys.stderr, flush=True)
        load_before = os.getloadavg()
        bandwidth = measure_bandwidth(threads)
        ids = prompt_ids(shape_d["vocab_size"], max(PREFILL_LENGTHS), seed)
        pairs = [compare_pair(model_dir, ggufs["f32"], laplace_weights="fp32", gguf_label="F32", rounds=rounds,
                              decode_tokens=decode_tokens, threads=threads, ids=ids, bandwidth=bandwidth, converter=conv,
                              workdir=work, max_others=max_others),
                 compare_pair(model_dir, ggufs["q8_0"], laplace_weights="int8", gguf_label="Q8_0", rounds=rounds,
                              decode_tokens=decode_tokens, threads=threads, ids=ids, bandwidth=bandwidth, converter=conv,
                              workdir=work, max_others=max_others)]
        bandwidth_after = measure_bandwidth(threads)
        bound = best_bandwidth(bandwidth, bandwidth_after)
        pairs = [apply_bound(p, bound) for p in pairs]
        load_after = os.getloadavg()
        drift = quantization_drift(work, pairs[0]["raw"], pairs[1]["raw"])
        sizes = {p.name: p.stat().st_size for p in (*ggufs.values(), *model_dir.glob("*.safetensors"))}
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    fp32, int8 = pairs
    others = [run["others_cpu_share"] for p in pairs for side in ("laplace", "llama_cpp") for run in p["raw"][side]]
    redone = sum(len(p["raw"]["rounds_redone"]) for p in pairs)
    rows = [fp32["rows"][0], fp32["rows"][1], int8["rows"][0], int8["rows"][1], fp32["rows"][2], int8["rows"][2]]
    agree = {k: p["raw"]["agreement"] for k, p in (("fp32_vs_F32", fp32), ("int8_vs_Q8_0", int8))}
    params = fp32["raw"]["laplace"][0]["params"]
    return {
        "rows": rows,
        "summary": {
            "model": f"random Mamba2ForCausalLM (seed {seed}), {params / 1e6:.1f} M parameters, "
                     + ", ".join(f"{k}={v}" for k, v in shape_d.items()) + ", tied embeddings",
            "setting": f"batch 1, {threads} threads, {rounds} rounds alternating (laplace first), prefill {'/'.join(map(str, PREFILL_LENGTHS))} tokens, "
                       f"greedy decode of {decode_tokens} tokens from the {PREFILL_LENGTHS[0]}-token prompt",
            "read_bandwidth_GBps": f"{bound['read_Bps'] / 1e9:.1f} (before {bandwidth['read_Bps'] / 1e9:.1f}, "
                                   f"after {bandwidth_after['read_Bps'] / 1e9:.1f}; the bound uses the faster)",
            "copy_bandwidth_GBps": round(bound["copy_Bps"] / 1e9, 1),
            "bytes_counted": "weights one decode step reads, at the runtime's dtype (tied embedding whole as LM head; Q8_0 34 B/32 weights; "
                             "laplace int8 1 B/weight + 8 B/row, tied head int8 too)",
            "fp32_greedy_top1": f"{agree['fp32_vs_F32']['identical']}/{agree['fp32_vs_F32']['of']}",
            "fp32_max_logit_diff": agree["fp32_vs_F32"]["max_abs_logit_diff"],
            "int8_greedy_top1": f"{agree['int8_vs_Q8_0']['identical']}/{agree['int8_vs_Q8_0']['of']}",
            "int8_max_logit_diff": agree["int8_vs_Q8_0"]["max_abs_logit_diff"],
            "quantized_vs_own_fp32": drift["line"],
            "others_cpu_share": f"median {median(others):.2f}, max {max(others):.2f} of the machine's CPU time went to other "
                                f"processes while the kept runs ran (0 = quiet; timings from a busy machine are low); "
                                f"{redone} round(s) run again because others took over {max_others if max_others is not None else 1:.0%}; "
                                f"loadavg {load_before[0]:.2f} before, {load_after[0]:.2f} after",
            "setup_s": round(setup_s, 1),
        },
        "quantization_drift": drift,
        "shape": shape_d,
        "bandwidth": {"before": bandwidth, "after": bandwidth_after},
        "file_bytes": sizes,
        "pairs": {"fp32_vs_F32": fp32["raw"], "int8_vs_Q8_0": int8["raw"]},
        "llama_cpp_python": LLAMA_CPP_PYTHON,
    }


def quantization_drift(work: Path, fp32: dict[str, Any], int8: dict[str, Any]) -> dict[str, Any]:
    """Each runtime's quantized logits and greedy tokens against its own fp32 ones: how
    far quantization alone moves this model, the scale for the int8 / Q8_0 agreement."""
    import numpy as np

    ref = np.load(work / "laplace-fp32-F32-r0.npy")
    out: dict[str, Any] = {"fp32_logit_std": float(ref.std())}
    for side, a, b in (("laplace", "fp32-F32", "int8-Q8_0"), ("llama_cpp", "fp32-F32", "int8-Q8_0")):
        prefix = "laplace" if side == "laplace" else "llama"
        x, y = np.load(work / f"{prefix}-{a}-r0.npy"), np.load(work / f"{prefix}-{b}-r0.npy")
        same, first = agreement(fp32[side][0]["tokens"][:AGREE_TOKENS], int8[side][0]["tokens"][:AGREE_TOKENS])
        out[side] = {"max_abs_logit_diff": float(np.abs(x - y).max()), "identical": same, "first_divergence": first}
    n = min(AGREE_TOKENS, len(fp32["laplace"][0]["tokens"]))
    out["line"] = (f"laplace int8 vs fp32 {out['laplace']['identical']}/{n} tokens, max logit diff {out['laplace']['max_abs_logit_diff']:.3g}; "
                   f"llama.cpp Q8_0 vs F32 {out['llama_cpp']['identical']}/{n}, {out['llama_cpp']['max_abs_logit_diff']:.3g} "
                   f"(fp32 logits' std {out['fp32_logit_std']:.3g})")
    return out
