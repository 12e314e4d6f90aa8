"""The shipped draft/target pair: save and load, with a checksum for every file.

Explained in: notebooks/08_decoding_demo.

The pair lives in ``src/speculative/pair/`` as package data, so ``pip install`` of the repository brings
it along. Weights are float16 safetensors (loading runs no code, unlike pickle); ``pair.json`` holds both
configs, ``train_log.json`` the training runs, ``prompts.json`` the fixed held-out prompts, and
``SHA256SUMS`` a checksum for each of them, verified on every load. A pair is written into a fresh
folder beside its destination and moved into place only when complete, so a failure leaves no partial pair.
How a pair is trained is in :mod:`speculative.training.train`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from speculative.engine.model import GPT, GPTConfig

__all__ = ["PAIR_DIR", "PAIR_FILES", "Pair", "save_pair", "load_pair", "sha256_file", "check_destination",
           "check_device",
           "write_checksummed"]
PAIR_DIR = Path(__file__).resolve().parents[1] / "pair"
PAIR_FILES = ("target.safetensors", "draft.safetensors", "pair.json", "train_log.json", "prompts.json")


@dataclass
class Pair:
    target: GPT
    draft: GPT
    info: dict  # pair.json: configs and a summary of training
    prompts: list[bytes]  # fixed held-out prompts
    sha256: str  # one hash for the whole pair: the sha256 of its SHA256SUMS file
    folder: Path


def check_device(device: str, available: bool = True) -> str:
    """Return ``device`` when it is ``cpu`` or ``cuda[:N]`` and, with ``available``, torch sees CUDA here."""
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"unknown device {device!r}: use cpu or cuda[:N]")
    if available and device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"--device {device} was asked for, but torch sees no CUDA device here")
    return device


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _weights(model: GPT) -> dict[str, torch.Tensor]:
    # the output head is tied to the token embedding; safetensors stores each tensor once
    return {name: tensor.detach().to(torch.float16).contiguous().cpu()
            for name, tensor in model.state_dict().items() if name != "head.weight"}


def check_destination(folder: Path, overwrite: bool = False) -> Path:
    """Return ``folder`` as a Path; raise FileExistsError if it holds anything and ``overwrite`` is False."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not overwrite:
        raise FileExistsError(f"{folder} already exists and is not empty: choose another folder, or replace it "
                              "with --force (overwrite=True)")
    return folder


def write_checksummed(folder: Path, names: Sequence[str], write: Callable[[Path], None],
                      overwrite: bool = False) -> str:
    """Write a folder of files with a SHA256SUMS line for each of ``names``; return the sha256 of SHA256SUMS.

    ``write(staging)`` writes the files into a temporary folder beside ``folder``, which is moved into
    place only when complete (an old folder is moved aside first and removed last), so a failure never
    leaves a half-written folder nor loses the old one. A non-empty ``folder`` is refused unless
    ``overwrite``.
    """
    destination = check_destination(folder, overwrite)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.partial-", dir=destination.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a model folder is readable like any other
    try:
        write(staging)
        sums = "".join(f"{sha256_file(staging / name)}  {name}\n" for name in names)
        (staging / "SHA256SUMS").write_text(sums)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if destination.exists():  # move the old one aside first, so that a failure never loses both
        old = destination.with_name(f".{destination.name}.replaced-{staging.name}")
        destination.rename(old)
    staging.rename(destination)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    return hashlib.sha256(sums.encode()).hexdigest()


def save_pair(folder: Path, target: GPT, draft: GPT, info: dict, train_log: dict, prompts: list[bytes],
              overwrite: bool = False) -> str:
    """Write the pair into ``folder`` with its checksums; return the pair's sha256.

    Refuses a non-empty ``folder`` unless ``overwrite``; the files are written into a temporary folder
    beside it and moved into place at the end, so a failure leaves nothing half written
    (:func:`write_checksummed`).
    """
    from safetensors.torch import save_file

    def write(staging: Path) -> None:
        save_file(_weights(target), str(staging / "target.safetensors"))
        save_file(_weights(draft), str(staging / "draft.safetensors"))
        described = dict(info, target_config=target.config.to_dict(), draft_config=draft.config.to_dict())
        (staging / "pair.json").write_text(json.dumps(described, indent=2) + "\n")
        (staging / "train_log.json").write_text(json.dumps(train_log, indent=2) + "\n")
        prompt_record = {"encoding": "latin-1", "count": len(prompts),
                         "prompts": [p.decode("latin-1") for p in prompts]}
        (staging / "prompts.json").write_text(json.dumps(prompt_record, indent=1) + "\n")

    return write_checksummed(folder, PAIR_FILES, write, overwrite)


def _load_model(path: Path, config: GPTConfig, device, dtype) -> GPT:
    from safetensors.torch import load_file

    state = load_file(str(path))
    state["head.weight"] = state["token_embedding.weight"]
    model = GPT(config)
    keys = model.load_state_dict(state, strict=False)
    if keys.missing_keys or keys.unexpected_keys:
        raise ValueError(f"{path.name} does not match its config: missing {keys.missing_keys}, "
                         f"unexpected {keys.unexpected_keys}")
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
