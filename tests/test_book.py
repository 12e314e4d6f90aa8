"""book.py: how computed values reach the prose, and what every chapter shares."""

import sys
import types
from fractions import Fraction as F

import pytest

from speculative.book import glue as book
from speculative.book.glue import Shown, as_text, glue


def test_as_text_writes_fractions_as_a_reader_would():
    assert as_text(F(3, 10)) == "3/10"
    assert as_text(F(4, 4)) == "1"
    assert as_text([F(1, 5), F(0), F(1, 2)]) == "(1/5, 0, 1/2)"
    assert as_text(0.25) == "0.25"


def test_shown_prints_without_quotes():
    assert repr(Shown("3/10")) == "3/10"
    assert Shown("a") == Shown("a") and Shown("a") != Shown("b")


def test_glue_hands_myst_nb_text_for_fractions_and_numbers_for_scalars(monkeypatch):
    stored = {}
    fake = types.ModuleType("myst_nb")
    fake.glue = lambda name, value, display=False: stored.__setitem__(name, (value, display))
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    import numpy as np

    assert glue("half", F(1, 2)) is None
    glue("pair", [F(1, 5), F(3, 10)])
    glue("scalar", np.float64(0.25))
    assert stored["half"] == (Shown("1/2"), False)
    assert stored["pair"] == (Shown("(1/5, 3/10)"), False)
    assert stored["scalar"] == (0.25, False) and type(stored["scalar"][0]) is float


def test_glue_without_myst_nb_prints_the_value_and_does_not_fail(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # importing it now raises ImportError
    with pytest.raises(ImportError):
        import myst_nb  # noqa: F401
    assert glue("x", F(1, 2)) is None
    glue("speedup", 1.534567)
    assert capsys.readouterr().out == "x = 1/2\nspeedup = 1.535\n"


def test_results_are_found_from_a_chapter_or_the_root(monkeypatch, tmp_path):
    root = book.results_dir()
    assert (root / "decode_cpu.json").is_file()
    monkeypatch.chdir(root.parent / "notebooks")
    assert book.results_dir() == root
    assert book.load_record("decode_cpu.json")["benchmark"] == "decode"
    assert {r["file"] for r in book.load_records()} >= {"decode_cpu.json", "sampler_cpu.json"}


def test_pick_device_follows_what_torch_sees(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert book.pick_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert book.pick_device() == "cpu"


@pytest.mark.parametrize("value, shown", [(1e-6, "10⁻⁶"), (7.6e-56, "7.6 × 10⁻⁵⁶"), (0.0, "0"), (0.0312, "0.031"),
                                          (123.4, "123"), (9.96e-5, "10⁻⁴"), (12345.0, "1.2 × 10⁴")])
def test_scientific_writes_numbers_for_reading(value, shown):
    assert book.scientific(value) == Shown(shown)


def test_cite_is_a_role_in_a_book_build_and_empty_without_myst_nb(monkeypatch):
    assert book.cite(["a", "b"]) == " {cite:p}`a,b`" and book.cite([]) == ""
    monkeypatch.setitem(sys.modules, "myst_nb", None)
    assert book.cite("a") == ""


def test_doc_is_a_role_in_a_book_build_and_the_chapters_name_without_myst_nb(monkeypatch):
    assert book.doc("01_lossless") == "{doc}`01_lossless`"
    monkeypatch.setitem(sys.modules, "myst_nb", None)
    assert book.doc("01_lossless") == "01_lossless"


def test_demo_settings_read_each_scale_and_refuse_an_unknown_one(monkeypatch):
    from speculative import defaults

    monkeypatch.setenv("SPECULATIVE_SCALE", "smoke")
    smoke = book.demo_settings("cuda")  # the smoke scale wins over the device: it is for tests
    assert smoke == {"scale": "smoke", "check_claims": False, **defaults.DEMO_SMOKE}
    monkeypatch.delenv("SPECULATIVE_SCALE")
    small = book.demo_settings("cpu")
    assert small["scale"] == "small" and small["check_claims"] is True and small["audit_rows"] is None
    assert book.demo_settings("cuda") == small  # a GPU gets no automatic full sweep (chapter 08's budget)
    # smoke runs the same cells on fewer samples: every size is at most the small scale's, every list a subset
    for key, value in defaults.DEMO_SMALL.items():
        if isinstance(value, list):
            assert set(smoke[key]) <= set(value), key
        else:
            assert smoke[key] <= value, key
    monkeypatch.setenv("SPECULATIVE_SCALE", " FULL ")
    assert book.demo_settings("cpu")["scale"] == "full"
    monkeypatch.setenv("SPECULATIVE_SCALE", "huge")
    with pytest.raises(ValueError, match="SPECULATIVE_SCALE='huge' is not a scale; use one of small, full, smoke"):
        book.demo_settings("cpu")


def test_named_drafts_names_the_shipped_draft_by_the_pair_a_record_was_made_with():
    import json

    from speculative.engine.pair import PAIR_DIR

    shipped = json.loads((PAIR_DIR / "pair.json").read_text())["shipped_draft"]
    # a record of the shipped pair: its own draft takes pair.json's name, and its training where the record has none
    agreement = book.load_record("agreement_cpu.json")
    assert agreement["drafts"]["shipped"]["training"] is None
    named = book.named_drafts(agreement)
    assert "shipped" not in named["drafts"] and named["drafts"][shipped["name"]]["training"] == shipped["training"]
    assert agreement["drafts"]["shipped"]["training"] is None  # the loaded record is left as it was
    # a record of the pair it replaced: that pair's draft is named by the candidate folder it was kept as
    intel = book.named_drafts(book.load_record("drafts_intel_cpu.json"))
    assert "original" in intel["drafts"] and intel["drafts"]["original"]["training"] is None
    assert intel["drafts"][shipped["name"]]["training"]["candidate"]["name"] == shipped["name"]
