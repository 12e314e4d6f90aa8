"""Command line: ``python -m speculative COMMAND``; ``--help`` lists the commands, each with its own help.

Explained in: book/intro (how to run things) and notebooks/04_transforms (the sampler benchmark).

Every default is shown by ``--help``; most come from :mod:`speculative.defaults`, and some are still written
next to their options. A bad input ends the
program with exit status 2 and one line on stderr naming the problem, before any long work starts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from speculative import __version__, defaults

_DTYPES = ("float32", "bfloat16", "float16")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser(convert, accept, expected: str, many: bool = False):
    """Return an argparse type: ``convert`` each comma-separated part (one value unless ``many``), and
    refuse, saying what was ``expected``, a value that does not convert or that ``accept`` rejects."""

    def parse(text: str):
        try:
            values = [convert(part) for part in (text.split(",") if many else [text]) if part.strip()]
        except ValueError:
            values = []
        if not values or not all(accept(v) for v in values):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return values if many else values[0]

    return parse


_ints = _parser(int, lambda v: v >= 1, "comma-separated integers >= 1", many=True)
_temperatures = _parser(float, lambda v: 0 <= v < float("inf"), "comma-separated temperatures, finite and >= 0",
                        many=True)
_int = _parser(int, lambda v: v >= 1, "an integer >= 1")
_seconds = _parser(float, lambda v: 0 < v < float("inf"), "a number of seconds > 0")
_fraction = _parser(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
_top_p = _parser(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _shape(text: str) -> dict:
    layers, width = (int(x) for x in text.lower().split("x"))
    if layers < 1 or width < 1:
        raise ValueError(text)
    return {"n_layer": layers, "d_model": width, "n_head": max(1, width // 64)}


_shapes = _parser(_shape, bool, "comma-separated shapes LAYERSxWIDTH, e.g. 2x128,2x256", many=True)


def _rules(text: str) -> list[str]:
    rules = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [r for r in rules if r not in ("token", "block")]
    if not rules or unknown:
        raise argparse.ArgumentTypeError(f"unknown rule {', '.join(unknown) or repr(text)}: use token, block or "
                                         "token,block")
    if len(set(rules)) != len(rules):
        raise argparse.ArgumentTypeError(f"rule listed twice in {text!r}")
    return rules


def _gammas(text: str) -> list:
    parts = [t.strip() for t in text.split(",")]
    numbers = _ints(",".join(t for t in parts if t != "auto")) if any(t != "auto" for t in parts) else []
    return [*numbers, *(["auto"] if "auto" in parts else [])]


def _policies(text: str) -> list[str]:
    from speculative.engine.policy import POLICIES
    from speculative.measure.bench import split_policy

    names = [t.strip() for t in text.split(",")]
    try:
        parsed = [split_policy(n) for n in names]
    except ValueError:
        parsed = []
    if len(parsed) != len(names) or len(set(parsed)) != len(names) or any(b not in POLICIES for b, _ in parsed):
        raise argparse.ArgumentTypeError(f"expected distinct names among {', '.join(POLICIES)}, each optionally "
                                         f"with +block (block verification), got {text!r}")
    return names


def _schedules(text: str) -> list[str]:
    from speculative.engine.hf import HF_SCHEDULES

    names = [t.strip() for t in text.split(",")]
    bad = [n for n in names if n not in HF_SCHEDULES]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct names among {', '.join(HF_SCHEDULES)}, got {text!r}")
    return names


def _device(text: str) -> str:
    import torch

    if text == "cpu":
        return text
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("--device cuda was asked for, but torch sees no CUDA device here")
        return text
    raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu or cuda[:N]")


def _no_progress(parser) -> None:
    """The option every long-running command shares."""
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = _Parser(prog="python -m speculative", description=__doc__.splitlines()[0], formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"speculative {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _add_verify_and_audit(commands, formatter)
    _add_audit_engine(commands, formatter)
    _add_bench(commands, formatter)
    _add_gpu_report(commands, formatter)
    _add_train(commands, formatter)
    _add_train_draft(commands, formatter)
    return parser


def _add_verify_and_audit(commands, formatter) -> None:
    """The ``verify`` and ``audit`` commands."""
    verify = commands.add_parser("verify", help="check the rule exactly, print every pitfall's exact law and "
                                 "the exact gains of block verification and of several drafts",
                                 formatter_class=formatter)
    verify.set_defaults(run=_run_verify)

    audit = commands.add_parser(
        "audit", help="test a verification rule against exact laws, with stated error rates",
        description="Audit a verification rule: exit 0 when every case passes, 1 when any fails, 2 when the "
        "audit cannot run.", formatter_class=formatter)
    audit.add_argument("sampler", metavar="MODULE:FUNCTION|pitfall:KEY|hf",
                       help="the rule to audit, e.g. speculative.sampling.sampler:rejection_sample; pitfall:KEY "
                       "audits an "
                       "entry of the gallery (python -m speculative verify lists the keys); 'hf' audits the "
                       "installed transformers' _speculative_sampling")
    audit.add_argument("--convention", choices=("probs", "hf", "pitfall"), default=None,
                       help="how the function is called (default: hf for 'hf', else probs)")
    audit.add_argument("--rule", choices=("token", "block"), default="token",
                       help="the verification rule the sampler claims: token-wise, or block verification (Sun et "
                       "al.); it fixes the exact law of a whole block")
    audit.add_argument("--case", action="append", default=None, metavar="TEXT",
                       help="audit only the battery's cases whose name contains TEXT (repeatable; default: every "
                       "case; chapter 09 lists them), e.g. --case 'three-token' for a quick check")
    audit.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON here")
    audit.add_argument("--seed", type=int, default=0, help="seed of the drafts and of the sampler's generator")
    _no_progress(audit)
    audit.set_defaults(run=_run_audit)



def _add_audit_engine(commands, formatter) -> None:
    """The ``audit-engine`` command."""
    audit = commands.add_parser(
        "audit-engine", help="test a whole engine's emitted law against exact laws of tiny models",
        description="Audit a whole speculative-decoding engine end to end: exit 0 when every case passes, 1 when "
        "any fails, 2 when the audit cannot run.", formatter_class=formatter)
    audit.add_argument("engine", metavar="ours|hf|vllm|openai|gallery:KEY|MODULE:FUNCTION",
                       help="'ours': this library's speculative_decode; 'hf': the installed transformers' assisted "
                       "generation, in each configuration of engines.HF_CONFIGURATIONS; 'vllm': vLLM in-process "
                       "on the serving battery; 'openai': an OpenAI-compatible server (--base-url or --serve); "
                       "gallery:KEY an engine of the gallery (chapter 12); MODULE:FUNCTION your engine in the "
                       "models convention")
    audit.add_argument("--temperature", type=float, default=None, help="replace every case's processors: temperature")
    audit.add_argument("--top-k", type=int, default=None, help="... top-k (with --temperature and friends)")
    audit.add_argument("--top-p", type=float, default=None, help="... top-p")
    audit.add_argument("--repetition-penalty", type=float, default=None,
                       help="... transformers' repetition penalty; without the other flags, adds the battery's "
                       "penalty case")
    audit.add_argument("--gamma", type=int, default=2, help="ours: drafts per block (a policy's start)")
    audit.add_argument("--rule", choices=("token", "block"), default="token", help="ours: the verification rule")
    audit.add_argument("--policy", choices=("heuristic", "confidence", "auto"), default=None,
                       help="ours: a draft-length policy instead of a fixed gamma (at most 3 drafts)")
    audit.add_argument("--per-row", action="store_true", help="ours: each row keeps its own draft length")
    audit.add_argument("--mixed", action="store_true", help="ours: rows of two prompt lengths in every batch")
    audit.add_argument("--hf-config", action="append", default=None, metavar="LABEL",
                       help="hf: audit only the configurations whose label contains LABEL (repeatable)")
    audit.add_argument("--case", action="append", default=None, metavar="TEXT",
                       help="audit only the cases whose name contains TEXT (repeatable)")
    serving = audit.add_argument_group("vllm and openai (the serving battery: Llama folders, head size 32)")
    serving.add_argument("--method", action="append", default=None, metavar="NAME",
                         help="vllm: a speculative method of doors.VLLM_METHODS (repeatable; default draft_model)")
    serving.add_argument("--speculative-config", default=None, metavar="JSON",
                         help="vllm: vLLM's speculative_config as JSON ({draft} is the case's draft folder, "
                              "{eagle} its EAGLE head)")
    serving.add_argument("--axis", action="append", default=None, metavar="NAME",
                         help="the serving axes to audit, of doors.AXES: plain, mixed, paired, seeded "
                         "(repeatable; default plain)")
    serving.add_argument("--as-shipped", action="store_true",
                         help="vllm: run without this package's vLLM plugin (VLLM_PLUGINS empty)")
    serving.add_argument("--base-url", default=None, metavar="URL", help="openai: a server already running")
    serving.add_argument("--serve", default=None, metavar="TEMPLATE",
                         help="openai: a shell command with {target}, {draft} and {port}, started per case on "
                         "127.0.0.1 and stopped after it")
    serving.add_argument("--battery", default=None, metavar="DIR",
                         help="where the serving battery's folders are (written when missing; default: a "
                         "temporary folder)")
    serving.add_argument("--record", default=None, metavar="FILE",
                         help="add this run to a serving record (JSON), under --run")
    serving.add_argument("--surface", action="store_true",
                         help="vllm: also record what greedy-match and logprob checks see, with the first method")
    serving.add_argument("--run", dest="run_name", default=None, metavar="NAME", help="the run's name in --record")
    audit.add_argument("--max-rows", type=int, default=None, help="cap on each case's sample")
    audit.add_argument("--json", default=None, metavar="FILE", help="also write the report(s) as JSON here")
    audit.add_argument("--seed", type=int, default=0, help="seed of the engine's generator")
    _no_progress(audit)
    audit.set_defaults(run=_run_audit_engine)


def _engine_cases(args):
    from speculative.audit.engines import engine_battery
    from speculative.sampling.transforms import PenalizedConfig

    flags = (args.temperature, args.top_k, args.top_p)
    config = None
    if any(v is not None for v in flags):
        config = PenalizedConfig(1.0 if args.temperature is None else args.temperature, args.top_k, args.top_p,
                                 repetition_penalty=args.repetition_penalty or 1.0)
    cases = engine_battery(penalty=args.repetition_penalty is not None and config is None, config=config)
    if args.repetition_penalty is not None and config is None:
        cases = [c for c in cases if "penalty" in c.name]
    if args.case:
        cases = [c for c in cases if any(text in c.name for text in args.case)]
        if not cases:
            raise ValueError(f"no engine case matches {args.case}")
    for case in cases:
        case.law()  # a config that leaves the support too large fails here, in one line
    return cases


def _load_engine(args):
    from speculative.audit.engines import GALLERY, library_engine

    spec = args.engine
    if spec == "ours":
        return library_engine(args.gamma, rule=args.rule, per_row=args.per_row, mixed=args.mixed, policy=args.policy)
    if spec.startswith("gallery:"):
        key = spec.partition(":")[2]
        for entry in GALLERY:
            if entry.key == key:
                return entry.engine()
        raise ValueError(f"no gallery engine {key!r}; known: {', '.join(e.key for e in GALLERY)}")
    return _import_callable(spec, "ours, hf, gallery:KEY or MODULE:FUNCTION")


def _run_audit_engine(args) -> int:
    import json
    from pathlib import Path

    from speculative.audit.core import audit_engine

    if args.engine == "hf":
        return _run_audit_engine_hf(args)
    if args.engine in ("vllm", "openai"):
        return _run_audit_engine_serving(args)
    engine = _load_engine(args)
    cases = _engine_cases(args)
    if args.engine == "ours" and any(getattr(c.config, "repetition_penalty", 1) != 1 for c in cases):
        raise ValueError("this library's engine does not apply a repetition penalty: audit it without one")
    report = audit_engine(engine, cases=cases, seed=args.seed, max_rows=args.max_rows, progress=not args.no_progress)
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(json.loads(report.to_json()), indent=2) + "\n")
        print(f"report written to {args.json}")
    return 0 if report.passed else 1


def _run_audit_engine_serving(args) -> int:
    import json

    from speculative.audit.doors import run_serving_audit

    if args.engine == "vllm" and (args.base_url or args.serve):
        raise ValueError("--base-url and --serve are for 'openai'; 'vllm' runs vLLM in this process")
    if args.engine == "openai" and bool(args.base_url) == bool(args.serve):
        raise ValueError("openai needs exactly one of --base-url URL and --serve TEMPLATE")
    if args.record and not args.run_name:
        raise ValueError("--record needs --run NAME (the run's name in the record)")
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    if args.speculative_config and not isinstance(spec, dict):
        raise ValueError("--speculative-config must be a JSON object")
    run = run_serving_audit(args.engine, methods=args.method, speculative_config=spec, axes=args.axis or ["plain"],
                            battery=args.battery, case_names=args.case, as_shipped=args.as_shipped,
                            base_url=args.base_url, serve=args.serve, seed=args.seed, max_rows=args.max_rows,
                            progress=not args.no_progress, record=args.record, run_name=args.run_name,
                            surface=args.surface)
    for check in (run.get("surface_checks") or {}).get("cases", []):
        gap = "—" if check["logprob_gap"] is None else f"{check['logprob_gap']:.1e}"
        print(f"{check['case']}: greedy matches the target: {check['greedy_matches']}; largest logprob gap {gap}")
    for configuration in run["configurations"]:
        print(configuration["table"] + "\n")
    if args.record:
        print(f"run {args.run_name!r} written to {args.record}")
    return 0 if all(c["passed"] for c in run["configurations"]) else 1


def _run_audit_engine_hf(args) -> int:
    import json
    from pathlib import Path

    from speculative.audit.core import audit_engine
    from speculative.audit.engines import HF_CONFIGURATIONS, cases_named, engine_battery

    try:
        import transformers
    except ImportError as error:
        raise ValueError(f"cannot import transformers ({error}); pip install transformers") from None
    chosen = {label: value for label, value in HF_CONFIGURATIONS.items()
              if not args.hf_config or any(text in label for text in args.hf_config)}
    if not chosen:
        raise ValueError(f"no transformers configuration matches {args.hf_config}; "
                         f"known: {', '.join(HF_CONFIGURATIONS)}")
    battery = engine_battery(penalty=True)
    import importlib.util

    import torch

    record = {"engine": "hf", "transformers": transformers.__version__, "torch": torch.__version__,
              # without scikit-learn, transformers keeps assistant_confidence_threshold fixed (no adaptation)
              "scikit_learn": importlib.util.find_spec("sklearn") is not None, "configurations": []}
    passed = True
    for label, (settings, names) in chosen.items():
        report = audit_engine(settings, convention="hf", cases=cases_named(battery, names), seed=args.seed,
                              max_rows=args.max_rows, name=f"transformers {transformers.__version__}: {label}",
                              progress=not args.no_progress)
        print(report.table() + "\n")
        record["configurations"].append({"label": label, "settings": settings, **json.loads(report.to_json())})
        passed = passed and report.passed
    if args.json:
        from speculative.engine.timing import environment

        record["environment"] = environment()
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        print(f"report written to {args.json}")
    return 0 if passed else 1


def _add_bench(commands, formatter) -> None:
    """The ``bench`` command and its benchmarks."""
    bench = commands.add_parser("bench", help="measure, side by side, and write a JSON record",
                                formatter_class=formatter)
    targets = bench.add_subparsers(dest="target", required=True, parser_class=_Parser,
                                   metavar="{sampler,decode,peer,prices,agreement,drafts}")
    _add_bench_sampler(targets, formatter)
    _add_bench_decode(targets, formatter)
    _add_bench_peer(targets, formatter)
    _add_bench_drafts(targets, formatter)


def _add_bench_drafts(targets, formatter) -> None:
    """``bench prices``, ``bench agreement`` and ``bench drafts``: which draft."""
    d, p = defaults.BENCH_DECODE, defaults.BENCH_PRICES
    prices = targets.add_parser("prices", help="the forwards' price list: the target over 1-9 positions and random "
                                "drafts of several shapes over one", formatter_class=formatter)
    prices.add_argument("--shapes", type=_shapes, default=list(p["shapes"]), metavar="LxW[,LxW...]",
                        help="draft shapes: layers x width (heads: width / 64)")
    prices.add_argument("--widths", type=_ints, default=list(p["widths"]), metavar="W[,W...]",
                        help="target widths: positions per forward (a verification of gamma drafts has gamma + 1)")
    prices.add_argument("--repeats", type=_int, default=p["repeats"], help="interleaved rounds (medians kept)")
    prices.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    prices.add_argument("--out", default=None, help="write the JSON record here, e.g. results/prices_cpu.json")
    _no_progress(prices)
    prices.set_defaults(run=_run_bench_prices)
    for name, what in (("agreement", "each draft's exact acceptance rate from full forwards on held-out contexts "
                                     "(nothing timed)"),
                       ("drafts", "plain decoding and each draft, side by side, in independent runs")):
        race = targets.add_parser(name, help=what, formatter_class=formatter)
        race.add_argument("--draft", action="append", default=[], metavar="FOLDER",
                          help="a candidate draft's folder (python -m speculative train-draft); repeat for more; "
                               "the pair's own draft always takes part, as 'shipped'")
        race.add_argument("--temperature", type=_temperatures, default=[0.0, 1.0], metavar="T[,T...]",
                          help="temperatures, 0 = greedy")
        race.add_argument("--pair", default=None, help="folder of the pair (default: the shipped pair)")
        race.add_argument("--out", default=None, help="write the JSON record here")
        if name == "drafts":
            race.add_argument("--gamma", type=_ints, default=[2, 4, 6], metavar="G[,G...]", help="draft lengths")
            race.add_argument("--prompts", type=_int, default=d["prompts"], help="held-out prompts, batch 1")
            race.add_argument("--max-new-tokens", type=_int, default=d["max_new_tokens"], help="tokens per prompt")
            race.add_argument("--repeats", type=_int, default=1, help="timed rounds per run")
            race.add_argument("--runs", type=_int, default=3, help="independent runs, one after another")
            race.add_argument("--calibration-repeats", type=_int, default=d["calibration_repeats"],
                              help="rounds of each draft's step calibration")
            _no_progress(race)
            race.add_argument("--no-profile", action="store_true",
                              help="skip the profile of a block that ends each run (bench.profile_block)")
            race.add_argument("--compiled", action="store_true",
                              help="race each draft also with torch.compile on its forward (the target stays "
                                   "eager), named NAME+compiled (drafts.compiled)")
        race.set_defaults(run=_run_bench_agreement if name == "agreement" else _run_bench_drafts)


def _raced_drafts(args) -> tuple:
    """The pair and {name: pair with that draft}: the shipped draft first, then each --draft folder."""
    from pathlib import Path

    from speculative.engine.pair import load_pair
    from speculative.measure.drafts import compiled, with_draft

    pair = load_pair(args.pair)
    drafts = {"shipped": pair}
    for folder in args.draft:
        name = Path(folder).name
        if name in drafts:
            raise ValueError(f"two drafts are named {name!r}: give their folders different names")
        drafts[name] = with_draft(pair, folder)
    if getattr(args, "compiled", False):
        drafts.update({f"{name}+compiled": compiled(other) for name, other in drafts.items()})
    return pair, drafts


def _run_bench_prices(args) -> int:
    import torch

    from speculative.engine.decode import encode_prompts
    from speculative.engine.pair import load_pair
    from speculative.measure.drafts import prices_record
    from speculative.measure.report import format_prices_table

    pair = load_pair(device=args.device, dtype=torch.float32)
    record = prices_record(pair.target, args.shapes, args.widths, encode_prompts(pair.prompts[:1]),
                           repeats=args.repeats, progress=not args.no_progress)
    from speculative.measure.analysis import analyse

    record["results"] = analyse(record)
    return _write(record, format_prices_table, args.out)


def _run_bench_agreement(args) -> int:
    from speculative.measure.analysis import analyse
    from speculative.measure.drafts import measure_agreement
    from speculative.measure.report import format_agreement_table

    pair, drafts = _raced_drafts(args)
    record = measure_agreement(pair, drafts, args.temperature)
    record["results"] = analyse(record)
    return _write(record, format_agreement_table, args.out)


def _run_bench_drafts(args) -> int:
    from speculative.measure.bench import DecodeSettings, bench_drafts
    from speculative.measure.report import format_drafts_table

    pair, drafts = _raced_drafts(args)
    settings = DecodeSettings(gammas=args.gamma, temperatures=args.temperature, batches=[1], prompts=args.prompts,
                              max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                              calibration_repeats=args.calibration_repeats)
    record = bench_drafts(pair, drafts, settings, runs=args.runs, progress=not args.no_progress,
                          profile=not args.no_profile)
    return _write(record, format_drafts_table, args.out)


def _add_bench_sampler(targets, formatter) -> None:
    """``bench sampler``: the batched sampler against the per-row reference."""
    s = defaults.BENCH_SAMPLER
    sampler = targets.add_parser("sampler", help="the batched rejection sampler vs the plain per-row reference",
                                 formatter_class=formatter)
    sampler.add_argument("--batch", type=_ints, default=list(s["batches"]), metavar="B[,B...]", help="batch sizes")
    sampler.add_argument("--vocab", type=_ints, default=list(s["vocabs"]), metavar="V[,V...]", help="vocabularies")
    sampler.add_argument("--k", type=_int, default=s["k"], help="drafted tokens per row")
    sampler.add_argument("--repeats", type=_int, default=s["repeats"], help="timed runs per point, after a warm-up")
    sampler.add_argument("--seed", type=int, default=s["seed"], help="seed of the inputs and the uniforms")
    sampler.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    sampler.add_argument("--out", default=None, help="write the JSON record here, e.g. results/sampler_cpu.json")
    _no_progress(sampler)
    sampler.set_defaults(run=_run_bench_sampler)



def _add_bench_decode(targets, formatter) -> None:
    """``bench decode``: plain against speculative decoding."""
    d = defaults.BENCH_DECODE
    decode = targets.add_parser("decode", help="plain vs speculative decoding on the model pair",
                                formatter_class=formatter)
    decode.add_argument("--gamma", type=_gammas, default=list(d["gammas"]), metavar="G[,G...]",
                        help="draft lengths; auto = chosen per block by the calibrated cost model")
    decode.add_argument("--temperature", type=_temperatures, default=list(d["temperatures"]), metavar="T[,T...]",
                        help="temperatures, 0 = greedy")
    decode.add_argument("--top-k", type=_int, default=None, help="keep the k likeliest tokens (both models)")
    decode.add_argument("--top-p", type=_top_p, default=None, help="keep the smallest head of mass >= p (both models)")
    decode.add_argument("--batch", type=_ints, default=list(d["batches"]), metavar="B[,B...]", help="batch sizes")
    decode.add_argument("--rule", type=_rules, default=list(d["rules"]), metavar="R[,R...]",
                        help="verification rules, side by side: token (token-wise), block (block verification)")
    decode.add_argument("--drafts", type=_ints, default=list(d["drafts"]), metavar="K[,K...]",
                        help="draft chains per block; K > 1 runs multi-draft decoding (batch 1, token-wise chains)")
    decode.add_argument("--scheme", choices=("with_replacement", "without_replacement", "top_k"),
                        default=d["scheme"], help="how the K chains' first tokens are drawn")
    decode.add_argument("--prompts", type=_int, default=d["prompts"],
                        help="held-out prompts decoded per point, in groups of the batch size")
    decode.add_argument("--max-new-tokens", type=_int, default=d["max_new_tokens"], help="tokens generated per row")
    decode.add_argument("--repeats", type=_int, default=d["repeats"], help="timed runs per point, after a warm-up")
    decode.add_argument("--calibration-repeats", type=_int, default=d["calibration_repeats"],
                        help="rounds of the step timings the cost model is calibrated from (medians kept)")
    decode.add_argument("--runs", type=_int, default=1,
                        help="independent runs of the whole benchmark, one after another, each kept in the "
                             "record's runs list (their spread is the drift between runs)")
    decode.add_argument("--seed", type=int, default=d["seed"], help="seed of the sampling generators")
    decode.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    decode.add_argument("--dtype", choices=_DTYPES, default="float32",
                        help="weights and cache dtype (half precision is meant for CUDA)")
    decode.add_argument("--pair", default=None, help="folder of a model pair (default: the shipped pair)")
    decode.add_argument("--hf-target", default=None, metavar="NAME|FOLDER",
                        help="a transformers causal LM as the target (with --hf-draft; same tokenizer), decoding "
                             "the shipped prompts as text")
    decode.add_argument("--hf-draft", default=None, metavar="NAME|FOLDER", help="a transformers causal LM as the draft")
    decode.add_argument("--out", default=None, help="write the JSON record here, e.g. results/decode_cpu.json")
    _no_progress(decode)
    decode.set_defaults(run=_run_bench_decode)



def _add_bench_peer(targets, formatter) -> None:
    """``bench peer``: this engine against transformers' assisted generation."""
    peer = targets.add_parser("peer", help="this engine vs transformers' assisted generation on the exported pair",
                              formatter_class=formatter)
    d, e = defaults.BENCH_DECODE, defaults.BENCH_PEER  # the race's prompts, tokens, repeats and seed are decode's
    peer.add_argument("--temperature", type=_temperatures, default=list(e["temperatures"]), metavar="T[,T...]",
                      help="temperatures, 0 = greedy")
    peer.add_argument("--gamma", type=_int, default=e["gamma"],
                      help="this engine's draft length, and the fixed schedule's")
    peer.add_argument("--schedules", type=_schedules, default=list(e["schedules"]), metavar="S[,S...]",
                      help="transformers' draft-length schedules: default, fixed, heuristic")
    peer.add_argument("--policies", type=_policies, default=list(e["policies"]), metavar="P[,P...]",
                      help="this engine's draft-length policies: fixed (at --gamma), heuristic, confidence, auto; "
                           "name+block verifies by block verification (e.g. auto+block)")
    peer.add_argument("--prompts", type=_int, default=d["prompts"],
                      help="held-out prompts, each decoded by every decoder")
    peer.add_argument("--max-new-tokens", type=_int, default=d["max_new_tokens"], help="tokens generated per prompt")
    peer.add_argument("--repeats", type=_int, default=d["repeats"],
                      help="timed rounds over the prompts, after a warm-up")
    peer.add_argument("--runs", type=_int, default=1,
                      help="independent races, one after another, each kept in the record's runs list (their "
                           "spread is the drift between runs)")
    peer.add_argument("--seed", type=int, default=d["seed"], help="seed of the sampling generators")
    peer.add_argument("--calibration-repeats", type=_int, default=d["calibration_repeats"],
                      help="rounds of the step timings the auto policy is calibrated from (medians kept)")
    peer.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    peer.add_argument("--dtype", choices=_DTYPES, default="float32", help="weights and cache dtype")
    peer.add_argument("--draft", default=None, metavar="FOLDER",
                      help="race with this candidate draft (python -m speculative train-draft) instead of the "
                           "pair's own; both sides export it")
    peer.add_argument("--pair", default=None, help="folder of the model pair (default: the shipped pair)")
    peer.add_argument("--out", default=None, help="write the JSON record here, e.g. results/peer_hf_cpu.json")
    _no_progress(peer)
    peer.set_defaults(run=_run_bench_peer)



