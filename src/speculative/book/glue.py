"""What every chapter shares: glue for the prose, the device picker, the demo scale, and the recorded runs.

Explained in: book/intro (how the book is built). Every number in the prose is glued from a cell with
MyST-NB's ``glue``; outside a book build (in Colab, say) ``myst_nb`` may be missing, and :func:`glue`
then prints ``name = value`` under the cell, which is where a Colab edition's text points the reader.
Chapters import these instead of keeping copies.
"""

from __future__ import annotations

import os
from numbers import Rational
from pathlib import Path

from speculative import defaults
from speculative.measure.report import Shown, as_text, markdown_table, scientific

__all__ = ["Shown", "as_text", "cite", "doc", "scientific", "glue", "table", "pick_device", "demo_settings",
           "results_dir", "named_drafts", "load_record", "load_records"]


def cite(keys) -> str:
    """Return a parenthetical citation of ``keys`` (bibliography keys) for Markdown a cell displays.

    In a book build it is the MyST role, which links to the references page; where MyST-NB is missing
    (a Colab edition) it is empty, and the text around it names the source.
    """
    keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys:
        return ""
    try:
        import myst_nb  # noqa: F401
    except ImportError:
        return ""
    return " {cite:p}`" + ",".join(keys) + "`"


def doc(chapter: str) -> str:
    """Return a link to ``chapter`` (a notebook's name, such as ``"10_beyond_one_draft"``) for Markdown a cell
    displays: the MyST role in a book build, the chapter's name where MyST-NB is missing (a Colab edition)."""
    try:
        import myst_nb  # noqa: F401
    except ImportError:
        return chapter
    return "{doc}`" + chapter + "`"


