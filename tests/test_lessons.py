"""Lessons led by what separates (issue 49): no interval from fewer than 3 trials, speedups on a log axis,
a verdict in words under every figure, and the measure that separates the policies said first."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuna_lab.analysis.figures import (
    FASTER,
    NO_DIFFERENCE,
    SLOWER,
    mechanism_bars,
    race_verdict,
    speedup_bars,
    verdict,
    verdict_table,
    verdict_text,
)
from tuna_lab.analysis.mechanism import lead_sentence, mechanism_lines, mechanism_table, separation
from tuna_lab.analysis.stats import (
    MIN_INTERVAL_TRIALS,
    TOO_FEW_TRIALS,
    compare_policies,
    format_interval,
    scenario_stats,
    speedup_summary,
)
from tuna_lab.errors import AnalysisError
from tuna_lab.measure import load_results

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
APP = {"workers": 2, "threads": 1, "cpus": 2, "model": "small", "batch": 10}


def trials_table(p99, evidence=None):
    """One application's trial table: ``p99`` maps a policy to its trials' p99s (seconds)."""
    rows = []
    for policy, values in p99.items():
        for trial, value in enumerate(values):
            row = {**APP, "policy": policy, "trial": trial, "trial_status": "ok", "p99": value}
            for column, per_policy in (evidence or {}).items():
                row[column] = per_policy[policy][trial]
            rows.append(row)
    return pd.DataFrame(rows)


# -- no interval from fewer than 3 trials ---------------------------------------------------------


def test_the_threshold_is_three_trials_and_two_give_no_interval_anywhere():
    assert MIN_INTERVAL_TRIALS == 3
    # Notebook 06's case: 2 trials of 292 and 66 ms once gave "[0.1, 556121.8] ms" (t = 12.7).
    two = trials_table({"cfs": [0.0777, 0.0244], "tuna-scatter": [0.2921, 0.0657]},
                       {"migrations_per_request": {"cfs": [0.1, 0.2], "tuna-scatter": [0.0, 0.0]}})
    scen = scenario_stats(two)
    assert scen[["ci_low", "ci_high"]].isna().all(axis=None)
    assert format_interval(*scen[["ci_low", "ci_high"]].iloc[0]) == f"({TOO_FEW_TRIALS})"
    c = compare_policies(scen, "cfs", "tuna-scatter")
    assert all(math.isnan(c[k]) for k in ("ci_low", "ci_high", "speedup_ci_low", "speedup_ci_high"))
    summary = speedup_summary(scen, baselines="cfs", by=(None,))
    assert summary[["ci_low", "ci_high"]].isna().all(axis=None)
    table = mechanism_table(two)
    assert table[["ci_low", "ci_high"]].isna().all(axis=None)       # even two zeros: no [0, 0] from 2 trials
    lines = "\n".join(mechanism_lines(table))
    assert "tuna-scatter 0.00 (too few trials for an interval)" in lines and "[" not in lines.split("\n", 1)[1]


def test_three_trials_give_an_interval():
    three = trials_table({"cfs": [0.0777, 0.0244, 0.05], "tuna-scatter": [0.2921, 0.0657, 0.1]})
    scen = scenario_stats(three)
    assert np.isfinite(scen[["ci_low", "ci_high"]].to_numpy()).all()
    c = compare_policies(scen, "cfs", "tuna-scatter")
    assert 0 < c["speedup_ci_low"] < c["speedup"] < c["speedup_ci_high"] < math.inf


def test_a_run_summary_says_too_few_trials_in_words():
    from tuna_lab.analysis import summarize

    # The first two trials of a stored cell: one fewer than an interval needs.
    requests, trials, _ = load_results(NOTEBOOKS / "data" / "sweep-2cpu" / "w3-t2-medium-b100")
    two = trials["trial"] < MIN_INTERVAL_TRIALS - 1
    requests = requests[requests["trial"] < MIN_INTERVAL_TRIALS - 1]
    ok = trials[two & trials["trial_status"].eq("ok")]
    p99 = ok.groupby("policy")["p99"].mean()
    text = summarize(requests, trials[two]).to_text()
    assert f"tuna-scatter vs cfs: p99 speedup {p99['cfs'] / p99['tuna-scatter']:.2f}x (too few trials for an " \
           "interval)" in text
    assert "(95% interval)" not in text


# -- figures ------------------------------------------------------------------------------------


def _summary(ci):
    return pd.DataFrame({"baseline": "cfs", "policy": ["round-robin", "tuna-scatter"], "group": "subscription",
                         "subscription": "over", "n": 1, "speedup": [0.8, 1.6],
                         "ci_low": [ci[0], 1.2], "ci_high": [ci[1], 2.1]})


def test_speedups_are_drawn_on_a_log_axis_with_1_marked():
    fig = speedup_bars(_summary((0.5, 1.3)))
    assert fig.layout.yaxis.type == "log"
    assert any(s.type == "line" and s.y0 == s.y1 == 1 for s in fig.layout.shapes)


def test_no_error_bar_where_there_is_no_interval_and_the_hover_says_why():
    fig = speedup_bars(_summary((float("nan"), float("nan"))))
    few, drawn = fig.data
    assert np.isnan(np.asarray(few.error_y.array, dtype=float)).all()
    assert few.customdata[0][1] == f"({TOO_FEW_TRIALS})"
    assert np.isfinite(np.asarray(drawn.error_y.array, dtype=float)).all()
    two = trials_table({"cfs": [0.03, 0.031], "tuna-scatter": [0.02, 0.021]},
                       {"run_delay_per_request": {"cfs": [0.004, 0.005], "tuna-scatter": [0.001, 0.0012]}})
    bars = mechanism_bars(mechanism_table(two))
    assert all(np.isnan(np.asarray(t.error_y.array, dtype=float)).all() for t in bars.data)
    assert all(t.customdata[0] == f"({TOO_FEW_TRIALS})" for t in bars.data)


# -- verdicts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("speedup", "low", "high", "word"), [
    (1.4, 1.1, 1.8, FASTER), (0.7, 0.5, 0.9, SLOWER), (1.2, 0.9, 1.6, NO_DIFFERENCE),
    (0.99, 0.5, 1.0, NO_DIFFERENCE), (3.0, float("nan"), float("nan"), TOO_FEW_TRIALS),
    (1.2, 1.1, math.inf, FASTER)])
def test_a_verdict_is_never_from_the_value_alone(speedup, low, high, word):
    assert verdict(speedup, low, high) == word


def test_verdict_text_says_what_the_intervals_show_and_no_more():
    held = verdict_text(_summary((0.5, 1.3)).assign(ci_low=[0.5, 0.9]))
    assert held == "No policy's p99 differed from cfs's: both intervals hold 1."
    one = verdict_text(_summary((0.5, 1.3)))
    assert one.startswith("tuna-scatter faster than cfs at oversubscribed: 1.60x [1.20, 2.10].")
    assert "No difference shown in the other 1 of 2" in one
    assert verdict_text(_summary((0.6, 0.9))).startswith("round-robin slower than cfs")
    few = verdict_text(_summary((float("nan"),) * 2).assign(ci_low=np.nan, ci_high=np.nan))
    assert few.startswith("No verdict: too few trials for an interval")
    # Many comparisons: one clearing 1 is what chance gives, and the text says to read it with care.
    many = pd.concat([_summary((0.5, 1.3)).assign(ci_low=[0.5, 0.9])] * 4 + [_summary((0.5, 1.3))])
    assert "read them with care" in verdict_text(many)
    with pytest.raises(AnalysisError):
        verdict_text(pd.DataFrame({"policy": ["x"]}))


def test_verdict_table_gives_each_application_its_own_interval():
    three = trials_table({"cfs": [0.030, 0.031, 0.032], "tuna-scatter": [0.020, 0.021, 0.0205]})
    row = verdict_table(scenario_stats(three)).iloc[0]
    ref = compare_policies(scenario_stats(three), "cfs", "tuna-scatter")
    assert (row["ci_low"], row["ci_high"]) == (ref["speedup_ci_low"], ref["speedup_ci_high"])
    assert row["verdict"] == FASTER


def test_the_race_verdict_separates_only_when_the_bounds_do():
    table = pd.DataFrame({"candidate": ["a", "b"], "rate": [20.0, 8.0], "rate_low": [15.0, 6.0],
                          "rate_high": [25.0, 12.0]})
    assert race_verdict(table).startswith("Separated: the winner a")
    assert race_verdict(table.assign(rate_low=[0.0, 0.0])).startswith("Not separated: b")


# -- what separates the policies, said first ------------------------------------------------------


def test_the_stored_runs_lead_with_what_separates_in_each_configuration():
    # notebooks/data/sched-2cpu: 5 trials x 1,000 requests per policy, on a quiet machine (notebook 10).
    _, trials, manifests = load_results(NOTEBOOKS / "data" / "sched-2cpu")
    # Both configurations: p99 separates 2 of 4, the migrations 4 of 4, so the migrations lead and p99 follows.
    both = lead_sentence(trials)
    assert text_starts(both, "Migrations per request separates 4 of 4 policy comparisons with cfs: round-robin at 2x1 "
                             "0.00 [0.00, 0.00] against cfs 0.0016 [0.00066, 0.0039]")
    assert "p99 separates only 2 of 4: round-robin at 2x2 p99 speedup 1.24x [1.15, 1.33]" in both
    # 2 x 1, a CPU per worker: p99 does not separate, the migrations do, and they lead.
    one = lead_sentence(trials[trials["threads"].eq(1)])
    assert text_starts(one, "Migrations per request separates 2 of 2 policy comparisons with cfs: round-robin 0.00 "
                            "[0.00, 0.00] against cfs 0.0016 [0.00066, 0.0039]")
    assert "p99 does not: its speedup intervals hold 1 in 2 of 2 (round-robin p99 speedup 1.09x [0.82, 1.45]" in one
    # 2 x 2, oversubscribed: p99 separates, and every quantity of the evidence that does is named after it.
    two = lead_sentence(trials[trials["threads"].eq(2)])
    assert text_starts(two, "p99 separates 2 of 2 policy comparisons with cfs: round-robin p99 speedup 1.24x [1.15, 1.33]")
    assert "Of the scheduler's evidence, run-queue wait per request separates 2; also migrations per request (2)" in two
    sep = separation(trials)
    at22 = sep[sep["threads"].eq(2) & sep["measure"].isin(["p99", "run_delay_per_request"])]
    assert at22["state"].eq("separated").all()


def text_starts(text, start):
    assert text.startswith(start), text
    return True


def test_p99_leads_where_it_separates():
    trials = trials_table({"cfs": [0.030, 0.031, 0.032], "tuna-scatter": [0.020, 0.021, 0.0205]},
                          {"migrations_per_request": {"cfs": [0.1, 0.2, 0.15], "tuna-scatter": [0.0] * 3}})
    text = lead_sentence(trials)
    assert text.startswith("p99 separates 1 of 1 policy comparison with cfs: tuna-scatter p99 speedup 1.51x")
    assert "Of the scheduler's evidence, migrations per request separates 1." in text


def test_too_few_trials_separate_nothing_and_a_missing_baseline_is_refused():
    two = trials_table({"cfs": [0.03, 0.04], "tuna-scatter": [0.02, 0.03]})
    assert lead_sentence(two).startswith("These trials cannot separate anything: too few trials")
    with pytest.raises(AnalysisError, match="baseline 'round-robin'"):
        separation(two, baseline="round-robin")


# -- the notebooks -------------------------------------------------------------------------------


def _code_cells(name):
    nb = json.loads(next(NOTEBOOKS.glob(f"{name}_*.ipynb")).read_text("utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _printed(cell):
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.mark.parametrize("name", ["06", "08", "09", "10"])
def test_every_figure_has_a_verdict_printed_under_it(name):
    cells = _code_cells(name)
    figures = [i for i, c in enumerate(cells)
               if any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in c.get("outputs", []))]
    assert figures
    for i in figures:
        assert "Verdict" in _printed(cells[i + 1]), (name, "".join(cells[i]["source"])[:80])


def test_notebook_06_stores_no_interval_from_two_trials():
    cells = _code_cells("06")
    assert all("trials=2," not in "".join(c["source"]) for c in cells)
    stored = json.dumps([c.get("outputs", []) for c in cells])
    assert "38785" not in stored and "556121" not in stored
