"""Reading, masking, bad-record handling and packing of training data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from agent.train.data import IGNORE_INDEX, DataError, encode_chat, load_documents, pack

TOK = byte_level_tokenizer()
TPL = ChatTemplate()


def test_chat_loss_covers_assistant_content_and_end_token_only() -> None:
    doc = encode_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], TOK, TPL)
    trained = [i for i, t in zip(doc.ids, doc.train) if t]
    assert TOK.decode(trained, skip_special=False) == "hello<|end|>"
    assert doc.ids[0] == TOK.token_id("<|bos|>")


def test_session_export_drops_cancelled_replies(tmp_path: Path) -> None:
    export = {"format": "laplace.session.v1", "session": {"uid": "x"}, "messages": [
        {"role": "user", "content": "q1", "status": "complete"},
        {"role": "assistant", "content": "half", "status": "cancelled"},
        {"role": "assistant", "content": "full answer", "status": "complete"},
    ]}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(export, indent=2), encoding="utf-8")
    docs, report = load_documents([p], TOK, TPL)
    assert report.chats == 1
    text = TOK.decode(docs[0].ids, skip_special=False)
    assert "half" not in text and "full answer" in text


def test_folders_texts_and_ignored_files(text_dir: Path) -> None:
    docs, report = load_documents([text_dir], TOK, TPL)
    assert report.files == 2 and report.documents == 2 and len(report.ignored_files) == 1
    assert all(all(d.train) for d in docs)


def test_bad_records_are_reported_with_file_and_line(tmp_path: Path, chat_file: Path) -> None:
    lines = chat_file.read_text().splitlines()
    lines.insert(2, "{not json")
    lines.insert(4, json.dumps({"messages": [{"role": "wizard", "content": "x"}]}))
    lines.insert(6, json.dumps({"foo": 1}))
    chat_file.write_text("\n".join(lines), encoding="utf-8")
    docs, report = load_documents([chat_file], TOK, TPL, on_bad="skip")
    assert len(docs) == 30
    assert [b.line for b in report.bad] == [3, 5, 7]
    assert "unknown role 'wizard'" in str(report.bad[1]) and str(report.bad[0]).startswith(f"{chat_file}:3:")
    with pytest.raises(DataError, match=rf"{chat_file.name}:3: invalid JSON"):
        load_documents([chat_file], TOK, TPL, on_bad="error")


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda d: [], "no training data"),
        (lambda d: [d / "missing.txt"], "no such file"),
        (lambda d: [(d / "x.csv").write_text("a,b") and d / "x.csv"], "unknown data format"),
        (lambda d: [(d / "e.txt").write_text("  \n") and d], "no trainable tokens"),
        (lambda d: [(d / "u.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]})) and d / "u.jsonl"], "no trainable tokens"),
    ],
    ids=["nothing", "missing", "unknown-format", "empty", "no-assistant"],
)
def test_unusable_data_is_an_error_naming_why(tmp_path: Path, setup, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_documents(setup(tmp_path), TOK, TPL)


def test_pack_shifts_labels_and_masks_padding() -> None:
    from agent.train.data import Document

    doc = Document(list(range(10)), [True] * 10)
    data = pack([doc], seq_len=4, pad_id=99)
    assert data.tokens.tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9, 99, 99, 99]]
    inputs, labels = data.rows(torch.arange(3))
    assert inputs.tolist()[1] == [4, 5, 6, 7] and labels.tolist()[1] == [5, 6, 7, 8]
    assert labels.tolist()[2] == [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_row_order_is_a_function_of_step_and_covers_each_epoch() -> None:
    from agent.train.data import Document

    data = pack([Document(list(range(41)), [True] * 41)], seq_len=4, pad_id=0)  # 10 rows
    first = torch.cat([data.row_order(s, 5, seed=3) for s in range(2)])
    assert sorted(first.tolist()) == list(range(10))
    assert torch.equal(data.row_order(3, 5, seed=3), data.row_order(3, 5, seed=3))
    assert not torch.equal(data.row_order(0, 5, seed=3), data.row_order(0, 5, seed=4))


def test_weight_zero_keeps_an_assistant_reply_as_context_only() -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Noted.", "weight": 0},
            {"role": "user", "content": "q"}, {"role": "assistant", "content": "Answer."}]
    doc = encode_chat(msgs, TOK, TPL)
    plain = encode_chat([{k: v for k, v in m.items() if k != "weight"} for m in msgs], TOK, TPL)
    assert doc.ids == plain.ids  # the reply is still read
    trained = TOK.decode([i for i, t in zip(doc.ids, doc.train) if t])
    assert "Answer." in trained and "Noted." not in trained
    assert sum(plain.train) > sum(doc.train)
    with pytest.raises(ValueError, match="no complete assistant message"):
        encode_chat(msgs[:2], TOK, TPL)
    with pytest.raises(ValueError, match="weight"):
        encode_chat([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0.5}], TOK, TPL)


def test_trimming_the_untrained_tail_keeps_the_loss_and_cuts_the_padding() -> None:
    """`--pack rows` pads each dialogue to seq_len; the trainer cuts every micro-batch after
    the last position any row trains on. The model is causal: the same summed loss."""
    from agent.runtime.model import build_model
    from agent.train.data import trim_untrained_tail
    from tests.runtime.test_window import window_config

    model = build_model(window_config(memory_slots=2, memory_policy="attention"), seed=0).eval()
    inputs = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(0))
    labels = torch.full((2, 30), IGNORE_INDEX)
    labels[0, 3:9] = 5
    labels[1, 12:17] = 7
    short_in, short_lab = trim_untrained_tail(inputs, labels)
    assert short_in.shape == (2, 17) and short_lab.shape == (2, 17)
    with torch.no_grad():
        full, _ = model(inputs)
        cut, _ = model(short_in)
    loss = torch.nn.functional.cross_entropy
    torch.testing.assert_close(loss(cut.flatten(0, 1), short_lab.flatten(), reduction="sum"),
                               loss(full.flatten(0, 1), labels.flatten(), reduction="sum"))
    none_in, _ = trim_untrained_tail(inputs, torch.full((2, 30), IGNORE_INDEX))
    assert none_in.shape == (2, 1)
