"""The shipped draft/target pair: save, load with checksums, or train a small one on request.

Explained in: notebooks/08_decoding_demo.

The pair lives in ``src/speculative/pair/`` as package data, so ``pip install`` of the repository brings
it along. Weights are float16 safetensors (loading runs no code, unlike pickle); ``pair.json`` holds both
configs, ``train_log.json`` the training runs, ``prompts.json`` the fixed held-out prompts, and
``SHA256SUMS`` a checksum for each of them, verified on every load.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .model import GPT, GPTConfig

__all__ = ["PAIR_DIR", "PAIR_FILES", "Pair", "save_pair", "load_pair", "get_pair", "make_prompts", "train_pair",
           "sha256_file"]

PAIR_DIR = Path(__file__).resolve().parent / "pair"
PAIR_FILES = ("target.safetensors", "draft.safetensors", "pair.json", "train_log.json", "prompts.json")


@dataclass
class Pair:
    target: GPT
    draft: GPT
    info: dict  # pair.json: configs and a summary of training
    prompts: list[bytes]  # fixed held-out prompts
    sha256: str  # one hash for the whole pair: the sha256 of its SHA256SUMS file
    folder: Path


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _weights(model: GPT) -> dict[str, torch.Tensor]:
    # the output head is tied to the token embedding; safetensors stores each tensor once
    return {name: tensor.detach().to(torch.float16).contiguous().cpu()
            for name, tensor in model.state_dict().items() if name != "head.weight"}


def make_prompts(text: bytes, count: int = 64, length: int = 96, seed: int = 0) -> list[bytes]:
    """Return ``count`` prompts of ``length`` bytes that start at line starts of ``text``, chosen by ``seed``."""
    line_starts = [i + 1 for i, byte in enumerate(text[:-length - 1]) if byte == 10 and text[i + 1] not in b"\n"]
    if len(line_starts) < count:
        raise ValueError(f"text has only {len(line_starts)} usable line starts, {count} prompts asked for")
    rng = random.Random(seed)
    return [text[start:start + length] for start in sorted(rng.sample(line_starts, count))]


def save_pair(folder: Path, target: GPT, draft: GPT, info: dict, train_log: dict, prompts: list[bytes]) -> str:
    """Write the pair into ``folder`` with its checksums; return the pair's sha256."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_weights(target), str(folder / "target.safetensors"))
    save_file(_weights(draft), str(folder / "draft.safetensors"))
    info = dict(info, target_config=target.config.to_dict(), draft_config=draft.config.to_dict())
    (folder / "pair.json").write_text(json.dumps(info, indent=2) + "\n")
    (folder / "train_log.json").write_text(json.dumps(train_log, indent=2) + "\n")
    prompt_record = {"encoding": "latin-1", "count": len(prompts),
                     "prompts": [p.decode("latin-1") for p in prompts]}
    (folder / "prompts.json").write_text(json.dumps(prompt_record, indent=1) + "\n")
    sums = "".join(f"{sha256_file(folder / name)}  {name}\n" for name in PAIR_FILES)
    (folder / "SHA256SUMS").write_text(sums)
    return hashlib.sha256(sums.encode()).hexdigest()


def _load_model(path: Path, config: GPTConfig, device, dtype) -> GPT:
    from safetensors.torch import load_file

    state = load_file(str(path))
    state["head.weight"] = state["token_embedding.weight"]
    model = GPT(config)
    missing, unexpected = model.load_state_dict(state, strict=False), None
    if missing.missing_keys or missing.unexpected_keys:
        raise ValueError(f"{path.name} does not match its config: missing {missing.missing_keys}, "
                         f"unexpected {missing.unexpected_keys}")
    return model.to(device=device, dtype=dtype).eval()


def load_pair(folder: Optional[Path] = None, device="cpu", dtype=torch.float32) -> Pair:
    """Return the pair in ``folder`` (default: the shipped one) after verifying every checksum."""
    folder = Path(folder) if folder is not None else PAIR_DIR
    sums_path = folder / "SHA256SUMS"
    if not sums_path.is_file():
        raise FileNotFoundError(f"no model pair at {folder}: SHA256SUMS is missing (train one with "
                                "`python -m speculative train`, or pass train_small=True to get_pair)")
    expected = {}
    for line in sums_path.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        expected[name.strip()] = digest
    for name in PAIR_FILES:
        path = folder / name
        if name not in expected:
            raise ValueError(f"SHA256SUMS in {folder} lists no checksum for {name}")
        if not path.is_file():
            raise FileNotFoundError(f"the model pair in {folder} is missing {name}")
        if sha256_file(path) != expected[name]:
            raise ValueError(f"{name} in {folder} is corrupt: its sha256 does not match SHA256SUMS")
    info = json.loads((folder / "pair.json").read_text())
    target = _load_model(folder / "target.safetensors", GPTConfig(**info["target_config"]), device, dtype)
    draft = _load_model(folder / "draft.safetensors", GPTConfig(**info["draft_config"]), device, dtype)
    record = json.loads((folder / "prompts.json").read_text())
    prompts = [p.encode(record["encoding"]) for p in record["prompts"]]
    return Pair(target, draft, info, prompts, hashlib.sha256(sums_path.read_bytes()).hexdigest(), folder)


