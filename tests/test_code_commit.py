"""Every record says which code made it: the git commit of the library's source, or None outside a checkout."""

import shutil
import subprocess
from pathlib import Path

import pytest

from speculative.engine import timing

ROOT = Path(timing.__file__).resolve().parents[3]


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("git") is None or git("rev-parse", "HEAD").returncode != 0,
                    reason="needs the library to run from a git checkout")
def test_the_environment_names_the_commit_the_source_runs_from():
    head = git("rev-parse", "HEAD").stdout.strip()
    changed = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    assert timing.environment()["code_commit"] == head + ("+changes" if changed else "")


def test_a_copied_tree_has_no_commit(tmp_path, monkeypatch):
    copy = tmp_path / "timing.py"
    copy.write_text(Path(timing.__file__).read_text())
    monkeypatch.setattr(timing, "__file__", str(copy))
    assert timing.code_commit() is None
