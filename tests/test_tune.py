"""tune: the race on a simulated target with known rates (seeded), one real tune on the lab server, bad input."""

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import USERAPP, main, simulated_race
from hypothesis import HealthCheck, given, settings
from strategies import race_problems
from tuna_lab.errors import TuneError
from tuna_lab.measure.tune.tuner import (Candidate, RaceRules, Step, auto_configs, parse_duration, race, rate_bounds,
                                         read_tune, tune)

SLA = 0.05


class Simulated:
    """A target whose candidates' true rates are known: each run draws its server's rate with noise.

    At offered rate ``r`` a request is over the target with probability
    ``0.01 ** ((true / r) ** 4)``: exactly 1% at the true rate, fast falling
    below it and rising above, as an open loop's tail does. Time is simulated.
    """

    def __init__(self, rates, noise=0.05, overhead=4.0, seed=0, exact=False):
        self.rates, self.noise, self.overhead, self.exact = rates, noise, overhead, exact
        self.rng = np.random.default_rng(seed)
        self.now = 0.0
        self.runs = {}
        self.steps = []

    def clock(self):
        return self.now

    def evaluate(self, candidate, rnd, next_step):
        self.now += self.overhead
        self.runs.setdefault(candidate.name, []).append(rnd)
        true = self.rates[candidate.name] * (1.0 if self.exact else math.exp(self.rng.normal(0, self.noise)))
        step = next_step(None)
        self.steps.append(0)
        while step is not None:
            rate, duration = step
            self.steps[-1] += 1
            if self.exact:
                # No noise: every request is over the target above the true rate, none at or below it.
                n = max(1, round(rate * duration))
                over = n if rate > true else 0
            else:
                n = int(self.rng.poisson(rate * duration))
                over = int(self.rng.binomial(n, 0.01 ** ((true / rate) ** 4))) if n else 0
            self.now += duration + 0.2
            step = next_step(Step(rate, duration, n, over, SLA * (rate / true) ** 2, cpu_per_request=1 / true,
                                  seconds=duration + 0.2))


def _candidates():
    """Five W x T pairs x three policies; the policies within 5% of each other, the pairs far apart."""
    rates = {}
    for (w, t), base in {(1, 1): 25.0, (2, 1): 21.0, (4, 1): 17.0, (1, 2): 9.0, (2, 2): 8.0}.items():
        for policy, gain in {"cfs": 1.0, "round-robin": 1.02, "tuna-scatter": 1.05}.items():
            rates[Candidate(w, t, policy).name] = base * gain
    return [Candidate(w, t, p) for (w, t) in ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2))
            for p in ("cfs", "round-robin", "tuna-scatter")], rates


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_race_finds_the_true_best_and_drops_the_clearly_worse_early(seed):
    candidates, rates = _candidates()
    sim = Simulated(rates, seed=seed)
    result = race(candidates, sim.evaluate, SLA, 3600, clock=sim.clock, rules=RaceRules(rounds=4, step_seconds=1.0))
    best = max(rates.values())
    assert rates[result.winner.name] >= 0.9 * best
    # Less than half the best's rate: out after the first round, and the budget went to the close ones.
    for name, runs in sim.runs.items():
        if rates[name] < 0.5 * best:
            assert runs == [0], name
    # 15 -> 4 -> 1 (eta 4): the winner ran at least the two rounds that chose it.
    assert len(sim.runs[result.winner.name]) >= 2
    table = result.table.set_index("candidate")
    assert table.loc[result.winner.name, "status"] == "winner"
    dropped = table[table["status"] == "dropped"]
    assert len(dropped) >= len(candidates) - 3 and (dropped["reason"] != "").all()
    # The winner's estimate is within its interval, and the interval holds its true rate.
    row = table.loc[result.winner.name]
    assert row["rate_low"] <= row["rate"] < row["rate_high"]
    assert row["rate_low"] <= rates[result.winner.name] * 1.15
    assert list(result.history["round"].unique()) == sorted(result.history["round"].unique())