def _add_gpu_report(commands, formatter) -> None:
    """The ``gpu-report`` command."""
    report = commands.add_parser("gpu-report", help="the book's GPU evidence in one command: the sampler, the "
                                 "shipped pair's sweep, host syncs per block and the public pair's race, each "
                                 "written as a record (see speculative.measure.gpu_report)", formatter_class=formatter)
    report.add_argument("--device", default="cuda", help="cuda[:N]; cpu runs every step at the smoke sizes, "
                        "into *_cpu_smoke.json (for testing the command without a GPU)")
    report.add_argument("--out-dir", default="results", help="folder for the records")
    report.add_argument("--budget", type=_seconds, default=defaults.GPU_REPORT["budget_s"],
                        help="seconds after which the steps not yet started are skipped")
    report.set_defaults(run=_run_gpu_report)


def _run_gpu_report(args) -> int:
    from speculative.measure.gpu_report import gpu_report

    device = args.device
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"unknown device {device!r}: use cpu or cuda[:N]")
    gpu_report(device=device, out_dir=args.out_dir, budget_s=args.budget)
    return 0


def _add_train(commands, formatter) -> None:
    """The ``train`` command."""
    train = commands.add_parser("train", help="train a target and a draft on the stdlib corpus and save the pair "
                                "(defaults: the shipped pair's shapes and budgets)", formatter_class=formatter)
    train.add_argument("--out", required=True, help="folder for the pair (the shipped one is src/speculative/pair)")
    train.add_argument("--force", action="store_true", help="replace --out if it already holds files")
    train.add_argument("--target-seconds", type=_seconds, default=defaults.TARGET_SECONDS,
                       help="time budget for the target")
    train.add_argument("--draft-seconds", type=_seconds, default=defaults.DRAFT_SECONDS,
                       help="time budget for the draft")
    train.add_argument("--distill", type=_fraction, default=defaults.DISTILL_WEIGHT,
                       help="weight of the KL-to-target term for the draft, in [0, 1) (0: off)")
    for role, shape in (("target", defaults.TARGET_SHAPE), ("draft", defaults.DRAFT_SHAPE)):
        train.add_argument(f"--{role}-layers", type=_int, default=shape["n_layer"], help=f"{role} blocks")
        train.add_argument(f"--{role}-width", type=_int, default=shape["d_model"],
                           help=f"{role} width (divisible by its heads)")
        train.add_argument(f"--{role}-heads", type=_int, default=shape["n_head"], help=f"{role} attention heads")
    train.add_argument("--context", type=_int, default=defaults.CONTEXT, help="positions both models hold")
    train.add_argument("--reuse-target", default=None,
                       help="take the target from this pair folder; train only the draft")
    train.add_argument("--draft-init", default=None,
                       help="start the draft from this pair folder's draft (same shape) and keep training it")
    train.add_argument("--seed", type=int, default=defaults.TRAIN_SEED, help="seed of weights and batches")
    train.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    _no_progress(train)
    train.set_defaults(run=_run_train)


