"""Records: every summary is recomputed from the raw observations it keeps, and records are written and read
safely. The committed records are checked here too: each is re-analysed and gives back its summary."""

import json
import math

import pytest

from conftest import save_tiny_pair
from speculative.book.glue import results_dir
from speculative.measure import analysis, analysis_decode, analysis_drafts, compare, lookup, records, shared


def normalised(value):
    """``value`` as it reads back from JSON (integer keys become strings), NaN made comparable."""
    text = json.dumps(value, sort_keys=True)
    return json.loads(text.replace("NaN", '"NaN"'))


@pytest.fixture(scope="module")
def fresh_records(tmp_path_factory):
    """A decode record (a fixed gamma and the cost model, two batch sizes, two repeats, and block
    verification at batch 1 greedily) and a sampler record, each measured once on a tiny pair and read
    back from JSON."""
    from speculative.engine.pair import load_pair
    from speculative.measure.bench_decode import bench_decode, bench_decode_runs
    from speculative.measure.bench_sampler import bench_sampler

    folder = tmp_path_factory.mktemp("records") / "pair"
    save_tiny_pair(folder)
    pair = load_pair(str(folder))
    decode = bench_decode(pair, gammas=(2, "auto"), temperatures=(1.0,), batches=(1, 2), prompts=2,
                          max_new_tokens=8, repeats=2, calibration_repeats=1, progress=False)
    block = bench_decode(pair, gammas=(2,), temperatures=(0.0,), batches=(1,), prompts=2, max_new_tokens=8,
                         repeats=1, rules=("token", "block"), calibration_repeats=1, progress=False)
    sampler = bench_sampler(batches=(2,), vocabs=(16,), repeats=2, progress=False)
    runs = bench_decode_runs(pair, gammas=(2,), temperatures=(1.0,), batches=(1,), prompts=2, max_new_tokens=8,
                             repeats=1, calibration_repeats=1, progress=False, runs=2)
    return {name: json.loads(json.dumps(r)) for name, r in (("decode", decode), ("block", block),
                                                             ("sampler", sampler), ("runs", runs))}


@pytest.mark.parametrize("benchmark", ["decode", "block", "sampler", "runs"])
def test_a_fresh_records_summary_is_its_reanalysed_observations(fresh_records, benchmark):
    record = fresh_records[benchmark]
    assert record["schema"] == records.SCHEMA_VERSION
    assert all(run["observations"] for run in record.get("runs", [record]))
    assert normalised(analysis.analyse(record)) == normalised(record["results"])


def test_the_summary_means_what_the_old_benchmark_meant(fresh_records):
    """The summary's main figures, recomputed here by hand from the observations."""
    record = fresh_records["decode"]
    row = lookup.row_where(record, batch=2, temperature=1.0, gamma=2)
    timed = [o for o in record["observations"] if o["batch"] == 2 and not o.get("timing_run")]
    plain = [o["seconds"] - o["prefill_seconds"] for o in timed if o["decoder"] is None]
    spec = [o for o in timed if o["decoder"] == [2, "token", 1]]
    assert len(spec) == len(plain) == 2  # one group of two prompts, two repeats
    assert row["speedup"] == pytest.approx(sum(plain) / sum(o["seconds"] - o["prefill_seconds"] for o in spec))
    counts = [a for o in spec for block in o["accepted"] for a in block if a >= 0]
    assert row["alpha"] == pytest.approx(sum(counts) / sum(a + (a < 2) for a in counts))  # accepted / tested
    calls = sum(len(o["accepted"]) for o in spec)
    assert row["tokens_per_target_forward"] == pytest.approx(8 * len(spec) / calls)
    assert row["target_calls_per_group"] == [calls]
    first = next(o for o in spec if o["repeat"] == 0)
    assert row["accepted_per_block"] == [list(r) for r in zip(*first["accepted"])]


