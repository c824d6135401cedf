"""Tokenizers over Hugging Face `tokenizers`, the chat template, and streaming decode.

A model directory ships `tokenizer.json` (any `tokenizers` model, usually byte-level BPE)
and `chat_template.json`. `byte_level_tokenizer()` builds the test tokenizer in code: 256
byte tokens plus the chat special tokens, so tests never need a file or a download.

Special-token strings typed by a user are encoded as plain text (`encode_special_tokens`),
so a message containing "<|end|>" cannot end a turn or forge a role.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

SPECIAL_TOKENS = ["<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|document|>", "<|pad|>", "<|unk|>"]
ROLES = ("system", "user", "assistant", "document")


class Tokenizer:
    """Text <-> token ids for one model."""

    def __init__(self, hf: HFTokenizer) -> None:
        self.hf = hf
        self.hf.encode_special_tokens = True
        self._json: str | None = None  # serialized on first need: 0.1 s for a 50k vocabulary
        self._specials: re.Pattern[str] | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        return cls(HFTokenizer.from_file(str(path)))

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_markup(self, text: str) -> list[int]:
        """Encode template text: special-token strings in it *are* special tokens (unlike
        `encode`, which reads them as plain text so a user cannot forge them)."""
        if self._specials is None:  # built once: the tokenizer never changes
            names = sorted((t.content for t in self.hf.get_added_tokens_decoder().values() if t.special and t.content),
                           key=len, reverse=True)  # longest first, so a longer token wins where two start
            self._specials = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else re.compile("(?!)")
        ids: list[int] = []
        for i, part in enumerate(self._specials.split(text)):  # odd parts are the special tokens
            if i % 2:
                ids.append(self.token_id(part))
            elif part:
                ids += self.encode(part)
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_id(self, token: str) -> int:
        tid = self.hf.token_to_id(token)
        if tid is None:
            raise KeyError(f"tokenizer has no token {token!r}")
        return tid

    def to_json(self) -> str:
        if self._json is None:
            self._json = self.hf.to_str()
        return self._json

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenizes to)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def byte_level_tokenizer() -> Tokenizer:
    """256 byte tokens (id = byte value) + the chat special tokens (ids 256..263)."""
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(SPECIAL_TOKENS)
    return Tokenizer(hf)


@dataclass(frozen=True)
class ChatTemplate:
    """How messages become tokens: `<|role|>content<|end|>` for each message, then
    `<|assistant|>` to prompt a reply, which the model ends with `<|end|>`."""

    role_tokens: dict[str, str] = field(default_factory=lambda: {r: f"<|{r}|>" for r in ROLES})
    end_token: str = "<|end|>"
    bos_token: str = "<|bos|>"
    separator: str = "\n"

    @classmethod
    def load(cls, path: str | Path) -> "ChatTemplate":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(role_tokens=dict(data["role_tokens"]), end_token=data["end_token"], bos_token=data["bos_token"], separator=data.get("separator", "\n"))

    def to_json(self) -> str:
        return json.dumps(
            {"role_tokens": self.role_tokens, "end_token": self.end_token, "bos_token": self.bos_token, "separator": self.separator},
            indent=2, sort_keys=True,
        )

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(sorted(self.role_tokens))

    def open_ids(self, tok: Tokenizer, role: str, *, first: bool = False) -> list[int]:
        """Tokens before a message's content (the session's first message gets a BOS)."""
        if role not in self.role_tokens:
            raise ValueError(f"unknown role {role!r}; expected one of {sorted(self.role_tokens)}")
        return ([tok.token_id(self.bos_token)] if first else []) + [tok.token_id(self.role_tokens[role])]

    def close_ids(self, tok: Tokenizer, role: str) -> list[int]:
        """Tokens after a message's content."""
        return [tok.token_id(self.end_token), *tok.encode(self.separator)]

    def bos_ids(self, tok: Tokenizer) -> list[int]:
        try:
            return [tok.token_id(self.bos_token)]
        except KeyError:
            return []

    def message(self, tok: Tokenizer, role: str, content: str, *, first: bool = False) -> list[int]:
        """Token ids of one whole message."""
        return self.open_ids(tok, role, first=first) + tok.encode(content) + self.close_ids(tok, role)

    def reply_prefix(self, tok: Tokenizer) -> list[int]:
        """Tokens that open the assistant's turn; generation continues from here."""
        return [tok.token_id(self.role_tokens["assistant"])]

    def reply_suffix(self, tok: Tokenizer) -> list[int]:
        """Tokens that close an assistant turn (the end token, then the separator)."""
        return [tok.token_id(self.end_token), *tok.encode(self.separator)]

    def stop_ids(self, tok: Tokenizer) -> list[int]:
        return [tok.token_id(self.end_token)]


class StreamDecoder:
    """Incremental detokenization that never emits half of a multi-byte character."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read])
        full_text = self.tok.decode(self.ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return full_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end of the stream),
        so that everything pushed, joined, equals `decode(ids)`."""
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read])
        full_text = self.tok.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text) :]
