"""speculative: speculative sampling, exactly.

The library behind the book. Notation: p = target distribution, q = draft distribution. The modules, each
with one job (``defaults`` holds every default):

- exact, no torch: ``rule`` (the rule on any number type), ``exact`` (enumeration in fractions),
  ``symbolic`` (SymPy derivations), ``pitfalls`` (wrong rules, exact and sampled);
- torch: ``transforms`` (temperature, top-k, top-p, greedy), ``sampler`` (the batched rejection sampler),
  ``model`` (a byte-level GPT with a static KV cache), ``decode`` (plain and speculative decoding),
  ``evaluate`` (reference laws and scores from full forwards), ``timing`` (device-aware clocks);
- ``stats`` (goodness of fit, TV bounds, sample sizes, the measured acceptance rate);
- audits: ``audit`` (samplers and whole engines against exact laws), ``engines`` (the engine battery, the
  reference engine and its gallery), ``serving`` (the serving battery of Llama folders, serving settings
  and axes, the serving gallery), ``doors`` (vLLM in-process and OpenAI-compatible servers),
  ``serving_record`` (serving records analysed again), ``vllm_plugin`` (the correction vLLM loads);
- ``pair`` (save and load a checksummed model pair), ``corpus`` and ``train`` (how the pair is made),
  ``bench`` (benchmarks: raw observations), ``records`` (their schema), ``analysis`` (every figure from
  them), ``report`` (tables), ``book`` (what the chapters share), and the CLI
  (``python -m speculative``).

The names below are importable from ``speculative`` itself; importing the package loads torch only when
one of the torch names is first used, so ``import speculative.rule`` stays torch-free.
"""

import os as _os
from pathlib import Path as _Path

__version__ = "0.2.0"

# The book is built with the package imported from its wheel (``colab.build_site``), as Colab imports it;
# the build names that folder here, so that a chapter whose kernel imported the checkout instead fails.
_EXPECTED = _os.environ.get("SPECULATIVE_PACKAGE_FROM")
if _EXPECTED and not _Path(__file__).resolve().is_relative_to(_Path(_EXPECTED).resolve()):
    raise ImportError(f"speculative was imported from {__file__}, not from SPECULATIVE_PACKAGE_FROM={_EXPECTED}")

_PUBLIC = {
    "SamplingConfig": "transforms", "logits_to_probs": "transforms",
    "rejection_sample": "sampler", "reference_rejection_sample": "sampler", "SamplerOutput": "sampler",
    "Randomness": "sampler", "draw_randomness": "sampler",
    "GPT": "model", "GPTConfig": "model",
    "speculative_decode": "decode", "plain_decode": "decode", "prefill": "decode", "DecodeResult": "decode",
    "exact_two_byte_law": "evaluate", "completion_bits_per_byte": "evaluate",
    "Pair": "pair", "load_pair": "pair", "save_pair": "pair",
    "train_pair": "train", "get_pair": "train",
    "Clock": "timing", "environment": "timing",
    "goodness_of_fit": "stats", "samples_needed": "stats", "measured_acceptance_rate": "stats",
    "acceptance_rate": "rule", "output_distribution": "rule", "total_variation": "rule",
    "bench_decode": "bench", "bench_sampler": "bench",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name):
    if name in _PUBLIC:
        from importlib import import_module

        value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
