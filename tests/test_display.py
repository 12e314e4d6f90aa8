"""display.py: how computed values reach the prose."""

from fractions import Fraction as F

from speculative.display import Shown, as_text, glue


def test_as_text_writes_fractions_as_a_reader_would():
    assert as_text(F(3, 10)) == "3/10"
    assert as_text(F(4, 4)) == "1"
    assert as_text([F(1, 5), F(0), F(1, 2)]) == "(1/5, 0, 1/2)"
    assert as_text(0.25) == "0.25"


def test_shown_prints_without_quotes():
    assert repr(Shown("3/10")) == "3/10"
    assert Shown("a") == Shown("a") and Shown("a") != Shown("b")


def test_glue_outside_a_notebook_returns_nothing_and_does_not_fail():
    assert glue("x", F(1, 2)) is None
