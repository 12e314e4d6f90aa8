"""The built site in _build/html: offline, math typeset locally, Colab links, every page present.

`make test` builds the site from a clean _build before pytest runs, so these tests read the fresh build.
Run on their own, they fail (not skip) when there is no build.
"""

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.md"))

pytestmark = pytest.mark.site


@pytest.fixture(scope="module")
def pages():
    if not (HTML / "index.html").exists():
        pytest.fail("no built site in _build/html: run `make book` (or `make test`, which builds it first)")
    return sorted(HTML.rglob("*.html"))


class _Loads(HTMLParser):
    """Collect every URL a page loads by itself: scripts, stylesheets, images, frames, media."""

    def __init__(self):
        super().__init__()
        self.loads: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "audio", "video", "source", "embed") and attrs.get("src"):
            self.loads.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            rel = (attrs.get("rel") or "").lower()
            if any(word in rel for word in ("stylesheet", "preload", "icon", "modulepreload")):
                self.loads.append(attrs["href"])
        if tag == "object" and attrs.get("data"):
            self.loads.append(attrs["data"])


def _remote(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url.strip(), re.I))


def test_no_page_loads_anything_from_a_remote_host(pages):
    offenders = {}
    for page in pages:
        parser = _Loads()
        parser.feed(page.read_text(errors="replace"))
        remote = [u for u in parser.loads if _remote(u)]
        # a stylesheet may also pull remote fonts with @import or url()
        remote += re.findall(r"@import\s+url\(\s*['\"]?((?:https?:)?//[^'\")]+)", page.read_text(errors="replace"))
        if remote:
            offenders[str(page.relative_to(HTML))] = remote
    assert not offenders, f"pages that load remote resources: {offenders}"


def test_static_css_imports_nothing_remote(pages):
    for css in (HTML / "_static").rglob("*.css"):
        remote = re.findall(r"(?:@import|url\()\s*['\"]?((?:https?:)?//[^'\")\s]+)", css.read_text(errors="replace"))
        assert not remote, f"{css.relative_to(HTML)} pulls {remote}"


def test_mathjax_is_served_locally_with_its_fonts(pages):
    chapter = HTML / "notebooks" / "02_derivation.html"
    parser = _Loads()
    parser.feed(chapter.read_text())
    mathjax = [u for u in parser.loads if "mathjax" in u.lower()]
    assert mathjax, "the derivation chapter loads no MathJax"
    for url in mathjax:
        assert not _remote(url)
        assert (chapter.parent / url.split("?")[0]).resolve().is_file(), url
    fonts = list((HTML / "_static" / "mathjax").rglob("*.woff"))
    assert fonts, "MathJax's CHTML fonts were not copied into the build"


def test_math_reaches_the_pages(pages):
    text = (HTML / "notebooks" / "02_derivation.html").read_text()
    assert text.count('class="math') >= 5
    assert r"\min" in text


def test_every_page_with_math_typesets_it_offline_and_no_title_holds_math(pages):
    for page in pages:
        text = page.read_text(errors="replace")
        parser = _Loads()
        parser.feed(text)
        if 'class="math' in text or "\\(" in text:
            assert any("mathjax" in u.lower() and not _remote(u) for u in parser.loads), f"{page}: math, no MathJax"
        # the navigation and the page titles are not typeset: a heading written with $...$ shows as TeX source
        titles = re.findall(r"<title>(.*?)</title>", text) + re.findall(r'class="reference internal"[^>]*>(.*?)</a>',
                                                                         text, re.S)
        assert not [t for t in titles if "\\(" in t or "$" in t], f"{page}: TeX in a title or a link"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_colab_button_opens_the_paired_ipynb_on_main(pages, chapter):
    page = (HTML / "notebooks" / f"{chapter}.html").read_text()
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/").rstrip("/")
    expected = f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{chapter}.ipynb"
    links = set(re.findall(r"https://colab\.research\.google\.com/[^\"'<>\s]+", page))
    assert links == {expected}, links
    assert (ROOT / "notebooks" / f"{chapter}.ipynb").is_file()


def test_every_toc_page_was_built(pages):
    built = {str(p.relative_to(HTML)) for p in pages}
    for name in ["book/intro.html", "book/notation.html", "book/references.html"]:
        assert name in built
    for chapter in CHAPTERS:
        assert f"notebooks/{chapter}.html" in built


def test_glued_numbers_appear_in_the_prose(pages):
    text = re.sub(r"<[^>]+>", "", (HTML / "notebooks" / "03_three_tokens.html").read_text())
    # the seed's worked example, computed by the chapter and glued into its prose
    assert "(1/5, 3/10, 1/5)" in text and "(1, 0, 0)" in text


def test_bibliography_lists_the_required_sources(pages):
    text = (HTML / "book" / "references.html").read_text()
    for needle in ["Leviathan", "Chen", "vLLM"]:
        assert needle in text, needle