def test_race_costs_a_fraction_of_the_exhaustive_search():
    candidates, rates = _candidates()
    raced, full = Simulated(rates, seed=4), Simulated(rates, seed=4)
    fast = race(candidates, raced.evaluate, SLA, 3600, clock=raced.clock, rules=RaceRules(rounds=4, step_seconds=1.0))
    slow = race(candidates, full.evaluate, SLA, 3600, clock=full.clock, rules=RaceRules(rounds=4, step_seconds=1.0),
                exhaustive=True)
    assert all(runs == [0, 1, 2, 3] for runs in full.runs.values())
    assert (slow.table["status"] != "dropped").all()
    assert fast.elapsed <= 0.3 * slow.elapsed
    exhaustive = slow.table.set_index("candidate")["rate"]
    assert exhaustive[fast.winner.name] >= 0.9 * exhaustive.max()


@pytest.mark.parametrize("budget", [40.0, 120.0])
def test_race_honours_its_budget_and_says_how_sure_it_is(budget):
    candidates, rates = _candidates()
    sim = Simulated(rates, seed=5)
    result = race(candidates, sim.evaluate, SLA, budget, clock=sim.clock, rules=RaceRules(rounds=4, step_seconds=1.0))
    assert sim.now <= 1.1 * budget
    assert result.winner is not None and result.sure.startswith(("sure", "not sure"))
    assert "budget ran out" in result.sure


def test_a_budget_that_runs_out_in_round_1_leaves_pairings_unmeasured_not_a_configuration():
    # Two runs' worth of budget over 2 pairs x 2 policies: in the order given (every policy of 1x1 first) the
    # two runs measured 1x1 alone, and a tune's report had one cell; covering first, both pairs and both
    # policies have a measured run.
    candidates = [Candidate(w, 1, p) for w in (1, 2) for p in ("cfs", "round-robin")]
    sim = Simulated({c.name: 20.0 for c in candidates}, seed=0, overhead=4.0)
    result = race(candidates, sim.evaluate, SLA, 20, clock=sim.clock, rules=RaceRules(rounds=2, step_seconds=1.0))
    measured = result.table[result.table["steps"] > 0]
    assert len(measured) < len(candidates), "the budget must run out in round 1 for this test to say anything"
    assert set(measured["workers"]) == {1, 2} and set(measured["policy"]) == {"cfs", "round-robin"}
    assert list(sim.runs)[:2] == ["1x1 cfs", "2x1 round-robin"]


def test_a_candidate_that_cannot_meet_the_target_is_dropped_as_such():
    # Raced first, with no leader to compare with: it is searched down to the lowest rate.
    candidates = [Candidate(1, 2, "cfs"), Candidate(1, 1, "cfs")]
    sim = Simulated({"1x1 cfs": 20.0, "1x2 cfs": 1e-3}, seed=0)
    result = race(candidates, sim.evaluate, SLA, 600, clock=sim.clock, rules=RaceRules(rounds=2, step_seconds=1.0))
    row = result.table.set_index("candidate").loc["1x2 cfs"]
    assert row["status"] == "dropped" and row["reason"].startswith("cannot meet the target")
    assert result.winner.name == "1x1 cfs"


def test_a_candidate_far_below_the_leader_is_not_searched_down():
    candidates = [Candidate(1, 1, "cfs"), Candidate(1, 2, "cfs")]
    sim = Simulated({"1x1 cfs": 20.0, "1x2 cfs": 1e-3}, seed=0)
    result = race(candidates, sim.evaluate, SLA, 600, clock=sim.clock, rules=RaceRules(rounds=2, step_seconds=1.0))
    row = result.table.set_index("candidate").loc["1x2 cfs"]
    assert row["status"] == "dropped" and "a quarter or less of the leader's" in row["reason"]
    assert row["steps"] <= 2 and result.winner.name == "1x1 cfs"
    # An exhaustive search measures it down to the lowest rate instead.
    full = Simulated({"1x1 cfs": 20.0, "1x2 cfs": 1e-3}, seed=0)
    slow = race(candidates, full.evaluate, SLA, 600, clock=full.clock, rules=RaceRules(rounds=2, step_seconds=1.0),
                exhaustive=True)
    assert slow.table.set_index("candidate").loc["1x2 cfs", "reason"].startswith("cannot meet the target")


