"""What the chapters share (``glue``: glue, demo settings, records for the chapters) and each chapter's
Colab edition (``colab``). Nothing in the library imports this package.
"""
