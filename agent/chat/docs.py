"""Attaching documents: read a file safely, fold it into a state in fixed-size pieces.

Memory stays flat in the document's length: the text is tokenized in slices and folded
segment by segment (the runner's segment length bounds the activations); only the token
ids, which the transcript must store anyway, grow with the document.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from agent.chat.types import ChatError, ProgressEvent

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.decoding import Runner
    from agent.runtime.state import RecurrentState

SLICE_CHARS = 16_384


def read_document(path: Path) -> str:
    """The file's text, or a one-line ChatError saying what is wrong and what to do."""
    if not path.exists():
        raise ChatError(f"cannot attach {path}: no such file")
    if path.is_dir():
        raise ChatError(f"cannot attach {path}: it is a directory; attach the files in it one by one")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ChatError(f"cannot attach {path}: {exc.strerror or exc}") from None
    if b"\x00" in raw[:8192]:
        raise ChatError(f"cannot attach {path}: it looks binary (NUL bytes); attach a text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChatError(
            f"cannot attach {path}: not UTF-8 text (bad byte at offset {exc.start}); convert it, e.g. iconv -t utf-8"
        ) from None
    if not text.strip():
        raise ChatError(f"cannot attach {path}: the file is empty")
    return text


def _slices(text: str, size: int = SLICE_CHARS) -> Iterator[str]:
    """Consecutive slices of about `size` characters, cut after whitespace where possible."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut + 1 if cut != -1 else end
        yield text[start:end]
        start = end


def fold_document(
    lm: LoadedModel, runner: Runner, name: str, text: str, state: RecurrentState, ids_out: list[int],
    cancel: threading.Event | None = None,
) -> Iterator[tuple[ProgressEvent, RecurrentState]]:
    """Fold the template's document message (`<|document|>name\\n\\ntext<|end|>\\n` in the
    Laplace template) into `state`, yielding progress and the new state.

    The ids folded are appended to `ids_out` (they become the turn's stored token ids)."""
    tok, template = lm.tokenizer, lm.template
    head = [*template.open_ids(tok, "document"), *tok.encode(f"{name}\n\n")]
    tail = template.close_ids(tok, "document")
    pieces = [head] + [tok.encode(s) for s in _slices(text)] + [tail]
    total = sum(len(p) for p in pieces)
    done = 0
    for piece in pieces:
        for start in range(0, len(piece), runner.segment_len):
            if cancel is not None and cancel.is_set():
                return
            seg = piece[start : start + runner.segment_len]
            _, state = runner.prefill(seg, state)
            ids_out.extend(seg)
            done += len(seg)
            yield ProgressEvent(f"folding {name}", done, total), state
