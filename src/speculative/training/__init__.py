"""How the pair is made: the stdlib corpus (``corpus``), training and the pair recipe (``train``).
"""
