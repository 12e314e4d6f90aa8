"""speculative.engine.hf: the shipped models exported to transformers' GPT-2, and any transformers causal LM in the
engine.

Offline throughout: the exported pair, and tiny randomly initialised GPT-2 and Llama models built from
configs with fixed seeds (no download). The two-token law tests use Pearson's chi-square after pooling,
rejecting at p < 1e-6 (``stats.FALSE_ALARM_RATE``): a correct engine fails one with probability 1e-6, and
the seeds are fixed. Their power is asserted: with probability 0.99 each rejects any law whose total
variation from the exact one, on the pooled cells, exceeds ``stats.detectable_tv`` (under 0.1 here).
"""

from collections import Counter

import pytest
import torch

from speculative.engine.decode import plain_decode, speculative_decode
from speculative.engine.evaluate import exact_two_byte_law
from speculative.engine.hf import export, wrap
from speculative.engine.hf import load_pair as load_hf_pair
from speculative.engine.hf import pair as hf_pair
from speculative.sampling import stats
from speculative.sampling.transforms import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


@pytest.mark.parametrize("name", ["target", "draft"])
def test_exported_logits_equal_the_library_models(pair, name):
    model = getattr(pair, name)
    hf = export(model)
    tokens = torch.randint(0, 256, (3, model.config.context), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max().item() < 1e-4  # float32, every position of the context
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as ours


def test_the_check_can_fail_a_misplaced_layer_is_seen(pair):
    hf = export(pair.draft)
    layer = hf.transformer.h[0].mlp.c_fc
    with torch.no_grad():  # scramble one exported layer (its input rows reversed): the logits must move
        layer.weight.copy_(layer.weight.flip(0))
        tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(2))
        assert (pair.draft(tokens) - hf(tokens).logits).abs().max().item() > 1e-2


def test_transformers_greedy_generation_equals_the_engines(pair):
    hf = export(pair.target)
    prompt = pair.prompts[5]
    ids = torch.tensor([list(prompt)])
    generated = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    ours = plain_decode(pair.target, [prompt], 24, SamplingConfig(temperature=0.0))
    assert generated[0, ids.shape[1]:].tolist() == ours.tokens[0]


def test_export_refuses_anything_but_the_library_gpt():
    with pytest.raises(TypeError, match="library's GPT"):
        export(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------------------
# wrap: any transformers causal LM in the engine


def tiny(family: str, seed: int, vocab: int = 8, layers: int = 2, width: int = 32, context: int = 64):
    """A randomly initialised transformers model from a config (no download). The large initial scale
    makes its distributions far from uniform, so that draft and target disagree often."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    special = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=context, n_embd=width, n_layer=layers, n_head=4,
                            initializer_range=0.5, **special)
        return GPT2LMHeadModel(config).eval()
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                         initializer_range=0.5, **special)
    return LlamaForCausalLM(config).eval()


def byte_tokenizer(swap: bool = False):
    """A byte-level tokenizer of 256 tokens with no merges, built offline; ``swap`` exchanges two ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if swap:
        alphabet[0], alphabet[1] = alphabet[1], alphabet[0]
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core)