# -- properties of the race, on simulated targets drawn by hypothesis -----------------------------------

def _race(problem, exact, exhaustive=False):
    candidates = [Candidate(w, t, p) for (w, t) in problem["pairs"] for p in problem["policies"]]
    sim = Simulated(problem["rates"], overhead=problem["overhead"], seed=problem["seed"], exact=exact)
    rules = RaceRules(rounds=problem["rounds"], eta=problem["eta"], steps=problem["steps"],
                      step_seconds=problem["step_seconds"])
    result = race(candidates, sim.evaluate, SLA, problem["budget"], clock=sim.clock, rules=rules, exhaustive=exhaustive)
    return sim, result


def _check_shape(problem, sim, result):
    """What holds whatever the noise: the budget, the rounds, the steps per run, who may win."""
    assert sim.now <= 1.1 * problem["budget"]
    assert max(sim.steps, default=0) <= problem["steps"] + 3
    for runs in sim.runs.values():
        assert runs == list(range(len(runs))) and len(runs) <= problem["rounds"]   # a run per round, no gaps
    table = result.table
    assert set(table["status"]) <= {"winner", "in race", "dropped"}
    assert (table.loc[table["status"] == "dropped", "reason"] != "").all()
    if result.winner is not None:
        assert table.loc[0, "candidate"] == result.winner.name and table.loc[0, "status"] == "winner"
        assert (table["status"] == "winner").sum() == 1 and table.loc[0, "rate"] > 0
        last = result.history[result.history["round"] == result.history["round"].max()]
        alive = set(last.loc[last["status"] == "in race", "candidate"])
        # Never a dropped candidate over one still in the race that met the target.
        assert result.winner.name in alive or not (table.set_index("candidate").loc[list(alive), "rate"] > 0).any()


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(race_problems())
def test_race_on_an_exact_target_keeps_the_truth_inside_every_interval(problem):
    """Without noise the bounds must hold the truth, so every racing drop is of a truly worse candidate."""
    sim, result = _race(problem, exact=True)
    _check_shape(problem, sim, result)
    best = max(problem["rates"].values())
    for _, row in result.table[result.table["steps"] > 0].iterrows():
        true = problem["rates"][row["candidate"]]
        assert row["rate_low"] <= row["rate"] <= true < row["rate_high"]
        if row["reason"].startswith("round"):   # the racing rule, or missed at a quarter of the leader's rate
            assert true < best
    if result.winner is not None and sim.now + 60 < problem["budget"]:
        # Finished within its budget: the winner is within the halving's resolution of the best (the
        # first round brackets each rate within x2, and no better candidate is dropped by the racing rule).
        assert problem["rates"][result.winner.name] >= best / 4


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(race_problems())
def test_race_on_a_noisy_target_keeps_its_budget_and_shape(problem):
    sim, result = _race(problem, exact=False)
    _check_shape(problem, sim, result)
    assert (result.table["rate_low"] <= result.table["rate"]).all()


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(race_problems(max_candidates=6))
def test_exhaustive_search_drops_nothing_and_runs_every_round_it_can(problem):
    sim, result = _race({**problem, "budget": 3600.0}, exact=False, exhaustive=True)
    reasons = result.table["reason"]
    assert not reasons.str.startswith(("round", "halving")).any()
    for name, runs in sim.runs.items():
        row = result.table.set_index("candidate").loc[name]
        assert row["status"] != "in race" or runs == list(range(problem["rounds"]))


def test_rate_bounds_pool_steps_by_monotonicity():
    # 300 requests with none over at 10/s: fewer than 1% over there, surely; 30 of 60 at 20/s: more.
    assert rate_bounds([Step(10.0, 30.0, 300, 0, 0.02), Step(20.0, 3.0, 60, 30, 0.5)]) == (10.0, 20.0)
    # Too few requests to say anything.
    assert rate_bounds([Step(10.0, 1.0, 10, 0, 0.02)]) == (0.0, math.inf)
    # Steps at higher rates that met the target count for a lower rate's lower bound.
    steps = [Step(8.0, 10.0, 80, 0, 0.02), Step(9.0, 10.0, 90, 0, 0.02), Step(10.0, 10.0, 100, 0, 0.02)]
    assert rate_bounds(steps)[0] == 8.0
    # A stricter confidence needs more evidence.
    assert rate_bounds(steps, confidence=0.99)[0] == 0.0