def _run_bench_decode(args) -> int:
    import torch

    from speculative.engine.pair import load_pair
    from speculative.measure.bench import DecodeSettings, bench_decode, bench_decode_runs
    from speculative.measure.report import format_decode_table, format_runs_table

    if (args.hf_target is None) != (args.hf_draft is None):
        raise ValueError("pass both --hf-target and --hf-draft, or neither")
    if args.hf_target and args.pair:
        raise ValueError("--pair and --hf-target name two different pairs: pass one")
    pair = load_pair(args.pair, device=args.device, dtype=getattr(torch, args.dtype))
    if args.hf_target:
        from speculative.engine.hf import load_pair as load_hf_pair

        text = [p.decode("utf-8", errors="replace") for p in pair.prompts]
        pair = load_hf_pair(args.hf_target, args.hf_draft, text, device=args.device, dtype=getattr(torch, args.dtype))
    settings = DecodeSettings(gammas=args.gamma, temperatures=args.temperature, batches=args.batch,
                              max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed,
                              prompts=args.prompts, top_k=args.top_k, top_p=args.top_p, rules=args.rule,
                              drafts=args.drafts, scheme=args.scheme, calibration_repeats=args.calibration_repeats)
    if args.runs == 1:
        return _write(bench_decode(pair, settings, progress=not args.no_progress), format_decode_table, args.out)
    return _write(bench_decode_runs(pair, settings, runs=args.runs, progress=not args.no_progress), format_runs_table,
                  args.out)


