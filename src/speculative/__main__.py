"""Command line: ``python -m speculative verify | bench sampler | bench decode | train``.

Explained in: book/intro (how to run things) and notebooks/04_transforms (the sampler benchmark).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _temperatures(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v >= 0 or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"temperatures must be finite and >= 0, got {text!r}")
    return values


def _device(text: str) -> str:
    import torch

    if text == "cpu":
        return text
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("--device cuda was asked for, but torch sees no CUDA device here")
        return text
    raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu or cuda[:N]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m speculative", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{verify,bench,train}")

    verify = commands.add_parser("verify", help="check the rule exactly and print every pitfall's exact law")
    verify.set_defaults(run=_run_verify)

    bench = commands.add_parser("bench", help="measure, side by side, and write a JSON record")
    targets = bench.add_subparsers(dest="target", required=True, metavar="{sampler,decode}")
    sampler = targets.add_parser("sampler", help="the batched rejection sampler vs the plain per-row reference")
    sampler.add_argument("--batch", type=_positive_ints, default=[1, 64], help="batch sizes (default 1,64)")
    sampler.add_argument("--vocab", type=_positive_ints, default=[256, 32000], help="vocabularies (default 256,32000)")
    sampler.add_argument("--k", type=int, default=4, help="drafted tokens per row (default 4)")
    sampler.add_argument("--repeats", type=int, default=5, help="timed runs per point, after a warm-up (default 5)")
    sampler.add_argument("--seed", type=int, default=0)
    sampler.add_argument("--device", type=_device, default="cpu", help="cpu (default) or cuda")
    sampler.add_argument("--out", default=None, help="write the JSON record here, e.g. results/sampler_cpu.json")
    sampler.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sampler.set_defaults(run=_run_bench_sampler)
    decode = targets.add_parser("decode", help="plain vs speculative decoding on the model pair")
    decode.add_argument("--gamma", type=_positive_ints, default=[1, 2, 4, 6, 8], help="draft lengths (default 1,2,4,6,8)")
    decode.add_argument("--temperature", type=_temperatures, default=[0.0, 0.7, 1.0],
                        help="temperatures, 0 = greedy (default 0,0.7,1)")
    decode.add_argument("--batch", type=_positive_ints, default=[1, 4, 16], help="batch sizes (default 1,4,16)")
    decode.add_argument("--max-new-tokens", type=int, default=128)
    decode.add_argument("--repeats", type=int, default=5)
    decode.add_argument("--seed", type=int, default=0)
    decode.add_argument("--device", type=_device, default="cpu", help="cpu (default) or cuda")
    decode.add_argument("--pair", default=None, help="folder of a model pair (default: the shipped pair)")
    decode.add_argument("--out", default=None, help="write the JSON record here, e.g. results/decode_cpu.json")
    decode.add_argument("--no-progress", action="store_true")
    decode.set_defaults(run=_run_bench_decode)
    train = commands.add_parser("train", help="train a target and a draft on the stdlib corpus and save the pair "
                                 "(defaults: the shipped pair's shapes and budgets)")
    train.add_argument("--out", required=True, help="folder for the pair (the shipped one is src/speculative/pair)")
    train.add_argument("--target-seconds", type=float, default=4200.0, help="time budget for the target")
    train.add_argument("--draft-seconds", type=float, default=720.0, help="time budget for the draft")
    train.add_argument("--distill", type=float, default=0.8, help="weight of the KL-to-target term for the draft (0: off)")
    train.add_argument("--target-layers", type=int, default=6)
    train.add_argument("--target-width", type=int, default=384)
    train.add_argument("--target-heads", type=int, default=6)
    train.add_argument("--draft-layers", type=int, default=2)
    train.add_argument("--draft-width", type=int, default=128)
    train.add_argument("--draft-heads", type=int, default=2)
    train.add_argument("--context", type=int, default=256)
    train.add_argument("--reuse-target", default=None, help="take the target from this pair folder; train only the draft")
    train.add_argument("--draft-init", default=None,
                       help="start the draft from this pair folder's draft (same shape) and keep training it")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", type=_device, default="cpu")
    train.add_argument("--no-progress", action="store_true")
    train.set_defaults(run=_run_train)
    return parser


def _run_bench_decode(args) -> int:
    from .bench import bench_decode, format_decode_table, write_record
    from .pair import load_pair

    if args.max_new_tokens < 1 or args.repeats < 1:
        print("error: --max-new-tokens and --repeats must be >= 1", file=sys.stderr)
        return 2
    pair = load_pair(args.pair, device=args.device)
    record = bench_decode(pair, args.gamma, args.temperature, args.batch, args.max_new_tokens, args.repeats,
                          args.seed, args.device, progress=not args.no_progress)
    print(format_decode_table(record))
    path = write_record(record, args.out)
    if path:
        print(f"record written to {path}")
    return 0


def _run_train(args) -> int:
    from .model import GPTConfig
    from .pair import train_pair

    if args.target_seconds <= 0 or args.draft_seconds <= 0 or not 0 <= args.distill < 1:
        print("error: time budgets must be > 0 and --distill in [0, 1)", file=sys.stderr)
        return 2
    target = GPTConfig(context=args.context, n_layer=args.target_layers, n_head=args.target_heads,
                       d_model=args.target_width)
    draft = GPTConfig(context=args.context, n_layer=args.draft_layers, n_head=args.draft_heads,
                      d_model=args.draft_width)
    digest = train_pair(args.out, target, draft, args.target_seconds, args.draft_seconds, args.distill,
                        args.device, args.seed, progress=not args.no_progress, reuse_target=args.reuse_target,
                        draft_init=args.draft_init)
    print(f"pair written to {args.out} (sha256 {digest})")
    return 0


def _run_verify(args) -> int:
    from .display import as_text
    from .pitfalls import FIX, PITFALLS, SEED_P, SEED_Q, extend
    from .rule import output_distribution, total_variation

    out = output_distribution(SEED_P, SEED_Q)
    print(f"seed example: p = {as_text(SEED_P)}, q = {as_text(SEED_Q)} -> output {as_text(out)}")
    if out != list(SEED_P):
        print("FAILED: the output is not p", file=sys.stderr)
        return 1
    print(f"{'pitfall':28s} {'exact law on its demo pair (last entry: invalid id)':52s} TV from p")
    for pitfall in PITFALLS + [FIX]:
        law = pitfall.exact_law()
        print(f"{pitfall.key:28s} {as_text(law):52s} {as_text(total_variation(law, extend(pitfall.demo_p)))}")
    return 0


def _run_bench_sampler(args) -> int:
    from .bench import bench_sampler, format_sampler_table, write_record

    if args.k < 1 or args.repeats < 1:
        print("error: --k and --repeats must be >= 1", file=sys.stderr)
        return 2
    record = bench_sampler(args.batch, args.vocab, args.k, args.repeats, args.seed, args.device,
                           progress=not args.no_progress)
    print(format_sampler_table(record))
    path = write_record(record, args.out)
    if path:
        print(f"record written to {path}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
