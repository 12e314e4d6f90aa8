"""Measuring: benchmarks that keep raw observations (``bench``), candidate drafts distilled and scored
(``drafts``), the record schema (``records``), every figure from a record (``analysis``), tables and
numbers as a reader writes them (``report``), and the GPU report (``gpu_report``).
"""
