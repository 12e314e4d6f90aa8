"""Command line: ``python -m speculative COMMAND``; ``--help`` lists the commands, each with its own help.

Explained in: book/intro (how to run things) and notebooks/04_transforms (the sampler benchmark).

The commands are one table (:data:`COMMANDS`); options shared by several commands are declared once
(:data:`SHARED`), and a benchmark's options are read from the fields of its settings dataclass
(:mod:`speculative.measure.settings`, through :mod:`speculative.options`), whose defaults and validation are
the only ones. A bad input ends the
program with exit status 2 and one line on stderr naming the problem, before any long work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from speculative import __version__, defaults
from speculative.audit import commands
from speculative.audit.battery import select_cases
from speculative.audit.core import audit_sampler
from speculative.engine.decode import encode_prompts
from speculative.engine.hf import load_raced_pair
from speculative.engine.pair import check_device, load_pair
from speculative.measure import drafts, report
from speculative.measure.analysis import analyse
from speculative.measure.bench_decode import bench_decode, bench_decode_runs
from speculative.measure.bench_drafts import bench_drafts
from speculative.measure.bench_peer import bench_peer, bench_peer_runs
from speculative.measure.bench_sampler import bench_sampler
from speculative.measure.gpu_report import GPUReportSettings, gpu_report
from speculative.measure.records import write_record
from speculative.measure.settings import DecodeSettings, DraftsSettings, PeerSettings, PricesSettings, SamplerSettings
from speculative.options import Parser, argument, count, settings_from, settings_options
from speculative.training.train import TrainSettings, parse_candidate, train_pair

#: Options that several commands take: declared here once, named by key in a command's ``shared``.
SHARED = {
    "no-progress": (("--no-progress",), {"action": "store_true", "help": "hide progress bars"}),
    "out": (("--out",), {"default": None, "metavar": "FILE", "help": "write the JSON record here"}),
    "device": (("--device",), {"type": argument(check_device), "default": "cpu", "help": "cpu or cuda[:N]"}),
    "dtype": (("--dtype",), {"choices": ("float32", "bfloat16", "float16"), "default": "float32",
                             "help": "weights and cache dtype (half precision is meant for CUDA)"}),
    "pair": (("--pair",), {"default": None, "help": "folder of the model pair (none: the shipped pair)"}),
    "runs": (("--runs",), {"type": argument(count), "default": 1, "help": "independent runs, one after another, "
                           "each kept in the record's runs list (their spread is the drift between runs)"}),
    "seed": (("--seed",), {"type": int, "default": 0, "help": "seed of the generators"}),
    "json": (("--json",), {"default": None, "metavar": "FILE", "help": "also write the report as JSON here"}),
    "max-rows": (("--max-rows",), {"type": argument(count), "default": None, "help": "cap on each case's sample"}),
    "case": (("--case",), {"action": "append", "default": None, "metavar": "TEXT",
                           "help": "audit only the cases whose name contains TEXT (repeatable)"}),
    "force": (("--force",), {"action": "store_true", "help": "replace folders that already hold files"}),
}


def _opt(*flags, **kwargs) -> tuple:
    return flags, kwargs


# --------------------------------------------------------------------------- what each command runs


def _write(record: dict, table: Callable, out: Optional[str]) -> int:
    """Print a record's table and write the record to ``out`` (if given); return exit status 0."""
    text = table(record)
    if out:
        text += f"\nrecord written to {write_record(record, out)}"
    print(text)
    return 0


def _report(text: str, data: str, out: Optional[str], passed: bool) -> int:
    """Print a report's text, write its JSON ``data`` to ``out`` (if given); exit 0 when it passed, else 1."""
    if out:
        Path(out).write_text(data + "\n")
        text += f"\nreport written to {out}"
    print(text)
    return 0 if passed else 1


def _run_verify(args) -> int:
    text, ok = commands.verify_report()
    print(text)
    if not ok:
        print("FAILED: a lossless rule is not p, or block verification accepted fewer drafts", file=sys.stderr)
    return 0 if ok else 1


