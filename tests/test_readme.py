"""The README: short enough to read on one screen or two, and its Python examples run as written."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short():
    words = len(README.split())
    assert words <= 900, f"the README has {words} words"


def test_the_readmes_python_examples_run():
    blocks = re.findall(r"(?s)```python\n(.*?)```", README)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def test_every_command_the_readme_names_exists():
    from speculative.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    named = set(re.findall(r"^\| `([a-z-]+)", README, re.M))
    assert named and named <= commands, named - commands
