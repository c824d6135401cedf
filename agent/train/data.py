"""Training data: read text, JSONL chat and session exports; tokenize once; pack.

Formats, by file extension (folders are walked, sorted, and their other files ignored):
- `.txt .md .markdown .rst .text`: one plain-text document per file, trained on every token.
- `.jsonl`: one record per line: `{"messages": [{"role", "content"}, ...]}` (chat) or
  `{"text": "..."}` (a document) or a session export object.
- `.json`: a session export from `laplace sessions export --format json`
  (`{"format": "laplace.session.v1", "messages": [...]}`), or a list of records.

Chat is rendered with the model's ChatTemplate; the loss covers assistant content and its
end token only, and not that of an assistant message with `"weight": 0` (as in OpenAI's
chat fine-tuning format: a reply kept as context, not learned). Messages whose `status` is not "complete" (cancelled replies in session
exports) are dropped. A bad record is reported with its file and line and either skipped
(`on_bad="skip"`) or rejected before any training starts (`on_bad="error"`).

Packing: all documents are concatenated into one stream and cut into rows of
`seq_len + 1` tokens with stride `seq_len` (inputs are the first `seq_len`, labels the
last), so no token is wasted; the recurrent state starts from zero in every row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

from agent.runtime.tokenizer import ChatTemplate, Tokenizer

TEXT_EXTENSIONS = (".txt", ".md", ".markdown", ".rst", ".text")
DATA_EXTENSIONS = TEXT_EXTENSIONS + (".jsonl", ".json")
IGNORE_INDEX = -100


class DataError(ValueError):
    """The training data cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class BadRecord:
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class Document:
    """Token ids and, per token, whether it is a training target."""

    ids: list[int]
    train: list[bool]


@dataclass
class DataReport:
    files: int = 0
    documents: int = 0
    chats: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    bad: list[BadRecord] = field(default_factory=list)
    ignored_files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        s = f"{self.files} files, {self.documents} documents + {self.chats} chats, {self.tokens:,} tokens ({self.trained_tokens:,} trained)"
        if self.bad:
            s += f", {len(self.bad)} bad records skipped"
        return s


def find_files(paths: list[str | Path]) -> tuple[list[Path], list[str]]:
    """Data files under `paths` and the folder entries ignored for their extension."""
    if not paths:
        raise DataError("no training data given")
    files: list[Path] = []
    ignored: list[str] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            for f in sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")):
                (files.append(f) if f.suffix.lower() in DATA_EXTENSIONS else ignored.append(str(f)))
        elif p.is_file():
            if p.suffix.lower() not in DATA_EXTENSIONS:
                raise DataError(f"{p}: unknown data format {p.suffix or '(no extension)'!r}; use {', '.join(DATA_EXTENSIONS)}")
            files.append(p)
        else:
            raise DataError(f"{p}: no such file or folder")
    if not files:
        raise DataError(f"no data files ({', '.join(DATA_EXTENSIONS)}) in {', '.join(map(str, paths))}")
    return files, ignored


def _records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, parsed record or an Exception) for a JSON or JSONL file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            yield exc.lineno, exc
            return
        for item in data if isinstance(data, list) else [data]:
            yield 1, item
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                yield n, exc


def encode_chat(messages: Any, tok: Tokenizer, template: ChatTemplate) -> Document:
    """A chat rendered with the template; targets are assistant content + its end token."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    kept = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} needs string 'role' and 'content'")
        if m["role"] not in template.roles:
            raise ValueError(f"message {i} has unknown role {m['role']!r} (expected {', '.join(template.roles)})")
        if m.get("weight", 1) not in (0, 1):
            raise ValueError(f"message {i} has weight {m['weight']!r}; a message's weight is 0 (context only) or 1")
        if m.get("status", "complete") == "complete":
            kept.append(m)
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in kept):
        raise ValueError("no complete assistant message to learn from")
    ids: list[int] = []
    train: list[bool] = []
    stops = set(template.stop_ids(tok))
    for i, m in enumerate(kept):
        head = template.open_ids(tok, m["role"], first=i == 0)
        body = tok.encode(m["content"])
        tail = template.close_ids(tok, m["role"])
        ids += head + body + tail
        if m["role"] == "assistant" and m.get("weight", 1):
            # The opening is given, not learned; the closing is learned up to its stop token.
            end = next((j + 1 for j, t in enumerate(tail) if t in stops), len(tail))
            train += [False] * len(head) + [True] * (len(body) + end) + [False] * (len(tail) - end)
        else:
            train += [False] * (len(head) + len(body) + len(tail))
    return Document(ids, train)


def encode_text(text: str, tok: Tokenizer, template: ChatTemplate) -> Document:
    ids = template.bos_ids(tok) + tok.encode(text)
    return Document(ids, [True] * len(ids))


def _record_document(rec: Any, tok: Tokenizer, template: ChatTemplate) -> tuple[Document, bool]:
    """(document, is_chat) for one JSON record, or ValueError saying what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    if "messages" in rec:
        return encode_chat(rec["messages"], tok, template), True
    if isinstance(rec.get("text"), str):
        if not rec["text"]:
            raise ValueError("empty 'text'")
        return encode_text(rec["text"], tok, template), False
    raise ValueError("record has neither 'messages' nor 'text'")


