"""speculative: speculative sampling, exactly.

The library behind the book. Notation: p = target distribution, q = draft distribution. Its subpackages are
rings, each importing only from the rings before it (``tests/test_structure.py`` checks it):

- ``exact``: the rule on any number type, enumeration in fractions, SymPy derivations; no torch;
- ``sampling``: temperature, top-k, top-p and serving settings, the batched rejection sampler, statistics;
- ``engine``: the byte-level GPT, decoding, draft-length policies, transformers models, the model pair,
  reference laws, clocks;
- ``training``: the corpus and how the pair is trained;
- ``measure``: benchmarks (raw observations), candidate drafts, the record schema, analysis, tables;
- ``audit``: samplers, engines and servers against exact laws, with their galleries, the doors to vLLM and
  OpenAI-compatible servers, and the vLLM plugin;
- ``book``: what the chapters share and their Colab editions; nothing else imports it.

``defaults`` holds every default and ``cli`` the command line (``python -m speculative``). The names below
are importable from ``speculative`` itself; importing the package loads torch only when one of the torch
names is first used, so ``import speculative.exact.rule`` stays torch-free.
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
    "SamplingConfig": "sampling.transforms", "logits_to_probs": "sampling.transforms",
    "rejection_sample": "sampling.sampler", "reference_rejection_sample": "sampling.sampler",
    "SamplerOutput": "sampling.sampler", "Randomness": "sampling.sampler", "draw_randomness": "sampling.sampler",
    "GPT": "engine.model", "GPTConfig": "engine.model", "speculative_decode": "engine.decode",
    "plain_decode": "engine.decode", "prefill": "engine.decode", "DecodeResult": "engine.decode",
    "exact_two_byte_law": "engine.evaluate", "completion_bits_per_byte": "engine.evaluate", "Pair": "engine.pair",
    "load_pair": "engine.pair", "save_pair": "engine.pair", "train_pair": "training.train",
    "get_pair": "training.train", "Clock": "engine.timing", "environment": "engine.timing",
    "goodness_of_fit": "sampling.stats", "samples_needed": "sampling.stats",
    "measured_acceptance_rate": "sampling.stats", "acceptance_rate": "exact.rule",
    "output_distribution": "exact.rule", "total_variation": "exact.rule", "bench_decode": "measure.bench_decode",
    "bench_sampler": "measure.bench_sampler",
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
