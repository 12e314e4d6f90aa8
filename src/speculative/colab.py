"""The Colab edition of a chapter: its MyST source turned into a notebook that plain Jupyter renders.

Explained in: book/intro (run it in Colab). Colab shows a notebook's Markdown as plain Markdown, so the
MyST roles of the book (``{glue:text}``, ``{doc}``, ``{cite:t}``, ``{eq}``, ``{numref}``) and equation
labels would appear raw. :func:`colab_notebook` rewrites them: a glued number becomes the name of the
value in code font (the cell that computes it prints ``name = value`` there, see :func:`book.glue`), a
chapter reference a link to its notebook, a citation its authors and year, linked where the
bibliography has an address, and an equation label is dropped. Code cells are kept exactly.
``make sync`` writes every edition (``python -m speculative.colab notebooks/NN_*.md``); a test
regenerates them and compares.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["colab_notebook", "install_cell", "MYST_LEFT", "publish_repository", "write_editions", "build_site"]

ROOT = Path(__file__).resolve().parents[2]
#: What must not survive in a Colab edition's Markdown: a MyST role or directive.
MYST_LEFT = re.compile(r"\{[a-z]+(:[a-z]+)?\}`|^(```|:::)\{", re.MULTILINE)
_NOTE = ("*This is the Colab edition of a chapter of* Speculative Sampling, Exactly. *Numbers that the book's "
         "text shows are printed here by the cells that compute them, as `name = value`; the text names them "
         "in code font.*")


def _bibliography() -> dict[str, str]:
    """Return each reference key as 'Authors (year)', linked when the entry has a url."""
    text = (ROOT / "book" / "references.bib").read_text()
    out = {}
    for entry in re.split(r"\n(?=@)", text):
        key = re.match(r"@\w+\{([^,]+),", entry.strip())
        if not key:
            continue
        field = {name: value for name, value in re.findall(r"(\w+)\s*=\s*\{(.*?)\},?\s*$", entry, re.MULTILINE)}
        author = field.get("author", "").replace("\\#", "#").replace("\\_", "_")
        authors = [a.strip().strip("{}") for a in author.split(" and ") if a.strip()]
        surname = authors[0].split(",")[0] if authors else key.group(1)
        others = {0: "", 1: "", 2: f" and {authors[-1].split(',')[0]}"}.get(len(authors), " et al.")
        who = surname + others
        label = f"{who} ({field.get('year', 'n.d.')})"
        out[key.group(1)] = f"[{label}]({field['url']})" if "url" in field else label
    return out


def _markdown(text: str, references: dict[str, str], repository: str) -> str:
    def doc(match):
        label, target = match.group(2), match.group(3)
        name = target.split("/")[-1]
        href = f"{name}.ipynb" if "/" not in target else f"{repository}/blob/main/{target.lstrip('./')}.md"
        return f"[{label or name}]({href})"

    def cite(match):
        return "; ".join(references.get(key.strip(), key.strip()) for key in match.group(2).split(","))

    text = re.sub(r"\{glue:text\}`([^`:]+)(:[^`]*)?`", r"`\1`", text)
    text = re.sub(r"\{doc\}`(([^`<]*?) <)?([^`<>]+)>?`", doc, text)
    text = re.sub(r"\{cite:(t|p)\}`([^`]+)`", cite, text)
    text = re.sub(r"\{eq\}`([^`]+)`", r"equation `\1`", text)
    text = re.sub(r"\{numref\}`([^`]+)`", r"the figure `\1`", text)
    return re.sub(r"^\$\$ \([\w-]+\)$", "$$", text, flags=re.MULTILINE)


def colab_notebook(md_path: Path):
    """Return the Colab edition (an nbformat notebook, no outputs) of the MyST chapter at ``md_path``."""
    import jupytext
    import nbformat
    import yaml

    notebook = jupytext.read(md_path)
    repository = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    references = _bibliography()
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = _markdown(cell.source, references, repository)
    notebook.cells.insert(1, nbformat.v4.new_markdown_cell(_NOTE))
    notebook.metadata.pop("jupytext", None)
    return notebook


#: The hidden first cell of every chapter, opened by this line.
INSTALL_HEAD = "# Install the book's library when it is missing (a fresh Colab runtime); a local build already has it."
_INSTALL_CELL = re.compile(r"(```\{code-cell\} ipython3\n:tags: \[remove-cell\]\n\n)" + re.escape(INSTALL_HEAD) +
                           r"\n.*?(?=\n```\n)", re.DOTALL)


def install_cell(url: str, branch: str) -> str:
    """Return the source of the install cell for the repository at ``url`` (branch ``branch``).

    When pip cannot install, it prints one line that says what to run, instead of pip's traceback.
    """
    source = f"git+{url.rstrip('/')}@{branch}"
    return (f"{INSTALL_HEAD}\n"
            "import importlib.util, subprocess, sys\n"
            'if importlib.util.find_spec("speculative") is None:\n'
            f'    SOURCE = "{source}"\n'
            '    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", SOURCE],\n'
            "                      capture_output=True).returncode != 0:\n"
            "        print(\"Could not install the book's library: run  pip install \" + SOURCE + \"  then restart.\")")


def _repository() -> tuple[str, str]:
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    return config["url"].rstrip("/"), config.get("branch", "main")


def publish_repository(paths) -> list[Path]:
    """Write ``_config.yml``'s repository URL into each chapter's install cell and into ``CITATION.cff``.

    The URL is one setting: the launch buttons read it from ``_config.yml``; this copies it to the two
    places that cannot read it. Return the files it changed.
    """
    url, branch = _repository()
    changed = []
    for path in map(Path, paths):
        text = path.read_text()
        if not _INSTALL_CELL.search(text):
            raise ValueError(f"{path.name}: no install cell opening with {INSTALL_HEAD!r}")
        new = _INSTALL_CELL.sub(lambda m: m.group(1) + install_cell(url, branch), text, count=1)
        if new != text:
            path.write_text(new)
            changed.append(path)
    citation = ROOT / "CITATION.cff"
    text = citation.read_text()
    new = re.sub(r'^repository-code: .*$', f'repository-code: "{url}"', text, flags=re.MULTILINE)
    if new != text:
        citation.write_text(new)
        changed.append(citation)
    return changed


def write_editions(paths) -> None:
    """Write each chapter's Colab edition beside it (``NN_name.ipynb``)."""
    import nbformat

    for path in map(Path, paths):
        notebook = colab_notebook(path)
        for index, cell in enumerate(notebook.cells):  # fixed ids, so that a rewrite changes nothing
            cell.id = f"cell-{index}"
        nbformat.write(notebook, path.with_suffix(".ipynb"), version=4)