def load_documents(paths: list[str | Path], tok: Tokenizer, template: ChatTemplate, *, on_bad: str = "skip") -> tuple[list[Document], DataReport]:
    """Read and tokenize every file; bad records are skipped or raise `DataError`."""
    if on_bad not in ("skip", "error"):
        raise ValueError("on_bad must be 'skip' or 'error'")
    files, ignored = find_files(paths)
    report = DataReport(files=len(files), ignored_files=ignored)
    docs: list[Document] = []

    def bad(path: Path, line: int, reason: str) -> None:
        record = BadRecord(str(path), line, reason)
        if on_bad == "error":
            raise DataError(f"bad record at {record} (pass --on-bad skip to skip such records)")
        report.bad.append(record)

    for path in files:
        try:
            if path.suffix.lower() in TEXT_EXTENSIONS:
                text = path.read_text(encoding="utf-8")
                if text.strip():
                    docs.append(encode_text(text, tok, template))
                    report.documents += 1
                continue
            for line, rec in _records(path):
                if isinstance(rec, Exception):
                    bad(path, line, f"invalid JSON ({rec})")
                    continue
                try:
                    doc, is_chat = _record_document(rec, tok, template)
                except ValueError as exc:
                    bad(path, line, str(exc))
                    continue
                docs.append(doc)
                if is_chat:
                    report.chats += 1
                else:
                    report.documents += 1
        except UnicodeDecodeError:
            bad(path, 1, "not UTF-8 text")
    report.tokens = sum(len(d.ids) for d in docs)
    report.trained_tokens = sum(sum(d.train) for d in docs)
    if report.trained_tokens == 0:
        raise DataError(f"no trainable tokens in {', '.join(map(str, paths))} ({report.summary()})")
    return docs, report


@dataclass
class PackedData:
    """Rows of `seq_len + 1` token ids and target flags."""

    tokens: Tensor  # [N, seq_len + 1] int64
    train: Tensor  # [N, seq_len + 1] bool (flag of each token as a target)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1] - 1

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def rows(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """(inputs [b, L], labels [b, L] with IGNORE_INDEX where not trained)."""
        t, m = self.tokens[index], self.train[index]
        labels = t[:, 1:].masked_fill(~m[:, 1:], IGNORE_INDEX)
        return t[:, :-1].contiguous(), labels.contiguous()

    def row_order(self, step: int, batch_rows: int, seed: int) -> Tensor:
        """Global row indices of step `step`: epochs of seeded permutations laid end to end,
        so the order is a pure function of (step, seed) and a resumed run sees the same data."""
        n = len(self)
        start = step * batch_rows
        out = []
        while len(out) < batch_rows:
            epoch, offset = divmod(start + len(out), n)
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
            out += perm[offset : offset + batch_rows - len(out)].tolist()
        return torch.tensor(out, dtype=torch.long)


def trim_untrained_tail(inputs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Rows [b, L] cut after the last position any row trains on. The model is causal, so
    the loss is the same, and a `--pack rows` dialogue padded to seq_len costs only its own
    tokens (at half a row on average, half the compute)."""
    trained = (labels != IGNORE_INDEX).any(0).nonzero()
    end = int(trained[-1]) + 1 if len(trained) else 1
    return inputs[:, :end], labels[:, :end]


def pack(docs: list[Document], seq_len: int, pad_id: int, *, align: bool = False) -> PackedData:
    """Concatenate documents and cut rows of seq_len + 1 with stride seq_len; the tail row
    is padded with `pad_id` (never a target).

    With `align` (`--pack rows`) every document starts a row and is padded (never a target)
    to the end of its last row, so no row reads the end of one document before the start of
    another: a dialogue whose later answers depend on its earlier turns keeps them in the
    row as long as it fits in seq_len (longer ones still run on into the next row)."""
    if align:
        ids, train = [], []
        for d in docs:
            n = len(d.ids)
            fill = -n % seq_len
            ids += d.ids + [pad_id] * fill
            # The first token is the previous row's last label: the padding cannot predict it.
            train += [False] + d.train[1:] + [False] * fill
    else:
        ids = [i for d in docs for i in d.ids]
        train = [t for d in docs for t in d.train]
    if len(ids) < 2:
        raise DataError("the data has fewer than 2 tokens; nothing to learn")
    n_rows = max(1, -(-(len(ids) - 1) // seq_len))
    total = n_rows * seq_len + 1
    ids_t = torch.full((total,), pad_id, dtype=torch.long)
    tr_t = torch.zeros(total, dtype=torch.bool)
    ids_t[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    tr_t[: len(ids)] = torch.tensor(train, dtype=torch.bool)
    idx = torch.arange(n_rows)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return PackedData(ids_t[idx], tr_t[idx])


def pad_token(tok: Tokenizer) -> int:
    for name in ("<|pad|>", "<|end|>"):
        try:
            return tok.token_id(name)
        except KeyError:
            continue
    return 0
