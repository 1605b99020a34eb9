"""The scheduler's evidence per policy and its relation to p99 (tuna_lab.analysis.mechanism), on synthetic tables.

The synthetic trial table: one application, three policies x ``TRIALS``
trials, where cfs waits on the run queue four times as long as tuna-scatter
and round-robin in between, and p99 grows with the run-queue wait; IRQs are
noise, migrations are missing or NaN as a test needs.
"""

import html
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuna_lab.analysis.figures import mechanism_bars
from tuna_lab.analysis.mechanism import (
    MECHANISM,
    MIN_CORRELATION_TRIALS,
    NOT_RECORDED,
    evidence_notes,
    mechanism_correlations,
    mechanism_lines,
    mechanism_table,
)
from tuna_lab.analysis.report import write_report
from tuna_lab.analysis.stats import format_interval, scenario_stats
from tuna_lab.analysis.summary import summarize
from tuna_lab.errors import AnalysisError

TRIALS = 4
DELAY = {"cfs": 0.004, "round-robin": 0.002, "tuna-scatter": 0.001}      # run-queue wait per request, s


def make_trials(trials=TRIALS, seed=0):
    """A trial table with evidence columns: run delay drives p99, IRQs are noise, no migrations column."""
    rng = np.random.default_rng(seed)
    rows = []
    for policy, delay in DELAY.items():
        for trial in range(trials):
            run_delay = delay * rng.uniform(0.9, 1.1)
            rows.append({"cell": "w2-t1-medium-b100", "workers": 2, "threads": 1, "cpus": 2, "model": "medium",
                         "batch": 100, "policy": policy, "trial": trial, "trial_status": "ok", "reason": "",
                         "p99": 0.02 + 5 * run_delay, "p50": 0.01,
                         "run_delay_per_request": run_delay,
                         "involuntary_per_request": 3.0 * run_delay / delay * rng.uniform(0.9, 1.1),
                         "foreign_cpu_share": rng.uniform(0.01, 0.05),
                         "irqs_per_request": rng.uniform(5, 10)})
    return pd.DataFrame(rows)


def _row(table, policy, evidence):
    return table[table["policy"].eq(policy) & table["evidence"].eq(evidence)].iloc[0]


# -- per policy --------------------------------------------------------------------------------------


def test_a_policy_with_more_run_queue_wait_shows_it_with_its_interval():
    trials = make_trials()
    table = mechanism_table(trials)
    cfs, rr, scatter = (_row(table, p, "run_delay_per_request") for p in DELAY)
    assert cfs["mean"] > rr["mean"] > scatter["mean"]
    assert scatter["ci_high"] < cfs["ci_low"]                      # the trials tell cfs from tuna-scatter
    for row in (cfs, rr, scatter):
        assert row["trials"] == TRIALS and row["note"] == ""
        assert 0 < row["ci_low"] < row["mean"] < row["ci_high"]
    # The interval is the p99's, from the one machinery: scenario_stats of the quantity.
    own = trials[trials["policy"].eq("cfs")].assign(p99=lambda t: t["run_delay_per_request"])
    ref = scenario_stats(own).iloc[0]
    assert (cfs["mean"], cfs["ci_low"], cfs["ci_high"]) == pytest.approx(
        (ref["mean_p99"], ref["ci_low"], ref["ci_high"]))


def test_a_share_interval_stops_at_one():
    trials = make_trials().assign(foreign_cpu_share=np.tile([0.05, 0.9], 6))
    table = mechanism_table(trials)
    rows = table[table["evidence"].eq("foreign_cpu_share")]
    assert (rows["ci_high"] == 1.0).all() and (rows["ci_low"] > 0).all()


def test_failed_trials_are_left_out():
    trials = make_trials()
    bad = trials["policy"].eq("tuna-scatter") & trials["trial"].eq(0)
    trials.loc[bad, ["trial_status", "run_delay_per_request"]] = ["failed", 99.0]
    row = _row(mechanism_table(trials), "tuna-scatter", "run_delay_per_request")
    assert row["trials"] == TRIALS - 1 and row["mean"] < 0.01


def test_a_quantity_every_trial_measured_as_zero_has_the_interval_zero():
    trials = make_trials().assign(migrations_per_request=0.0)
    row = _row(mechanism_table(trials), "tuna-scatter", "migrations_per_request")
    assert row["mean"] == 0 and (row["ci_low"], row["ci_high"]) == (0, 0) and row["note"] == ""


