"""Each chapter's Colab edition runs as Colab runs it: the package installed from a wheel, the notebook alone
in an empty folder, nothing of the repository in reach.

What this proves: no chapter reads a file outside the installed package (the recorded runs and the model pair
ship inside it), and every edition executes to the end. What it does not: that pip can reach the repository
from Colab (no network here), nor anything about Colab's own Python or GPU, nor the chapters' claims: the
editions run at the smoke scale (``SPECULATIVE_SCALE=smoke``, see ``book.demo_settings``), toy sample sizes
at which every cell runs but the claims that need a sample are not asserted. The book build (``make book``)
runs every chapter at its normal scale and asserts them all.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
# the editions that took over ten seconds at the smoke scale (under a load of about 4 on 2 cores, 01-05
# took 4-5 s each): marked slow like every test over ten seconds
SLOW = {"02_derivation", "06_three_equalities", "07_cost_model", "08_decoding_demo", "09_audit", "10_beyond_one_draft"}
EDITIONS = [pytest.param(path, marks=[pytest.mark.slow] if path.stem in SLOW else [], id=path.stem)
            for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The package built as a wheel and unpacked into a folder that only PYTHONPATH points at."""
    # built from a copy of what the package is made of, so that no stale build/ folder leaks into it
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", source / "src", ignore=skip)
    shutil.copytree(ROOT / "results", source / "results", ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True)
    (wheel,) = out.glob("speculative-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_carries_the_pair_and_the_records(wheel_site):
    assert (wheel_site / "speculative" / "pair" / "target.safetensors").is_file()
    assert {p.name for p in (wheel_site / "speculative" / "results").glob("*.json")} >= {"decode_cpu.json",
                                                                                       "sampler_cpu.json"}


@pytest.mark.parametrize("edition", EDITIONS)
def test_colab_edition_runs_alone_from_the_wheel(edition, wheel_site, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(wheel_site))  # the kernel inherits it: the wheel shadows the checkout
    monkeypatch.setenv("SPECULATIVE_SCALE", "smoke")  # what is read from where needs no scale
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one thread, like the worker itself (conftest.py): two kernel threads beside the other worker
        # oversubscribe the 2 cores, and torch's spinning threads made these editions 3-5x slower
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(edition, as_version=4)
    # first, prove the kernel imports the wheel, not the repository
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        "import speculative\n"
        f"assert speculative.__file__.startswith({str(wheel_site)!r}), speculative.__file__"))
    empty = tmp_path / "colab"
    empty.mkdir()
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(empty)}},
                   allow_errors=False).execute()