def _run_audit(args) -> int:
    function, convention, name = commands.load_sampler(args.sampler)
    convention = args.convention or convention
    commands.check_signature(function, convention)
    audit = audit_sampler(function, convention=convention, name=name, seed=args.seed, rule=args.rule,
                          cases=select_cases(args.case) if args.case else None, progress=not args.no_progress)
    return _report(audit.table(), audit.to_json(), args.json, audit.passed)


def _run_audit_engine(args) -> int:
    options = settings_from(commands.EngineAuditOptions, args)
    text, data, passed = commands.run_engine_audit(args.engine, options, args.case, args.seed, args.max_rows,
                                                   not args.no_progress)
    return _report(text, data, args.json, passed)


def _run_bench_sampler(args) -> int:
    return _write(bench_sampler(settings_from(SamplerSettings, args), progress=not args.no_progress),
                  report.format_sampler_table, args.out)


def _race(args, pair, settings, once: tuple, several: tuple) -> int:
    """A decoding race: one run, or ``--runs`` independent ones, each (benchmark, table)."""
    if args.runs == 1:
        return _write(once[0](pair, settings, progress=not args.no_progress), once[1], args.out)
    return _write(several[0](pair, settings, runs=args.runs, progress=not args.no_progress), several[1], args.out)


def _run_bench_decode(args) -> int:
    settings = settings_from(DecodeSettings, args)
    pair = load_raced_pair(args.pair, args.hf_target, args.hf_draft, args.device, getattr(torch, args.dtype))
    return _race(args, pair, settings, (bench_decode, report.format_decode_table),
                 (bench_decode_runs, report.format_runs_table))


def _run_bench_peer(args) -> int:
    settings = settings_from(PeerSettings, args)
    pair = load_pair(args.pair, device=args.device, dtype=getattr(torch, args.dtype))
    pair = drafts.with_draft(pair, args.draft) if args.draft else pair
    return _race(args, pair, settings, (bench_peer, report.format_peer_table),
                 (bench_peer_runs, report.format_peer_runs_table))


def _run_bench_prices(args) -> int:
    settings, pair = settings_from(PricesSettings, args), load_pair(device=args.device, dtype=torch.float32)
    record = drafts.prices_record(pair.target, list(settings.shapes), list(settings.widths),
                                  encode_prompts(pair.prompts[:1]), repeats=settings.repeats,
                                  progress=not args.no_progress)
    record["results"] = analyse(record)
    return _write(record, report.format_prices_table, args.out)


def _run_bench_agreement(args) -> int:
    pair = load_pair(args.pair)
    temperatures = settings_from(DraftsSettings, args).temperatures
    record = drafts.measure_agreement(pair, drafts.raced_drafts(pair, args.draft), list(temperatures))
    record["results"] = analyse(record)
    return _write(record, report.format_agreement_table, args.out)


def _run_bench_drafts(args) -> int:
    settings = settings_from(DraftsSettings, args)
    pair = load_pair(args.pair)
    record = bench_drafts(pair, drafts.raced_drafts(pair, args.draft, args.compiled), settings, runs=args.runs,
                          progress=not args.no_progress, profile=not args.no_profile)
    return _write(record, report.format_drafts_table, args.out)


def _run_gpu_report(args) -> int:
    settings = settings_from(GPUReportSettings, args)
    gpu_report(device=settings.device, out_dir=settings.out_dir, budget_s=settings.budget)
    return 0


def _run_train(args) -> int:
    settings = settings_from(TrainSettings, args)
    digest = train_pair(args.out, *settings.configs(), settings.target_seconds, settings.draft_seconds,
                        settings.distill, args.device, settings.seed, progress=not args.no_progress,
                        reuse_target=args.reuse_target, draft_init=args.draft_init, overwrite=args.force)
    print(f"pair written to {args.out} (sha256 {digest})")
    return 0


def _run_train_draft(args) -> int:
    settings = settings_from(drafts.DistillSettings, args)
    digests = drafts.train_drafts(load_pair(args.pair), args.out, args.candidate, settings.sampled_windows,
                                  settings.text_windows, settings.seed, progress=not args.no_progress,
                                  overwrite=args.force)
    for name, digest in digests.items():
        print(f"{name}: written to {args.out}/{name} (sha256 {digest})")
    return 0


