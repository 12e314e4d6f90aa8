"""Sphinx extension: stamp every page's footer with the commit and the date the book was built from.

A reader who cites a page can then say which version of the book they read. The commit is the
checkout's HEAD (marked when tracked files had uncommitted changes); without git it says so.
"""

import datetime
import subprocess
from pathlib import Path


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def build_stamp(source: Path) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        commit = _git("rev-parse", "--short=12", "HEAD", cwd=source)
        dirty = _git("status", "--porcelain", "--untracked-files=no", cwd=source)
    except (OSError, subprocess.CalledProcessError):
        return f"Built {date}, not from a git checkout."
    changes = " with uncommitted changes" if dirty else ""
    return f"Built {date} from commit <code>{commit}</code>{changes}."


def _stamp(app, config):
    options = dict(config.html_theme_options or {})
    footer = options.get("extra_footer", "")
    options["extra_footer"] = f"{footer} <span class=\"build-stamp\">{build_stamp(Path(app.srcdir))}</span>".strip()
    config.html_theme_options = options


def setup(app):
    app.connect("config-inited", _stamp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
