"""The record schema as code: every committed record reads back through :func:`records.read_record`, whose
summary rows are checked against their kind's row type (:mod:`speculative.measure.rows`), and a record broken
in any one way (a key missing, a value of the wrong type, a key the schema has not) is refused in one line
that names the file, the row and the problem."""

import copy
import dataclasses
import json

import pytest

from speculative.book.glue import results_dir
from speculative.measure import analysis, records, rows

#: folders of results/ that hold other files than benchmark records: audit reports and the candidate drafts' cards
OTHER_FILES = ("audits", "drafts")


def _committed():
    """Every JSON file under results/, split into the benchmark records and the other files."""
    folder = results_dir()
    paths = sorted(folder.rglob("*.json"))
    others = [p for p in paths if p.relative_to(folder).parts[0] in OTHER_FILES and p.parent != folder]
    return [p for p in paths if p not in others], others


def test_every_committed_record_reads_back_through_its_schema():
    found, others = _committed()
    assert len(found) >= len(records.KINDS) - 1  # every kind is committed but the GPU report's sync count
    kinds = {records.read_record(path)["benchmark"] for path in found}  # each row checked against its type
    assert kinds >= set(records.KINDS) - {"syncs"}, kinds
    for path in others:  # the other files are not records: a record put among them would not be read here
        assert "benchmark" not in json.loads(path.read_text()), path


@pytest.mark.parametrize("name", ["sampler_cpu.json", "prices_cpu.json", "agreement_cpu.json", "policy_cpu.json"])
def test_a_rows_keys_are_written_in_its_types_field_order(name):
    """The JSON is the dataclass written field by field: the same keys, in the order the record holds them."""
    record = records.read_record(results_dir() / name)
    assert [list(row) for row in analysis.analyse(record)] == [list(row) for row in record["results"]]


def _broken(tmp_path, name: str, breaks) -> str:
    """The one-line message that reading ``name`` broken by ``breaks(record)`` raises; it names the file."""
    record = json.loads((results_dir() / name).read_text())
    broken = copy.deepcopy(record)
    breaks(broken)
    path = tmp_path / name
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError) as error:
        records.read_record(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


def test_a_row_missing_a_key_is_refused_in_one_line_naming_the_row(tmp_path):
    message = _broken(tmp_path, "sampler_cpu.json", lambda r: r["results"][2].pop("speedup"))
    assert "results[2] (batch=64" in message and "lacks 'speedup' (a SamplerRow)" in message


def test_a_value_of_the_wrong_type_is_refused_naming_the_field(tmp_path):
    message = _broken(tmp_path, "prices_cpu.json", lambda r: r["results"][0].update(seconds="fast"))
    assert "results[0] (kind='verification', width=1).seconds is str 'fast', not float" in message
    message = _broken(tmp_path, "sampler_cpu.json", lambda r: r["results"][0].update(batch=True))
    assert ".batch is bool True, not int" in message
    message = _broken(tmp_path, "agreement_cpu.json", lambda r: r["results"][1]["alpha_ci95"].__setitem__(1, None))
    assert "results[1] (draft=" in message and ".alpha_ci95[1] is NoneType None, not float" in message


def test_a_key_the_schema_has_not_is_refused(tmp_path):
    message = _broken(tmp_path, "policy_cpu.json", lambda r: r["results"][0].update(speedup_squared=4.0))
    assert "has 'speedup_squared', not a field of DecodeRow" in message


def test_a_run_of_a_record_of_several_runs_is_checked_as_its_kinds_row(tmp_path):
    message = _broken(tmp_path, "headline_cpu.json", lambda r: r["results"][1]["runs"][2].pop("alpha"))
    assert "results[1] (batch=1" in message and ".runs[2] lacks 'alpha' (a DecodeRow)" in message
    message = _broken(tmp_path, "headline_cpu.json", lambda r: r["results"][0].pop("speedup_range"))
    assert "lacks 'speedup_range' (a DecodeRunsRow)" in message
    message = _broken(tmp_path, "headline_cpu.json", lambda r: r["runs"][1].pop("observations"))
    assert "runs[1] lacks 'observations'" in message


def test_a_record_missing_a_top_level_field_or_of_no_known_kind_is_refused(tmp_path):
    assert "a prices record lacks 'environment'" in _broken(tmp_path, "prices_cpu.json", lambda r: r.pop("environment"))
    assert "lacks 'results'" in _broken(tmp_path, "sampler_cpu.json", lambda r: r.pop("results"))
    assert "unknown benchmark 'speed'" in _broken(tmp_path, "sampler_cpu.json", lambda r: r.update(benchmark="speed"))


def test_absent_fields_are_left_out_of_the_row_and_required_ones_are_required():
    row = rows.PricesRow(kind="verification", seconds=1.0, relative=1.0, relative_range=[1.0, 1.0], width=1)
    assert rows.row_dict(row) == {"kind": "verification", "seconds": 1.0, "relative": 1.0,
                                  "relative_range": [1.0, 1.0], "width": 1}
    assert rows.row_problem(rows.PricesRow, rows.row_dict(row)) is None
    with pytest.raises(TypeError):
        rows.PricesRow(kind="verification", seconds=1.0, relative=1.0)  # relative_range is required
    required = {f.name: 0 for f in dataclasses.fields(rows.DecodeRow) if f.default is not rows.ABSENT}
    drafts_row = rows.row_dict(rows.DraftsRow(draft="d", **required))  # a race's row: the draft's name first
    assert list(drafts_row) == ["draft", *required]
