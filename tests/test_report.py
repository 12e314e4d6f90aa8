"""The report module's tables: an interval's bounds show which side of 1 they lie on."""

import math
import re

import pytest

from speculative import defaults
from speculative.book.glue import load_record
from speculative.measure.report import (
    format_decode_table,
    format_peer_table,
    format_sampler_table,
    interval_text,
    ratio_bound,
)


@pytest.mark.parametrize("value, text", [(0.9969, "0.997"), (1.0031, "1.003"), (0.99996, "0.99996"),
                                         (1.0, "1.00"), (0.94, "0.94"), (1.2345, "1.23")])
def test_a_bound_next_to_1_gets_the_digits_that_show_its_side(value, text):
    assert ratio_bound(value) == text


def test_a_nan_bound_prints_as_nan():
    assert ratio_bound(math.nan) == "nan"


def test_every_printed_interval_of_the_committed_records_is_on_the_side_of_1_it_lies_on():
    # the peer table's ours/HF column and the decode table's speedup interval, row by row
    peer = load_record("peer_hf_cpu.json")
    # in each line of the peer table the first interval of a ratio is ours/HF's (the speeds are whole numbers)
    lines = [re.search(r"\d\.\d\d \[(\d\.\d+)-(\d\.\d+)\]", line) for line in format_peer_table(peer).splitlines()]
    printed = [found.groups() for found in lines if found]
    bounds = [row["ours_over_hf_assisted_ci95"] for row in peer["results"]]
    decode = load_record("decode_cpu.json")
    printed += re.findall(r"x\s+(\d\.\d+)-(\d\.\d+)\s", format_decode_table(decode))
    bounds += [row["speedup_ci95"] for row in decode["results"] if row["groups"] >= defaults.MIN_INTERVAL_GROUPS]
    assert len(printed) == len(bounds)
    for shown, actual in zip(printed, bounds):
        for text, value in zip(shown, actual):
            assert (float(text) < 1) == (value < 1) and (float(text) > 1) == (value > 1), (text, value)


def test_an_interval_over_too_few_groups_of_prompts_is_not_printed():
    enough = defaults.MIN_INTERVAL_GROUPS
    assert interval_text([0.9969, 1.2], enough) == "0.997–1.20"
    assert interval_text([0.9, 1.2], enough - 1) == f"no interval ({enough - 1} groups)"
    assert interval_text([math.nan, math.nan], 1) == "no interval (1 group)"
    assert interval_text([math.nan, math.nan], enough) == f"no interval ({enough} groups)"
    decode = load_record("decode_cpu.json")
    few = [row for row in decode["results"] if row["groups"] < enough]
    assert few and format_decode_table(decode).count("no interval") == len(few)


def test_markdown_tables_keep_cells_as_given_and_align_each_column():
    from speculative.measure.report import markdown_table

    text = markdown_table([["a", "1.50", "x"], ["bb", "10", "yy"]], ["name", "value", "note"], "lrc")
    header, rule, first, _ = text.splitlines()
    assert [(c.startswith(":"), c.endswith(":")) for c in rule.strip("|").split("|")] == [
        (True, False), (False, True), (True, True)]
    assert "1.50" in first  # not re-formatted as a number
    assert markdown_table([["a", "1"]], ["x", "y"]).splitlines()[1] == "|:----|----:|"  # default: l, then r
    with pytest.raises(ValueError, match="one of l, r, c per column"):
        markdown_table([["a"]], ["x", "y"], "l")


def test_a_runs_table_names_each_chains_row_by_its_count():
    from speculative.measure.report import format_runs_table

    record = load_record("multidraft_repeat_cpu.json")
    counts = sorted({row["drafts"] for row in record["results"] if row["rule"] == "chains"})
    assert len(counts) > 1
    text = format_runs_table(record, markdown=True)
    for k in counts:
        wanted = sum(row["rule"] == "chains" and row["drafts"] == k for row in record["results"])
        assert text.count(f"| chains ×{k} ") == wanted, k


def test_a_decode_table_marks_each_verification_price_below_1():
    import copy

    decode = copy.deepcopy(load_record("decode_cpu.json"))
    assert not re.findall(r"\s\d\.\d\d\*\s", format_decode_table(decode))  # every v here is at least 1
    assert "marked *" not in format_decode_table(decode)  # the legend explains no mark the table lacks
    decode["results"][1]["calibration"]["v"] = 0.96
    assert re.findall(r"\s(\d\.\d\d)\*\s", format_decode_table(decode)) == ["0.96"]
    assert "marked *" in format_decode_table(decode)
    assert "marked *" not in format_decode_table(decode, batch=decode["results"][1]["batch"] + 1)


def test_a_decode_table_explains_the_policy_and_forward_times_only_when_present():
    import copy

    decode = copy.deepcopy(load_record("decode_cpu.json"))
    decode["config"].pop("forward_times_from", None)
    text = format_decode_table(decode)
    assert "forward_times_from" not in text and "cost-model policy" not in text
    decode["config"]["forward_times_from"] = "the timed runs"
    decode["results"][0]["gamma"] = "auto"
    text = format_decode_table(decode)
    assert "forward_times_from" in text and "cost-model policy" in text


def test_sampler_table_gives_each_ratio_its_extremes_over_the_runs():
    timings = {"batched": {"median_s": 1.0, "min_s": 0.5, "max_s": 2.0, "repeats": 3},
               "reference": {"median_s": 4.0, "min_s": 3.0, "max_s": 6.0, "repeats": 3}}
    record = {"config": {"k": 4, "repeats": 3, "seed": 0},
              "environment": {"device": "cpu", "cpu": "test CPU", "cpu_count": 2, "threads": 2, "torch": "2"},
              "results": [{"batch": 1, "vocab": 8, "batched_positions_per_s": 4.0, "reference_positions_per_s": 1.0,
                           "speedup": 4.0, "timings": timings}]}
    text = format_sampler_table(record, markdown=True)
    assert "1.5-12.0x" in text  # 3.0 / 2.0 and 6.0 / 0.5
    assert "k = 4 drafts per row, 3 interleaved runs" in text