def glue(name: str, value, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the prose (MyST-NB); return nothing, so a cell shows no echo.

    Fractions and sequences of them are stored as :class:`Shown` text such as ``3/10``; other values are
    stored as they are, so ``{glue:text}`name:.3f``` can format numbers.
    """
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy or torch scalar -> Python number
        value = value.item()
    shown = value
    if isinstance(value, (list, tuple)) or (isinstance(value, Rational) and not isinstance(value, (bool, int))):
        shown = Shown(as_text(value))
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # not building the book (a Colab edition, say): show the value where it is computed
        print(f"{name} = {shown:.4g}" if isinstance(shown, float) else f"{name} = {shown}")
        return
    myst_glue(name, shown, display=display)


def table(rows, headers, align: str = ""):
    """Return :func:`measure.report.markdown_table` of ``rows`` under ``headers`` as an IPython ``Markdown``
    object, which a chapter's cell shows as a table."""
    from IPython.display import Markdown

    return Markdown(markdown_table(rows, headers, align))


def pick_device() -> str:
    """Return ``"cuda"`` when torch sees a GPU, else ``"cpu"``: the device every chapter runs on."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


SCALES = ("small", "full", "smoke")


def demo_settings(device: str) -> dict:
    """Return the sizes a chapter should run at: small on any device, full only with SPECULATIVE_SCALE=full.

    A GPU gets the small sizes too, so that a chapter run on a free Colab GPU stays within minutes (chapter
    08's live sweep at the full sizes is about 25 CPU-minutes of work); the GPU's full measurement is
    ``python -m speculative gpu-report``.

    This is the one place that reads ``SPECULATIVE_SCALE``; the sizes are ``defaults.DEMO_SMALL``,
    ``defaults.DEMO_FULL`` and ``defaults.DEMO_SMOKE``. ``SPECULATIVE_SCALE=smoke`` (any device) only
    proves that a chapter runs to its end (tests/test_colab.py): ``check_claims`` is then False, and a
    chapter skips the assertions that need its normal sample sizes; at the other scales it is True.
    Raises ``ValueError`` for a scale it does not know.
    """
    scale = os.environ.get("SPECULATIVE_SCALE", "").strip().lower() or "small"
    if scale not in SCALES:
        raise ValueError(f"SPECULATIVE_SCALE={scale!r} is not a scale; use one of {', '.join(SCALES)}")
    if scale == "smoke":
        return {"scale": "smoke", "check_claims": False, **defaults.DEMO_SMOKE}
    if scale == "full":
        return {"scale": "full", "check_claims": True, "audit_rows": None, **defaults.DEMO_FULL}
    return {"scale": "small", "check_claims": True, "audit_rows": None, **defaults.DEMO_SMALL}


def results_dir() -> Path:
    """Return the folder of recorded runs: the repository's ``results/`` when a chapter runs in a checkout
    (``notebooks/``) or from its root, else the copy installed inside the package (a wheel, Colab).

    Raise FileNotFoundError, saying where it looked, when none holds them.
    """
    package = Path(__file__).resolve().parents[1]
    candidates = [Path.cwd() / "results", Path.cwd().parent / "results", package.parents[1] / "results",
                  package / "results"]
    for folder in candidates:
        if folder.is_dir() and any(folder.glob("*.json")):
            return folder
    raise FileNotFoundError("no recorded runs in " + ", ".join(str(c) for c in candidates) +
                            ": reinstall the package, or record one with `python -m speculative bench`")


def load_record(name: str) -> dict:
    """Return the recorded run ``results/<name>`` with its file name under ``"file"``; a ValueError (from
    :func:`speculative.measure.records.read_record`) names a file that is not a record of this library's schema."""
    from speculative.measure.records import read_record

    path = results_dir() / name
    return read_record(path) | {"file": path.name}


def named_drafts(record: dict) -> dict:
    """Return a record of several drafts with each draft under its own name
    (:func:`speculative.measure.analysis_drafts.draft_names`): the races call the pair's own draft "shipped",
    which is ``tv128c`` in a record of the shipped pair and ``original`` in one of the pair it replaced. A
    record of the shipped pair made before records kept the shipped draft's training (``"training": null``)
    gets it from pair.json's ``shipped_draft``, which describes that same draft. Reads the shipped pair's
    pair.json and SHA256SUMS only."""
    import hashlib
    import json

    from speculative.engine.pair import PAIR_DIR
    from speculative.measure.analysis_drafts import draft_names, rename_drafts

    sha256 = hashlib.sha256((PAIR_DIR / "SHA256SUMS").read_bytes()).hexdigest()
    info = json.loads((PAIR_DIR / "pair.json").read_text())
    names = draft_names(record, sha256, info)
    renamed = rename_drafts(record, names)
    own = renamed["drafts"].get(names["shipped"]) if "shipped" in record["drafts"] else None
    if record.get("pair_sha256") == sha256 and own is not None and own.get("training") is None:
        own["training"] = (info.get("shipped_draft") or {}).get("training")
    return renamed


#: The chapters that read each committed record in ``results/`` by its name (the results page only where
#: no chapter does), for the records page's index; ``tests/test_chapters.py`` checks both ways.
READ_BY = {
    "agreement_cpu.json": ("14_which_draft",),
    "decode_cpu.json": ("07_cost_model", "08_decoding_demo", "14_which_draft"),
    "drafts_cpu.json": ("14_which_draft",),
    "drafts_price_cpu.json": ("14_which_draft",),
    "drafts_intel_cpu.json": ("14_which_draft",),
    "drafts_long_cpu.json": ("14_which_draft", "00_results"),
    "headline_cpu.json": ("14_which_draft", "00_results"),
    "multidraft_cpu.json": ("10_beyond_one_draft",),
    "multidraft_repeat_cpu.json": ("10_beyond_one_draft", "00_results"),
    "peer_hf_cpu.json": ("08_decoding_demo", "11_draft_length"),
    "peer_hf_tv128c_cpu.json": ("08_decoding_demo",),
    "peer_hf_tv128c_intel_cpu.json": ("08_decoding_demo",),
    "policy_cpu.json": ("11_draft_length",),
    "policy_gammas_cpu.json": ("11_draft_length", "00_results"),
    "policy_gammas_intel_cpu.json": ("11_draft_length",),
    "prices_cpu.json": ("14_which_draft",),
    "prices_intel_cpu.json": ("14_which_draft",),
    "rules_cpu.json": ("10_beyond_one_draft",),
    "rules_repeat_cpu.json": ("10_beyond_one_draft",),
    "sampler_cpu.json": ("04_transforms",),
}


def load_records() -> list[dict]:
    """Return every recorded run in ``results/``, sorted by file name; a record of several runs comes as
    one record per run (:func:`speculative.measure.lookup.split_runs`), each with its own environment."""
    from speculative.measure.lookup import split_runs

    return [run for path in sorted(results_dir().glob("*.json")) for run in split_runs(load_record(path.name))]