def test_a_record_of_several_runs_keeps_each_run_whole_and_its_spread_is_theirs(fresh_records):
    from speculative.measure.bench_decode import bench_decode_runs

    record = fresh_records["runs"] | {"file": "h.json"}
    assert record["config"]["runs"] == len(record["runs"]) == 2 and "observations" not in record
    alone = lookup.split_runs(record)
    assert [run["file"] for run in alone] == ["h.json run 1", "h.json run 2"]
    for run, kept in zip(alone, record["runs"]):
        assert run["environment"] == kept["environment"] and run["observations"] == kept["observations"]
        bare = {k: v for k, v in run.items() if k not in ("results", "file")}
        assert normalised(analysis.analyse(bare)) == normalised(run["results"])  # each run is a whole record
    row = record["results"][0]
    assert row["speedup_runs"] == [run["results"][0]["speedup"] for run in alone]
    assert row["speedup_range"] == [min(row["speedup_runs"]), max(row["speedup_runs"])]
    spread = compare.across_records([record], batch=1, temperature=1.0, gamma=2)
    assert spread["n"] == 2 and [spread["low"], spread["high"]] == row["speedup_range"]
    assert lookup.split_runs(fresh_records["decode"]) == [fresh_records["decode"]]
    with pytest.raises(ValueError, match="runs must be"):
        bench_decode_runs(None, runs=0)


def test_settings_listing_a_value_twice_are_refused():
    from speculative.measure.settings import DecodeSettings, PeerSettings, SamplerSettings

    for make in (lambda: DecodeSettings(batches=(1, 1)), lambda: DecodeSettings(temperatures=(1.0, 1.0)),
                 lambda: PeerSettings(temperatures=(0.0, 0.0)), lambda: SamplerSettings(vocabs=(16, 16))):
        with pytest.raises(ValueError, match="listed once"):
            make()


def test_the_summary_follows_the_observations(fresh_records):
    """Re-analysis is not an echo: a slower plain run shows up in the speedup."""
    record = json.loads(json.dumps(fresh_records["decode"]))
    before = analysis.analyse(record)[0]
    plain = next(o for o in record["observations"] if o["decoder"] is None and not o.get("timing_run"))
    plain["seconds"] += 1.0
    after = analysis.analyse(record)[0]
    assert after["speedup"] > before["speedup"] and after["plain_seconds"] == pytest.approx(before["plain_seconds"] + 1)


def test_every_committed_record_is_of_this_schema_and_its_summary_is_reanalysed():
    paths = sorted(results_dir().glob("*.json"))
    assert {path.name for path in paths} >= {"decode_cpu.json", "headline_cpu.json", "peer_hf_cpu.json",
                                             "sampler_cpu.json"}, [path.name for path in paths]
    for path in paths:
        record = records.read_record(path)  # refuses a record of any other schema, in one line
        assert normalised(analysis.analyse(record)) == normalised(record["results"]), path.name


