"""Training the target and the draft on the stdlib corpus, within a time budget, and the pair recipe.

Explained in: notebooks/08_decoding_demo (how the shipped pair was made) and notebooks/14_which_draft
(drafts distilled for acceptance).

Training is seeded, but a *time* budget makes the number of steps depend on the machine: the log records
the steps taken, the tokens seen, and validation bits per byte against wall time, so a run says what it
did. The draft can be distilled from the target: its loss mixes the usual next-byte cross-entropy with
the KL divergence to the target's next-byte distribution, which raises the acceptance rate.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from speculative import defaults
from speculative.defaults import setting
from speculative.engine.model import GPT, GPTConfig
from speculative.engine.pair import Pair, check_destination, load_pair, save_pair

__all__ = ["TrainConfig", "train_model", "bits_per_byte", "byte_tensor", "train_pair", "get_pair", "make_prompts",
           "DISTILL_OBJECTIVES", "distill_loss", "DistillData", "target_samples",
           "joined", "parse_candidate"]

#: The draft's distillation losses, per position, averaged: "kl", the forward KL(p || q) (the shipped
#: draft's); "tv", the total variation distance 1/2 sum |p - q|, whose complement is the acceptance rate
#: itself; "mixed", the mean of the forward and the reverse KL(q || p). DistillSpec (Zhou et al., ICLR
#: 2024, https://arxiv.org/abs/2310.08461) compares such divergences and finds that the best one depends
#: on the task and on the decoding strategy (greedy or sampled).
DISTILL_OBJECTIVES = ("kl", "tv", "mixed")


def distill_loss(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, objective: str) -> torch.Tensor:
    """Return the mean per-position distillation loss of student logits (..., V) against the teacher's
    log-probabilities (..., V) under ``objective`` (one of :data:`DISTILL_OBJECTIVES`)."""
    if objective not in DISTILL_OBJECTIVES:
        raise ValueError(f"unknown distillation objective {objective!r}: use one of {', '.join(DISTILL_OBJECTIVES)}")
    student = F.log_softmax(student_logits.float(), dim=-1).flatten(0, -2)  # (N, V)
    teacher = teacher_logprobs.float().flatten(0, -2)
    if objective == "tv":
        return 0.5 * (student.exp() - teacher.exp()).abs().sum(-1).mean()
    forward = F.kl_div(student, teacher, log_target=True, reduction="batchmean")  # KL(p || q)
    if objective == "kl":
        return forward
    reverse = F.kl_div(teacher, student, log_target=True, reduction="batchmean")  # KL(q || p)
    return 0.5 * (forward + reverse)


@dataclass
class DistillData:
    """Windows to distil on, with the teacher's log-probabilities at every input position, computed once."""

    tokens: torch.Tensor  # (N, L + 1) int64: inputs are [:, :-1], next tokens [:, 1:]
    teacher_logprobs: torch.Tensor  # (N, L, V) float16
    description: dict  # how the windows were made (prefix, temperature, seed, count)


@torch.no_grad()
def target_samples(target: GPT, text: bytes, windows: int, prefix: int = 32, temperature: float = 1.0,
                   seed: int = 0, batch: int = 64, progress: bool = True) -> DistillData:
    """Return ``windows`` windows of the target's own samples with its log-probabilities at each position.

    Each window is ``prefix`` bytes of ``text`` at a line start chosen by ``seed``, continued by the
    target at ``temperature`` (0: greedily) to the target's whole context (a ``prefix`` of the whole
    context gives windows of the text itself, nothing sampled); the teacher's log-probabilities
    are those of the untransformed target (temperature 1), as distillation uses them. These are the
    contexts a draft meets when lossless speculative decoding emits the target's text. DistillSpec found
    the data the draft trains on to matter, and favoured the draft's own samples (on-policy); the
    target's samples are another of the sources it compares, and the one used here.
    """
    from tqdm import tqdm

    from speculative.engine.decode import plain_decode
    from speculative.sampling.transforms import SamplingConfig

    context = target.config.context
    if not 1 <= prefix <= context:
        raise ValueError(f"prefix must be in [1, {context}], got {prefix}")
    prompts = make_prompts(text, count=windows, length=prefix, seed=seed)
    generator = torch.Generator(device=target.device).manual_seed(seed)
    config = SamplingConfig(temperature=temperature)
    rows, logprobs = [], []
    for first in tqdm(range(0, windows, batch), desc="target samples", disable=not progress, file=sys.stderr):
        chunk = prompts[first:first + batch]
        made = plain_decode(target, chunk, context - prefix, config, generator=generator).tokens if prefix < context \
            else [[] for _ in chunk]  # a prefix of the whole context: windows of the text itself
        tokens = torch.tensor([list(p) + t for p, t in zip(chunk, made)], device=target.device)  # (b, L+1)
        rows.append(tokens.cpu())
        logprobs.append(F.log_softmax(target(tokens[:, :-1]).float(), dim=-1).to(torch.float16).cpu())
    description = {"source": "target samples" if prefix < context else "text", "windows": windows,
                   "prefix": prefix, "temperature": temperature, "seed": seed, "positions": context - 1}
    return DistillData(torch.cat(rows), torch.cat(logprobs), description)


