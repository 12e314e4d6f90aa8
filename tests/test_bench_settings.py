"""The benchmarks' settings (``speculative.measure.settings``): each field says what it is for, its default is
:mod:`speculative.defaults`', the fields keep the order records write them in, and the module loads without
torch (a command line builds its options from these fields before any benchmark runs)."""

import dataclasses
import subprocess
import sys

import pytest

from speculative import defaults
from speculative.measure.settings import DecodeSettings, PeerSettings, RunSettings, SamplerSettings

SETTINGS = (SamplerSettings, RunSettings, DecodeSettings, PeerSettings)


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.__name__)
def test_every_field_has_a_help_text(cls):
    helps = {f.name: f.metadata.get("help") for f in dataclasses.fields(cls)}
    assert helps and all(isinstance(h, str) and h.strip() for h in helps.values()), helps


def test_the_defaults_are_the_defaults_module():
    assert dataclasses.asdict(SamplerSettings()) == {**defaults.BENCH_SAMPLER, "device": "cpu"}
    run = {f.name: defaults.BENCH_DECODE[f.name] for f in dataclasses.fields(RunSettings)}
    assert dataclasses.asdict(RunSettings()) == run
    assert dataclasses.asdict(DecodeSettings()) == {**run, **{k: v for k, v in defaults.BENCH_DECODE.items()
                                                              if k in DecodeSettings.__dataclass_fields__},
                                                    "top_k": None, "top_p": None}
    assert dataclasses.asdict(PeerSettings()) == {**run, **defaults.BENCH_PEER}


def test_peer_settings_keep_the_run_fields_first_and_word_their_help_for_the_race():
    # a record's config is dataclasses.asdict of its settings: its keys come in the fields' order
    run = [f.name for f in dataclasses.fields(RunSettings)]
    assert [f.name for f in dataclasses.fields(PeerSettings)] == [*run, *defaults.BENCH_PEER]
    assert [f.name for f in dataclasses.fields(DecodeSettings)][:len(run)] == run
    peer = {f.name: f.metadata["help"] for f in dataclasses.fields(PeerSettings)}
    assert peer["prompts"] == "held-out prompts, each decoded by every decoder"


def test_the_settings_load_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import dataclasses, speculative.measure.settings as s\n"
            "assert all(dataclasses.fields(c) for c in (s.SamplerSettings, s.DecodeSettings, s.PeerSettings))\n"
            "assert not {'torch', 'numpy'} & {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
