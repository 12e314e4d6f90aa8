"""The chapter sources: md <-> ipynb pairs, install cells, the table of contents, and typed numbers."""

import re
from pathlib import Path

import jupytext
import nbformat
import pytest
import yaml

from speculative.book import colab
from speculative.book.colab import MYST_LEFT, colab_notebook, glued_names

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())


def _toc_files(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root"):
                yield value
            else:
                yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


def test_chapters_are_numbered_without_gaps_and_listed_in_that_order():
    # the numbers are what chapters and prose refer to ({doc}`05_pitfalls`): a gap or a swap breaks them;
    # 00 is the results page, which comes first and is not a numbered chapter
    assert [int(md.name[:2]) for md in CHAPTERS] == list(range(len(CHAPTERS)))
    assert CHAPTERS[0].stem == "00_results" and "notebooks/00_results" in _toc_files(TOC["parts"][0])
    listed = [entry for entry in _toc_files(TOC) if entry.startswith("notebooks/")]
    assert listed == [f"notebooks/{md.stem}" for md in CHAPTERS]


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_colab_edition_is_in_sync_and_free_of_myst(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make sync`"
    committed = nbformat.read(ipynb, as_version=4)
    as_built = committed.metadata.get("speculative", {}).get("as_built", {})
    missing = sorted(glued_names(md) - set(as_built))
    assert not missing, f"{ipynb.name} shows {missing} as names, not values: run `make sync`"
    expected = colab_notebook(md, as_built)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in expected.cells], \
        f"{ipynb.name} is out of date: run `make sync`"
    assert [c.source for c in committed.cells if c.cell_type == "code"] == [
        c.source for c in jupytext.read(md).cells if c.cell_type == "code"]  # the code is the chapter's, exactly
    for cell in committed.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{ipynb.name} is committed with outputs"
            assert cell.get("execution_count") is None
        else:
            assert not MYST_LEFT.search(cell.source), f"{ipynb.name} shows raw MyST: {cell.source[:200]}"


def test_the_converter_rewrites_every_role():
    text = ("p = {glue:text}`alpha:.3f`, see {doc}`02_derivation` and the {doc}`notation page <../book/notation>`, "
            "{cite:t}`leviathan2023fast`, {eq}`eq-cost`, {numref}`fig-x`\n$$ (eq-cost)")
    out = colab._markdown(text, colab._bibliography(), "https://example.org/repo")
    assert not colab.MYST_LEFT.search(out)
    assert "`alpha`" in out and "[02_derivation](02_derivation.ipynb)" in out  # no value known: the name
    shown = colab._markdown(text, colab._bibliography(), "https://example.org/repo", {"alpha": "0.71234"})
    assert shown.startswith("p = **0.712**<sup>alpha</sup>, see")
    assert [colab._as_built(text, spec) for text, spec in (("0.5", ".0%"), ("'cpu'", ""), ("(1/2, 3/10)", ""),
                                                             ("12345", ","), ("3", ""))] == \
        ["50%", "cpu", "(1/2, 3/10)", "12,345", "3"]
    assert "[notation page](https://example.org/repo/blob/main/book/notation.md)" in out
    assert "Leviathan et al. (2023)" in out and out.endswith("\n$$")


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_install_cell_agrees_with_config(md):
    notebook = jupytext.read(md)
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    url = CONFIG["repository"]["url"].rstrip("/")
    branch = CONFIG["repository"]["branch"]
    assert "remove-cell" in first.metadata.get("tags", []), "the install cell must be hidden"
    assert 'find_spec("speculative") is None' in first.source, "install only when the package is missing"
    found = re.findall(r"git\+(https://[^\"'@\s]+)@([\w.-]+)", first.source)
    assert found == [(url, branch)], f"install cell installs {found}, _config.yml says {(url, branch)}"


def test_repository_url_is_one_setting():
    url = CONFIG["repository"]["url"].rstrip("/")
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["repository-code"] == url, "CITATION.cff disagrees with _config.yml: run `make sync`"
    for md in CHAPTERS:  # publishing the URL again changes nothing
        assert colab._INSTALL_CELL.search(md.read_text()), md.name


def test_install_cell_prints_one_line_when_pip_fails(monkeypatch, capsys):
    import importlib.util
    import subprocess

    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as on a fresh runtime
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or subprocess.CompletedProcess(a, 1))
    exec(colab.install_cell("https://example.invalid/repo", "main"), {})
    out = capsys.readouterr().out
    assert calls and "git+https://example.invalid/repo@main" in calls[0][0]
    assert out.count("\n") == 1 and "pip install git+https://example.invalid/repo@main" in out


def test_toc_lists_every_chapter_and_only_existing_files():
    listed = set(_toc_files(TOC))
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), entry
    for md in CHAPTERS:
        assert f"notebooks/{md.stem}" in listed, f"{md.name} is not in _toc.yml"


def test_the_records_index_names_every_record_and_the_chapters_that_read_it():
    """glue.READ_BY, the records page's index: every committed record, each chapter named there naming the
    record, and every chapter but the results page and the records page that names a record listed."""
    from speculative.book.glue import READ_BY

    files = {path.name for path in (ROOT / "results").glob("*.json")}
    assert set(READ_BY) == files
    for md in CHAPTERS:
        text = md.read_text()
        named = {file for file in files if file in text.replace("previous_pair/" + file, "")}
        listed = {file for file, chapters in READ_BY.items() if md.stem in chapters}
        assert listed <= named, (md.stem, listed - named)
        if md.stem not in ("00_results", "15_records"):
            assert named <= listed, (md.stem, named - listed)


def test_config_builds_each_chapter_once_strictly_and_offline():
    import importlib.util

    from sphinx.util.matching import Matcher

    # Sphinx's own matching of exclude_patterns: every Colab edition is left out (else each chapter would
    # be built twice), and no chapter source, book page or table-of-contents entry is
    excluded = Matcher(CONFIG["exclude_patterns"])
    assert all(excluded(f"notebooks/{md.stem}.ipynb") for md in CHAPTERS)
    sources = [f"notebooks/{md.name}" for md in CHAPTERS] + [f"book/{p.name}" for p in (ROOT / "book").glob("*.md")]
    assert not [path for path in sources if excluded(path)]
    # every chapter is executed on every build: book/_ext/prerun.py empties MyST-NB's cache and fills it
    assert CONFIG["only_build_toc_files"] is True and CONFIG["execute"]["execute_notebooks"] == "cache"
    assert CONFIG["sphinx"]["local_extensions"]["prerun"] == "book/_ext"
    assert CONFIG["execute"]["allow_errors"] is False and CONFIG["execute"]["stderr_output"] == "error"
    # warnings are errors in the build that make book and CI run
    build = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "$(JB) build" in line)
    assert {"-W", "-n", "--keep-going"} <= set(build.split())
    # math offline: every extension the config names is installed, under the name Sphinx imports
    for extension in CONFIG["sphinx"]["extra_extensions"]:
        assert importlib.util.find_spec(extension) is not None, extension
    assert "sphinx-mathjax-offline" in CONFIG["sphinx"]["extra_extensions"]


_TIMES_LIVE = re.compile(r"perf_counter|bench_(decode|peer|sampler)\(|race_public_pair\(|Clock\(|time\.time\(")


def test_every_chapter_that_times_something_runs_alone():
    # book/_ext/prerun.py executes chapters two at a time; one that times code live must be listed in
    # prerun_alone, so that MyST-NB executes it with nothing beside it
    alone = set(CONFIG["sphinx"]["config"]["prerun_alone"])
    for md in CHAPTERS:
        code = "\n".join(re.findall(r"(?s)```\{code-cell\}.*?```", md.read_text()))
        if _TIMES_LIVE.search(code):
            assert f"notebooks/{md.stem}" in alone, f"{md.name} times code but would run beside another chapter"
    assert alone <= {f"notebooks/{md.stem}" for md in CHAPTERS}, alone


_NOT_PROSE = [
    r"(?s)```.*?```",  # code and directive blocks
    r"(?s)\$\$.*?\$\$",  # display math
    r"\$[^$\n]+\$",  # inline math
    r"\{[\w:-]+\}`[^`]*`",  # roles: {glue:text}`x:.3f`, {doc}`...`, {eq}`...`
    r"`[^`\n]*`",  # inline code
    r"\]\([^)]*\)",  # link targets
    r"(?m)^#+ .*$",  # headings
    r"(?m)^\s*\d+\. ",  # list numbering
    r"\([A-Z]{2,}[\w .-]*\)",  # names such as (GHSA-...)
    r"#\d+",  # issue and pull-request numbers are names, not figures
]
# a typed figure: a decimal, a fraction, a percentage, or an integer of two or more digits
_TYPED_FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+|\d+/\d+|\d+ ?%|\d{2,})(?![\w])")


@pytest.mark.parametrize(
    "page",
    CHAPTERS + sorted((ROOT / "book").glob("*.md")),
    ids=lambda p: p.name,
)
def test_prose_has_no_typed_figures(page):
    text = page.read_text()
    if text.startswith("---"):
        text = text.split("---", 2)[2]
    for pattern in _NOT_PROSE:
        text = re.sub(pattern, " ", text)
    typed = _TYPED_FIGURE.findall(text)
    assert not typed, f"{page.name}: figures typed into prose instead of glued: {typed}"


def test_citation_file_names_every_author_the_bibliography_names():
    bib = (ROOT / "book" / "references.bib").read_text()
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    for entry in citation["references"]:
        match = re.search(r"title\s*=\s*\{" + re.escape(entry["title"]) + r"\}.*?author\s*=\s*\{(.*?)\},", bib, re.S)
        if match is None:  # not a paper of the bibliography (the seed article is cited there by its publisher)
            continue
        surnames = [name.split(",")[0].strip() for name in match.group(1).split(" and ")]
        assert [a.get("family-names") for a in entry["authors"]] == surnames, entry["title"]


#: about 3,000 words of prose and 30 lines of shown code at most (issue 23); a chapter listed here would be
#: over the word budget and being cut (none is), and the list may only shrink
WORDS, SHOWN_LINES = 3_000, 33
OVER_WORDS = set()
#: the whole book's chapters (notebooks/), however much is added (issue 45)
BOOK_WORDS = 26_000


def prose_words(text: str) -> int:
    """Words of a chapter's Markdown, code cells and other fenced blocks left out."""
    if text.startswith("---"):
        text = text.split("---", 2)[2]
    return len(re.sub(r"(?s)```.*?```", " ", text).split())


def shown_cells(text: str) -> list[tuple[int, str]]:
    """(lines, first line) of every code cell whose input the reader sees (not removed, not hidden)."""
    cells = []
    for body in re.findall(r"(?s)```\{code-cell\}[^\n]*\n(.*?)\n```", text):
        if re.search(r":tags:.*(remove-cell|remove-input|hide-input|hide-cell)", body):
            continue
        lines = [line for line in body.splitlines() if not line.startswith(":tags:")]
        cells.append((len(lines), lines[0] if lines else ""))
    return cells


def test_prose_words_count_text_not_code():
    page = "---\nkernelspec: {}\n---\n# Title\n\nOne two three.\n\n```{code-cell} ipython3\nx = 1 2 3 4\n```\n"
    assert prose_words(page) == 5
    hidden = "```{code-cell} ipython3\n:tags: [hide-input]\n\na\nb\n```\n```{code-cell} ipython3\na\nb\nc\n```"
    assert shown_cells(hidden) == [(3, "a")]


def test_the_chapters_together_stay_within_the_books_word_budget():
    words = {md.stem: prose_words(md.read_text()) for md in CHAPTERS}
    assert sum(words.values()) <= BOOK_WORDS, f"{sum(words.values())} words of prose in all: {words}"


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_is_read_in_one_sitting(md):
    text = md.read_text()
    words = prose_words(text)
    if md.stem in OVER_WORDS:
        assert words > WORDS, f"{md.stem} is within the budget now: take it off OVER_WORDS"
    else:
        assert words <= WORDS, f"{md.stem} has {words} words of prose (at most about {WORDS})"
    long = [cell for cell in shown_cells(text) if cell[0] > SHOWN_LINES]
    assert not long, f"{md.stem}: shown cells over {SHOWN_LINES} lines (hide their bookkeeping): {long}"
