"""The chapters run as Colab runs them: the package installed from a wheel, each notebook alone in an empty
folder, nothing of the repository in reach.

The book build is where every chapter is run that way, at its normal scale: the Makefile unpacks the wheel
(``colab.build_site``) ahead of the editable install on ``PYTHONPATH``, sets ``SPECULATIVE_PACKAGE_FROM``
so that the package refuses to load from anywhere else, and ``_config.yml`` runs each chapter in an empty
temporary folder. A chapter that read a file outside the package would fail the build. The Colab editions
hold exactly the chapters' code cells (``test_chapters.py`` regenerates and compares them), so the build
runs what a Colab reader runs.

Here: the wheel carries the pair and the records; the guard refuses an import from elsewhere; the build is
configured as above; and one Colab edition, the results page, runs from the wheel in an empty folder, so
the mechanism is seen to work on an ``.ipynb`` too. What this does not prove: that pip can reach the
repository from Colab (no network here), nor anything about Colab's own Python or GPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from speculative.book.colab import build_site, glued_names

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The package built as a wheel and unpacked into a folder that only PYTHONPATH points at."""
    return build_site(tmp_path_factory.mktemp("site") / "site")


def test_the_wheel_carries_the_pair_and_the_records(wheel_site):
    assert (wheel_site / "speculative" / "pair" / "target.safetensors").is_file()
    assert {p.name for p in (wheel_site / "speculative" / "results").glob("*.json")} >= {"decode_cpu.json",
                                                                                       "sampler_cpu.json"}


def _import(site, expected):
    env = {**os.environ, "PYTHONPATH": str(site), "SPECULATIVE_PACKAGE_FROM": str(expected)}
    return subprocess.run([sys.executable, "-c", "import speculative; print(speculative.__file__)"], env=env,
                          capture_output=True, text=True)


def test_the_package_refuses_to_load_from_anywhere_but_the_named_folder(wheel_site, tmp_path):
    loaded = _import(wheel_site, wheel_site)
    assert loaded.returncode == 0 and loaded.stdout.startswith(str(wheel_site)), loaded.stderr
    elsewhere = _import(wheel_site, tmp_path)  # the wheel is on the path, but another folder is expected
    assert elsewhere.returncode != 0
    assert f"not from SPECULATIVE_PACKAGE_FROM={tmp_path}" in elsewhere.stderr.splitlines()[-1]


def test_the_book_is_built_from_the_wheel_each_chapter_in_an_empty_folder():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(BUILT):", 1)[1].split("\n\n", 1)[0]
    assert "-m speculative.book.colab --site _build/site" in recipe
    assert "PYTHONPATH=$(CURDIR)/_build/site SPECULATIVE_PACKAGE_FROM=$(CURDIR)/_build/site" in recipe
    assert recipe.index("--site") < recipe.index("$(JB) build")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["run_in_temp"] is True


def test_the_results_page_runs_alone_from_the_wheel(wheel_site, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(wheel_site))  # the kernel inherits it: the wheel shadows the checkout
    monkeypatch.setenv("SPECULATIVE_PACKAGE_FROM", str(wheel_site))
    monkeypatch.setenv("SPECULATIVE_SCALE", "smoke")  # what is read from where needs no scale
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one thread, like the worker itself (conftest.py): two kernel threads beside the other worker
        # oversubscribe the 2 cores, and torch's spinning threads made the editions 3-5x slower
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(ROOT / "notebooks" / "00_results.ipynb", as_version=4)
    prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    for name in glued_names(ROOT / "notebooks" / "00_results.md"):  # the reader sees values, not names
        assert f"<sup>{name}</sup>" in prose and f"`{name}`" not in prose, name
    # first, prove the kernel imports the wheel, not the repository
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        "import speculative\n"
        f"assert speculative.__file__.startswith({str(wheel_site)!r}), speculative.__file__"))
    empty = tmp_path / "colab"
    empty.mkdir()
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(empty)}},
                   allow_errors=False).execute()
    assert not list(empty.iterdir())  # it wrote nothing where it ran
