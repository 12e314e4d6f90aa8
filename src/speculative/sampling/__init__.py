"""Sampling with torch: temperature, top-k, top-p and serving settings (``transforms``), the batched
rejection sampler (``sampler``), tokens drawn from given uniforms by inverse CDF (``draws``), and the
statistics every test and audit uses (``stats``).
"""
