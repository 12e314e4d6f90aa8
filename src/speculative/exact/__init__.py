"""The exact core, no torch: the rule on any number type (``rule``), enumeration in fractions (``exact``),
several drafts per position and draft trees (``multi_draft``), the laws of wrong rules (``pitfall_laws``),
SymPy derivations (``symbolic``). Nothing here imports torch; a test imports it with torch blocked.
"""
