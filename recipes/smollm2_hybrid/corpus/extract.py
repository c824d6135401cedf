"""Turn the formats the sources ship in into plain paragraphs of English prose.

Every function here returns text as paragraphs separated by one blank line, with whitespace
inside a paragraph collapsed to single spaces. Code is dropped, not kept: HTML `<pre>` blocks
and tables, man-page no-fill (`.nf` / `.EX`) blocks and synopses, POD verbatim paragraphs.
`prose` then drops what is left that reads like an index, a table row or a code fragment.
"""

from __future__ import annotations

import re
import unicodedata
from html.parser import HTMLParser

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")
_SPACE = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")


def normalize(text: str) -> str:
    """NFC, Unix newlines, no control characters, no trailing spaces."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text.replace("\t", " "))
    return "\n".join(_SPACE.sub(" ", ln).strip() for ln in text.split("\n"))


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each reflowed onto one line; a block of two or more
    short lines (verse, an address, a signature) keeps its line breaks."""
    out = []
    for block in re.split(r"\n\s*\n", normalize(text)):
        lines = [ln for ln in block.split("\n") if ln]
        if len(lines) >= 2 and max(map(len, lines)) < 55:
            out.append("\n".join(lines))
        elif lines:
            out.append(" ".join(" ".join(lines).split()))
    return out


def join(paras: list[str]) -> str:
    return "\n\n".join(p for p in paras if p)


_PG_START = re.compile(r"^\s*(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT)", re.IGNORECASE | re.MULTILINE)
_PG_END = re.compile(r"^\s*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|END OF (THE|THIS) PROJECT GUTENBERG"
                     r"|End of (the )?Project Gutenberg)", re.IGNORECASE | re.MULTILINE)
_PG_CREDIT = re.compile(r"^(Produced by|Transcribed from|E-?text prepared by|This e-?text was)", re.IGNORECASE)


def strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg text: everything between the START and END marker lines
    (their whole lines dropped), without a "Produced by ..." credit paragraph right after the
    start. Text with no markers comes back unchanged."""
    start = _PG_START.search(text)
    if start:
        nl = text.find("\n", start.end())
        text = text[nl + 1:] if nl >= 0 else ""
    end = _PG_END.search(text)
    if end:
        text = text[:end.start()]
    paras = re.split(r"\n\s*\n", text.strip("\n"))
    while paras and _PG_CREDIT.match(paras[0].strip()):
        paras.pop(0)
    return "\n\n".join(paras).strip()


# --- HTML -----------------------------------------------------------------------------------

_BLOCK = {"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "br", "section",
          "article", "blockquote", "caption", "figure", "figcaption", "header", "main", "body", "hr", "title", "aside"}
_SKIP_TAGS = {"script", "style", "pre", "head", "nav", "noscript", "svg", "math", "table", "form", "button", "select",
              "textarea", "iframe", "object"}
_SKIP_CLASSES = {"navheader", "navfooter", "toc", "sphinxsidebar", "related", "footer", "headerlink", "breadcrumbs",
                 "docnav", "navigation", "highlight", "literal-block", "programlisting", "screen", "synopsis",
                 "cmdsynopsis", "funcsynopsis", "index", "toctree-wrapper", "contents", "legalnotice",
                 "copyright", "footnote-reference", "line-block", "doctest", "mobile-nav"}
_SKIP_IDS = {"navigation", "header", "footer", "sidebar", "toc", "nav", "search"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
_SELF_CLOSING = {"p": {"p"}, "li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"}, "option": {"option"}}


class _HTMLText(HTMLParser):
    def __init__(self, main_only: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, skips, is main)
        self.skip = 0
        self.main = 0 if main_only else 1
        self.buf: list[str] = []
        self.paras: list[str] = []

    def _flush(self) -> None:
        text = " ".join("".join(self.buf).split())
        if text:
            self.paras.append(text)
        self.buf = []

    def _pop(self) -> None:
        tag, skips, is_main = self.stack.pop()
        self.skip -= skips
        self.main -= is_main
        if tag in _BLOCK:
            self._flush()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:
            self._flush()
        if tag in _VOID:
            return
        closes = _SELF_CLOSING.get(tag)
        if closes and self.stack and self.stack[-1][0] in closes:
            self._pop()
        a = {k: v or "" for k, v in attrs}
        classes = set(a.get("class", "").split())
        skips = tag in _SKIP_TAGS or bool(classes & _SKIP_CLASSES) or a.get("id", "") in _SKIP_IDS \
            or any(c.startswith("highlight-") for c in classes)
        is_main = a.get("role") == "main"
        self.stack.append((tag, skips, is_main))
        self.skip += skips
        self.main += is_main

    def handle_endtag(self, tag: str) -> None:
        if tag in _BLOCK:
            self._flush()
        if any(t == tag for t, _, _ in self.stack):
            while self.stack:
                if self.stack[-1][0] == tag:
                    self._pop()
                    break
                self._pop()

    def handle_data(self, data: str) -> None:
        if self.skip == 0 and self.main > 0:
            self.buf.append(data)


def html_to_text(html: str) -> str:
    """The visible prose of one HTML page: inside its role="main" element when it has one,
    without navigation, code, tables, sidebars or scripts."""
    parser = _HTMLText(main_only='role="main"' in html)
    parser.feed(html)
    parser.close()
    parser._flush()
    paras = [p.replace("\u00b6", "").strip() for p in parser.paras]
    return join([normalize(p) for p in paras])


# --- man pages (roff) -----------------------------------------------------------------------

_ROFF_NAMED = {"em": "\u2014", "en": "\u2013", "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d", "oq": "\u2018",
               "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae", "mu": "\u00d7", "hy": "-", "ti": "~",
               "ha": "^", "rs": "\\", "lh": "", "rh": "", "bv": "|", "ba": "|", "Fo": "\u00ab", "Fc": "\u00bb",
               ">=": "\u2265", "<=": "\u2264", "->": "\u2192", "<-": "\u2190", "!=": "\u2260", "de": "\u00b0",
               "pl": "+", "mi": "-", "eq": "=", "sl": "/", "tm": "\u2122", "ga": "`", "ul": "_"}
_ROFF_SKIP_SECTIONS = {"SYNOPSIS", "SEE ALSO", "COLOPHON", "AUTHORS", "AUTHOR", "REPORTING BUGS", "COPYRIGHT"}


def roff_inline(s: str) -> str:
    s = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", s)
    s = re.sub(r"\\s[+-]?\d", "", s)
    s = re.sub(r"\\\*(\[[^\]]*\]|\(..|.)", "", s)
    s = re.sub(r"\\\((..)", lambda m: _ROFF_NAMED.get(m.group(1), ""), s)
    s = re.sub(r"\\\[([^\]]*)\]", lambda m: _ROFF_NAMED.get(m.group(1), ""), s)
    s = re.sub(r"\\[&%|^:c]", "", s)
    s = re.sub(r"\\[ ~0]", " ", s)
    s = s.replace("\\-", "-").replace("\\e", "\\").replace("\\(", "(")
    return re.sub(r"\\(.)", r"\1", s)


def _roff_args(s: str) -> list[str]:
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', s)]


def roff_to_text(src: str) -> str:
    """A man page's prose: headings, paragraphs and list items, without its synopsis, examples
    (no-fill blocks), tables and the SEE ALSO list."""
    paras: list[str] = []
    buf: list[str] = []
    nofill = skip_section = False
    pending_heading = False

    def flush() -> None:
        if buf and not skip_section:
            paras.append(" ".join(" ".join(buf).split()))
        buf.clear()

    for line in src.splitlines():
        if line.startswith(("'\\\"", ".\\\"")) or line.strip() in (".", "'"):
            continue
        if nofill:
            if re.match(r"^\.(fi|EE|TE)\b", line):
                nofill = False
            continue
        if pending_heading and not line.startswith("."):
            heading = roff_inline(line).strip()
            skip_section = heading.upper() in _ROFF_SKIP_SECTIONS
            if not skip_section:
                paras.append(heading)
            pending_heading = False
            continue
        m = re.match(r"^[.'](\w+|\S)\s*(.*)$", line)
        if not m:
            buf.append(roff_inline(line))
            continue
        macro, rest = m.group(1), m.group(2)
        if macro in ("SH", "SS"):
            flush()
            heading = roff_inline(" ".join(_roff_args(rest))).strip()
            if not heading:
                pending_heading = True
                continue
            skip_section = heading.upper() in _ROFF_SKIP_SECTIONS
            if not skip_section:
                paras.append(heading)
        elif macro in ("nf", "EX", "TS"):
            flush()
            nofill = True
        elif macro in ("PP", "LP", "P", "TP", "sp", "HP", "TQ"):
            flush()
        elif macro == "IP":
            flush()
            tag = roff_inline(_roff_args(rest)[0]) if rest else ""
            if tag and tag not in ("\u2022", "*", "-") and not tag.rstrip(".").isdigit():
                buf.append(tag)
        elif macro in ("B", "I", "SM", "SB"):
            buf.append(roff_inline(" ".join(_roff_args(rest))))
        elif macro in ("BR", "BI", "IB", "IR", "RB", "RI"):
            buf.append(roff_inline("".join(_roff_args(rest))))
        elif macro in ("UE", "ME") and buf and rest:
            buf[-1] += roff_inline(rest.strip())
        # every other request (.TH, .RS, .in, .ad, .de, .so, .UR, ...) carries no prose
    flush()
    return join([normalize(p) for p in paras])


# --- Perl POD -------------------------------------------------------------------------------

_POD_ESC = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}


def _pod_number(body: str) -> str:
    """E<0x263A> (hex), E<075> (octal), E<61> (decimal); anything else is dropped."""
    try:
        n = int(body, 16) if body.lower().startswith("0x") else int(body, 8 if body.startswith("0") else 10)
        return chr(n)
    except (ValueError, OverflowError):
        return ""


def _pod_code(m: re.Match[str]) -> str:
    code, body = m.group(1), m.group(3)
    if code in "XZ":
        return ""
    if code == "E":
        return _POD_ESC.get(body) or _pod_number(body)
    if code == "L":
        text = body.split("|", 1)[0] if "|" in body else body
        return text.replace('"', "").replace("/", " ").strip()
    return body


def pod_inline(s: str) -> str:
    s = re.sub(r"([A-Z])(<{2,})\s+(.*?)\s+>{2,}", _pod_code, s)
    while True:
        t = re.sub(r"([A-Z])(<)([^<>]*)>", _pod_code, s)
        if t == s:
            return s
        s = t


def pod_to_text(src: str) -> str:
    """Perl POD's ordinary paragraphs, headings and items; verbatim (indented) paragraphs,
    `=begin` ... `=end` blocks, `=for` paragraphs and code after `=cut` are dropped."""
    paras: list[str] = []
    in_pod, skipping = True, False
    for block in re.split(r"\n[ \t]*\n", src.replace("\r\n", "\n")):
        if not block.strip():
            continue
        if block[0] in " \t":
            continue
        if block.startswith("="):
            cmd, _, rest = block[1:].partition(" ")
            cmd = cmd.split("\n")[0]
            rest = " ".join(rest.split())
            if cmd == "cut":
                in_pod = False
            elif cmd in ("pod", "head1", "head2", "head3", "head4", "item", "over", "back", "encoding"):
                in_pod = True
            if cmd == "begin":
                skipping = True
            elif cmd == "end":
                skipping = False
            elif not skipping and (cmd.startswith("head") or (
                    cmd == "item" and rest and rest not in ("*", "-") and not rest.rstrip(".").isdigit())):
                paras.append(pod_inline(rest))
            continue
        if in_pod and not skipping:
            paras.append(pod_inline(" ".join(block.split())))
    return join([normalize(p) for p in paras])


# --- prose filter ---------------------------------------------------------------------------

def letter_share(text: str) -> float:
    if not text:
        return 0.0
    return sum(ch.isalpha() or ch == " " for ch in text) / len(text)


def english_letters(text: str) -> float:
    """The share of its letters that are ASCII (near 1 for English, low for CJK or Cyrillic)."""
    letters = [ch for ch in text if ch.isalpha()]
    return sum(ch.isascii() for ch in letters) / len(letters) if letters else 0.0


def prose(text: str, min_letters: float = 0.75) -> str:
    """Paragraphs that read as English prose: mostly letters and spaces, mostly ASCII letters,
    and either a sentence (ends in . ! ? : or a quote) of four words or more, or a short
    heading-like line (a title, a function's signature) right before such a sentence."""
    paras = [p for p in paragraphs(text) if letter_share(p) >= min_letters and english_letters(p) >= 0.9]
    sentence = [len(p.split()) >= 4 and p.rstrip("\"'\u201d\u2019)").endswith((".", "!", "?", ":")) for p in paras]
    keep = [p for i, p in enumerate(paras)
            if sentence[i] or (len(p) <= 100 and i + 1 < len(paras) and sentence[i + 1])]
    return join(keep)
