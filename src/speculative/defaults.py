"""Every default in one place: the shipped pair's shapes and budgets, and the benchmarks' settings.

The CLI, the library functions and :class:`speculative.engine.model.GPTConfig` read these names; nothing else
types them. Changing a value here changes it everywhere (``--help`` included).
"""

from __future__ import annotations

from dataclasses import field


def setting(default, help: str, **cli):
    """A field of a settings dataclass: its default and the help text the command line shows for it, and how
    the command line spells it where that differs from the field (``flag``, ``metavar``, ``choices``, ``words``
    accepted beside numbers; ``repeat``: the option may be given several times, each adding one value;
    ``parse``: the name of the command line's parser for its items, e.g. ``shape``)."""
    return field(default=default, metadata={"help": help, **cli})


#: The shipped target: 6 blocks of width 384 with 6 heads, over bytes, 256 positions.
TARGET_SHAPE = {"n_layer": 6, "d_model": 384, "n_head": 6}
#: The shipped draft: 2 blocks of width 128 with 2 heads.
DRAFT_SHAPE = {"n_layer": 2, "d_model": 128, "n_head": 2}
CONTEXT = 256  # positions the models and their caches hold
VOCAB_SIZE = 256  # bytes

#: The pair ``train.get_pair(train_small=True)`` trains in about a minute, for machines without the files.
SMALL_TARGET_SHAPE = {"n_layer": 2, "d_model": 64, "n_head": 2}
SMALL_DRAFT_SHAPE = {"n_layer": 1, "d_model": 32, "n_head": 2}
#: The held-out prompts saved with a pair: how many, and how many bytes each.
PROMPTS = {"count": 64, "length": 96}

#: Training budgets (wall-clock seconds) and the draft's distillation weight, as the shipped pair used.
TARGET_SECONDS = 4200.0
DRAFT_SECONDS = 720.0
DISTILL_WEIGHT = 0.8
TRAIN_SEED = 0
#: ``train-draft``: the windows every candidate distils on, of the target's own samples and of training text.
DISTILL_WINDOWS = {"sampled": 2048, "text": 2048}

#: ``bench decode``: draft lengths, temperatures, batch sizes, prompts decoded per point (in groups of the
#: batch size), tokens per row, timed repeats, seed.
BENCH_DECODE = {"gammas": (1, 2, 4, 6, 8), "temperatures": (0.0, 0.7, 1.0), "batches": (1, 4, 16), "prompts": 32,
                "max_new_tokens": 128, "repeats": 2, "seed": 0, "calibration_repeats": 5,
                "rules": ("token",), "drafts": (1,), "scheme": "with_replacement"}
#: ``bench drafts`` and ``bench agreement``: draft lengths and temperatures raced, timed rounds per run,
#: independent runs.
BENCH_DRAFTS = {"gammas": (2, 4, 6), "temperatures": (0.0, 1.0), "repeats": 1, "runs": 3}
#: The fewest groups of prompts over which a report prints a bootstrap interval: with n groups the resamples
#: take at most C(2n - 1, n) distinct values (3 at two groups, 35 at four, 126 at five), too few below five
#: for a 95% interval to mean much. The records keep the interval; the tables print "no interval".
MIN_INTERVAL_GROUPS = 5
#: The longest block the cost-model policy (``--gamma auto``) may draft, and the lengths it is calibrated at.
AUTO_MAX_GAMMA = 8
#: The least a verification may cost in the cost-model policy, in plain steps: a forward over k + 1 positions
#: does not cost less than a plain step over one, so a calibrated v(k) below this is timing noise.
AUTO_V_FLOOR = 1.0
#: The most drafts the heuristic and confidence policies may ask for in ``bench peer`` (transformers'
#: default assisted generation drafts up to 20).
PEER_MAX_GAMMA = 20
#: ``bench prices``: draft shapes timed (random weights: a forward's cost does not depend on them), the
#: target's widths (positions per forward), interleaved rounds.
BENCH_PRICES = {"shapes": ({"n_layer": 1, "d_model": 128, "n_head": 2}, {"n_layer": 2, "d_model": 128, "n_head": 2},
                           {"n_layer": 2, "d_model": 192, "n_head": 3}, {"n_layer": 2, "d_model": 256, "n_head": 4},
                           {"n_layer": 3, "d_model": 256, "n_head": 4}, {"n_layer": 4, "d_model": 256, "n_head": 4},
                           {"n_layer": 2, "d_model": 384, "n_head": 6}),
                "widths": tuple(range(1, 10)), "repeats": 7}
