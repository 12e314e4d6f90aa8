"""speculative: speculative sampling, exactly.

The library behind the book: the acceptance rule and exact verification (``rule``, ``exact``), with more
modules added chapter by chapter. Notation: p = target distribution, q = draft distribution.
"""

__version__ = "0.1.0"