# -- not recorded, never 0 ----------------------------------------------------------------------------


def test_missing_and_all_nan_columns_are_not_recorded_with_the_reason():
    trials = make_trials().assign(foreign_cpu_share=np.nan)        # migrations: no column at all
    table = mechanism_table(trials)
    migrations = table[table["evidence"].eq("migrations_per_request")]
    assert (migrations["note"] == NOT_RECORDED["missing"]).all()
    assert migrations["mean"].isna().all() and (migrations["trials"] == 0).all()
    foreign = table[table["evidence"].eq("foreign_cpu_share")]
    assert (foreign["note"] == NOT_RECORDED["empty"]).all() and foreign["mean"].isna().all()
    correlations = mechanism_correlations(trials)
    by = correlations.set_index("evidence")
    assert by.loc["migrations_per_request", "sentence"] == NOT_RECORDED["missing"]
    assert by.loc["foreign_cpu_share", "weak"] and np.isnan(by.loc["migrations_per_request", "rho"])
    lines = mechanism_lines(table, correlations)
    assert "  migrations per request: " + NOT_RECORDED["missing"] in lines
    assert not any(" 0.00" in line for line in lines if "migrations" in line)


def test_a_kernel_that_hides_migrations_gives_the_manifests_reason():
    trials = make_trials().assign(migrations=np.nan, migrations_per_request=np.nan)
    notes = evidence_notes([{"cell": "a"}, {"migrations_note": "this kernel has no se.nr_migrations"}])
    table = mechanism_table(trials, notes)
    assert set(table.loc[table["evidence"].eq("migrations_per_request"), "note"]) == {
        "not recorded: this kernel has no se.nr_migrations"}
    assert set(mechanism_table(trials).loc[lambda t: t["evidence"].eq("migrations_per_request"), "note"]) == {
        NOT_RECORDED["empty"]}


def test_one_policy_without_a_value_is_not_recorded_for_that_policy_only():
    trials = make_trials()
    trials.loc[trials["policy"].eq("round-robin"), "irqs_per_request"] = np.nan
    table = mechanism_table(trials)
    assert _row(table, "round-robin", "irqs_per_request")["note"].startswith("not recorded")
    assert _row(table, "cfs", "irqs_per_request")["note"] == ""
    line = next(x for x in mechanism_lines(table) if x.lstrip().startswith("IRQs"))
    assert "round-robin not recorded" in line and "cfs " in line


def test_results_from_before_the_evidence_have_no_lines_in_the_summary():
    trials = make_trials().drop(columns=[e.column for e in MECHANISM if e.column in make_trials().columns])
    s = summarize(None, trials)
    assert s.mechanism.empty and s.mechanism_text() == "" and "scheduler evidence" not in s.to_text()
    # load_results fills the columns of older results with NaN: still "before the evidence", not "hidden".
    filled = trials.assign(**{e.column: np.nan for e in MECHANISM})
    assert summarize(None, filled).mechanism_text() == ""
    assert set(mechanism_table(filled)["note"]) == {NOT_RECORDED["missing"]}


# -- relation to p99 ----------------------------------------------------------------------------------


def test_the_correlation_has_the_sign_of_the_relation_and_says_so():
    trials = make_trials()
    c = mechanism_correlations(trials).set_index("evidence")
    delay = c.loc["run_delay_per_request"]
    assert delay["trials"] == 3 * TRIALS and delay["rho"] > 0.9 and delay["ci_low"] > 0 and not delay["weak"]
    assert "higher p99" in delay["sentence"] and format_interval(delay["ci_low"], delay["ci_high"]) in \
        delay["sentence"]
    # A quantity that falls as p99 rises: the sign and the sentence turn.
    falling = trials.assign(run_delay_per_request=1 / trials["run_delay_per_request"])
    row = mechanism_correlations(falling).set_index("evidence").loc["run_delay_per_request"]
    assert row["rho"] < -0.9 and row["ci_high"] < 0 and "lower p99" in row["sentence"]


def test_a_weak_correlation_is_said_to_be_weak():
    c = mechanism_correlations(make_trials()).set_index("evidence")
    noise = c.loc["irqs_per_request"]                       # IRQs drawn apart from p99
    assert noise["ci_low"] <= 0 <= noise["ci_high"] and noise["weak"]
    assert noise["sentence"].startswith("weak: its interval holds 0")