#: ``bench sampler``: batch sizes, vocabularies, drafted tokens per row, timed repeats, seed.
BENCH_SAMPLER = {"batches": (1, 64), "vocabs": (256, 32000), "k": 4, "repeats": 5, "seed": 0}

#: What a chapter runs live: small on a CPU; the benchmark's own settings at full scale (a GPU, or
#: SPECULATIVE_SCALE=full), with fewer repeats since a chapter shows a run, not a record.
DEMO_SMALL = {"gammas": [1, 4], "temperatures": [0.0, 1.0], "batches": [1, 4], "prompts": 4, "max_new_tokens": 64,
              "repeats": 1, "distribution_rows": 6_000, "task_rows": 512,
              "calibration_repeats": BENCH_DECODE["calibration_repeats"]}
DEMO_FULL = {"gammas": list(BENCH_DECODE["gammas"]), "temperatures": list(BENCH_DECODE["temperatures"]),
             "batches": list(BENCH_DECODE["batches"]), "prompts": BENCH_DECODE["prompts"],
             "max_new_tokens": BENCH_DECODE["max_new_tokens"], "repeats": BENCH_DECODE["repeats"],
             "distribution_rows": 24_000, "task_rows": 4096, "calibration_repeats": BENCH_DECODE["calibration_repeats"]}
#: SPECULATIVE_SCALE=smoke: toy sizes at which every chapter runs to its end in seconds, for the test that
#: runs each Colab edition from the wheel (tests/test_colab.py). Its figures mean nothing, and a chapter
#: skips the claims that need a large sample (``check_claims`` is False in ``book.demo_settings``).
#: ``audit_rows`` caps each audit case's sample (None: the audit's own sizes, ``audit.MAX_ROWS``).
DEMO_SMOKE = {"gammas": [4], "temperatures": [0.0, 1.0], "batches": [1], "prompts": 2, "max_new_tokens": 16,
              "repeats": 1, "distribution_rows": 300, "task_rows": 32, "audit_rows": 200, "calibration_repeats": 1}
#: ``bench peer``: temperatures, this engine's fixed draft length (and transformers' fixed schedule's),
#: transformers' schedules, this engine's policies; its prompts, tokens per prompt, timed rounds and seed
#: are ``bench decode``'s (above).
BENCH_PEER = {"temperatures": (0.0, 1.0), "gamma": 4, "schedules": ("default", "fixed"), "policies": ("fixed",)}
#: The confidence stop's threshold: drafting stops after a token the draft gave less than this probability
#: (transformers' default ``assistant_confidence_threshold``).
CONFIDENCE_THRESHOLD = 0.4

#: ``gpu-report`` (:mod:`speculative.measure.gpu_report`) on one GPU: each step's sizes and the report's time budget in
#: seconds. Sized to fit about 8 minutes on one GPU (not yet measured there): the shipped pair's forwards
#: cost about a millisecond on a GPU, so its sweep is dominated by the number of calls.
GPU_REPORT = {
    "budget_s": 480,
    "sampler": {"batches": (1, 64), "vocabs": (256, 32000), "repeats": 5},
    "decode": {"gammas": (1, 2, 4, 6, 8), "temperatures": (0.0, 1.0), "batches": (1, 16), "prompts": 16,
               "max_new_tokens": 64, "repeats": 3, "calibration_repeats": 3},
    "syncs": {"batches": (1, 16), "temperatures": (0.0, 1.0), "gamma": 4, "max_new_tokens": 64},
    "prices": {"shapes": BENCH_PRICES["shapes"], "widths": BENCH_PRICES["widths"], "repeats": 5},
    "public": {"prompts": 4, "gammas": (2, 4, 6), "max_new_tokens": 64, "repeats": 1, "calibration_repeats": 2},
}
#: ``gpu-report --device cpu``: the same steps at sizes a CPU runs in seconds (for the offline test).
GPU_REPORT_SMOKE = {
    "budget_s": 480,
    "sampler": {"batches": (2,), "vocabs": (16,), "repeats": 1},
    "decode": {"gammas": (2,), "temperatures": (0.0, 1.0), "batches": (1,), "prompts": 2, "max_new_tokens": 8,
               "repeats": 1, "calibration_repeats": 1},
    "syncs": {"batches": (1, 2), "temperatures": (1.0,), "gamma": 4, "max_new_tokens": 16},
    "prices": {"shapes": ({"n_layer": 1, "d_model": 32, "n_head": 1},), "widths": (1, 2), "repeats": 1},
    "public": {"prompts": 2, "gammas": (2, 3), "max_new_tokens": 8, "repeats": 1, "calibration_repeats": 1},
}
