"""The training corpus: the Python standard library's own ``.py`` source, read as bytes.

Explained in: notebooks/08_decoding_demo (what the model pair was trained on).

Every Python installation carries it, Colab included, so nothing is downloaded. It differs between
Python versions (3.12 dropped ``distutils``, for example), so the training log records the corpus's
sha256 and the Python version, and the prompts used by the benchmark and tests are shipped as a fixed
file beside the model pair instead of being re-read from the local standard library.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = ["Corpus", "stdlib_dir", "source_files", "load_corpus", "is_validation_file"]

# test suites, codec tables and generated documentation data are not representative source code
SKIPPED_DIRS = {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages", "dist-packages",
                "__pycache__", "lib2to3"}
VALIDATION_PERCENT = 5


@dataclass(frozen=True)
class Corpus:
    train: bytes
    validation: bytes
    train_files: int
    validation_files: int
    sha256: str  # of every file's relative path and bytes, in sorted order
    python: str
    root: str

    def describe(self) -> str:
        return (f"Python {self.python} standard library: {self.train_files + self.validation_files} files, "
                f"{len(self.train) / 1e6:.2f} MB train / {len(self.validation) / 1e6:.2f} MB validation "
                f"(sha256 {self.sha256[:12]})")


def stdlib_dir() -> Path:
    """Return the folder of the running Python's standard library; raise if it holds no source."""
    path = Path(sysconfig.get_paths()["stdlib"])
    if not (path / "os.py").is_file():
        raise FileNotFoundError(
            f"the Python standard library source was not found at {path} (no os.py there); this corpus "
            "needs an installation that ships the stdlib as .py files")
    return path


def source_files(root: Optional[Path] = None) -> list[Path]:
    """Return the corpus's files, relative to ``root``, sorted: .py files outside skipped folders and tests."""
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus folder {root} does not exist")
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("test"))
        for name in files:
            if name.endswith(".py") and not name.startswith("test_"):
                found.append((Path(folder) / name).relative_to(root))
    if not found:
        raise FileNotFoundError(f"no .py files found under {root}")
    return sorted(found)


def is_validation_file(relative: Path) -> bool:
    """Return True for the deterministic ~5% of files held out for validation (by a hash of the path)."""
    digest = hashlib.sha256(relative.as_posix().encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < VALIDATION_PERCENT


def load_corpus(root: Optional[Path] = None) -> Corpus:
    """Return the corpus split by file into train and validation bytes (files joined by a blank line)."""
    root = Path(root) if root is not None else stdlib_dir()
    hasher = hashlib.sha256()
    train, validation = [], []
    for relative in source_files(root):
        data = (root / relative).read_bytes()
        hasher.update(relative.as_posix().encode() + b"\0" + data + b"\0")
        (validation if is_validation_file(relative) else train).append(data)
    if not train or not validation:
        raise ValueError(f"the corpus under {root} is too small to split into train and validation files")
    return Corpus(b"\n\n".join(train), b"\n\n".join(validation), len(train), len(validation),
                  hasher.hexdigest(), ".".join(map(str, sys.version_info[:3])), str(root))