def _run_ship_draft(args) -> int:
    digest = drafts.ship_draft(load_pair(args.pair), args.draft, args.out, args.keep_old, overwrite=args.force)
    print(f"pair written to {args.out} (sha256 {digest}), its draft from {args.draft}")
    if args.keep_old:
        print(f"the replaced draft kept as a candidate in {args.keep_old}")
    return 0


# --------------------------------------------------------------------------- the table of commands


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its words (``("bench", "decode")``), help, what it runs, its own options, the
    settings dataclass its other options come from, and the shared options it takes."""

    words: tuple
    help: str
    run: Callable
    options: tuple = ()
    settings: Optional[type] = None
    shared: tuple = ()
    fields: tuple = ()  # the settings fields it takes as options (default: every field with a help text)


_EXITS = "exit 0: every case passes, 1: any fails, 2: the audit cannot run"
_DRAFT_FOLDERS = _opt("--draft", action="append", default=[], metavar="FOLDER",
                      help="a candidate draft's folder (train-draft); repeat for more; the pair's own draft always "
                           "takes part, as 'shipped'")

COMMANDS = (
    Command(("verify",), "check the rule exactly, print every pitfall's exact law and the exact gains of block "
            "verification and of several drafts", _run_verify),
    Command(("audit",), f"test a verification rule against exact laws, with stated error rates ({_EXITS})",
            _run_audit, (
        _opt("sampler", metavar="MODULE:FUNCTION|pitfall:KEY|hf", help="the rule to audit, e.g. "
             "speculative.sampling.sampler:rejection_sample; pitfall:KEY an entry of the gallery (verify lists "
             "them); hf the installed transformers' _speculative_sampling"),
        _opt("--convention", choices=("probs", "hf", "pitfall"), default=None,
             help="how the function is called (default: hf for 'hf', else probs)"),
        _opt("--rule", choices=("token", "block"), default="token", help="the verification rule the sampler "
             "claims: token-wise, or block verification (Sun et al.); it fixes the exact law of a whole block"),
    ), shared=("case", "json", "seed", "no-progress")),
    Command(("audit-engine",), f"test a whole engine's emitted law against exact laws of tiny models ({_EXITS})",
            _run_audit_engine, (
        _opt("engine", metavar="ours|hf|vllm|openai|gallery:KEY|MODULE:FUNCTION", help="'ours': this library's "
             "decoding; 'hf': transformers' assisted generation in each of engines.HF_CONFIGURATIONS; 'vllm': vLLM "
             "in-process; 'openai': an OpenAI-compatible server (--base-url or --serve); gallery:KEY an engine of "
             "chapter 12's gallery; MODULE:FUNCTION your engine in the models convention"),
    ), commands.EngineAuditOptions, ("case", "max-rows", "json", "seed", "no-progress")),
    Command(("bench", "sampler"), "the batched rejection sampler vs the plain per-row reference",
            _run_bench_sampler, settings=SamplerSettings, shared=("out", "no-progress")),
    Command(("bench", "decode"), "plain vs speculative decoding on the model pair", _run_bench_decode, (
        _opt("--hf-target", default=None, metavar="NAME|FOLDER", help="a transformers causal LM as the target "
             "(with --hf-draft; same tokenizer), decoding the shipped prompts as text"),
        _opt("--hf-draft", default=None, metavar="NAME|FOLDER", help="a transformers causal LM as the draft"),
    ), DecodeSettings, ("runs", "device", "dtype", "pair", "out", "no-progress")),
    Command(("bench", "peer"), "this engine vs transformers' assisted generation on the exported pair",
            _run_bench_peer, (
        _opt("--draft", default=None, metavar="FOLDER", help="race with this candidate draft (train-draft) "
             "instead of the pair's own; both sides export it"),
    ), PeerSettings, ("runs", "device", "dtype", "pair", "out", "no-progress")),
    Command(("bench", "prices"), "the forwards' price list: the target over 1-9 positions and random drafts of "
            "several shapes over one", _run_bench_prices, (), PricesSettings, ("device", "out", "no-progress")),
    Command(("bench", "agreement"), "each draft's exact acceptance rate from full forwards on held-out contexts "
            "(nothing timed)", _run_bench_agreement, (
        _DRAFT_FOLDERS,
    ), DraftsSettings, ("pair", "out"), fields=("temperatures",)),
    Command(("bench", "drafts"), "plain decoding and each draft, side by side, in independent runs",
            _run_bench_drafts, (
        _DRAFT_FOLDERS,
        _opt("--runs", type=argument(count), default=defaults.BENCH_DRAFTS["runs"],
             help="independent runs, one after another"),
        _opt("--no-profile", action="store_true", help="skip the profile of a block that ends each run"),
        _opt("--compiled", action="store_true", help="race each draft also with torch.compile on its forward "
             "(the target stays eager), named NAME+compiled"),
    ), DraftsSettings, ("pair", "out", "no-progress"),
        fields=("gammas", "temperatures", "prompts", "max_new_tokens", "repeats", "calibration_repeats")),
    Command(("gpu-report",), "the book's GPU evidence in one command: the sampler, the shipped pair's sweep, host "
            "syncs per block and the public pair's race, each written as a record", _run_gpu_report, (),
            GPUReportSettings),
    Command(("train",), "train a target and a draft on the stdlib corpus and save the pair (defaults: the shipped "
            "pair's shapes and budgets)", _run_train, (
        _opt("--out", required=True, help="folder for the pair (the shipped one is src/speculative/pair)"),
        _opt("--reuse-target", default=None, help="take the target from this pair folder; train only the draft"),
        _opt("--draft-init", default=None, help="start the draft from this pair folder's draft (same shape)"),
    ), TrainSettings, ("force", "device", "no-progress")),
    Command(("train-draft",), "distil candidate drafts from a pair's target, each saved in a folder of its own",
            _run_train_draft, (
        _opt("--out", required=True, help="folder for the candidates, one subfolder each"),
        _opt("--candidate", type=argument(parse_candidate), action="append", required=True,
             metavar="NAME=LxW:OBJECTIVE:SECONDS[:init]", help="a candidate: shape, loss (kl, tv, mixed), seconds "
             "of training, and init (from the pair's draft) or from=FOLDER (a candidate's); repeat for more"),
    ), drafts.DistillSettings, ("pair", "force", "no-progress")),
    Command(("ship-draft",), "write a pair whose draft is a candidate's: the target, prompts and target's log "
            "copied byte for byte, the replaced pair listed in pair.json", _run_ship_draft, (
        _opt("--draft", required=True, metavar="FOLDER", help="the candidate draft to ship"),
        _opt("--out", required=True, help="folder for the new pair (src/speculative/pair ships it)"),
        _opt("--keep-old", default=None, metavar="FOLDER", help="also save the replaced draft here as a candidate"),
    ), shared=("pair", "force")),
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of :data:`COMMANDS`: one subparser per command (``bench`` holds the benchmarks)."""
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = Parser(prog="python -m speculative", description=__doc__.splitlines()[0], formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"speculative {__version__}")
    top = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    groups = {}
    for command in COMMANDS:
        place = top
        if len(command.words) == 2:
            if command.words[0] not in groups:
                group = top.add_parser(command.words[0], help="measure, side by side, and write a JSON record",
                                       formatter_class=formatter)
                names = ",".join(c.words[1] for c in COMMANDS if c.words[0] == command.words[0])
                groups[command.words[0]] = group.add_subparsers(dest="target", required=True, parser_class=Parser,
                                                                metavar=f"{{{names}}}")
            place = groups[command.words[0]]
        sub = place.add_parser(command.words[-1], help=command.help, description=command.help,
                               formatter_class=formatter)
        options = [*command.options, *(settings_options(command.settings, command.fields) if command.settings else []),
                   *(SHARED[name] for name in command.shared)]
        for flags, kwargs in options:
            sub.add_argument(*flags, **kwargs)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        # the library's input errors are one line naming the problem; show that line, not a traceback
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"python -m speculative: error: {message}", file=sys.stderr)
        return 2
