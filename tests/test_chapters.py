"""The chapter sources: md <-> ipynb pairs, install cells, the table of contents, and typed numbers."""

import re
from pathlib import Path

import jupytext
import pytest
import yaml
from jupytext.compare import compare_notebooks

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


def test_there_are_chapters():
    assert len(CHAPTERS) >= 3


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_ipynb_pair_is_in_sync(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make sync`"
    source, paired = jupytext.read(md), jupytext.read(ipynb)
    compare_notebooks(paired, source, fmt="md:myst")  # raises on any difference in cells or metadata
    for cell in paired.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{ipynb.name} is committed with outputs"
            assert cell.get("execution_count") is None


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


def test_toc_lists_every_chapter_and_only_existing_files():
    listed = set(_toc_files(TOC))
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), entry
    for md in CHAPTERS:
        assert f"notebooks/{md.stem}" in listed, f"{md.name} is not in _toc.yml"


def test_config_is_strict_and_offline():
    assert CONFIG["only_build_toc_files"] is True
    assert "notebooks/*.ipynb" in CONFIG["exclude_patterns"]
    assert CONFIG["execute"]["execute_notebooks"] == "force"
    assert "sphinx-mathjax-offline" in CONFIG["sphinx"]["extra_extensions"]
    assert CONFIG["launch_buttons"]["colab_url"].startswith("https://colab.research.google.com")


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