def train_pair(
    folder: Path,
    target_config: GPTConfig,
    draft_config: GPTConfig,
    target_seconds: float,
    draft_seconds: float,
    distill_weight: float = 0.5,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
    reuse_target: Optional[Path] = None,
    draft_init: Optional[Path] = None,
) -> str:
    """Train a target, then a draft (distilled from it when distill_weight > 0), save; return the sha256.

    With ``reuse_target`` (a pair folder), the target and its training log are taken from that pair and
    only the draft is trained. With ``draft_init`` (a pair folder), the draft starts from that pair's draft
    weights (same config required) and its earlier training log is kept under ``draft.initial``.
    """
    from .corpus import load_corpus
    from .train import TrainConfig, train_model

    corpus = load_corpus()

    def earlier(folder, role: str):
        """Return (that pair's model in ``role``, its training log) after checking it saw this corpus."""
        previous = load_pair(folder, device=device)
        if previous.info.get("corpus", {}).get("sha256") != corpus.sha256:
            raise ValueError(f"the {role} in {folder} was trained on a different corpus (sha256 differs)")
        log = json.loads((Path(folder) / "train_log.json").read_text())[role]
        return getattr(previous, role), dict(log, pair_sha256=previous.sha256)

    if reuse_target is not None:
        target, target_log = earlier(reuse_target, "target")
    else:
        target, target_log = train_model(target_config, corpus.train, corpus.validation,
                                         TrainConfig(seconds=target_seconds, device=device, seed=seed),
                                         progress=progress, label="target")
    initial_draft, initial_log = earlier(draft_init, "draft") if draft_init is not None else (None, None)
    draft, draft_log = train_model(
        draft_config, corpus.train, corpus.validation,
        TrainConfig(seconds=draft_seconds, device=device, seed=seed + 1, distill_weight=distill_weight),
        teacher=target if distill_weight else None, progress=progress, label="draft", init=initial_draft)
    if initial_log is not None:
        draft_log["initial"] = initial_log
    environment = {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads()}
    corpus_info = {"description": corpus.describe(), "sha256": corpus.sha256, "python": corpus.python,
                   "train_bytes": len(corpus.train), "validation_bytes": len(corpus.validation),
                   "train_files": corpus.train_files, "validation_files": corpus.validation_files}
    info = {
        "target_validation_bpb": target_log["final_validation_bpb"],
        "draft_validation_bpb": draft_log["final_validation_bpb"],
        "target_parameters": target.num_parameters(),
        "draft_parameters": draft.num_parameters(),
        "distill_weight": distill_weight,
        "corpus": corpus_info,
        "trained_on": environment,
    }
    log = {"corpus": corpus_info, "environment": environment, "target": target_log, "draft": draft_log}
    return save_pair(folder, target, draft, info, log, make_prompts(corpus.validation))


def get_pair(train_small: bool = False, folder: Optional[Path] = None, seconds: float = 60.0, device="cpu",
             dtype=torch.float32) -> Pair:
    """Return the shipped pair (checksums verified), or with ``train_small=True`` a small pair trained now.

    The small pair (a 2-layer target and a 1-layer draft, ``seconds`` of training in all) is written to
    ``folder`` (default: a fresh temporary folder) and loaded from there through the same checks. It
    exists for machines without the shipped files; its numbers are not the book's.
    """
    if not train_small:
        return load_pair(folder, device=device, dtype=dtype)
    import tempfile

    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="speculative-pair-"))
    train_pair(folder, GPTConfig(n_layer=2, n_head=2, d_model=64), GPTConfig(n_layer=1, n_head=2, d_model=32),
               target_seconds=seconds * 0.7, draft_seconds=seconds * 0.3, device=device, progress=False)
    return load_pair(folder, device=device, dtype=dtype)