def test_the_wrapped_exported_pair_decodes_greedily_as_the_library_target(pair):
    # three prompts of different lengths in one batch: each row keeps its own cache and positions
    prompts = [pair.prompts[0][:50], pair.prompts[1], pair.prompts[2][:70]]
    target, draft = wrap(export(pair.target)), wrap(export(pair.draft))
    reference = plain_decode(pair.target, prompts, 40, GREEDY).tokens
    out = speculative_decode(target, draft, prompts, 40, 4, GREEDY)
    assert out.tokens == reference
    assert 0 < out.acceptance_rate() < 1  # drafts were both accepted and rejected: the rollback ran
    assert plain_decode(target, prompts, 40, GREEDY).tokens == reference


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_models_decode_greedily_as_their_own_generate(family):
    target, draft = tiny(family, 1), tiny(family, 2, layers=1, width=16)
    prompts = [[1, 2, 3, 4, 5], [7, 0, 6], [3, 3, 1, 0, 2, 5, 4]]
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        expected.append(target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30,
                                        do_sample=False)[0, len(prompt):].tolist())
    wrapped = wrap(target)
    assert plain_decode(wrapped, prompts, 30, GREEDY).tokens == expected
    out = speculative_decode(wrapped, wrap(draft), prompts, 30, 3, GREEDY)
    assert out.tokens == expected
    assert 0 < out.acceptance_rate() < 1


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rows_that_start_together_run_as_one_batch_with_the_logits_of_full_forwards(family):
    # a prefill of four rows (one batch), then a call at starts 6, 3, 6, 4: rows 0 and 2 are stacked, rows 1
    # and 3 are cropped and run alone; every row's logits must be those of a full forward over its history
    model = tiny(family, 1)
    wrapped = wrap(model)
    prompt = torch.randint(0, 8, (4, 6), generator=torch.Generator().manual_seed(3))
    step = torch.randint(0, 8, (4, 2), generator=torch.Generator().manual_seed(4))
    starts = torch.tensor([6, 3, 6, 4])
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    cache = wrapped.new_cache(4)
    wrapped(prompt, 0, cache)
    logits = wrapped(step, starts, cache)
    assert len(calls) == 1 + 3  # the prefill, then rows 0 and 2 together and rows 1 and 3 alone
    with torch.no_grad():
        for row, begin in enumerate(starts.tolist()):
            history = torch.cat([prompt[row, :begin], step[row]])[None]
            full = model(history).logits[0, -2:]
            assert (logits[row] - full).abs().max().item() < 1e-4, row
    assert [past.get_seq_length() for past in cache.rows] == [8, 5, 8, 6]
    # a third call at starts 8, 4, 7, 4: rows 1 and 3, both cropped to 4, are stacked; rows 0 and 2, whose
    # caches came out of the last call's split, run alone, row 2 after a crop
    histories = [torch.cat([prompt[row, :begin], step[row]]) for row, begin in enumerate(starts.tolist())]
    more = torch.randint(0, 8, (4, 1), generator=torch.Generator().manual_seed(5))
    again = torch.tensor([8, 4, 7, 4])
    before = len(calls)  # the reference forwards above were counted too
    logits = wrapped(more, again, cache)
    assert len(calls) == before + 3
    with torch.no_grad():
        for row, begin in enumerate(again.tolist()):
            full = model(torch.cat([histories[row][:begin], more[row]])[None]).logits[0, -1:]
            assert (logits[row] - full).abs().max().item() < 1e-4, row


def _two_token_test(target, draft, seed: int, rows: int = 3_000):
    prompt = [1, 2, 3, 4, 5]
    law = exact_two_byte_law(target, prompt, SamplingConfig()).flatten().tolist()  # full forwards, no cache
    out = speculative_decode(target, draft, [prompt] * rows, 2, 1, SamplingConfig(),
                             torch.Generator().manual_seed(seed))
    vocab = target.config.vocab_size
    counts = Counter(a * vocab + b for a, b in out.tokens)
    return stats.goodness_of_fit([counts[i] for i in range(vocab * vocab)], law), law, out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_models_first_two_tokens_follow_the_exact_law(family):
    # gamma = 1 and two tokens: a row whose draft is rejected needs a second block, after a crop
    target, draft = wrap(tiny(family, 1)), wrap(tiny(family, 2, layers=1, width=16))
    result, law, out = _two_token_test(target, draft, seed=5)
    assert not result.rejects(), result
    assert stats.detectable_tv(3_000, stats.pooled(law, 3_000)) < 0.1
    assert 0.1 < out.acceptance_rate() < 0.9  # both paths taken often