def _run_bench_peer(args) -> int:
    import torch

    from speculative.engine.pair import load_pair
    from speculative.measure.bench import PeerSettings, bench_peer, bench_peer_runs
    from speculative.measure.report import format_peer_runs_table, format_peer_table

    pair = load_pair(args.pair, device=args.device, dtype=getattr(torch, args.dtype))
    if args.draft:
        from speculative.measure.drafts import with_draft

        pair = with_draft(pair, args.draft)
    settings = PeerSettings(temperatures=args.temperature, gamma=args.gamma, schedules=args.schedules,
                            policies=args.policies, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                            repeats=args.repeats, seed=args.seed, calibration_repeats=args.calibration_repeats)
    if args.runs == 1:
        return _write(bench_peer(pair, settings, progress=not args.no_progress), format_peer_table, args.out)
    return _write(bench_peer_runs(pair, settings, runs=args.runs, progress=not args.no_progress),
                  format_peer_runs_table, args.out)


def _write(record: dict, table, out: Optional[str]) -> int:
    """Print a record's table and write the record to ``out`` (if given); return exit status 0."""
    from speculative.measure.records import write_record

    print(table(record))
    path = write_record(record, out)
    if path:
        print(f"record written to {path}")
    return 0


def _add_train_draft(commands, formatter) -> None:
    """The ``train-draft`` command."""
    from speculative.training.train import parse_candidate

    draft = commands.add_parser("train-draft", help="distil candidate drafts from a pair's target, each saved in a "
                                "folder of its own (see speculative.measure.drafts)", formatter_class=formatter)
    draft.add_argument("--out", required=True, help="folder for the candidates, one subfolder each")
    shape = "NAME=LAYERSxWIDTH:OBJECTIVE:SECONDS[:init], e.g. tv=2x128:tv:240:init"
    draft.add_argument("--candidate", type=_parser(parse_candidate, bool, shape), action="append",
                       required=True, metavar="NAME=LxW:OBJECTIVE:SECONDS[:init]",
                       help="a candidate: shape, loss (kl, tv, mixed), seconds of training, and init to start "
                            "from the pair's draft or from=FOLDER to start from a candidate's; repeat for more")
    draft.add_argument("--pair", default=None, help="folder of the pair (default: the shipped pair)")
    draft.add_argument("--sampled-windows", type=_int, default=2048, help="windows of the target's own samples")
    draft.add_argument("--text-windows", type=_int, default=2048, help="windows of training text")
    draft.add_argument("--seed", type=int, default=defaults.TRAIN_SEED, help="seed of the windows and weights")
    draft.add_argument("--force", action="store_true", help="replace candidate folders that hold files")
    _no_progress(draft)
    draft.set_defaults(run=_run_train_draft)
    ship = commands.add_parser("ship-draft", help="write a pair whose draft is a candidate's: the target, prompts "
                               "and target's log copied byte for byte, the replaced pair listed in pair.json",
                               formatter_class=formatter)
    ship.add_argument("--draft", required=True, metavar="FOLDER", help="the candidate draft to ship")
    ship.add_argument("--out", required=True, help="folder for the new pair (src/speculative/pair ships it)")
    ship.add_argument("--keep-old", default=None, metavar="FOLDER",
                      help="also save the replaced draft here as a candidate, so the old pair can still be raced")
    ship.add_argument("--pair", default=None, help="folder of the pair (default: the shipped pair)")
    ship.add_argument("--force", action="store_true", help="replace folders that hold files")
    ship.set_defaults(run=_run_ship_draft)