def test_too_few_trials_give_no_correlation():
    trials = make_trials(trials=1)                          # 3 trials in all
    assert 3 < MIN_CORRELATION_TRIALS
    row = mechanism_correlations(trials).set_index("evidence").loc["run_delay_per_request"]
    assert np.isnan(row["rho"]) and row["weak"] and row["sentence"].startswith("too few trials to tell: 3")


def test_the_bootstrap_is_seeded_and_a_constant_quantity_has_no_correlation():
    trials = make_trials()
    a, b = mechanism_correlations(trials), mechanism_correlations(trials)
    pd.testing.assert_frame_equal(a, b)
    row = mechanism_correlations(trials.assign(irqs_per_request=4.0)).set_index("evidence").loc["irqs_per_request"]
    assert np.isnan(row["rho"]) and row["weak"] and "same IRQs per request" in row["sentence"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda t: mechanism_table(pd.DataFrame()), "empty"),
    (lambda t: mechanism_table(t.drop(columns="p99")), "missing column"),
    (lambda t: mechanism_table(t, notes=["x"]), "notes must map"),
    (lambda t: mechanism_correlations(t, resamples=0), "resamples"),
    (lambda t: mechanism_correlations("trials"), "DataFrame"),
])
def test_bad_inputs_raise_one_line_analysis_error(call, message):
    with pytest.raises(AnalysisError, match=message):
        call(make_trials())


# -- figure, text, report -----------------------------------------------------------------------------


def test_the_figure_draws_recorded_quantities_and_names_the_others():
    table = mechanism_table(make_trials())
    fig = mechanism_bars(table)
    drawn = [e for e in MECHANISM if e.column != "migrations_per_request"]
    assert [a.text for a in fig.layout.annotations] == [e.label + (f" ({e.unit})" if e.unit else "")
                                                      for e in drawn]
    assert "not recorded: migrations per request" in fig.layout.title.text
    first = [t for t in fig.data if t.xaxis == "x"]
    assert [t.name for t in first] == list(DELAY)
    cfs = _row(table, "cfs", "run_delay_per_request")
    assert first[0].y[0] == pytest.approx(cfs["mean"] * 1e3)
    assert first[0].customdata[0] == format_interval(cfs["ci_low"] * 1e3, cfs["ci_high"] * 1e3)


def test_the_text_summary_prints_each_quantity_per_policy_and_its_relation():
    trials = make_trials()
    s = summarize(None, trials)
    text = s.mechanism_text()
    assert "scheduler evidence" not in s.to_text()          # the speedups stay right above the scale line
    cfs = _row(mechanism_table(trials), "cfs", "run_delay_per_request")
    assert "scheduler evidence per policy (mean over trials [95% interval]):" in text
    assert (f"cfs {cfs['mean'] * 1e3:.2f} {format_interval(cfs['ci_low'] * 1e3, cfs['ci_high'] * 1e3)} ms"
            in text)
    assert "vs p99: trials with more of it had a higher p99" in text


def test_the_report_has_the_section_with_table_figure_and_relations(tmp_path):
    trials = make_trials()
    rng = np.random.default_rng(1)
    requests = trials[["cell", "workers", "threads", "cpus", "model", "batch", "policy", "trial"]].merge(
        pd.DataFrame({"request": range(50)}), how="cross")
    requests = requests.assign(status=200, server_seconds=rng.uniform(0.01, 0.03, len(requests)),
                               client_seconds=0.03, sent_at=0.01 * requests["request"],
                               **{s: 0.001 for s in ("deserialize", "convert", "dmatrix", "predict", "shap")})
    text = html.unescape(write_report(requests, trials, tmp_path / "r.html").read_text("utf-8"))
    assert "Scheduler evidence: what each policy did to the threads" in text
    scatter = _row(mechanism_table(trials), "tuna-scatter", "run_delay_per_request")
    assert (f"{scatter['mean'] * 1e3:.2f} {format_interval(scatter['ci_low'] * 1e3, scatter['ci_high'] * 1e3)}"
            in text)
    assert NOT_RECORDED["missing"] in text and "Spearman rho vs p99" in text
    assert "trials with more of it had a higher p99" in text


# -- a real run's folder ------------------------------------------------------------------------------

STORED = Path(__file__).resolve().parent.parent / "notebooks" / "data" / "sched-2cpu"