@pytest.mark.slow
def test_the_law_test_catches_a_wrapper_that_does_not_roll_back(monkeypatch):
    # sabotage: cropping does nothing, so a row after a rejection attends to the rejected draft
    from transformers import DynamicCache

    monkeypatch.setattr(DynamicCache, "crop", lambda self, n: None)
    target, draft = wrap(tiny("gpt2", 1)), wrap(tiny("gpt2", 2, layers=1, width=16))
    result, _, _ = _two_token_test(target, draft, seed=5)
    assert result.rejects(), result


def test_the_law_test_catches_a_wrong_rule_on_wrapped_models():
    from speculative.audit import pitfalls

    target, draft = wrap(tiny("gpt2", 1)), wrap(tiny("gpt2", 2, layers=1, width=16))
    prompt = [1, 2, 3, 4, 5]
    law = exact_two_byte_law(target, prompt, SamplingConfig()).flatten().tolist()
    out = speculative_decode(target, draft, [prompt] * 600, 2, 1, SamplingConfig(), torch.Generator().manual_seed(5),
                             sampler=pitfalls.resample_from_target_sampler())
    counts = Counter(a * 8 + b for a, b in out.tokens)
    assert stats.goodness_of_fit([counts[i] for i in range(64)], law).rejects()


def test_padded_vocabularies_are_cut_to_the_tokenizer():
    # two checkpoints padded past the tokenizer to different sizes (as Qwen2.5 0.5B and 7B are)
    tokenizer = byte_tokenizer()
    target, draft = tiny("gpt2", 1, vocab=272), tiny("gpt2", 2, vocab=264, layers=1, width=16)
    with pytest.raises(ValueError, match="pass both tokenizers"):
        hf_pair(target, draft)
    wrapped = hf_pair(target, draft, tokenizer, tokenizer, prompts=["def f(x):"])
    assert wrapped.target.config.vocab_size == wrapped.draft.config.vocab_size == 256
    ids = torch.tensor([wrapped.prompts[0]])
    assert torch.equal(wrapped.target(ids), target(ids).logits[..., :256])
    out = speculative_decode(wrapped.target, wrapped.draft, wrapped.prompts, 20, 3, GREEDY)
    assert out.tokens == plain_decode(wrapped.target, wrapped.prompts, 20, GREEDY).tokens
    assert max(max(row) for row in out.tokens) < 256


def test_a_draft_with_another_tokenizer_is_refused():
    target, draft = tiny("gpt2", 1, vocab=256), tiny("gpt2", 2, vocab=256, layers=1, width=16)
    with pytest.raises(ValueError, match="draft's tokenizer is not the target's"):
        hf_pair(target, draft, byte_tokenizer(), byte_tokenizer(swap=True))


def test_wrapped_models_refuse_what_they_cannot_do(pair):
    from speculative.engine.multi_draft import multi_draft_decode

    target = wrap(tiny("gpt2", 1))
    with pytest.raises(TypeError, match="library's GPT only"):
        multi_draft_decode(target, target, [1, 2, 3], 4, 2, 2)
    with pytest.raises(TypeError, match="transformers model"):
        wrap(pair.target)
    with pytest.raises(ValueError, match="vocab_size must be"):
        wrap(tiny("gpt2", 1), vocab_size=9)
    with pytest.raises(ValueError, match="context"):
        plain_decode(target, [[1, 2, 3]], 70, GREEDY)