def test_durations_and_auto_configs():
    assert parse_duration("50ms") == pytest.approx(0.05) and parse_duration("15m") == 900.0
    assert parse_duration("1.5 s") == 1.5 and parse_duration(3) == 3.0
    for bad in ("fast", "-5s", "0ms", "5 parsecs", ""):
        with pytest.raises(TuneError):
            parse_duration(bad)
    assert auto_configs(2) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
    assert all(t <= 32 and w * t in (16, 32, 64) for w, t in auto_configs(32))


def test_library_bad_input_raises_before_any_server():
    with pytest.raises(TuneError, match="too small for one trial"):
        tune("50ms", configs=[(1, 1)], budget="3s")
    with pytest.raises(TuneError, match="unknown policy"):
        tune("50ms", configs=[(1, 1)], policies=["nope"])
    with pytest.raises(TuneError, match="not a duration"):
        tune("soon", configs=[(1, 1)])
    with pytest.raises(TuneError, match="unknown policy"):
        tune("50ms", configs=[Candidate(1, 1, "nope")])
    with pytest.raises(TuneError, match="W x T pairs or Candidates, not both"):
        tune("50ms", configs=[Candidate(1, 1, "cfs"), (2, 1)])
    # The keywords tune() took before TrialSpec and Candidate configs carried them: one line, before anything.
    with pytest.raises(TuneError, match=r"seed as trial=TrialSpec\(seed=...\)"):
        tune("50ms", configs=[(1, 1)], seed=1)
    with pytest.raises(TuneError, match=r"candidates as configs=\[Candidate"):
        tune("50ms", candidates=[Candidate(1, 1, "cfs")])
    with pytest.raises(TuneError, match="no option 'round'"):
        tune("50ms", configs=[(1, 1)], round=2)
    with pytest.raises(TuneError, match="trial must be a TrialSpec"):
        tune("50ms", configs=[(1, 1)], trial={"seed": 1})


def test_a_head_to_head_races_exactly_the_candidates_given(tmp_path):
    # What bench tune does with two finalists: these two only, every round, nothing dropped.
    finalists = [Candidate(1, 1, "cfs"), Candidate(2, 1, "round-robin")]
    result = tune("200ms", configs=finalists, policies=["tuna-compact"], model="small",
                  batch=10, budget="20s", rounds=1, step_seconds=0.25, exhaustive=True)
    assert list(result.table["candidate"].sort_values()) == ["1x1 cfs", "2x1 round-robin"]
    assert result.winner in finalists and (result.table["rounds"] == 1).all()