def test_every_page_says_which_commit_and_date_it_was_built_from(pages):
    import subprocess

    stamps = set()
    for page in pages:
        if page.parent.name not in ("book", "notebooks"):  # theme partials, the index and search pages
            continue
        found = re.findall(r"Built (\d{4}-\d\d-\d\d \d\d:\d\d UTC) from commit <code>([0-9a-f]{12})</code>",
                           page.read_text())
        assert found, f"{page.relative_to(HTML)} carries no build stamp"
        stamps.update(found)
    assert len(stamps) == 1, f"pages of one build carry different stamps: {stamps}"
    ((_, commit),) = stamps
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT).returncode == 0
    assert known, f"the stamp names {commit}, which is not a commit of this repository"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_equations_and_figures_are_numbered_within_their_chapter(pages, chapter):
    page = (HTML / "notebooks" / f"{chapter}.html").read_text()
    number = str(int(chapter[:2]))  # the toc numbers chapter NN as NN
    equations = re.findall(r'<span class="eqno">\(([\d.]+)\)', page)
    figures = re.findall(r"Fig\. ([\d.]+)", page)
    for label in equations + figures:
        assert label.split(".")[0] == number and label != number, f"{chapter}: {label} is not in chapter {number}"
    if equations:
        assert equations[0] == f"{number}.1", f"{chapter}'s first equation is ({equations[0]}), not ({number}.1)"


def test_no_computer_notation_in_the_prose(pages):
    # numbers are for reading: 1e-06 or 0.0e+00 in a sentence is a formatting slip (code cells are left out)
    for page in pages:
        html = re.sub(r'(?s)<div class="(cell_input|highlight)[^"]*".*?</div>', " ", page.read_text(errors="replace"))
        prose = re.sub(r"<[^>]+>", " ", re.sub(r"(?s)<(script|style|pre)\b.*?</\1>", " ", html))
        slips = re.findall(r"(?<![\w.])\d(?:\.\d+)?e[+-]\d+\b", prose)
        assert not slips, f"{page.relative_to(HTML)}: {slips}"


def test_every_github_thread_named_in_a_chapter_is_in_the_bibliography(pages):
    references = (HTML / "book" / "references.html").read_text()
    for chapter in CHAPTERS:
        text = (ROOT / "notebooks" / f"{chapter}.md").read_text()
        for thread in re.findall(r"(?:transformers|vLLM|vllm) #(\d+)", text):
            assert f"#{thread}" in references, f"{chapter} names #{thread}, which the references page lacks"
        for advisory in re.findall(r"GHSA-[\w-]+", text):
            assert advisory in references, advisory


def test_wide_tables_scroll_and_long_code_lines_wrap(pages):
    page = (HTML / "notebooks" / "08_decoding_demo.html").read_text()
    assert "_static/book.css" in page, "the book's stylesheet is not linked"
    css = (HTML / "_static" / "book.css").read_text()
    assert "overflow-x: auto" in css and "pre-wrap" in css
    # the benchmark tables are real tables, not text in a <pre>
    assert page.count("<table") >= 3 and "tok/fwd" in re.sub(r"(?s)<pre.*?</pre>", "", page)


def test_figures_are_vector_graphics(pages):
    images = [p for p in (HTML / "_images").iterdir() if p.suffix in (".png", ".jpg", ".svg")]
    assert images and all(p.suffix == ".svg" for p in images), sorted(p.name for p in images)


#: glued values that are still clauses, by chapter. Empty: no chapter glues one (issue 23 rewrote the last,
#: in chapters 07 and 08). A clause glued anywhere fails.
GLUED_CLAUSES_LEFT = {}


def glued_words(text: str) -> int:
    """Words in a glued value as the reader sees it: runs of letters (a number, a symbol or T = 1 counts none
    but the letter T)."""
    return sum(any(c.isalpha() for c in token) for token in re.findall(r"\w+(?:[-'’]\w+)*", text.strip("'\"")))


def test_glued_words_counts_words_not_figures():
    assert glued_words("8.6 × 10⁻⁶") == 0 and glued_words("'2.0 percentage points'") == 2
    assert glued_words("cannot tell the two apart, even at the lax level") == 10


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_glued_value_is_a_clause(pages, chapter):
    """A glued value is a number or a short name (five words at most); sentences are written in the chapter,
    beside the cell that asserts them (issue 23)."""
    import json

    path = ROOT / "_build" / "jupyter_execute" / "notebooks" / f"{chapter}.glue.json"
    glued = json.loads(path.read_text()) if path.exists() else {}  # a page that glues nothing writes none
    clauses = {name for name, value in glued.items()
               if glued_words(value.get("data", {}).get("text/plain", "")) > 5}
    assert clauses == GLUED_CLAUSES_LEFT.get(chapter, set()), sorted(clauses)