def test_load_pair_reads_saved_checkpoints_offline(tmp_path):
    tokenizer = byte_tokenizer()
    for name, model in (("t", tiny("llama", 1, vocab=256)), ("d", tiny("llama", 2, vocab=256, layers=1, width=16))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    loaded = load_hf_pair(str(tmp_path / "t"), str(tmp_path / "d"), prompts=["x = 1"])
    assert loaded.prompts == [tokenizer("x = 1", add_special_tokens=False)["input_ids"]]
    out = speculative_decode(loaded.target, loaded.draft, loaded.prompts, 12, 2, GREEDY)
    assert out.tokens == plain_decode(loaded.target, loaded.prompts, 12, GREEDY).tokens


# ---------------------------------------------------------------------------------------------------------
# the command line: the race, and bench decode on a transformers pair


def test_bench_peer_records_both_sides_on_the_same_models(tmp_path, capsys):
    import json

    from speculative.cli import main
    from speculative.measure import analysis

    out = tmp_path / "peer.json"
    assert main(["bench", "peer", "--prompts", "2", "--max-new-tokens", "8", "--repeats", "1",
                 "--schedules", "default,fixed", "--no-progress", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["environment"]["transformers"] and record["config"]["schedules"] == ["default", "fixed"]
    rows = record["results"]
    # the summary is the analysis of the observations the race kept (re-analysed after the JSON round trip)
    assert json.dumps(analysis.analyse(record), sort_keys=True) == json.dumps(rows, sort_keys=True)
    assert len(record["observations"]) == 2 * 1 * 2 * 6  # temperatures x repeats x prompts x decoders
    assert sorted((r["temperature"], r["hf_schedule"]) for r in rows) == [(0.0, "default"), (0.0, "fixed"),
                                                                        (1.0, "default"), (1.0, "fixed")]
    for row in rows:
        assert row["batch"] == 1 and row["policy"] == "fixed"
        for key in ("ours_tokens_per_s", "hf_assisted_tokens_per_s", "hf_plain_tokens_per_s", "ours_acceptance",
                    "hf_acceptance", "ours_tokens_per_call", "hf_tokens_per_call", "ours_over_hf_assisted"):
            low, high = row[f"{key}_ci95"]
            assert low <= row[key] + 1e-9 and row[key] <= high + 1e-9 and row[key] > 0, key
        seconds = row["seconds_per_prompt"]
        assert row["ours_over_hf_assisted"] == pytest.approx(sum(seconds[f"hf_{row['hf_schedule']}"])
                                                             / sum(seconds["ours"]))
        # the decomposition: this loop on transformers' forwards, against both sides, paired by prompt
        for key, other in (("over_hf_assisted", f"hf_{row['hf_schedule']}"), ("over_ours_fixed", "ours_fixed")):
            low, high = row[f"ours_on_hf_models_{key}_ci95"]
            value = row[f"ours_on_hf_models_{key}"]
            assert low <= value + 1e-9 and value <= high + 1e-9
            assert value == pytest.approx(sum(seconds[other]) / sum(seconds["ours_on_hf_models"]))
    for row in rows:  # greedy: every decoder emitted the target's greedy tokens
        if row["temperature"] == 0:
            assert all(row["greedy_outputs_equal"].values()), row["greedy_outputs_equal"]
    fixed = [r for r in rows if r["hf_schedule"] == "fixed"]
    assert all(r["hf_drafts_per_call"] <= 4 for r in fixed)
    greedy_fixed = [r for r in fixed if r["temperature"] == 0][0]  # same drafts, same greedy matching
    assert greedy_fixed["hf_tokens_per_call"] == pytest.approx(greedy_fixed["ours_tokens_per_call"])
    assert "HF assisted tok/s" in capsys.readouterr().out


def test_bench_peer_runs_keeps_each_race_and_the_range_of_ours_over_hf(tmp_path, capsys):
    import json

    from speculative.cli import main
    from speculative.measure import analysis, lookup

    out = tmp_path / "peer_runs.json"
    assert main(["bench", "peer", "--prompts", "2", "--max-new-tokens", "6", "--repeats", "1", "--temperature", "1",
                 "--schedules", "default", "--runs", "2", "--no-progress", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["config"]["runs"] == 2 and "observations" not in record
    assert [len(run["observations"]) for run in record["runs"]] == [2 * 5, 2 * 5]  # prompts x decoders
    assert json.dumps(analysis.analyse(record), sort_keys=True) == json.dumps(record["results"], sort_keys=True)
    (row,) = record["results"]
    # each run's ratio is that run's own race, re-analysed alone; the range spans them
    alone = [analysis.analyse(run)[0]["ours_over_hf_assisted"] for run in lookup.split_runs(record)]
    assert row["ours_over_hf_assisted_runs"] == alone
    assert row["ours_over_hf_assisted_range"] == [min(alone), max(alone)]
    assert row["ours_speedup_range"][0] <= row["ours_speedup_median_run"] <= row["ours_speedup_range"][1]
    low, high = row["ours_over_hf_assisted_range"]
    assert f"{low:.2f}-{high:.2f}x" in capsys.readouterr().out  # the table's last column


def test_bench_decode_runs_a_transformers_pair(tmp_path, capsys):
    import json

    from speculative.cli import main

    tokenizer = byte_tokenizer()
    for name, model in (("t", tiny("llama", 1, vocab=256, context=512)),
                        ("d", tiny("llama", 2, vocab=256, layers=1, width=16, context=512))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--hf-target", str(tmp_path / "t"), "--hf-draft", str(tmp_path / "d"),
                 "--gamma", "2", "--temperature", "0", "--batch", "1,2", "--prompts", "2", "--max-new-tokens", "6",
                 "--repeats", "1", "--no-progress", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {r["batch"] for r in record["results"]} == {1, 2}
    assert record["config"]["dtype"] == "torch.float32" and str(tmp_path / "t") in record["pair_sha256"]
    assert main(["bench", "decode", "--hf-target", str(tmp_path / "t"), "--no-progress"]) == 2
    assert "pass both --hf-target and --hf-draft" in capsys.readouterr().err


def test_bench_decode_runs_the_shipped_pair_in_bfloat16(tmp_path):
    # the dtype path a GPU run takes (--device cuda --dtype bfloat16); on this CPU only its correctness is seen
    import json

    from speculative.cli import main

    out = tmp_path / "bf16.json"
    assert main(["bench", "decode", "--dtype", "bfloat16", "--gamma", "2", "--temperature", "0,1", "--batch", "1",
                 "--prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--no-progress", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["config"]["dtype"] == "torch.bfloat16"
    assert all(0 <= r["alpha"] <= 1 and r["tokens_per_target_forward"] >= 1 for r in record["results"])


def test_the_gpu_sections_race_runs_on_tiny_checkpoints(tmp_path):
    # chapter 08 calls race_public_pair on CUDA with a public pair; here the same code on CPU, offline
    from speculative.engine.hf import public_pair_names
    from speculative.measure.bench_peer import race_public_pair

    tokenizer = byte_tokenizer()
    for name, model in (("t", tiny("gpt2", 1, vocab=256, context=512)),
                        ("d", tiny("gpt2", 2, vocab=256, layers=1, width=16, context=512))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    out = race_public_pair(str(tmp_path / "t"), str(tmp_path / "d"), device="cpu", dtype=torch.float32,
                           prompts=["def f(x):\n    return", "import os\n"], gammas=(2, 3), max_new_tokens=8,
                           calibration_repeats=1)
    assert out["decode"]["config"]["calibration_repeats"] == out["peer"]["config"]["calibration_repeats"] == 1
    assert {r["gamma"] for r in out["decode"]["results"]} == {2, 3}
    peer = out["peer"]["results"]
    assert {(r["temperature"], r["hf_schedule"]) for r in peer} == {(0.0, "default"), (0.0, "fixed"), (1.0, "default"),
                                                                   (1.0, "fixed")}
    assert all(r["gamma"] == 3 and "ours_on_hf_models_tokens_per_s" not in r for r in peer)
    assert all(all(r["greedy_outputs_equal"].values()) for r in peer if r["temperature"] == 0)
    assert set(public_pair_names()) == {"target", "draft"}