# -- the command line, on the lab server ------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--sla-p99", "fast"], "is not a duration"),
    (["--sla-p99", "50ms", "--budget", "2s"], "too small for one trial"),
    (["--sla-p99", "50ms", "--configs", "2y2"], "--configs wants WxT"),
    (["--sla-p99", "50ms", "--url", "http://127.0.0.1:9/"], "is for your own server"),
    (["--sla-p99", "50ms", "--wait-policies", "sometimes"], "unknown wait policy 'sometimes'"),
    (["--sla-p99", "50ms", "--app", "timed_app:application", "-t", "2"], "are searched (--configs): leave out -t"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    done = main("tune", *args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_cli_a_target_no_candidate_can_meet_is_reported_as_such(tmp_path):
    done = main("tune", "--sla-p99", "1ms", "--model", "small", "--batch", "10", "--configs", "1x1",
                "--policies", "cfs", "--budget", "40s", "--step-seconds", "0.25", "--out", str(tmp_path / "t"))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tuna-lab: error: no candidate meets a p99 of 1 ms") and done.stdout == ""
    assert os.path.isfile(tmp_path / "t" / "w1-t1-small-b10" / "manifest.json")     # the evidence is kept


def test_cli_end_to_end_within_a_minute(tmp_path):
    out = tmp_path / "tune"
    t0 = time.monotonic()
    done = main("tune", "--sla-p99", "200ms", "--model", "small", "--batch", "10", "--configs", "1x1,2x1",
                "--policies", "cfs,round-robin", "--budget", "20s", "--step-seconds", "0.5", "--rounds", "2",
                "--out", str(out), "--json")
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert took <= 1.1 * 20 + 10          # the budget, and the imports and the records' writing
    assert result["elapsed"] <= 1.1 * 20
    win = result["winner"]
    assert win["candidate"] in {c["candidate"] for c in result["candidates"]} and win["rate"] > 0
    assert f"workers = {win['workers']}" in win["plan"] and "TUNA_LAB_PLAN" in win["plan"]
    assert {c["status"] for c in result["candidates"]} <= {"winner", "in race", "dropped"}
    assert all(c["rate_low"] <= c["rate"] for c in result["candidates"])
    # The records are a sweep's: report reads them.
    report = main("report", str(out), "-o", str(tmp_path / "report.html"), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["cells"] == 2
    from tuna_lab.measure.store import load_results

    _, trials, manifests = load_results(str(out))
    assert {"rate", "round", "step", "sla_p99"} <= set(trials.columns)
    assert all(m["tune"]["winner"] == win["candidate"] for m in manifests)
    assert trials.groupby(["cell", "policy", "trial"]).size().max() == 1     # every step is a trial of its own
    # The race itself is kept beside the records, and reads back as the run returned it.
    kept = read_tune(str(out))
    assert kept.winner.name == win["candidate"] and kept.plan == win["plan"]
    assert set(kept.history["candidate"]) == {c["candidate"] for c in result["candidates"]}
    assert kept.history["round"].max() >= 1 and (kept.table["rate_high"] > 0).all()


# -- a user's app that tuna_lab starts, with two wait policies ------------------------------------------

@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="tuna-scatter on one CPU is cfs")
def test_cli_tunes_a_users_app_over_policies_and_wait_policies(model_env, body, tmp_path):
    env = model_env
    out = tmp_path / "tune"
    done = main("tune", "--sla-p99", "100ms", "--app", "timed_app:application", "--app-dir", USERAPP,
                "--body", body, "--configs", "1x1", "--policies", "cfs,tuna-scatter",
                "--wait-policies", "default,passive", "--budget", "30s", "--step-seconds", "0.25", "--rounds", "1",
                "--out", out, "--json", env=env)
    # A policy none of whose candidates was measured fails the run (exit 1): the budget has room for both
    # policies' default-wait candidates even on a busy machine (an app's start and warm-up take 5-10 s there),
    # and for the passive ones on an idle machine; one round, since the round is not what is tested here.
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["elapsed"] <= 1.1 * 30
    names = {c["candidate"] for c in result["candidates"]}
    assert names == {"1x1 cfs", "1x1 tuna-scatter", "1x1 cfs passive", "1x1 tuna-scatter passive"}
    win = result["winner"]
    assert win["workers"] == 1 and win["threads"] == 1 and win["rate"] > 0
    assert win["wait_policy"] in ("default", "passive") and "workers = 1" in win["plan"]
    # One cell per wait policy, each the user's app as run and sweep record it.
    from tuna_lab.measure.store import load_results

    _, trials, manifests = load_results(str(out))
    assert {m["wait_policy"] for m in manifests} <= {"default", "passive"} and len(manifests) >= 1
    assert all(m["target"]["kind"] == "app" and m["target"]["app"] == "timed_app:application" for m in manifests)
    assert "server-timing" in set(trials["latency"])        # the app's own Server-Timing header
    assert set(trials["candidate"]) <= names


def test_read_tune_names_a_folder_that_is_not_a_tune(tmp_path):
    with pytest.raises(TuneError, match="no tune.json"):
        read_tune(str(tmp_path))
    (tmp_path / "tune.json").write_text("{")
    with pytest.raises(TuneError, match="is not JSON"):
        read_tune(str(tmp_path))


def test_the_stored_tune_draws_its_race_round_by_round():
    from tuna_lab.analysis.figures import race_rounds

    result = read_tune(str(Path(__file__).parent.parent / "notebooks" / "data" / "tune-2cpu"))
    fig = race_rounds(result.history, result.sla_p99)
    assert [t.name for t in fig.data] == [f"round {r}" for r in sorted(result.history["round"].unique())]
    # A dropped candidate stays on the chart, greyed, with the interval it had.
    last = result.history[result.history["round"] == result.history["round"].max()]
    assert len(fig.data[-1].y) == len(last) and "rgb(170, 170, 170)" in fig.data[-1].marker.color


# -- a policy the budget never reached ---------------------------------------------------------------

@pytest.mark.parametrize("fails, says", [((), "round-robin not measured: the 30 s budget ran out"),
                                         (("cfs",), "no valid trial of cfs: every trial failed")])
def test_a_policy_the_budget_never_reached_is_not_called_failed(fails, says, capsys):
    from tuna_lab.cli.commands import tune as command

    evaluate, clock = simulated_race(25.0, fails=fails)
    result = race([Candidate(1, 1, "cfs"), Candidate(1, 1, "round-robin")], evaluate, 0.05, 30,
                  rules=RaceRules(rounds=1, step_seconds=0.5), clock=clock)
    assert command._unmeasured_status(result) == 1
    err = capsys.readouterr().err
    assert says in err, err
    # Said once, and the one that never ran is not called failed.
    assert "round-robin: every trial failed" not in err and "of cfs, round-robin" not in err


def test_halving_says_why_it_drops_a_candidate_at_a_higher_rate_than_the_leader():
    # As in a tune of the lab server on 2 CPUs (2x1, after round 3): a bracket passed at 18/s but
    # failed only at 64/s ranks below one passed at 16/s whose p99 crosses the target nearer 26/s.
    from tuna_lab.measure.tune.race import _drop, _Entry

    leader, other = _Entry(Candidate(2, 1, "tuna-scatter")), _Entry(Candidate(2, 1, "round-robin"))
    leader.steps = [Step(16.0, 8.0, 200, 0, 0.10), Step(26.0, 8.0, 200, 10, 0.21)]
    other.steps = [Step(18.0, 8.0, 200, 0, 0.149), Step(64.0, 8.0, 200, 100, math.inf)]
    _drop([leader, other], 2, 4, 2, 0.1, 0.9, 1.0, False, sla_p99=0.15)
    assert (leader.status, other.status) == ("in race", "dropped")
    assert other.reason == ("halving after round 3: 18.0/s, rank 2 of 2 (leader 16.0/s; a higher rate than the "
                            "leader's, ranked below it by where its p99 crosses the target (18.2/s against 21.5/s))")


def test_the_bench_page_names_no_temporary_folder_and_both_clocks(tmp_path):
    # docs/tune-bench.md once printed the bench's /tmp records folder, which no reader can open.
    from dataclasses import replace

    from tuna_lab.bench.tune import _write_doc

    candidates, rates = _candidates()
    sim = Simulated(rates, seed=4)
    raced = replace(race(candidates, sim.evaluate, SLA, 3600, clock=sim.clock,
                         rules=RaceRules(rounds=2, step_seconds=1.0)), out="/tmp/tb/tune-race")
    full = replace(raced, out="/tmp/tb/tune-exhaustive", elapsed=raced.elapsed * 4)
    page = tmp_path / "tune-bench.md"
    _write_doc(str(page), {(1, 1): 0.01}, {(1, 1): 0.01}, SLA, raced, full, None, raced.elapsed + 1,
               full.elapsed + 1, "summary", [(0.1, 0.1, 0.1), (0.2, 0.2, 0.2)])
    text = page.read_text()
    assert "/tmp/tb" not in text and text.count("records: a folder of the bench run's own") == 2
    assert f"starts inside the search: {raced.elapsed:.0f} s and {full.elapsed:.0f} s" in text
