"""Chat templates of imported models, and the loader for a model directory's template.

A Hugging Face checkpoint describes its chat format as a Jinja template. `laplace import`
renders that template once, in a sandbox, with placeholder contents, and keeps what it
wrote around each placeholder: per role a prefix and a suffix, the text that opens the
assistant's reply, and the BOS text. That is a `SegmentTemplate`: plain strings, so a
session never runs template code, a model's fingerprint covers its exact chat format, and
every turn is tokenized the same way on every run.

Both template kinds answer the same calls (`message`, `open_ids`, `close_ids`,
`reply_prefix`, `reply_suffix`, `stop_ids`, `bos_ids`, `roles`), so the chat service,
probes and trainer never ask which kind they hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from agent.runtime.tokenizer import ChatTemplate, Tokenizer

SEGMENT_KIND = "segments"


@dataclass(frozen=True)
class SegmentTemplate:
    """`roles[r] = (prefix, suffix)` around each message's content; `reply_open` starts a
    reply; `stop_tokens` end one. Markup (special tokens) is allowed in every string."""

    roles_text: dict[str, tuple[str, str]]
    reply_open: str
    bos: str = ""
    stop_tokens: tuple[str, ...] = ()
    source: str = ""  # where it came from ("jinja", "plain"), for the card
    # The system prompt the checkpoint's own template writes when a chat has none (SmolLM2:
    # "You are a helpful AI assistant named SmolLM, ..."): an empty system message gets it,
    # so a session reads what the model was trained on. A given system prompt replaces it.
    default_system: str = ""

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(sorted(self.roles_text))

    def _pair(self, role: str) -> tuple[str, str]:
        if role not in self.roles_text:
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(self.roles)}")
        return self.roles_text[role]

    def open_ids(self, tok: Tokenizer, role: str, *, first: bool = False) -> list[int]:
        prefix = self._pair(role)[0]
        return tok.encode_markup((self.bos if first else "") + prefix)

    def close_ids(self, tok: Tokenizer, role: str) -> list[int]:
        return tok.encode_markup(self._pair(role)[1])

    def bos_ids(self, tok: Tokenizer) -> list[int]:
        return tok.encode_markup(self.bos)

    def message(self, tok: Tokenizer, role: str, content: str, *, first: bool = False) -> list[int]:
        if role == "system" and not content:
            content = self.default_system
        return self.open_ids(tok, role, first=first) + tok.encode(content) + self.close_ids(tok, role)

    def reply_prefix(self, tok: Tokenizer) -> list[int]:
        return tok.encode_markup(self.reply_open)

    def reply_suffix(self, tok: Tokenizer) -> list[int]:
        return self.close_ids(tok, "assistant")

    def stop_ids(self, tok: Tokenizer) -> list[int]:
        return sorted({tok.token_id(t) for t in self.stop_tokens})

    def to_json(self) -> str:
        data = {"kind": SEGMENT_KIND, "roles": {r: list(p) for r, p in self.roles_text.items()}, "reply_open": self.reply_open,
                "bos": self.bos, "stop_tokens": list(self.stop_tokens), "source": self.source}
        if self.default_system:  # only where there is one: older templates keep their bytes and fingerprints
            data["default_system"] = self.default_system
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "SegmentTemplate":
        return cls(
            roles_text={str(r): (str(p[0]), str(p[1])) for r, p in data["roles"].items()},
            reply_open=str(data["reply_open"]), bos=str(data.get("bos", "")),
            stop_tokens=tuple(str(t) for t in data.get("stop_tokens", ())), source=str(data.get("source", "")),
            default_system=str(data.get("default_system", "")),
        )


AnyTemplate = Union[ChatTemplate, SegmentTemplate]


def load_chat_template(path: str | Path) -> AnyTemplate:
    """The template of a model directory's `chat_template.json`, of either kind."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("kind") == SEGMENT_KIND:
        return SegmentTemplate.from_dict(data)
    return ChatTemplate.load(path)
