"""``experiment.run`` takes its load and its trial settings as specs (issue 48: at most 12 parameters).

No server is started: every case is refused, or split, in this process before anything would run.
"""

import pickle

import pytest

from tuna_lab.errors import ExperimentError
from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, run
from tuna_lab.measure.trial_spec import specs_of


@pytest.mark.parametrize("make, message", [
    (lambda: TrialSpec(seed=-1), "seed must be a non-negative integer, got -1"),
    (lambda: TrialSpec(warmup=1.5), "warmup must be a non-negative integer, got 1.5"),
    (lambda: TrialSpec(max_error_rate=1), r"max_error_rate must be in \[0, 1\), got 1"),
    (lambda: TrialSpec(max_error_rate="x"), r"max_error_rate must be in \[0, 1\), got 'x'"),
    (lambda: LoadSpec(0), "requests must be a positive integer, got 0"),
    (lambda: LoadSpec(None), "requests must be a positive integer, got None"),
    (lambda: LoadSpec(10, concurrency=0), "concurrency must be a positive integer, got 0"),
    (lambda: LoadSpec(None, rate=-5, duration=1), "rate must be a positive finite number, got -5"),
    (lambda: LoadSpec(duration=3), "rate must be a positive finite number, got None"),
])
def test_a_bad_spec_is_refused_when_it_is_made(make, message):
    with pytest.raises(ExperimentError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("keyword, where", [
    ("requests", "load=LoadSpec(requests=...)"), ("concurrency", "load=LoadSpec(concurrency=...)"),
    ("rate", "load=LoadSpec(rate=...)"), ("duration", "load=LoadSpec(duration=...)"),
    ("seed", "trial=TrialSpec(seed=...)"), ("warmup", "trial=TrialSpec(warmup=...)"),
    ("max_error_rate", "trial=TrialSpec(max_error_rate=...)"), ("client_cpus", "trial=TrialSpec(client_cpus=...)"),
])
def test_run_names_the_new_place_of_a_moved_keyword(keyword, where, tmp_path):
    # Refused before anything runs: no server, no folder.
    with pytest.raises(ExperimentError) as info:
        run(Config(1, 1, "small", 10), ["cfs"], out=str(tmp_path / "c"), **{keyword: 1})
    assert str(info.value) == f"run() takes {keyword} as {where}"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("given, message", [
    ({"load": 100}, "load must be a LoadSpec, got int"),
    ({"trial": {"seed": 1}}, "trial must be a TrialSpec, got dict"),
    ({"nope": 1}, "run() has no option 'nope'"),
])
def test_run_refuses_what_is_not_a_spec(given, message):
    with pytest.raises(ExperimentError) as info:
        run(Config(1, 1, "small", 10), ["cfs"], **given)
    assert str(info.value) == message


def test_the_specs_travel_to_a_worker_and_split_a_sweeps_options():
    # A cluster's worker gets the options pickled; the specs made there from them compare equal.
    load, trial, rest = specs_of(50, {"concurrency": 4, "seed": 7, "warmup": 0, "client_cpus": "none",
                                      "max_error_rate": 0.1, "csv": True, "strict": False})
    assert load == LoadSpec(50, concurrency=4) and trial == TrialSpec(7, 0, 0.1, "none")
    assert rest == {"csv": True, "strict": False}
    assert pickle.loads(pickle.dumps((load, trial))) == (load, trial)
    # The defaults are run()'s before the specs: 1,000 requests all at once, seed 0, warm-up 20, 1% failures.
    assert specs_of(1000, {})[:2] == (LoadSpec(), TrialSpec())
    assert (LoadSpec().requests, LoadSpec().concurrency, TrialSpec().warmup) == (1000, None, 20)


def test_every_spec_taking_function_refuses_another_type_in_one_way():
    # One rule (_checks.spec_or_default) for run(), tune(), race() and Server: the type named, nothing started.
    from tuna_lab.errors import ServerError, TuneError
    from tuna_lab.measure.tune import race
    from tuna_lab.measure.tune.tuner import tune
    from tuna_lab.server.launch import Server

    with pytest.raises(ServerError, match=r"^limits must be a ServerLimits, got dict$"):
        Server(1, 1, limits={"max_requests": 5})
    with pytest.raises(ServerError, match=r"^openmp must be an OpenMPEnv, got str$"):
        Server(1, 1, openmp="passive")
    with pytest.raises(TuneError, match=r"^rules must be a RaceRules, got int$"):
        race.race([race.Candidate(1, 1, "cfs", "default")], None, 1.0, 60.0, rules=3)
    with pytest.raises(TuneError, match=r"^trial must be a TrialSpec, got int$"):
        tune("1s", configs=[(1, 1)], budget="1m", trial=7)
