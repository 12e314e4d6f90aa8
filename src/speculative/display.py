"""Kept so that ``from speculative.display import glue`` still works: the helpers live in :mod:`speculative.book`."""

from .book import Shown, as_text, glue

__all__ = ["Shown", "as_text", "glue"]
