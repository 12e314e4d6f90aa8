"""The serving battery, its settings, the serving gallery's bug classes, and the OpenAI door against a server
kept outside the library (tests/serving_stub.py, started through --serve)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speculative.audit.core import _sample_size
from speculative.audit.doors import openai_engine, served_engine
from speculative.audit.engine_audit import ENGINE_MAX_ROWS, audit_engine
from speculative.audit.seeds import SEED_GALLERY, keyed_uniforms, seed_check_power, seed_checks
from speculative.audit.serving import (
    HEAD_SIZE,
    SERVING_CASES,
    SERVING_GALLERY,
    SERVING_TV,
    ServingConfig,
    _entry_cases,
    _enumerated_power,
    offset_case,
    paired,
    positional_law,
    serving_battery,
    serving_probs,
    wrong_law,
)
from speculative.sampling import stats
from speculative.sampling.draws import inverse_cdf

STUB = Path(__file__).with_name("serving_stub.py")
TEMPLATE = f"{sys.executable} {STUB} --target {{target}} --draft {{draft}} --port {{port}}"


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving-battery")
    return root, serving_battery(root)


def _by_name(cases):
    return {case.name: case for case in cases}


# --------------------------------------------------------------------------- settings


def test_serving_probs_follow_vllms_order_computed_by_hand():
    logits = torch.tensor([[1.0, -0.5, 0.3, 2.0]])
    tokens = torch.tensor([[0, 3, 3, 1]])  # prompt [0], output so far [3, 3, 1]
    config = ServingConfig(0.8, top_k=3, min_p=0.31, presence_penalty=0.1, frequency_penalty=0.2,
                           repetition_penalty=1.3, logit_bias=((1, 1.0), (2, -0.25)))
    got = serving_probs(logits, config, tokens, torch.tensor([4]), prompt_length=1)
    x = np.array([1.0, -0.5, 0.3, 2.0]) + np.array([0, 1.0, -0.25, 0])  # bias first: [1, 0.5, 0.05, 2]
    seen = np.array([True, True, False, True])  # prompt and output
    x = np.where(seen, np.where(x > 0, x / 1.3, x * 1.3), x)
    counts = np.array([0, 1, 0, 2])  # output only
    x = x - 0.2 * counts - 0.1 * (counts > 0)
    x = x / 0.8
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    x = np.where(p < 0.31 * p.max(), -np.inf, x)
    kth = np.sort(x)[-3]
    x = np.where(x < kth, -np.inf, x)
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert np.allclose(got[0].numpy(), want, atol=1e-6)
    # top-3 keeps token 1 and min_p drops it (its probability is 0.30 of the largest after the temperature;
    # 0.38 before it, so a min_p applied before the temperature would keep it)
    assert got[0, 1] == 0 and got[0, 2] == 0 and (got[0, [0, 3]] > 0).all()


@pytest.mark.parametrize("fields, word", [({"min_p": 1.5}, "min_p"), ({"presence_penalty": 3}, "presence_penalty"),
                                          ({"repetition_penalty": 0}, "repetition_penalty"),
                                          ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
                                          ({"logit_bias": ((1, float("nan")),)}, "bias")])
def test_bad_serving_settings_fail_in_one_line(fields, word):
    with pytest.raises(ValueError, match=word) as caught:
        ServingConfig(**fields)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- the battery


def test_battery_is_folders_that_engines_load_with_exact_laws_and_margins(battery):
    root, cases = battery
    assert [case.name for case in cases] == SERVING_CASES
    for case in cases:
        for model in (case.target, case.draft):
            folder = Path(model.folder)
            config = json.loads((folder / "config.json").read_text())
            assert config["architectures"] == ["LlamaForCausalLM"] and config["head_dim"] == HEAD_SIZE >= 32
            assert (folder / "model.safetensors").exists() and not list(folder.glob("tokenizer*"))
        assert all(0 <= t < case.vocab for t in case.prompt)
        codes, probs = case.law()
        assert abs(probs.sum() - 1) < 1e-9 and (probs > 0).all()
        assert case.margin >= 1e-4, case.name
        # the sample the audit draws detects SERVING_TV at power 0.99 within the models convention's cap
        n = _sample_size(list(probs) + [0.0], case, 1e-6 / len(cases), ENGINE_MAX_ROWS["models"])
        assert n < ENGINE_MAX_ROWS["models"]
        assert stats.detectable_tv(n, stats.pooled(list(probs), n), 1e-6 / len(cases)) <= SERVING_TV + 1e-9
    # the draft differs from the target, so speculation rejects and rolls back
    assert all(0.2 < case.acceptance < 0.95 for case in cases)


def test_the_battery_reloads_the_same_weights(battery):
    root, cases = battery
    again = serving_battery(root, names=[SERVING_CASES[0]])[0]
    context = torch.tensor([cases[0].prompt])
    assert torch.equal(again.target(context), cases[0].target(context))
    with pytest.raises(ValueError, match="no serving case named"):
        serving_battery(root, names=["V = 99"])


def test_paired_law_is_the_product_of_one_request_law(battery):
    case = battery[1][0]
    pair = paired(case)
    base_codes, base_probs = pair.base.law()
    codes, probs = pair.law()
    assert len(codes) == len(base_codes) ** 2 and abs(probs.sum() - 1) < 1e-12
    table = dict(zip(codes.tolist(), probs.tolist()))
    shift = case.vocab ** pair.base.length
    for i in (0, 3, len(base_codes) - 1):
        for j in (1, 2):
            assert math.isclose(table[int(base_codes[i]) * shift + int(base_codes[j])], base_probs[i] * base_probs[j])


# --------------------------------------------------------------------------- the serving gallery


#: the cases each wrong engine of the serving gallery must fail (every case it runs on)
_MUST_FAIL = {"settings_not_expanded": 2, "shared_stream": 1, "penalty_per_step": 1, "logit_bias_ignored": 1,
              "point_residual": 2, "bf16_draft": 1, "block_hybrid": 2}
#: entries whose wrong law is too close to the target's for a short sample: they run at the audit's size
_FULL_SIZE = {"bf16_draft"}


@pytest.mark.parametrize("entry", SERVING_GALLERY, ids=lambda entry: entry.key)
def test_each_serving_gallery_engine_gets_its_verdict(battery, entry):
    cases = _entry_cases(entry, battery[1])
    report = audit_engine(entry.engine(), cases=cases, max_rows=None if entry.key in _FULL_SIZE else 6_000)
    assert report.passed == entry.lawful, report.table()
    failed = sum(not r.passed for r in report.results)
    assert failed == (0 if entry.lawful else _MUST_FAIL[entry.key]), report.table()


@pytest.mark.parametrize("key, case_index", [("shared_stream", "paired"), ("logit_bias_ignored", 4),
                                             ("bf16_draft", "offset"), ("settings_not_expanded", 1),
                                             ("point_residual", 0)])
def test_an_enumerated_wrong_law_is_the_law_the_wrong_engine_samples(battery, key, case_index):
    entry = next(e for e in SERVING_GALLERY if e.key == key)
    cases = battery[1]
    made = {"paired": lambda: paired(cases[0]), "offset": lambda: offset_case(cases[0])}
    case = made[case_index]() if case_index in made else cases[case_index]
    wrong = wrong_law(entry, case)
    codes = np.array(sorted(wrong))
    probs = np.array([wrong[c] for c in codes])
    tokens = case.run(entry.engine(), torch.Generator().manual_seed(3), 6_000)
    rows = case.codes_of(torch.as_tensor(tokens))
    where = np.searchsorted(codes, rows).clip(max=len(codes) - 1)
    assert (codes[where] == rows).all()  # the engine emits nothing the enumerated law rules out
    fit = stats.goodness_of_fit(np.bincount(where, minlength=len(codes)), probs)
    assert fit.p_value > 1e-6  # false alarm 1e-6; a law that differs by TV 0.1 fails at power ~1
    # and the power from it, at the audit's sample size, is what the gallery reports
    assert _enumerated_power(entry, case, 30_000, 1e-6) > 0.99


def test_the_positional_law_of_the_correct_rule_is_the_target_law(battery):
    for case in battery[1]:
        codes, probs = case.law()
        law = positional_law(case)
        got = np.array([law.get(int(code), 0.0) for code in codes])
        assert abs(sum(law.values()) - 1) < 1e-6  # float32 probabilities, summed in float64
        assert 0.5 * np.abs(got - probs).sum() < 1e-6, case.name  # float32 models: agreement to ~1e-7
    with pytest.raises(ValueError, match="penalty_per_step"):
        positional_law(battery[1][0], "penalty_per_step")


def test_an_offset_draft_keeps_its_float32_law_and_moves_its_logits(battery):
    case = battery[1][0]
    shifted = offset_case(case, 64.0)
    probe = torch.randint(case.vocab, (64, 10), generator=torch.Generator().manual_seed(5))
    before, after = case.draft(probe), shifted.draft(probe)
    assert 48 < float((after - before).mean()) < 80  # about the offset asked for, in every context
    assert (torch.softmax(after, -1) - torch.softmax(before, -1)).abs().max() < 1e-4
    assert abs(shifted.law()[1] - case.law()[1]).max() < 1e-5


# --------------------------------------------------------------------------- seeds


def test_keyed_uniforms_are_a_pure_function_of_seed_stream_and_counter():
    first = keyed_uniforms([1, 2, 3], 1, [0, 5, 9])
    assert torch.equal(first, keyed_uniforms([1, 2, 3], 1, [0, 5, 9]))
    assert not torch.equal(first, keyed_uniforms([1, 2, 3], 3, [0, 5, 9]))
    many = keyed_uniforms(np.arange(20_000), 1, 0)
    assert 0 <= float(many.min()) and float(many.max()) < 1
    assert abs(float(many.mean()) - 0.5) < 0.02  # sd of the mean 0.002: ten of them


def test_inverse_cdf_never_picks_a_zero_probability_token_or_leaves_the_vocabulary():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4)
    uniforms = torch.tensor([0.0, 0.4999999, 0.5, 1 - 2.0 ** -53], dtype=torch.float64)
    picked = inverse_cdf(probs, uniforms)
    assert picked.tolist() == [1, 1, 3, 3]


@pytest.mark.parametrize("entry", SEED_GALLERY, ids=lambda entry: entry.key)
def test_each_seeded_engine_keeps_the_law_and_fails_exactly_its_seed_checks(battery, entry):
    case = _by_name(battery[1])[SERVING_CASES[1]]
    report = audit_engine(entry.law_engine(), cases=[case], max_rows=6_000)
    assert report.passed, report.table()
    checks = seed_checks(entry.engine(), case, range(16))
    assert {check for check, same in checks.items() if not same} == set(entry.fails)
    for check in entry.fails:
        assert seed_check_power(entry.engine(), case, check, 16, probe=range(500, 564)) > 0.99
    with pytest.raises(ValueError, match="unknown seed check"):
        seed_check_power(entry.engine(), case, "order", 16)


# --------------------------------------------------------------------------- the OpenAI door, over HTTP


def _leftover_stubs(root) -> list:
    """Stub servers still running on this module's battery (other pytest workers have their own folders)."""
    found = subprocess.run(["pgrep", "-f", f"{STUB} --target {root}"], capture_output=True, text=True)
    return found.stdout.split()