def build_site(destination) -> Path:
    """Build the package as a wheel, as Colab installs it, and unpack it into ``destination``; return it.

    The wheel is built from a fresh copy of what the package is made of (``src``, ``results``, the project
    files), so that no stale ``build/`` folder of the checkout leaks into it. Put ``destination`` first on
    ``PYTHONPATH`` and the wheel shadows the checkout's editable install: the book is built that way, each
    chapter in an empty folder, so a chapter that read a file outside the package would fail the build.
    """
    import shutil
    import subprocess
    import tempfile
    import zipfile

    destination = Path(destination)
    with tempfile.TemporaryDirectory() as scratch:
        source, out = Path(scratch) / "source", Path(scratch) / "wheel"
        source.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(ROOT / name, source / name)
        skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copytree(ROOT / "src", source / "src", ignore=skip)
        shutil.copytree(ROOT / "results", source / "results", ignore=skip)
        subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out)], check=True, capture_output=True)
        (wheel,) = out.glob("speculative-*.whl")
        shutil.rmtree(destination, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(destination)
    return destination


if __name__ == "__main__":
    if sys.argv[1:2] == ["--site"]:  # python -m speculative.colab --site FOLDER (the Makefile's book build)
        build_site(sys.argv[2])
    else:
        publish_repository(sys.argv[1:])
        write_editions(sys.argv[1:])