def test_a_stored_run_of_this_machine_reports_its_evidence(tmp_path):
    # Recorded by `tuna-lab run` here (notebook 10 reads it): every trial carries the evidence columns.
    from tuna_lab.measure import load_results

    requests, trials, manifests = load_results(STORED)
    notes = evidence_notes(manifests)
    table = mechanism_table(trials, notes)
    recorded = table[table["note"].eq("")]
    assert set(recorded["evidence"]) >= {"run_delay_per_request", "involuntary_per_request", "foreign_cpu_share",
                                         "irqs_per_request"}
    if "migrations_per_request" not in set(recorded["evidence"]):
        assert notes, "migrations missing without the manifest's reason"
    ok = trials[trials["trial_status"].eq("ok")]
    means = ok.groupby(["workers", "threads", "policy"])["run_delay_per_request"].mean()
    got = recorded[recorded["evidence"].eq("run_delay_per_request")].set_index(["workers", "threads", "policy"])
    assert got["mean"].to_dict() == pytest.approx(means.to_dict())
    assert (got["ci_low"] > 0).all() and (got["ci_low"] <= got["mean"]).all()
    text = summarize(requests, trials).mechanism_text()
    assert "scheduler evidence per policy" in text and "vs p99: " in text
    report = write_report(requests, trials, tmp_path / "r.html", manifest=manifests[0]).read_text("utf-8")
    assert "Scheduler evidence: what each policy did to the threads" in report and "Spearman rho vs p99" in report


# -- what separates, said first -----------------------------------------------------------------------


def test_where_p99_cannot_separate_the_quantity_that_can_leads_with_its_intervals_and_p99_follows():
    from tuna_lab.analysis.mechanism import lead_sentence
    from tuna_lab.measure import load_results

    _, trials, manifests = load_results(STORED)
    notes = evidence_notes(manifests)
    # 2 x 1, a CPU per worker: every p99 interval holds 1; the migrations separate, and they come first.
    one = lead_sentence(trials[trials["threads"].eq(1)], notes=notes)
    assert one.startswith("Migrations per request separates 2 of 2 policy comparisons with cfs: "
                          "round-robin 0.00 [0.00, 0.00] against cfs 0.0016 [0.00066, 0.0039]"), one
    assert one.index("Migrations") < one.index("p99 does not: its speedup intervals hold 1 in 2 of 2 (round-robin")
    # Both cells: the migrations separate 4 of 4, p99 2 of 4; every other quantity that separates is named.
    both = lead_sentence(trials, notes=notes)
    assert both.startswith("Migrations per request separates 4 of 4 policy comparisons with cfs: "), both
    assert "Also separating: run-queue wait per request (2 of 4)" in both
    # p99 after them: the comparisons it separates by name, the others by their count.
    assert both.index("Also separating") < both.index(" p99 separates only 2 of 4: round-robin at 2x2 p99 speedup "
                                                      "1.24x [1.15, 1.33]; tuna-scatter at 2x2 p99 speedup 1.23x")
    assert both.endswith("; in the other 2 its interval holds 1.")


def test_a_place_names_the_model_where_the_models_differ():
    from tuna_lab.analysis.mechanism import lead_sentence
    from tuna_lab.measure import load_results

    # notebooks/data/sweep-2cpu: ten cells, two models; 2x2 is two places.
    _, trials, _ = load_results(STORED.parent / "sweep-2cpu")
    text = lead_sentence(trials)
    assert text.startswith("Migrations per request separates 17 of 20 policy comparisons with cfs: "
                           "round-robin at 1x2 medium 0.00 [0.00, 0.00]"), text
    assert ("p99 separates only 4 of 20: round-robin at 2x2 medium p99 speedup 1.19x [1.10, 1.28]; "
            "tuna-scatter at 2x2 medium p99 speedup 1.17x [1.06, 1.28]") in text


def test_where_p99_separates_most_it_leads_and_nothing_separating_says_so():
    from tuna_lab.analysis.mechanism import lead_sentence

    two = lead_sentence(make_trials())
    assert two.startswith("p99 separates 2 of 2 policy comparisons with cfs: "), two
    assert "Of the scheduler's evidence, run-queue wait per request separates 2" in two
    alike = make_trials().assign(p99=0.03, run_delay_per_request=0.002, involuntary_per_request=3.0,
                                 foreign_cpu_share=0.02, irqs_per_request=7.0)
    alike["p99"] += np.random.default_rng(2).uniform(-0.005, 0.005, len(alike))
    assert lead_sentence(alike).startswith("Nothing measured here separates the policies from cfs")
