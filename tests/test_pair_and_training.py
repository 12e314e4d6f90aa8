"""corpus.py, train.py and pair.py: the corpus split, a short training run, checksums, and bad files."""

import json

import pytest
import torch

from conftest import TINY, save_tiny_pair
from speculative.engine.model import GPT, GPTConfig
from speculative.engine.pair import PAIR_DIR, PAIR_FILES, load_pair, sha256_file
from speculative.training import corpus
from speculative.training.train import TrainConfig, bits_per_byte, byte_tensor, get_pair, train_model


def test_corpus_is_the_stdlib_split_by_file():
    data = corpus.load_corpus()
    assert data.train_files > 100 and data.validation_files > 5
    assert len(data.train) > 1_000_000 and len(data.validation) > 10_000
    files = corpus.source_files()
    assert not any(part in corpus.SKIPPED_DIRS for f in files for part in f.parts[:-1])
    assert not any(f.name.startswith("test_") for f in files)
    held_out = [f for f in files if corpus.is_validation_file(f)]
    assert 0.02 < len(held_out) / len(files) < 0.09  # about 5% of files, chosen by a hash of the path
    assert corpus.load_corpus().sha256 == data.sha256  # deterministic


def test_corpus_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        corpus.source_files(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no .py files"):
        corpus.source_files(tmp_path)


def test_a_short_training_run_learns_and_logs(tmp_path):
    text = b"def f(x):\n    return x + 1\n\n" * 400
    # a step budget, not a time budget, so a loaded machine cannot make it learn less (the time limit is a guard)
    model, log = train_model(TINY, text, text, TrainConfig(seconds=300, eval_every_seconds=0.5, batch_size=8,
                                                          eval_windows=8, max_steps=150), progress=False)
    history = log["history"]
    assert log["steps"] > 5 and len(history) >= 2
    assert history[-1]["validation_bpb"] < history[0]["validation_bpb"] - 1  # it learned the repetition
    assert {"seconds", "step", "tokens", "validation_bpb"} <= set(history[0])


def test_training_can_start_from_trained_weights():
    text = b"def f(x):\n    return x + 1\n\n" * 400
    settings = TrainConfig(seconds=1, eval_every_seconds=1, batch_size=8, eval_windows=8)
    first = GPT(TINY)
    with torch.no_grad():
        first.token_embedding.weight.normal_(0, 3.0, generator=torch.Generator().manual_seed(5))
    start = bits_per_byte(first, byte_tensor(text), windows=8)
    assert abs(start - 8.0) > 1  # far from the near-uniform law of a fresh initialisation
    _, log = train_model(TINY, text, text, settings, progress=False, init=first)
    assert log["initialised_from_trained_weights"] is True
    # the first evaluation (before any step) is the initial model's, not a fresh model's
    assert log["history"][0]["validation_bpb"] == pytest.approx(start, abs=1e-3)
    _, fresh_log = train_model(TINY, text, text, settings, progress=False)
    assert fresh_log["initialised_from_trained_weights"] is False
    assert fresh_log["history"][0]["validation_bpb"] == pytest.approx(8.0, abs=0.1)
    wider = GPTConfig(**{**TINY.to_dict(), "d_model": TINY.d_model * 2})
    with pytest.raises(ValueError, match="config"):
        train_model(wider, text, text, settings, progress=False, init=first)


def test_distillation_needs_a_teacher():
    with pytest.raises(ValueError, match="teacher"):
        train_model(TINY, b"x" * 100, b"x" * 100, TrainConfig(seconds=1, distill_weight=0.5), progress=False)


def test_bits_per_byte_of_a_uniform_model_is_eight():
    model = GPT(TINY)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()  # every logit 0: a uniform next-byte distribution
    assert bits_per_byte(model, byte_tensor(b"abc" * 100), windows=4) == pytest.approx(8.0, abs=1e-4)


def test_save_and_load_round_trip(tmp_path):
    digest = save_tiny_pair(tmp_path)
    pair = load_pair(tmp_path)
    assert pair.sha256 == digest and len(pair.prompts) == 4
    assert pair.target.config == TINY
    assert pair.target.head.weight.data_ptr() == pair.target.token_embedding.weight.data_ptr()  # still tied
    for name in ("target.safetensors", "draft.safetensors"):
        # safetensors layout: an 8-byte little-endian header length, then a JSON header (a pickle starts 0x80)
        data = (tmp_path / name).read_bytes()
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        assert header["token_embedding.weight"]["dtype"] == "F16"
    assert json.loads((tmp_path / "pair.json").read_text())["target_config"]["d_model"] == TINY.d_model


def test_a_corrupt_file_is_refused(tmp_path):
    save_tiny_pair(tmp_path)
    data = bytearray((tmp_path / "draft.safetensors").read_bytes())
    data[-1] ^= 1
    (tmp_path / "draft.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="draft.safetensors .* is corrupt"):
        load_pair(tmp_path)


def test_a_missing_file_is_refused(tmp_path):
    save_tiny_pair(tmp_path)
    (tmp_path / "prompts.json").unlink()
    with pytest.raises(FileNotFoundError, match="missing prompts.json"):
        load_pair(tmp_path)
    with pytest.raises(FileNotFoundError, match="SHA256SUMS is missing"):
        load_pair(tmp_path / "elsewhere")


def test_the_shipped_pair_is_complete_and_verified():
    sums = (PAIR_DIR / "SHA256SUMS").read_text()
    for name in PAIR_FILES:
        assert f"{sha256_file(PAIR_DIR / name)}  {name}" in sums
    pair = load_pair()
    info = pair.info
    # the target predicts better than its draft, which replaced the first draft, kept as a candidate
    assert info["draft_validation_bpb"] > info["target_validation_bpb"]
    # the candidate it came from and every draft it replaced are on disk, under the names the pair gives them
    root = PAIR_DIR.parents[2]
    assert (root / info["shipped_draft"]["from"] / "draft.json").is_file()
    assert info["replaced"] and all((root / r["kept_as"]).is_dir() for r in info["replaced"])
    assert len(pair.prompts) >= 16


def test_get_pair_can_train_a_small_one(tmp_path):
    pair = get_pair(train_small=True, folder=tmp_path, seconds=4)
    assert (tmp_path / "SHA256SUMS").is_file() and pair.target.config.n_layer == 2


def test_save_pair_refuses_a_full_folder_and_replaces_it_only_when_asked(tmp_path, tiny_pair_dir):
    from speculative.engine.pair import save_pair

    pair = load_pair(tiny_pair_dir)
    args = (pair.target, pair.draft, {"note": "second"}, {"log": []}, pair.prompts)
    with pytest.raises(FileExistsError, match="already exists"):
        save_pair(tiny_pair_dir, *args)
    assert load_pair(tiny_pair_dir).info["note"] == "test"  # untouched
    save_pair(tiny_pair_dir, *args, overwrite=True)
    assert load_pair(tiny_pair_dir).info["note"] == "second"
    assert sorted(p.name for p in tiny_pair_dir.parent.iterdir()) == [tiny_pair_dir.name]  # nothing left aside
