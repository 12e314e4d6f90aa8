"""The Colab edition of a chapter: its MyST source turned into a notebook that plain Jupyter renders.

Explained in: book/intro (run it in Colab). Colab shows a notebook's Markdown as plain Markdown, so the
MyST roles of the book (``{glue:text}``, ``{doc}``, ``{cite:t}``, ``{eq}``, ``{numref}``) and equation
labels would appear raw. :func:`colab_notebook` rewrites them: a glued number becomes its value as the
book's own build computed it, in bold and marked with its name (the cell that computes it prints this
run's ``name = value``, see :func:`book.glue`); a chapter reference becomes a link to its notebook, a
citation its authors and year, linked where the bibliography has an address, and an equation label is
dropped. Code cells are kept exactly. ``make sync`` builds the book and writes every edition from it
(``python -m speculative.book.colab --values _build/jupyter_execute/notebooks notebooks/NN_*.md``); the values
used are kept in the edition's metadata, so a test regenerates each edition from its chapter and
compares.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["colab_notebook", "glued_names", "built_values", "install_cell", "MYST_LEFT", "publish_repository",
           "write_editions", "build_site"]

ROOT = Path(__file__).resolve().parents[3]
#: What must not survive in a Colab edition's Markdown: a MyST role or directive.
MYST_LEFT = re.compile(r"\{[a-z]+(:[a-z]+)?\}`|^(```|:::)\{", re.MULTILINE)
_NOTE = ("*This is the Colab edition of a chapter of* Speculative Sampling, Exactly. *A number in bold in the "
         "text is the value the book's own build computed, marked with its name; the cell that computes it "
         "prints your run's value as `name = value`. Exact results agree; a live timing will differ.*")


def _as_built(text: str, spec: str) -> str:
    """A glued value's plain text (as MyST-NB stored it) shown as ``{glue:text}`` shows it, with ``spec``."""
    import ast

    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):  # a Shown text such as (1/2, 3/10): shown as it is
        return text
    if isinstance(value, str):
        return value
    return format(value, spec) if spec else str(value)


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
        others = "" if len(authors) < 2 else f" and {authors[1].split(',')[0]}" if len(authors) == 2 else " et al."
        who = surname + others
        label = f"{who} ({field.get('year', 'n.d.')})"
        out[key.group(1)] = f"[{label}]({field['url']})" if "url" in field else label
    return out


def _markdown(text: str, references: dict[str, str], repository: str, as_built: dict = None) -> str:
    def glued(match):
        name, spec = match.group(1), (match.group(2) or ":")[1:]
        if name not in (as_built or {}):
            return f"`{name}`"
        return f"**{_as_built(as_built[name], spec)}**<sup>{name}</sup>"

    def doc(match):
        label, target = match.group(2), match.group(3)
        name = target.split("/")[-1]
        href = f"{name}.ipynb" if "/" not in target else f"{repository}/blob/main/{target.lstrip('./')}.md"
        return f"[{label or name}]({href})"

    def cite(match):
        return "; ".join(references.get(key.strip(), key.strip()) for key in match.group(2).split(","))

    text = re.sub(r"\{glue:text\}`([^`:]+)(:[^`]*)?`", glued, text)
    text = re.sub(r"\{doc\}`(([^`<]*?) <)?([^`<>]+)>?`", doc, text)
    text = re.sub(r"\{cite:(t|p)\}`([^`]+)`", cite, text)
    text = re.sub(r"\{eq\}`([^`]+)`", r"equation `\1`", text)
    text = re.sub(r"\{numref\}`([^`]+)`", r"the figure `\1`", text)
    return re.sub(r"^\$\$ \([\w-]+\)$", "$$", text, flags=re.MULTILINE)


def colab_notebook(md_path: Path, as_built: dict = None):
    """Return the Colab edition (an nbformat notebook, no outputs) of the MyST chapter at ``md_path``.

    ``as_built`` maps each glued name to the plain text the book's build stored for it (MyST-NB's
    ``NN.glue.json``); a name it lacks is shown in code font instead. It is kept in the notebook's
    metadata, under ``speculative.as_built``."""
    import jupytext
    import nbformat
    import yaml

    notebook = jupytext.read(md_path)
    repository = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    references = _bibliography()
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = _markdown(cell.source, references, repository, as_built)
    notebook.cells.insert(1, nbformat.v4.new_markdown_cell(_NOTE))
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["speculative"] = {"as_built": dict(sorted((as_built or {}).items()))}
    return notebook


def glued_names(md_path: Path) -> set[str]:
    """Return the names the prose of the chapter at ``md_path`` glues."""
    return set(re.findall(r"\{glue:text\}`([^`:]+)", Path(md_path).read_text()))


def built_values(md_path: Path, values_dir) -> dict:
    """Return {name: plain text} of the glued names of the chapter at ``md_path`` as the build in
    ``values_dir`` (``_build/jupyter_execute/notebooks``) stored them; a ValueError names any missing."""
    import json

    path = Path(values_dir) / f"{Path(md_path).stem}.glue.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    values = {name: stored[name]["data"]["text/plain"] for name in glued_names(md_path) if name in stored}
    missing = sorted(glued_names(md_path) - set(values))
    if missing:
        raise ValueError(f"{path} lacks the glued values {', '.join(missing)}: run make book first")
    return values


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


def write_editions(paths, values_dir=None) -> None:
    """Write each chapter's Colab edition beside it (``NN_name.ipynb``), its glued values read from the
    build in ``values_dir`` (None: none, the names shown instead)."""
    import nbformat

    for path in map(Path, paths):
        notebook = colab_notebook(path, built_values(path, values_dir) if values_dir else None)
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
    if sys.argv[1:2] == ["--site"]:  # python -m speculative.book.colab --site FOLDER (the Makefile's book build)
        build_site(sys.argv[2])
    elif sys.argv[1:2] == ["--values"]:  # python -m speculative.book.colab --values FOLDER CHAPTER.md ... (make sync)
        publish_repository(sys.argv[3:])
        write_editions(sys.argv[3:], sys.argv[2])
    else:
        publish_repository(sys.argv[1:])
        write_editions(sys.argv[1:])