def _run_train_draft(args) -> int:
    from speculative.engine.pair import load_pair
    from speculative.measure.drafts import train_drafts

    if len({c["name"] for c in args.candidate}) != len(args.candidate):
        raise ValueError("two candidates share a name")
    digests = train_drafts(load_pair(args.pair), args.out, args.candidate, args.sampled_windows, args.text_windows,
                           args.seed, progress=not args.no_progress, overwrite=args.force)
    for name, digest in digests.items():
        print(f"{name}: written to {args.out}/{name} (sha256 {digest})")
    return 0


def _run_ship_draft(args) -> int:
    from speculative.engine.pair import load_pair
    from speculative.measure.drafts import ship_draft

    digest = ship_draft(load_pair(args.pair), args.draft, args.out, args.keep_old, overwrite=args.force)
    print(f"pair written to {args.out} (sha256 {digest}), its draft from {args.draft}")
    if args.keep_old:
        print(f"the replaced draft kept as a candidate in {args.keep_old}")
    return 0


def _run_train(args) -> int:
    from speculative.engine.model import GPTConfig
    from speculative.training.train import train_pair

    target = GPTConfig(context=args.context, n_layer=args.target_layers, n_head=args.target_heads,
                       d_model=args.target_width)
    draft = GPTConfig(context=args.context, n_layer=args.draft_layers, n_head=args.draft_heads,
                      d_model=args.draft_width)
    digest = train_pair(args.out, target, draft, args.target_seconds, args.draft_seconds, args.distill,
                        args.device, args.seed, progress=not args.no_progress, reuse_target=args.reuse_target,
                        draft_init=args.draft_init, overwrite=args.force)
    print(f"pair written to {args.out} (sha256 {digest})")
    return 0


