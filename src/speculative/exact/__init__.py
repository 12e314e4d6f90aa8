"""The exact core, no torch: the rule on any number type (``rule``), enumeration in fractions (``exact``),
SymPy derivations (``symbolic``). Nothing here imports torch; a test imports it with torch blocked.
"""
