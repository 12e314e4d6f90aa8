"""Measuring: benchmarks that keep raw observations, one module each (``bench_sampler``, ``bench_decode``,
``bench_drafts``, ``bench_peer``), with their settings (``settings``) and the loop's steps timed apart
(``calibration``), candidate drafts distilled and scored (``drafts``), the record schema (``records``, its
summary rows' types in ``rows``), every figure from a record (``analysis``, by kind in ``analysis_<kind>``, with
``shared`` statistics, ``costs``, ``lookup``, ``compare`` and ``ranking``), tables and numbers as a reader
writes them (``report``), and the GPU report (``gpu_report``).
"""