def _run_verify(args) -> int:
    from speculative.audit.pitfalls import FIX, MULTI_DRAFT_PITFALLS, PITFALLS, SEED_P, SEED_Q, extend
    from speculative.exact.rule import output_distribution, total_variation
    from speculative.measure.report import as_text

    out = output_distribution(SEED_P, SEED_Q)
    print(f"seed example: p = {as_text(SEED_P)}, q = {as_text(SEED_Q)} -> output {as_text(out)}")
    if out != list(SEED_P):
        print("FAILED: the output is not p", file=sys.stderr)
        return 1
    print(f"{'pitfall':32s} {'exact law on its demo pair (last entry: invalid id)':52s} TV from p")
    for pitfall in PITFALLS + [FIX] + MULTI_DRAFT_PITFALLS:
        law = pitfall.exact_law()
        print(f"{pitfall.key:32s} {as_text(law):52s} {as_text(total_variation(law, extend(pitfall.demo_p)))}")
    print("law: the exact output distribution of the wrong rule on its demo pair; TV from p: its total variation "
          "distance from the target (0 = lossless)")
    return _verify_beyond_one_draft()


def _verify_beyond_one_draft() -> int:
    """Print the exact gains of block verification and of several drafts; return 1 if a check fails."""
    from speculative.exact.exact import multi_draft_table, sun_example_table
    from speculative.measure.report import as_text

    rows = sun_example_table()
    print(f"\nblock verification, Sun et al.'s example p = {as_text(rows[0]['p'])}, q = {as_text(rows[0]['q'])}, "
          "expected accepted drafts per block:")
    print(f"{'gamma':>5} {'token-wise':>12} {'block':>12} {'block / token':>14}")
    failed = False
    for row in rows:
        print(f"{row['gamma']:>5} {str(row['token']):>12} {str(row['block']):>12} "
              f"{str(row['block'] / row['token']):>14}")
        failed |= row["block"] < row["token"]
    rows = multi_draft_table()
    print(f"\nseveral drafts at one position, p = {as_text(rows[0]['p'])}, q = {as_text(rows[0]['q'])}: "
          "P(a draft is accepted) and TV(output, p)")
    print(f"{'scheme':32s} {'k = 1':>10} {'k = 2':>10} {'k = 3':>10}   TV at k = 1, 2, 3")
    for row in rows:
        print(f"{row['scheme']:32s} " + " ".join(f"{str(a):>10}" for a in row["acceptance"])
              + "   " + ", ".join(str(t) for t in row["tv"]))
        failed |= row["lossless"] and any(row["tv"])
    print("k: candidates per position; the last two schemes are wrong: their pitfall entries above show each on "
          "a pair where it bites")
    if failed:
        print("FAILED: block verification accepted fewer drafts than token-wise, or a lossless scheme is not p",
              file=sys.stderr)
    return 1 if failed else 0


