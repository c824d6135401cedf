"""One reader per source format: from the files inside an artifact to raw documents.

A reader takes the (path, bytes) pairs `fetch.members` yields for a source and returns
`RawDoc`s: a stable name and the document's text as a list of units (a book's chapters, or a
page as one unit). The corpus builder cuts long documents into parts at unit boundaries.
Books keep all their text (Gutenberg boilerplate stripped if present); manuals keep only
what `extract.prose` accepts as prose.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from recipes.smollm2_hybrid.corpus import extract
from recipes.smollm2_hybrid.corpus.rdata import lazyload_objects

Members = Iterable[tuple[str, bytes]]
MIN_PAGE_CHARS = 400  # a manual page with less prose than this (an index, a stub) is skipped


@dataclass(frozen=True)
class RawDoc:
    name: str
    units: tuple[str, ...]

    @property
    def chars(self) -> int:
        return sum(len(u) for u in self.units)


def _book_text(text: str) -> str:
    return extract.join(extract.paragraphs(extract.strip_gutenberg(extract.normalize(text))))


_CHAPTER = re.compile(r"^(CHAPTER|Chapter)\s+[0-9IVXLC]+\b.*$", re.MULTILINE)


def split_chapters(text: str) -> tuple[str, ...]:
    """A book's text cut before each "CHAPTER N" / "Chapter N" line (front matter stays with
    the first chapter)."""
    starts = [m.start() for m in _CHAPTER.finditer(text)]
    bounds = [0] + starts[1:] + [len(text)]
    return tuple(t for t in (text[a:b].strip() for a, b in itertools.pairwise(bounds)) if t)


AUSTEN_TITLES = {"sensesensibility": "sense_and_sensibility", "prideprejudice": "pride_and_prejudice",
                 "mansfieldpark": "mansfield_park", "emma": "emma", "northangerabbey": "northanger_abbey",
                 "persuasion": "persuasion"}


def austen_rdata(files: Members) -> list[RawDoc]:
    got = dict(files)
    rdx = next(v for k, v in got.items() if k.endswith(".rdx"))
    rdb = next(v for k, v in got.items() if k.endswith(".rdb"))
    objects = lazyload_objects(rdx, rdb)
    out = []
    for key, name in AUSTEN_TITLES.items():
        lines = ["" if ln is None else ln for ln in objects[key]]
        out.append(RawDoc(name, tuple(_book_text(c) for c in split_chapters("\n".join(lines)))))
    return out


def moby_dick(files: Members) -> list[RawDoc]:
    got = dict(files)
    order = json.loads(next(v for k, v in got.items() if k.endswith("file_list.json")))
    by_name = {PurePosixPath(k).name: v for k, v in got.items()}
    units = [_book_text(by_name[n].decode("utf-8")) for n in order if n != "contents.txt" and n in by_name]
    return [RawDoc("moby_dick", tuple(u for u in units if u))]


def bible_sqlite(files: Members) -> list[RawDoc]:
    (_, data), = list(files)
    con = sqlite3.connect(":memory:")
    con.deserialize(data)
    out = []
    for book_id, name, slug in con.execute("SELECT id, canonical_name, slug FROM books ORDER BY sort_order"):
        units = []
        for (chapter,) in con.execute("SELECT chapter_number FROM chapters WHERE book_id=? ORDER BY chapter_number",
                                      (book_id,)):
            verses = [v for (v,) in con.execute("SELECT text FROM verses WHERE book_id=? AND chapter_number=? "
                                                "ORDER BY verse_number", (book_id, chapter))]
            units.append(extract.join([f"{name}, chapter {chapter}", extract.normalize(" ".join(verses))]))
        out.append(RawDoc(slug, tuple(units)))
    con.close()
    return out


def devil_dict(files: Members) -> list[RawDoc]:
    """The dictd database of The Devil's Dictionary: the book from its preface on, without
    dictd's own 00-database entries and the alphabet line at the end."""
    (_, data), = list(files)
    text = gzip.decompress(data).decode("latin-1")
    text = text[text.find("PREFACE"):]
    text = re.sub(r"\n\s*[a-z]{20,}\s*$", "\n", text)
    return [RawDoc("devils_dictionary", tuple(extract.paragraphs(text)))]


def sotu(files: Members) -> list[RawDoc]:
    out = []
    for path, data in files:
        text = extract.join(extract.paragraphs(data.decode("utf-8")))
        if text:
            out.append(RawDoc(PurePosixPath(path).stem, (text,)))
    return out


def plain_gz(files: Members) -> list[RawDoc]:
    out = []
    for path, data in files:
        text = gzip.decompress(data).decode("utf-8", "replace") if path.endswith(".gz") else data.decode("utf-8", "replace")
        name = PurePosixPath(path).name.split(".")[0]
        out.append(RawDoc(name, tuple(extract.paragraphs(extract.strip_gutenberg(text)))))
    return out


def _pages(files: Members, to_text: Callable[[str], str], unzip: bool = False) -> list[RawDoc]:
    out = []
    for path, data in files:
        raw = gzip.decompress(data) if unzip and path.endswith(".gz") else data
        text = extract.prose(to_text(raw.decode("utf-8", "replace")))
        if len(text) >= MIN_PAGE_CHARS:
            parts = PurePosixPath(path).parts
            name = "/".join(parts[-2:]) if len(parts) > 1 else parts[-1]
            out.append(RawDoc(re.sub(r"\.(html|pod|gz)$", "", name), (text,)))
    return out


def html(files: Members) -> list[RawDoc]:
    return _pages(files, extract.html_to_text)


def man(files: Members) -> list[RawDoc]:
    return _pages(files, extract.roff_to_text, unzip=True)


def pod(files: Members) -> list[RawDoc]:
    return _pages(files, extract.pod_to_text)


READERS: dict[str, Callable[[Members], list[RawDoc]]] = {
    "austen_rdata": austen_rdata, "moby_dick": moby_dick, "bible_sqlite": bible_sqlite, "devil_dict": devil_dict,
    "sotu": sotu, "plain_gz": plain_gz, "html": html, "man": man, "pod": pod,
}
