"""Command line: ``python -m speculative verify | bench sampler``.

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
    commands = parser.add_subparsers(dest="command", required=True, metavar="{verify,bench}")

    verify = commands.add_parser("verify", help="check the rule exactly and print every pitfall's exact law")
    verify.set_defaults(run=_run_verify)

    bench = commands.add_parser("bench", help="measure, side by side, and write a JSON record")
    targets = bench.add_subparsers(dest="target", required=True, metavar="{sampler}")
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
    return parser


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