def _load_sampler(spec: str):
    """Return (function, convention, name) for ``MODULE:FUNCTION``, ``pitfall:KEY`` or ``hf``; a ValueError
    says what failed."""
    if spec == "hf":
        try:
            import transformers
            from transformers.generation.utils import _speculative_sampling
        except ImportError as error:
            raise ValueError(f"cannot import transformers' _speculative_sampling ({error}); "
                             "pip install transformers") from None
        return _speculative_sampling, "hf", f"transformers {transformers.__version__} _speculative_sampling"
    if spec.startswith("pitfall:"):  # an entry of the gallery, with the demo options it has in chapter 05
        from speculative.audit.core import pitfall_sampler
        from speculative.audit.pitfalls import find

        return pitfall_sampler(find(spec.partition(":")[2])), "pitfall", spec
    return _import_callable(spec, "MODULE:FUNCTION, pitfall:KEY or hf"), "probs", spec


def _import_callable(spec: str, expected: str):
    """Return the callable ``MODULE:FUNCTION`` names; a ValueError says what failed (``expected`` names the
    forms the command takes)."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected {expected}, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is reported in one line
        raise ValueError(f"cannot import {module_name!r}: {type(error).__name__}: {error}") from None
    function = module
    for part in attribute.split("."):
        if not hasattr(function, part):
            raise ValueError(f"{module_name!r} has no attribute {attribute!r}")
        function = getattr(function, part)
    if not callable(function):
        raise ValueError(f"{spec} is a {type(function).__name__}, not a function")
    return function


def _check_signature(function, convention: str) -> None:
    import inspect

    needed = {"probs": 4, "hf": 4, "pitfall": 4}[convention]
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # builtins without a signature: let the audit try
    try:
        signature.bind(*range(needed))
    except TypeError:
        raise ValueError(f"{getattr(function, '__qualname__', function)}{signature} cannot take the {needed} "
                         f"positional arguments of the {convention!r} convention") from None


def _run_audit(args) -> int:
    from speculative.audit.core import audit_sampler, select_cases

    function, convention, name = _load_sampler(args.sampler)
    convention = args.convention or convention
    _check_signature(function, convention)
    cases = select_cases(args.case) if args.case else None
    report = audit_sampler(function, convention=convention, name=name, seed=args.seed, cases=cases,
                           progress=not args.no_progress, rule=args.rule)
    print(report.table())
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(report.to_json() + "\n")
        print(f"report written to {args.json}")
    return 0 if report.passed else 1


def _run_bench_sampler(args) -> int:
    from speculative.measure.bench import SamplerSettings, bench_sampler
    from speculative.measure.report import format_sampler_table

    settings = SamplerSettings(batches=args.batch, vocabs=args.vocab, k=args.k, repeats=args.repeats, seed=args.seed,
                               device=args.device)
    return _write(bench_sampler(settings, progress=not args.no_progress), format_sampler_table, args.out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        # the library's input errors are one line naming the problem; show that line, not a traceback
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"python -m speculative: error: {message}", file=sys.stderr)
        return 2
