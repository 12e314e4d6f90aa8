"""How chapters hand computed values to their prose: exact fractions as text, and glue that works anywhere.

Explained in: book/intro (how the book is built). Every number in the prose is glued from a cell with
MyST-NB's ``glue``; outside a book build (in Colab, say) ``myst_nb`` may be missing, and :func:`glue`
then does nothing, so the chapter still runs.
"""

from __future__ import annotations

from fractions import Fraction
from numbers import Rational

__all__ = ["Shown", "as_text", "glue"]


class Shown:
    """A value whose plain-text form is ``text``: ``{glue:text}`` prints it as is, without quotes."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Shown) and other.text == self.text


def as_text(value) -> str:
    """Return ``value`` as a reader would write it: 3/10 for a Fraction, (1/5, 3/10) for a sequence of them."""
    if isinstance(value, Rational) and not isinstance(value, bool):
        value = Fraction(value)
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(as_text(v) for v in value) + ")"
    return str(value)


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
    except ImportError:  # not building the book: nothing to store
        return
    myst_glue(name, shown, display=display)