def test_an_old_record_is_refused_with_one_line_saying_how_to_re_record(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmark": "decode", "results": []}))
    with pytest.raises(ValueError) as error:
        records.read_record(old)
    message = str(error.value)
    assert "schema-1 record" in message and "python -m speculative bench decode and the settings" in message
    assert "\n" not in message
    with pytest.raises(ValueError, match="cannot be re-analysed"):
        analysis.analyse({"benchmark": "decode", "results": []})
    for text, expected in (("{", "is not JSON"), ("[1]", "not a benchmark record"),
                           ('{"benchmark": "decode", "schema": "two"}', "schema must be a whole number"),
                           ('{"benchmark": "decode", "schema": 3}', "newer than this library")):
        old.write_text(text)
        with pytest.raises(ValueError, match=expected) as error:
            records.read_record(old)
        assert str(old) in str(error.value) and "\n" not in str(error.value)
    old.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not a record file"):
        records.read_record(old)
    with pytest.raises(ValueError, match="not a record file"):
        records.read_record(tmp_path)


def test_a_record_is_written_whole_or_not_at_all(tmp_path, fresh_records, monkeypatch):
    import pathlib

    path = tmp_path / "deep" / "r.json"
    assert records.write_record(fresh_records["sampler"], str(path)) == path
    assert records.read_record(path) == fresh_records["sampler"]
    with pytest.raises(TypeError):  # a value JSON cannot hold: the old record stays as it was
        records.write_record({"benchmark": "sampler", "schema": 2, "bad": object()}, str(path))

    def interrupted(self, target):  # the new record was written in full beside the old, then the move failed
        assert self.read_text().endswith("\n") and self.name.startswith(".r.json.partial-")
        raise OSError("disk gone")

    monkeypatch.setattr(pathlib.Path, "replace", interrupted)
    with pytest.raises(OSError, match="disk gone"):
        records.write_record({"benchmark": "sampler", "schema": 2, "results": []}, str(path))
    monkeypatch.undo()
    assert records.read_record(path) == fresh_records["sampler"]
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no partial file left behind
    assert records.write_record({}, None) is None


def test_intervals_say_which_side_of_one_they_lie():
    assert shared.interval_side([1.1, 1.4]) == "above" and shared.interval_side([0.5, 0.9]) == "below"
    assert shared.interval_side([0.9, 1.2]) == "across"
    assert shared.interval_side([math.nan, math.nan]) == "across"


def test_lag1_autocorrelation_and_the_sequences_it_reads():
    alternating, pairs = analysis_decode.lag1_autocorrelation([[0, 1] * 4])
    assert alternating == pytest.approx(-1.0) and pairs == 7
    # centred on 1/2: products +1/4 four times and -1/4 three times over 7 pairs, over a variance of 1/4
    assert analysis_decode.lag1_autocorrelation([[0, 0, 1, 1, 0, 0, 1, 1]])[0] == pytest.approx(1 / 7)
    # two rows, each constant: pooled, they differ (a positive correlation); within rows, nothing is left
    rows = [[0, 0, 0], [2, 2, 2]]
    assert analysis_decode.lag1_autocorrelation(rows)[0] == pytest.approx(1.0)
    assert math.isnan(analysis_decode.lag1_autocorrelation(rows, within_row=True)[0])
    decoded = [{"batch": 2, "accepted_per_block": [[1, -1], [2, 3, -1]]}, {"batch": 1, "accepted_per_block": [[4, 0]]}]
    assert analysis_decode.block_sequences(decoded) == [[4, 0], [2, 3]]  # prompt 0 from batch 1, prompt 1 from batch 2


def test_rows_are_looked_up_by_their_fields_and_a_miss_names_itself():
    record = {"benchmark": "decode", "results": [{"batch": 1, "gamma": 4}, {"batch": 1, "gamma": 4, "rule": "block"},
                                                 {"batch": 4, "gamma": 4, "rule": "token"}]}
    assert lookup.row_where(record, batch=1, rule="token") == {"batch": 1, "gamma": 4}  # no rule: token-wise
    assert lookup.rows_where(record, gamma=4, drafts=1) == record["results"]
    with pytest.raises(ValueError, match="3 rows of the decode record have gamma=4; expected one"):
        lookup.row_where(record, gamma=4)
    with pytest.raises(ValueError, match="0 rows"):
        lookup.row_where(record, batch=16)


def _run(file, speedup, *, date="2026-11-30", pair="p", prompts="s", n_prompts=32, tokens=128, cpu="A", **row):
    return {"file": file, "benchmark": "decode", "pair_sha256": pair, "prompts_sha256": prompts,
            "environment": {"date_utc": f"{date}T00:00:00Z", "device": "cpu", "cpu": cpu},
            "config": {"prompts": n_prompts, "max_new_tokens": tokens, "dtype": "torch.float32"},
            "results": [{"batch": 1, "temperature": 1.0, "gamma": 4, "speedup": speedup,
                         "speedup_ci95": [speedup - 0.1, speedup + 0.1], **row},
                        {"batch": 1, "temperature": 0.0, "gamma": 4, "speedup": 9.0, "speedup_ci95": [8, 10]}]}


def test_across_records_gathers_one_configuration_and_leaves_out_other_pairs():
    runs = [_run("a.json", 1.5), _run("b.json", 1.4, rule="token"), _run("c.json", 1.7),
            _run("d.json", 3.0, rule="block"),   # another rule: not this configuration
            _run("e.json", 5.0, pair="other"),   # another pair: named, left out
            _run("f.json", 5.0, tokens=64),      # fewer tokens per prompt: left out
            _run("h.json", 5.0, cpu="B"),        # another CPU model: left out
            {"file": "g.json", "benchmark": "sampler", "results": {"not": "rows"}, "config": {}}]
    found = compare.across_records(runs, batch=1, temperature=1.0, gamma=4, rule="token")
    assert [r["file"] for r in found["runs"]] == ["a.json", "b.json", "c.json"]
    assert (found["n"], found["low"], found["high"], found["median"]) == (3, 1.4, 1.7, 1.5)
    assert found["left_out"] == ["e.json", "f.json", "h.json"]
    assert found["runs"][0]["speedup_ci95"] == [1.4, 1.6] and found["runs"][0]["date"] == "2026-11-30"
    assert found["runs"][0]["host_probe_ms"] is None  # the run kept no probe
    probed = _run("p.json", 1.5)
    probed["environment"]["host_probe"] = {"softmax_ms": 23.5}
    assert compare.across_records([probed], batch=1, temperature=1.0, gamma=4)["runs"][0]["host_probe_ms"] == 23.5
    with pytest.raises(ValueError, match="no record has one row"):
        compare.across_records(runs, batch=16, temperature=1.0)


def test_across_records_counts_a_race_of_drafts_by_the_pairs_own_draft():
    race = _run("race.json", 1.6)
    race["results"] = [{**row, "draft": name, "speedup": row["speedup"] + shift}
                       for name, shift in (("mine", 0.0), ("other", 9.0)) for row in race["results"]]
    race["drafts"] = {"mine": {"sha256": "p"}, "other": {"sha256": "q"}}
    found = compare.across_records([_run("a.json", 1.5), race], batch=1, temperature=1.0, gamma=4)
    assert [(r["file"], r["speedup"]) for r in found["runs"]] == [("a.json", 1.5), ("race.json", 1.6)]


def test_across_records_carries_the_extra_fields_asked_for():
    found = compare.across_records([_run("a.json", 1.5, calibration={"c": 0.1})], batch=1, temperature=1.0, gamma=4,
                                   extra=("calibration",))
    assert found["runs"][0]["calibration"] == {"c": 0.1} and "calibration" not in compare.across_records(
        [_run("a.json", 1.5, calibration={"c": 0.1})], batch=1, temperature=1.0, gamma=4)["runs"][0]


def test_the_committed_records_hold_the_headline_configuration_several_times():
    """The results page's between-run spread: batch 1, gamma 4, token-wise, one chain, at T = 1 and greedily,
    each measured by at least three independent benchmark runs of the shipped pair."""
    from speculative.book.glue import load_records

    for temperature in (0.0, 1.0):
        found = compare.across_records(load_records(), batch=1, gamma=4, temperature=temperature, rule="token",
                                        drafts=1)
        assert found["n"] >= 3 and all("intel" in file for file in found["left_out"]), found  # another CPU
        assert found["low"] <= found["median"] <= found["high"]


def test_best_length_is_the_draft_length_with_the_highest_median_over_runs():
    def row(gamma, speedups):
        return {"draft": "d", "temperature": 1.0, "gamma": gamma, "speedup_runs": speedups,
                "speedup_median_run": sorted(speedups)[len(speedups) // 2]}

    # gamma 4 wins the first run and has the single fastest run; gamma 6 has the highest median over runs
    record = {"results": [row(4, [2.5, 1.5, 1.6]), row(6, [2.0, 1.9, 1.95]), row(8, [1.0, 1.1, 1.2]),
                          {**row(6, [9.0, 9.0, 9.0]), "draft": "other"}]}
    assert analysis_drafts.best_length(record, "d", 1.0)["gamma"] == 6
    with pytest.raises(ValueError, match="no draft 'd' at temperature 0"):
        analysis_drafts.best_length(record, "d", 0.0)


def test_head_to_head_chooses_each_side_by_its_median_speedup_over_runs():
    from speculative.measure.analysis_peer import head_to_head

    # speeds over each library's own plain decoding: run 1 alone would pick the confidence policy and the
    # heuristic schedule; the medians pick the others
    ours = {"fixed": [1.0, 1.2, 1.2], "confidence": [1.3, 1.1, 1.1]}
    theirs = {"default": [0.9, 0.9, 0.9], "heuristic": [1.0, 0.8, 0.8]}
    ratio = {("fixed", "default"): ([1.2, 1.5, 1.3], [[1.1, 1.3], [1.4, 1.6], [0.95, 1.5]])}

    def row(policy, schedule, i):
        value, interval = ratio.get((policy, schedule), ([2.0] * 3, [[1.9, 2.1]] * 3))
        return {"temperature": 1.0, "policy": policy, "hf_schedule": schedule, "ours_speedup": ours[policy][i],
                "hf_assisted_speedup": theirs[schedule][i], "ours_over_hf_assisted": value[i],
                "ours_over_hf_assisted_ci95": interval[i]}

    results = [{"temperature": 1.0, "policy": p, "hf_schedule": s, "runs": [row(p, s, i) for i in range(3)]}
               for p in ours for s in theirs]
    record = {"benchmark": "peer", "runs": [{}, {}, {}], "results": results}
    found = head_to_head(record, 1.0)
    assert (found["policy"], found["hf_schedule"], found["runs"]) == ("fixed", "default", 3)
    assert found["ratios"] == [1.2, 1.5, 1.3] and found["range"] == [1.2, 1.5]
    assert (found["median"], found["median_ci95"], found["lowest_bound"]) == (1.3, [0.95, 1.5], 0.95)
    assert found["ours_margin"] == pytest.approx(1.2 / 1.1)  # fixed's median speedup over confidence's
    with pytest.raises(ValueError, match="no rows at temperature 0"):
        head_to_head(record, 0.0)


def test_race_efficiency_pools_every_row_and_run_and_gives_each_run_its_median():
    from speculative.measure.analysis_drafts import race_efficiency

    values = [[0.9, 1.0, 1.1], [0.8, 0.95, 1.2]]  # rows x runs
    results = [{"runs": [{"efficiency": v} for v in row]} for row in values]
    record = {"benchmark": "drafts", "runs": [{}, {}, {}], "results": results}
    found = race_efficiency(record, "efficiency")
    assert (found["points"], found["min"], found["max"]) == (6, 0.8, 1.2) and found["median"] == pytest.approx(0.975)
    assert found["run_medians"] == pytest.approx([0.85, 0.975, 1.15])


def test_a_race_names_the_pairs_own_draft_by_the_pair_it_was_made_with():
    info = {"shipped_draft": {"name": "tv128c"},
            "replaced": [{"pair_sha256": "b" * 64, "kept_as": "results/drafts/original"}]}
    record = {"pair_sha256": "a" * 64, "drafts": {"shipped": {"x": 1}, "tv128b": {"x": 2}},
              "config": {"drafts": [1]}, "results": [{"draft": "shipped", "runs": [{"draft": "shipped"}]}],
              "runs": [{"observations": [{"draft": "tv128b"}, {"draft": "shipped"}]}]}
    names = analysis_drafts.draft_names(record, "a" * 64, info)
    assert names == {"shipped": "tv128c", "tv128b": "tv128b"}
    renamed = analysis_drafts.rename_drafts(record, names)
    assert renamed == {"pair_sha256": "a" * 64, "drafts": {"tv128c": {"x": 1}, "tv128b": {"x": 2}},
                       "config": {"drafts": [1]}, "results": [{"draft": "tv128c", "runs": [{"draft": "tv128c"}]}],
                       "runs": [{"observations": [{"draft": "tv128b"}, {"draft": "tv128c"}]}]}
    assert record["drafts"].keys() == {"shipped", "tv128b"}  # the record itself is left as it was
    older = dict(record, pair_sha256="b" * 64)
    assert analysis_drafts.draft_names(older, "a" * 64, info)["shipped"] == "original"
    with pytest.raises(ValueError, match="made with pair cccccccccccc, neither the shipped pair"):
        analysis_drafts.draft_names(dict(record, pair_sha256="c" * 64), "a" * 64, info)
    with pytest.raises(ValueError, match="already has a draft named 'tv128b'"):
        analysis_drafts.draft_names(record, "a" * 64, {"shipped_draft": {"name": "tv128b"}})


def test_exact_alpha_of_a_draft_is_the_same_whichever_pair_scored_it():
    """The agreement records of the shipped pair and of the pair it replaced scored the same drafts against
    the same target, each time under the pair's own name for its draft ("shipped"). Named by what they are
    (book.named_drafts), each draft's exact acceptance rate agrees between the two records to float32
    round-off, at both temperatures: the rate is a property of the two models, not of the folder they came from.
    Naming a pair's own draft wrongly (the old pair's as the new one's) pairs different models and fails."""
    from speculative.book.glue import named_drafts

    folder = results_dir()
    shipped = named_drafts(records.read_record(folder / "agreement_cpu.json"))
    first = named_drafts(records.read_record(folder / "previous_pair" / "agreement_cpu.json"))
    assert shipped["pair_sha256"] != first["pair_sha256"] and shipped["config"] == first["config"]
    assert set(shipped["drafts"]) == set(first["drafts"]) and len(shipped["drafts"]) >= 2
    rates = [{(r["draft"], r["temperature"]): r["alpha"] for r in analysis.analyse(record)}
             for record in (shipped, first)]
    assert rates[0].keys() == rates[1].keys()
    for key, alpha in rates[0].items():
        assert abs(alpha - rates[1][key]) < 1e-6, key
    # the check can tell drafts apart: the closest two differ by a hundred times the tolerance
    alphas = rates[0].items()
    assert min(abs(a - b) for (d, t), a in alphas for (e, u), b in alphas if t == u and d < e) > 1e-4


def test_efficiencies_by_record_pools_a_records_runs_and_says_which_timed_decoding_calls():
    from speculative.measure.compare import efficiencies_by_record

    def row(batch, gamma, steps, calls=None):
        return {"batch": batch, "gamma": gamma, "efficiency": steps,
                **({"efficiency_decoded": calls} if calls is not None else {})}

    records = [
        {"file": "a.json run 1", "benchmark": "drafts", "results": [row(1, 4, 0.9, 1.0), row(4, 4, 0.1, 0.1)]},
        {"file": "a.json run 2", "benchmark": "drafts", "results": [row(1, 4, 1.1, 0.96), row(1, "auto", 5.0)]},
        {"file": "b.json", "benchmark": "decode", "results": [row(1, 2, 0.8), row(1, 4, 0.9), row(1, 6, 1.3)]},
        {"file": "c.json", "benchmark": "peer", "results": [row(1, 4, 7.0)]},
    ]
    found = efficiencies_by_record(records)
    assert found == {"a.json": {"points": 2, "steps": pytest.approx(1.0), "calls": pytest.approx(0.98)},
                     "b.json": {"points": 3, "steps": 0.9, "calls": None}}
    assert efficiencies_by_record(records, batch=4)["a.json"] == {"points": 1, "steps": 0.1, "calls": 0.1}


def test_split_by_price_cuts_runs_at_the_widest_gap_in_the_draft_steps_price():
    from speculative.measure.compare import split_by_price

    runs = [{"speedup": s, "calibration": {"c": c}} for s, c in
            ((1.9, 0.08), (1.5, 0.16), (1.95, 0.10), (1.45, 0.17), (1.85, 0.104))]
    dear, cheap = split_by_price(runs)
    assert [r["calibration"]["c"] for r in dear] == [0.16, 0.17]
    assert [r["calibration"]["c"] for r in cheap] == [0.08, 0.10, 0.104]
    assert split_by_price(runs[:2]) == ([runs[1]], [runs[0]])
    with pytest.raises(ValueError, match="at least two runs"):
        split_by_price(runs[:1])