def test_served_engine_passes_a_lawful_server_and_fails_a_wrong_one(battery):
    cases = _by_name(battery[1])
    lawful = served_engine(TEMPLATE)
    try:
        report = audit_engine(lawful, cases=[cases[SERVING_CASES[0]]], max_rows=3_000)
    finally:
        lawful.close()
    assert report.passed, report.table()
    wrong = served_engine(TEMPLATE + " --bug settings_not_expanded")
    try:
        report = audit_engine(wrong, cases=[cases[SERVING_CASES[1]]], max_rows=3_000)
    finally:
        wrong.close()
    assert not report.passed
    assert _leftover_stubs(battery[0]) == []


@pytest.mark.parametrize("flags, message", [(" --text", "answered text, not token ids"),
                                            (" --die-after 3", "no answer from")])
def test_a_server_that_answers_text_or_dies_fails_the_case_in_one_line(battery, flags, message):
    case = _by_name(battery[1])[SERVING_CASES[0]]
    engine = served_engine(TEMPLATE + flags)
    try:
        report = audit_engine(engine, cases=[case], max_rows=3_000)
    finally:
        engine.close()
    (result,) = report.results
    assert not result.passed and message in result.detail and "\n" not in result.detail
    assert _leftover_stubs(battery[0]) == []


def test_a_url_that_refuses_connections_fails_in_one_line(battery):
    from speculative.audit.doors import free_port

    engine = openai_engine(f"http://127.0.0.1:{free_port()}", timeout=5)
    report = audit_engine(engine, cases=[battery[1][0]], max_rows=100)
    (result,) = report.results
    assert not result.passed and "no answer from" in result.detail


@pytest.mark.parametrize("argv, message", [
    (["--serve", "python server.py --model {target}"], "no {port}"),
    (["--base-url", "http://127.0.0.1:9", "--serve", "x {port} {target}"], "exactly one of"),
    (["--axis", "sideways", "--base-url", "http://127.0.0.1:9"], "unknown serving axis"),
])
def test_cli_refuses_bad_serving_input_in_one_line(argv, message):
    done = subprocess.run([sys.executable, "-m", "speculative", "audit-engine", "openai", *argv, "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr


def test_cli_vllm_without_vllm_says_so_in_one_line():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here: its audit runs in make audit-vllm")
    except ImportError:
        pass
    done = subprocess.run([sys.executable, "-m", "speculative", "audit-engine", "vllm", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot import vLLM" in done.stderr and "Traceback" not in done.stderr