def joined(parts: Sequence[DistillData]) -> DistillData:
    """Return the windows of several :class:`DistillData` as one (their windows must have one length)."""
    return DistillData(torch.cat([p.tokens for p in parts]), torch.cat([p.teacher_logprobs for p in parts]),
                       {"parts": [p.description for p in parts]})


@dataclass(frozen=True)
class TrainConfig:
    seconds: float = 600.0  # wall-time budget for the optimisation loop
    batch_size: int = 32  # windows per step
    learning_rate: float = 2e-3  # peak; warm-up then cosine decay over the time budget
    min_learning_rate: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    eval_every_seconds: float = 60.0
    eval_windows: int = 48  # fixed validation windows, context bytes each
    distill_weight: float = 0.0  # 0: plain cross-entropy; > 0: mix in the distillation loss to the teacher
    objective: str = "kl"  # the distillation loss: see DISTILL_OBJECTIVES
    seed: int = 0
    device: str = "cpu"
    max_steps: Optional[int] = None  # also stop after this many steps (schedule by steps): runs that load can't change


def byte_tensor(data: bytes) -> torch.Tensor:
    """Return ``data`` as a uint8 tensor."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _windows(data: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    index = starts.unsqueeze(1) + torch.arange(length + 1)
    return data[index].long()  # (B, length + 1): inputs are [:, :-1], targets [:, 1:]


@torch.no_grad()
def bits_per_byte(model: GPT, data: torch.Tensor, windows: int, seed: int = 1234, device: str = "cpu") -> float:
    """Return the mean next-byte cross-entropy in bits over ``windows`` fixed windows of ``data``."""
    context = model.config.context
    if len(data) <= context + 1:
        raise ValueError(f"validation data of {len(data)} bytes is shorter than one window of {context + 1}")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - context - 1, (windows,), generator=generator)
    batch = _windows(data, starts, context).to(device)
    was_training = model.training
    model.eval()
    total = 0.0
    for chunk in batch.split(16):
        logits = model(chunk[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                 reduction="sum").item()
    model.train(was_training)
    return total / (batch.shape[0] * context) / math.log(2)


def train_model(
    config: GPTConfig,
    train_data: bytes,
    validation_data: bytes,
    settings: TrainConfig,
    teacher: Optional[GPT] = None,
    progress: bool = True,
    label: str = "model",
    init: Optional[GPT] = None,
    data: Optional[DistillData] = None,
) -> tuple[GPT, dict]:
    """Return (trained model, log) after ``settings.seconds`` of training from a fixed seed.

    With ``init`` (a model of the same config), training starts from a copy of its weights instead of a
    fresh initialisation; the optimiser and the learning-rate schedule still start anew. With ``data``
    (:func:`target_samples`), the batches are drawn from its windows and the teacher's log-probabilities
    are read from it instead of being computed at every step (a teacher forward costs far more than a
    small student's step), so no ``teacher`` is needed; validation is still on ``validation_data``.
    """
    from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

    if settings.objective not in DISTILL_OBJECTIVES:
        raise ValueError(f"unknown distillation objective {settings.objective!r}: use one of "
                         f"{', '.join(DISTILL_OBJECTIVES)}")
    if settings.distill_weight and teacher is None and data is None:
        raise ValueError("distill_weight > 0 needs a teacher model or distillation data")
    if data is not None and data.tokens.shape[1] - 1 > config.context:
        raise ValueError(f"distillation windows of {data.tokens.shape[1] - 1} positions exceed the context "
                         f"of {config.context}")
    if teacher is not None and teacher.config.vocab_size != config.vocab_size:
        raise ValueError("teacher and student vocabularies differ")
    torch.manual_seed(settings.seed)  # parameter initialisation; batches use their own generator below
    device = settings.device
    model = GPT(config).to(device)
    if init is not None:
        if init.config != config:
            raise ValueError(f"init model's config {init.config} differs from {config}")
        model.load_state_dict({k: v.float() for k, v in init.state_dict().items()})
    train_bytes, validation_bytes = byte_tensor(train_data), byte_tensor(validation_data)
    if len(train_bytes) <= config.context + 1:
        raise ValueError("training data is shorter than one window")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=settings.learning_rate, betas=(0.9, 0.95))
    batches = torch.Generator().manual_seed(settings.seed + 1)
    history = []
    start = time.perf_counter()
    last_eval = -math.inf
    step = 0
    bar = tqdm(total=int(settings.seconds), desc=f"train {label}", unit="s", disable=not progress, file=sys.stderr)
    train_bpb = float("nan")
    while True:
        elapsed = time.perf_counter() - start
        done = elapsed >= settings.seconds or (settings.max_steps is not None and step >= settings.max_steps)
        if elapsed - last_eval >= settings.eval_every_seconds or done:
            val = bits_per_byte(model, validation_bytes, settings.eval_windows, device=device)
            history.append({"seconds": round(elapsed, 1), "step": step,
                            "tokens": step * settings.batch_size * config.context,
                            "train_bpb": round(train_bpb, 4), "validation_bpb": round(val, 4)})
            bar.set_postfix(step=step, val_bpb=f"{val:.3f}")
            last_eval = elapsed
        if done:
            break
        fraction = min(elapsed / settings.seconds if settings.max_steps is None else step / settings.max_steps, 1.0)
        warm = min(1.0, (step + 1) / settings.warmup_steps)
        lr = settings.min_learning_rate + (settings.learning_rate - settings.min_learning_rate) * warm * 0.5 * (
            1 + math.cos(math.pi * fraction))
        for group in optimizer.param_groups:
            group["lr"] = lr
        if data is None:
            starts = torch.randint(0, len(train_bytes) - config.context - 1, (settings.batch_size,),
                                   generator=batches)
            batch = _windows(train_bytes, starts, config.context).to(device)
        else:
            chosen = torch.randint(0, len(data.tokens), (settings.batch_size,), generator=batches)
            batch = data.tokens[chosen].to(device)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        train_bpb = loss.item() / math.log(2)
        if settings.distill_weight:
            if data is not None:
                teacher_logprobs = data.teacher_logprobs[chosen].to(device)
            else:
                with torch.no_grad():
                    teacher_logprobs = F.log_softmax(teacher(inputs), dim=-1)
            distill = distill_loss(logits, teacher_logprobs, settings.objective)
            loss = (1 - settings.distill_weight) * loss + settings.distill_weight * distill
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        step += 1
        bar.n = min(int(elapsed), int(settings.seconds))
        bar.refresh()
    bar.close()
    model.eval()
    log = {
        "label": label,
        "model": config.to_dict(),
        "parameters": model.num_parameters(),
        "train": asdict(settings),
        "initialised_from_trained_weights": init is not None,
        "distillation_data": data.description if data is not None else None,
        "steps": step,
        "tokens_seen": step * settings.batch_size * config.context,
        "final_validation_bpb": history[-1]["validation_bpb"],
        "history": history,
    }
    return model, log


def make_prompts(text: bytes, count: int = defaults.PROMPTS["count"], length: int = defaults.PROMPTS["length"],
                 seed: int = 0) -> list[bytes]:
    """Return ``count`` prompts of ``length`` bytes that start at line starts of ``text``, chosen by ``seed``."""
    line_starts = [i + 1 for i, byte in enumerate(text[:-length - 1]) if byte == 10 and text[i + 1] not in b"\n"]
    if len(line_starts) < count:
        raise ValueError(f"text has only {len(line_starts)} usable line starts, {count} prompts asked for")
    rng = random.Random(seed)
    return [text[start:start + length] for start in sorted(rng.sample(line_starts, count))]


@dataclass(frozen=True)
class TrainSettings:
    """What ``train`` trains (defaults: the shipped pair's shapes and budgets, :mod:`speculative.defaults`):
    the two budgets in seconds, the draft's distillation weight, both shapes, the context and the seed."""

    target_seconds: float = setting(defaults.TARGET_SECONDS, "time budget for the target")
    draft_seconds: float = setting(defaults.DRAFT_SECONDS, "time budget for the draft")
    distill: float = setting(defaults.DISTILL_WEIGHT, "weight of the KL-to-target term for the draft, in [0, 1) "
                             "(0: off)")
    target_layers: int = setting(defaults.TARGET_SHAPE["n_layer"], "target blocks")
    target_width: int = setting(defaults.TARGET_SHAPE["d_model"], "target width (divisible by its heads)")
    target_heads: int = setting(defaults.TARGET_SHAPE["n_head"], "target attention heads")
    draft_layers: int = setting(defaults.DRAFT_SHAPE["n_layer"], "draft blocks")
    draft_width: int = setting(defaults.DRAFT_SHAPE["d_model"], "draft width (divisible by its heads)")
    draft_heads: int = setting(defaults.DRAFT_SHAPE["n_head"], "draft attention heads")
    context: int = setting(defaults.CONTEXT, "positions both models hold")
    seed: int = setting(defaults.TRAIN_SEED, "seed of weights and batches")

    def __post_init__(self):
        for name in ("target_seconds", "draft_seconds"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a number of seconds > 0, got {getattr(self, name)!r}")
        if not 0 <= self.distill < 1:
            raise ValueError(f"distill must be a number in [0, 1), got {self.distill!r}")
        self.configs()  # a shape the model cannot take fails here, before any training

    def configs(self) -> tuple[GPTConfig, GPTConfig]:
        """The target's and the draft's model configurations."""
        return tuple(GPTConfig(context=self.context, n_layer=getattr(self, f"{role}_layers"),
                               d_model=getattr(self, f"{role}_width"), n_head=getattr(self, f"{role}_heads"))
                     for role in ("target", "draft"))


def train_pair(
    folder: Path,
    target_config: GPTConfig = GPTConfig(**defaults.TARGET_SHAPE),
    draft_config: GPTConfig = GPTConfig(**defaults.DRAFT_SHAPE),
    target_seconds: float = defaults.TARGET_SECONDS,
    draft_seconds: float = defaults.DRAFT_SECONDS,
    distill_weight: float = defaults.DISTILL_WEIGHT,
    device: str = "cpu",
    seed: int = defaults.TRAIN_SEED,
    progress: bool = True,
    reuse_target: Optional[Path] = None,
    draft_init: Optional[Path] = None,
    overwrite: bool = False,
) -> str:
    """Train a target, then a draft (distilled from it when distill_weight > 0), save; return the sha256.

    With ``reuse_target`` (a pair folder), the target and its training log are taken from that pair and
    only the draft is trained. With ``draft_init`` (a pair folder), the draft starts from that pair's draft
    weights (same config required) and its earlier training log is kept under ``draft.initial``. A
    non-empty ``folder`` is refused before any training unless ``overwrite``.
    """
    from speculative.training.corpus import load_corpus

    check_destination(folder, overwrite)

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
    return save_pair(folder, target, draft, info, log, make_prompts(corpus.validation), overwrite=overwrite)


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
    train_pair(folder, GPTConfig(**defaults.SMALL_TARGET_SHAPE), GPTConfig(**defaults.SMALL_DRAFT_SHAPE),
               target_seconds=seconds * 0.7, draft_seconds=seconds * 0.3, distill_weight=0.5, device=device,
               progress=False)
    return load_pair(folder, device=device, dtype=dtype)


def parse_shape(text: str) -> dict:
    """Return a model shape from ``LAYERSxWIDTH`` (e.g. ``2x128``), with width / 64 heads (at least one)."""
    try:
        layers, width = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"a shape is LAYERSxWIDTH, e.g. 2x128, got {text!r}") from None
    if layers < 1 or width < 1:
        raise ValueError(f"a shape's layers and width must be >= 1, got {text!r}")
    return {"n_layer": layers, "d_model": width, "n_head": max(1, width // 64)}


def parse_candidate(text: str) -> dict:
    """Return a candidate draft from ``NAME=LAYERSxWIDTH:OBJECTIVE:SECONDS[:init|:from=FOLDER]`` (init:
    start from the pair's own draft; from=FOLDER: from the candidate draft in FOLDER; either must have that
    shape, and its heads are taken from it; otherwise width / 64, at least one), e.g. ``tv128=2x128:tv:240:init``."""
    try:
        name, spec = text.split("=", 1)
        shape, objective, seconds, *rest = spec.split(":")
        shape = parse_shape(shape)
        seconds = float(seconds)
    except ValueError:
        raise ValueError(f"candidate {text!r} is not NAME=LAYERSxWIDTH:OBJECTIVE:SECONDS[:init|:from=FOLDER]") \
            from None
    if objective not in DISTILL_OBJECTIVES:
        raise ValueError(f"candidate {name}: unknown objective {objective!r} (use {', '.join(DISTILL_OBJECTIVES)})")
    start = rest[0] if len(rest) == 1 else None
    if len(rest) > 1 or (start is not None and start != "init" and not (start.startswith("from=") and start[5:])) \
            or not name or not 0 < seconds < math.inf:
        raise ValueError(f"candidate {text!r} is not NAME=LAYERSxWIDTH:OBJECTIVE:SECONDS[:init|:from=FOLDER]")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):  # it names a folder under --out: nothing that leaves it
        raise ValueError(f"candidate name {name!r} must be letters, digits, '-' or '_'")
    return {"name": name, **shape, "objective": objective, "seconds": seconds, "init": start is not None,
            **({"from": start[5:]} if start and start != "init" else {})}

