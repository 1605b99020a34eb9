"""Analysis, figures and report on synthetic experiment tables with known numbers.

The synthetic experiment: 2 (model, batch) x 4 configurations on a 16-core
machine (2x16 and 4x8 oversubscribed) x 3 policies x 3 trials x 40 requests;
some requests fail (HTTP 500, client failure), and one trial fails entirely.
Reference values are recomputed here with plain numpy / scipy.
"""

import html
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tuna_lab.analysis.stats import (
    INTERVALS,
    MIN_INTERVAL_TRIALS,
    compare_policies,
    format_interval,
    scenario_stats,
    speedup_summary,
    speedups,
    trial_stats,
)
from tuna_lab.errors import AnalysisError, TunaError
from tuna_lab.measure.schema import PERCENTILES, percentiles
from tuna_lab.server.models import STAGES
from tuna_lab.analysis.report import write_report
from tuna_lab.analysis.summary import scale_note
from tuna_lab.analysis.figures import p99_by_configuration, speedup_bars, stage_p99_bars

CPUS = 16
CONFIGS = ((2, 2), (2, 16), (4, 2), (4, 8))           # ordered by W then T; 2x16 and 4x8 are over
APPS = (("medium", 100), ("small", 500))
POLICY_SCALE = {"cfs": 1.0, "round-robin": 0.9, "tuna-scatter": 0.5}
TRIALS, N = 3, 40
STAGE_SHARE = dict(zip(STAGES, (0.05, 0.05, 0.1, 0.3, 0.5), strict=True))
TRIAL_KEYS = ["workers", "threads", "cpus", "model", "batch", "policy", "trial"]
FAILED = {"policy": "cfs", "workers": 4, "threads": 8, "model": "medium", "batch": 100, "trial": 2}


def _product(**levels):
    return pd.MultiIndex.from_product(list(levels.values()), names=list(levels)).to_frame(index=False)


def make_tables(seed=0):
    """``(requests, trials)`` as the experiment runner writes them."""
    rng = np.random.default_rng(seed)
    df = _product(app=range(len(APPS)), config=range(len(CONFIGS)), policy=list(POLICY_SCALE),
                  trial=range(TRIALS), request=range(N))
    apps, configs = np.array(APPS, dtype=object), np.array(CONFIGS)
    df["model"] = apps[df["app"], 0].astype(str)
    df["batch"] = apps[df["app"], 1].astype(np.int64)
    df["workers"], df["threads"] = configs[df["config"], 0], configs[df["config"], 1]
    df["cpus"] = CPUS
    df["cell"] = ("w" + df["workers"].astype(str) + "-t" + df["threads"].astype(str) + "-"
                  + df["model"] + "-b" + df["batch"].astype(str))
    df["order"] = df["policy"].map({p: i for i, p in enumerate(POLICY_SCALE)})
    base = 0.01 * (1 + df["config"]) * (1 + df["app"])
    server = base * df["policy"].map(POLICY_SCALE) * rng.uniform(0.5, 1.5, len(df))
    df["status"] = np.where(df["request"] % 13 == 5, 500, np.where(df["request"] % 17 == 3, -1, 200))
    failed_trial = np.logical_and.reduce([df[k].eq(v) for k, v in FAILED.items()])
    df.loc[failed_trial, "status"] = -1
    ok = df["status"].eq(200)
    df["error"] = np.where(df["status"].eq(500), "HTTP 500", np.where(df["status"].eq(-1), "refused", ""))
    df["server_seconds"] = server.where(ok)
    for stage, share in STAGE_SHARE.items():
        df[stage] = (server * share * rng.uniform(0.8, 1.2, len(df))).where(ok)
    df["client_seconds"] = (df["server_seconds"] + 0.002).where(df["status"].ne(-1))
    df["pid"] = 1000 + df["request"] % 4
    df["sent_at"] = 100.0 * df["trial"] + 0.01 * df["request"]
    df["scheduled_at"] = df["sent_at"]
    df["send_lag"] = 0.0
    df["load_mode"] = "closed"
    requests = df.drop(columns=["app", "config"])

    trials = (requests.assign(_ok=ok)
              .groupby(["cell", *TRIAL_KEYS, "order"], as_index=False)
              .agg(n=("request", "size"), ok=("_ok", "sum"), wall_seconds=("sent_at", "max")))
    trials["failed"] = trials["n"] - trials["ok"]
    dead = np.logical_and.reduce([trials[k].eq(v) for k, v in FAILED.items()])
    trials["trial_status"] = np.where(dead, "failed", "ok")
    trials["reason"] = np.where(dead, "server died: <worker 3> exited", "")
    return requests, trials


@pytest.fixture(scope="module")
def tables():
    return make_tables()


@pytest.fixture(scope="module")
def per_trial(tables):
    requests, trials = tables
    return trial_stats(requests, trials)


def hand_scenarios(rows):
    """A scenario table from ``(workers, threads, model, batch, policy, mean_p99)`` rows."""
    df = pd.DataFrame(rows, columns=["workers", "threads", "model", "batch", "policy", "mean_p99"])
    return df.assign(cpus=32, std_p99=0.0, n_trials=5)


# -- trial_stats --------------------------------------------------------------------------------


def test_trial_percentiles_match_numpy_on_raw_rows(tables, per_trial):
    requests, _ = tables
    ok = requests[requests["status"].between(200, 299)]
    grouped = ok.groupby(TRIAL_KEYS)
    expected = pd.DataFrame({
        "p50": grouped["server_seconds"].apply(lambda s: np.percentile(s, 50)),
        "p95": grouped["server_seconds"].apply(lambda s: np.percentile(s, 95)),
        "p99": grouped["server_seconds"].apply(lambda s: np.percentile(s, 99)),
        "mean": grouped["server_seconds"].apply(np.mean),
        "client_p99": grouped["client_seconds"].apply(lambda s: np.percentile(s, 99)),
        **{f"{s}_p99": grouped[s].apply(lambda v: np.percentile(v, 99)) for s in STAGES},
    })
    got = per_trial.set_index(TRIAL_KEYS).loc[expected.index, expected.columns]
    np.testing.assert_allclose(got.to_numpy(), expected.to_numpy(), rtol=1e-12)
    # one row per trial, including the failed one (no ok request, so no p99)
    assert len(per_trial) == len(APPS) * len(CONFIGS) * len(POLICY_SCALE) * TRIALS
    dead = per_trial.set_index(TRIAL_KEYS).loc[tuple(FAILED[k] if k != "cpus" else CPUS for k in TRIAL_KEYS)]
    assert dead["ok"] == 0 and dead["failed"] == N and math.isnan(dead["p99"])
    assert dead["trial_status"] == "failed" and dead["reason"].startswith("server died")


def test_trial_percentiles_are_the_schema_ones(tables, per_trial):
    # The percentile columns are those measure.schema defines for every summary, in its order,
    # and agree with its percentiles() on one trial's requests.
    assert [c for c in per_trial.columns if re.fullmatch(r"p\d+", c)] == [f"p{q}" for q in PERCENTILES]
    requests, _ = tables
    key = per_trial.iloc[0][TRIAL_KEYS]
    mine = requests[requests[TRIAL_KEYS].eq(key).all(axis=1) & requests["status"].between(200, 299)]
    expected = percentiles(mine["server_seconds"].dropna())
    assert per_trial.iloc[0][list(expected)].astype(float).to_dict() == pytest.approx(expected, rel=1e-12)


def test_no_analysis_module_imports_a_private_name():
    import ast
    from pathlib import Path

    import tuna_lab.analysis

    root = Path(tuna_lab.analysis.__file__).parent
    private = [f"{path.relative_to(root)}: {alias.name}"
               for path in sorted(root.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module != "__future__"
               for alias in node.names if alias.name.startswith("_")]
    assert private == []


def test_trial_counts_throughput_and_subscription(tables, per_trial):
    requests, _ = tables
    row = per_trial.iloc[0]
    raw = requests[np.logical_and.reduce([requests[k].eq(row[k]) for k in TRIAL_KEYS])]
    n_ok = int(raw["status"].eq(200).sum())
    assert (row["n"], row["ok"], row["failed"]) == (N, n_ok, N - n_ok)
    span = (raw["sent_at"] + raw["client_seconds"]).max() - raw["sent_at"].min()
    assert row["throughput"] == pytest.approx(n_ok / span)
    over = per_trial["workers"] * per_trial["threads"] > CPUS
    assert (per_trial["subscription"] == np.where(over, "over", "under")).all()
    assert set(per_trial.loc[over, "threads"]) == {8, 16}


# -- scenario_stats -------------------------------------------------------------------------------


def test_scenario_means_and_log_scale_student_t_interval(per_trial):
    scen = scenario_stats(per_trial, confidence=0.9).set_index(TRIAL_KEYS[:-1])
    valid = per_trial[per_trial["trial_status"].eq("ok")]
    p99 = valid.groupby(TRIAL_KEYS[:-1])["p99"]
    np.testing.assert_allclose(scen.loc[p99.mean().index, "mean_p99"], p99.mean(), rtol=1e-12)
    key = (2, 2, CPUS, "medium", 100, "tuna-scatter")
    values = valid.set_index(TRIAL_KEYS[:-1]).loc[key, "p99"].to_numpy()
    # log(mean) +- t * (sem / mean), mapped back: the delta method on the log scale.
    half = stats.t.ppf(0.95, len(values) - 1) * stats.sem(values) / values.mean()
    low, high = values.mean() * np.exp(-half), values.mean() * np.exp(half)
    assert scen.loc[key, ["ci_low", "ci_high"]].tolist() == pytest.approx([low, high])
    assert scen.loc[key, "ci_low"] * scen.loc[key, "ci_high"] == pytest.approx(values.mean() ** 2)
    full = scen[scen["n_trials"].ge(MIN_INTERVAL_TRIALS)]    # fewer trials: no interval at all
    assert (full["ci_low"] <= full["mean_p99"]).all() and (full["mean_p99"] <= full["ci_high"]).all()
    assert scen.loc[scen["n_trials"].lt(MIN_INTERVAL_TRIALS), ["ci_low", "ci_high"]].isna().all(axis=None)
    assert (scen.loc[scen["n_trials"] == TRIALS, "n_failed"] == 0).all()
    assert set(scen["subscription"]) == {"over", "under"}
    mean_shap = valid.groupby(TRIAL_KEYS[:-1])["shap_p99"].mean()
    np.testing.assert_allclose(scen.loc[mean_shap.index, "mean_shap_p99"], mean_shap)


def test_failed_trial_is_left_out(tables, per_trial):
    requests, trials = tables
    key = tuple(FAILED[k] if k != "cpus" else CPUS for k in TRIAL_KEYS[:-1])
    row = scenario_stats(per_trial).set_index(TRIAL_KEYS[:-1]).loc[key]
    assert (row["n_trials"], row["n_failed"]) == (TRIALS - 1, 1)
    # a trial the runner marked failed is left out even if it has ok requests
    marked = trials.assign(trial_status=np.where(trials["trial"].eq(0), "failed", trials["trial_status"]))
    again = scenario_stats(trial_stats(requests, marked))
    assert (again["n_trials"] <= TRIALS - 1).all()
    # without the trials table, a trial without ok requests still drops out
    bare = scenario_stats(trial_stats(requests)).set_index(TRIAL_KEYS[:-1]).loc[key]
    assert bare["n_trials"] == TRIALS - 1


def test_interval_shrinks_with_more_trials():
    def scen(p99s):
        table = pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium", "batch": 100,
                              "policy": "cfs", "trial": range(len(p99s)), "p99": p99s})
        return scenario_stats(table).iloc[0]

    few, many = scen([0.1, 0.2, 0.3]), scen([0.1, 0.2, 0.3] * 4)
    assert few["mean_p99"] == pytest.approx(0.2) and many["mean_p99"] == pytest.approx(0.2)
    assert few["ci_low"] < 0.2 < few["ci_high"]
    assert many["ci_high"] - many["ci_low"] < few["ci_high"] - few["ci_low"]
    one = scen([0.1])
    assert one["n_trials"] == 1 and math.isnan(one["ci_low"]) and math.isnan(one["std_p99"])


def test_a_p99_interval_never_goes_below_zero():
    # The report's cfs cell of issue 38: two trials far apart, whose Student t interval on the p99s
    # themselves was 488.20 [-243.92, 1220.32] ms. Two trials now give no interval (issue 49: t is 12.7);
    # three trials that far apart still reach below zero on the p99s themselves.
    table = pd.DataFrame({"workers": 2, "threads": 2, "cpus": 2, "model": "medium", "batch": 100,
                          "policy": "cfs", "trial": [0, 1], "p99": [0.4306, 0.5458]})
    assert scenario_stats(table)[["ci_low", "ci_high"]].isna().all(axis=None)
    table = pd.DataFrame({"workers": 2, "threads": 2, "cpus": 2, "model": "medium", "batch": 100,
                          "policy": "cfs", "trial": [0, 1, 2], "p99": [0.1, 0.4306, 0.5458]})
    row = scenario_stats(table).iloc[0]
    t_low = row["mean_p99"] - stats.t.ppf(0.975, 2) * row["std_p99"] / math.sqrt(3)
    assert t_low < 0 < row["ci_low"] < row["mean_p99"] < row["ci_high"] < math.inf
    wild = scenario_stats(table.assign(p99=[0.001, 10.0, 1.0])).iloc[0]
    assert 0 <= wild["ci_low"] < wild["mean_p99"] < wild["ci_high"]


# -- speedups -------------------------------------------------------------------------------------


SPEEDUP_ROWS = [
    # workers, threads, model, batch, policy, mean p99   (cpus = 32: 16x16 is over)
    (4, 4, "medium", 100, "cfs", 0.2),
    (4, 4, "medium", 100, "tuna-scatter", 0.1),       # 2.0
    (4, 4, "medium", 100, "round-robin", 0.25),       # 0.8
    (16, 16, "medium", 100, "cfs", 0.6),
    (16, 16, "medium", 100, "tuna-scatter", 0.5),     # 1.2
    (16, 16, "medium", 100, "round-robin", 0.6),      # 1.0
    (4, 4, "large", 1000, "cfs", 1.0),
    (4, 4, "large", 1000, "tuna-scatter", 1.0),       # 1.0
    (4, 4, "large", 1000, "round-robin", 2.0),        # 0.5
]


def test_speedup_for_a_hand_built_case():
    table = speedups(hand_scenarios(SPEEDUP_ROWS[:3])).set_index("policy")
    assert table.loc["tuna-scatter", "speedup"] == pytest.approx(2.0)
    assert table.loc["round-robin", "speedup"] == pytest.approx(0.8)
    assert set(table["baseline"]) == {"cfs"} and "cfs" not in table.index


def test_speedup_summary_overall_and_by_groups():
    summary = speedup_summary(hand_scenarios(SPEEDUP_ROWS))
    key = ["baseline", "policy", "group", "subscription", "model", "batch"]
    got = summary.set_index(key)["speedup"]
    na = pd.NA
    assert got[("cfs", "tuna-scatter", "all", na, na, na)] == pytest.approx((2.0 + 1.2 + 1.0) / 3)
    assert got[("cfs", "tuna-scatter", "subscription", "under", na, na)] == pytest.approx(1.5)
    assert got[("cfs", "tuna-scatter", "subscription", "over", na, na)] == pytest.approx(1.2)
    assert got[("cfs", "tuna-scatter", "model", na, "medium", na)] == pytest.approx(1.6)
    assert got[("cfs", "round-robin", "batch", na, na, 1000)] == pytest.approx(0.5)
    combo = ("cfs", "tuna-scatter", "subscription+model+batch", "under", "medium", 100)
    assert got[combo] == pytest.approx(2.0)
    # tuna over round-robin: 0.25/0.1, 0.6/0.5, 2.0/1.0
    assert got[("round-robin", "tuna-scatter", "all", na, na, na)] == pytest.approx((2.5 + 1.2 + 2.0) / 3)
    geo = summary.set_index(key)["geomean"][("cfs", "tuna-scatter", "all", na, na, na)]
    assert geo == pytest.approx((2.0 * 1.2 * 1.0) ** (1 / 3))
    assert set(summary["group"]) == {"all", "subscription", "model", "batch", "subscription+model+batch"}
    assert summary["batch"].dtype == "Int64"


def test_missing_baseline_gives_nan_not_a_crash():
    rows = [r for r in SPEEDUP_ROWS if not (r[2] == "large" and r[4] == "cfs")]
    table = speedups(hand_scenarios(rows))
    assert table.loc[table["model"].eq("large"), "speedup"].isna().all()
    summary = speedup_summary(hand_scenarios(rows), by=("model",)).set_index(["baseline", "policy", "model"])
    large = summary.loc[("cfs", "tuna-scatter", "large")]
    assert math.isnan(large["speedup"]) and large["n"] == 0
    assert summary.loc[("cfs", "tuna-scatter", "medium"), "speedup"] == pytest.approx(1.6)
    absent = speedup_summary(hand_scenarios(rows), baselines=("numa",), by=(None,))
    assert absent["speedup"].isna().all() and (absent["n"] == 0).all()


# -- compare_policies ----------------------------------------------------------------------------


def _two_policy_scenarios(mean_a, mean_b, std_a, std_b, n=5):
    return pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium", "batch": 100,
                         "policy": ["cfs", "tuna-scatter"], "mean_p99": [mean_a, mean_b],
                         "std_p99": [std_a, std_b], "n_trials": n})


def test_compare_policies_on_known_data():
    exact = compare_policies(_two_policy_scenarios(0.2, 0.1, 0.0, 0.0), "cfs", "tuna-scatter")
    assert exact["ratio"] == pytest.approx(0.5) and exact["speedup"] == pytest.approx(2.0)
    assert exact["ci_low"] == pytest.approx(0.5) and exact["ci_high"] == pytest.approx(0.5)
    assert exact["method"] == "log" and exact["n_applications"] == 1

    r = compare_policies(_two_policy_scenarios(0.2, 0.1, 0.02, 0.01), "cfs", "tuna-scatter")
    # Both relative variances are 0.1**2 / 5: Welch-Satterthwaite gives 2 x 4 degrees of freedom.
    assert r["ci_low"] < 0.5 < r["ci_high"] and r["dof"] == pytest.approx(8)
    half = stats.t.ppf(0.975, 8) * math.sqrt(2 * 0.1**2 / 5)
    assert [r["ci_low"], r["ci_high"]] == pytest.approx([0.5 * math.exp(-half), 0.5 * math.exp(half)])
    assert r["speedup_ci_low"] == pytest.approx(1 / r["ci_high"]) and r["speedup_ci_high"] == pytest.approx(
        1 / r["ci_low"])

    # A denominator not significantly above 0: Fieller's interval was unbounded (and its reciprocal
    # started at 0); this one stays a finite, positive interval, very wide.
    wild = compare_policies(_two_policy_scenarios(0.2, 0.1, 0.3, 0.01), "cfs", "tuna-scatter")
    assert 0 < wild["ci_low"] < 0.5 < wild["ci_high"] < math.inf and wild["ci_high"] / wild["ci_low"] > 10
    assert 0 < wild["speedup_ci_low"] < wild["speedup_ci_high"] < math.inf
    few = compare_policies(_two_policy_scenarios(0.2, 0.1, float("nan"), float("nan"), n=1),
                           "cfs", "tuna-scatter")
    assert few["ratio"] == pytest.approx(0.5) and math.isnan(few["ci_low"])


def test_compare_policies_interval_covers_the_true_ratio():
    rng = np.random.default_rng(1)
    reps, n, hits = 300, 5, 0
    trials_a = rng.normal(0.2, 0.02, (reps, n))
    trials_b = rng.normal(0.1, 0.02, (reps, n))
    for a, b in zip(trials_a, trials_b, strict=True):
        r = compare_policies(_two_policy_scenarios(a.mean(), b.mean(), a.std(ddof=1), b.std(ddof=1)),
                             "cfs", "tuna-scatter")
        hits += r["ci_low"] <= 0.5 <= r["ci_high"]
    assert 0.9 <= hits / reps <= 0.99


def test_compare_policies_over_the_synthetic_experiment(per_trial):
    scen = scenario_stats(per_trial)
    # The application with a failed trial keeps 2 of cfs's: too few for its interval, so the average has none.
    assert math.isnan(compare_policies(scen, "cfs", "tuna-scatter")["ci_low"])
    scen = scen[~(scen["workers"].eq(FAILED["workers"]) & scen["threads"].eq(FAILED["threads"])
                  & scen["model"].eq(FAILED["model"]) & scen["batch"].eq(FAILED["batch"]))]
    r = compare_policies(scen, "cfs", "tuna-scatter")
    both = scen[scen["policy"].isin(["cfs", "tuna-scatter"])].pivot_table(
        index=["workers", "threads", "model", "batch"], columns="policy", values="mean_p99")
    assert r["ratio"] == pytest.approx(both["tuna-scatter"].mean() / both["cfs"].mean())
    assert r["n_applications"] == len(APPS) * len(CONFIGS) - 1
    assert r["ci_low"] < r["ratio"] < r["ci_high"] < 1


# -- figures ------------------------------------------------------------------------------------------


def test_p99_by_configuration_traces_and_shading(per_trial):
    fig = p99_by_configuration(per_trial, model="medium", batch=100)
    assert [t.mode for t in fig.data] == ["markers", "lines+markers"] * len(POLICY_SCALE)
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers"}
    assert list(lines) == list(POLICY_SCALE)
    assert list(fig.layout.xaxis.ticktext) == [f"{w}x{t}" for w, t in CONFIGS]
    # one shaded rectangle per run of oversubscribed configurations: 2x16 (x=1) and 4x8 (x=3)
    assert [(s.x0, s.x1) for s in fig.layout.shapes] == [(0.5, 1.5), (2.5, 3.5)]
    scen = scenario_stats(per_trial).query("model == 'medium' and batch == 100 and policy == 'cfs'")
    np.testing.assert_allclose(lines["cfs"].y, scen["mean_p99"] * 1e3)
    markers = {t.name: t for t in fig.data if t.mode == "markers"}
    assert len(markers["cfs trials"].x) == len(CONFIGS) * TRIALS - 1     # the failed trial is left out
    assert "ms" in fig.layout.yaxis.title.text and fig.layout.title.text
    with pytest.raises(AnalysisError, match="model"):
        p99_by_configuration(per_trial)                                  # two models: ambiguous
    assert "one configuration" not in fig.layout.title.text


def test_p99_by_configuration_of_one_configuration_draws_its_means(per_trial):
    # The demo runs one configuration: a line needs two points, so the mean must show as a marker.
    one = per_trial.query("workers == 2 and threads == 2 and model == 'medium' and batch == 100")
    fig = p99_by_configuration(one)
    means = [t for t in fig.data if t.name in POLICY_SCALE]
    assert [t.name for t in means] == list(POLICY_SCALE)
    for trace in means:
        assert "markers" in trace.mode and len(trace.x) == 1 and trace.marker.size > 0
    scen = scenario_stats(one).set_index("policy")["mean_p99"] * 1e3
    np.testing.assert_allclose([t.y[0] for t in means], scen[list(POLICY_SCALE)])
    assert "one configuration" in fig.layout.title.text


def test_stage_p99_bars(per_trial):
    fig = stage_p99_bars(per_trial, 4, 8, model="medium", batch=100)
    assert [t.name for t in fig.data] == list(POLICY_SCALE)
    assert all(list(t.x) == list(STAGES) for t in fig.data) and fig.layout.barmode == "group"
    sel = per_trial.query("workers == 4 and threads == 8 and model == 'medium' and batch == 100 "
                          "and policy == 'cfs' and trial_status == 'ok'")
    np.testing.assert_allclose(fig.data[0].y, sel[[f"{s}_p99" for s in STAGES]].mean() * 1e3)
    assert "oversubscribed" in fig.layout.title.text
    with pytest.raises(AnalysisError, match="3x3"):
        stage_p99_bars(per_trial, 3, 3, model="medium", batch=100)


def test_speedup_bars(per_trial):
    summary = speedup_summary(scenario_stats(per_trial))
    fig = speedup_bars(summary)
    names = [t.name for t in fig.data]
    assert "tuna-scatter vs cfs" in names and "tuna-scatter vs round-robin" in names
    assert len(names) == len(set(names)) == 4                   # 2 policies x 2 baselines
    assert len(fig.data[0].x) == len(APPS) * 2                  # (over, under) x (model, batch)
    fig = speedup_bars(summary, group="all", baseline="cfs")
    assert [list(t.x) for t in fig.data] == [["all"], ["all"]]
    with pytest.raises(AnalysisError, match="group"):
        speedup_bars(summary, group="nope")


# -- report -------------------------------------------------------------------------------------------


def test_write_report_is_one_self_contained_file(tables, per_trial, tmp_path):
    requests, trials = tables
    manifest = {"cpu_model": "Intel Xeon <8272CL>", "kernel": "5.15.0", "commit": "ba0cf89",
                "command": ["tuna-lab", "sweep", "--policies", "cfs,tuna-scatter"], "date": "2025-10-31"}
    out = write_report(requests, trials, tmp_path / "sub" / "report.html", title="Synthetic",
                       manifest=manifest)
    assert out == tmp_path / "sub" / "report.html"
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]      # no temp file left behind
    text = out.read_text(encoding="utf-8")
    assert text.count("* plotly.js v") == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", text, re.IGNORECASE)
    assert text.count('class="plotly-graph-div"') >= 1 + len(APPS)
    assert "Intel Xeon &lt;8272CL&gt;" in text and "tuna-lab sweep --policies cfs,tuna-scatter" in text
    assert "server died: &lt;worker 3&gt; exited" in text
    # requests with no per-request scheduler evidence: the anatomy's section says why it shows none
    assert "Anatomy of the tail</h2>\n<p>Not shown, not recorded: these requests carry no per-request" in text, \
        text[text.find("Anatomy"):][:300]
    scen = scenario_stats(per_trial).set_index(TRIAL_KEYS[:-1])
    row = scen.loc[(2, 2, CPUS, "medium", 100, "tuna-scatter")]
    cell = f"{row['mean_p99'] * 1e3:.2f} {format_interval(row['ci_low'] * 1e3, row['ci_high'] * 1e3)}"
    assert cell in text
    speed = speedup_summary(scen.reset_index()).query("group == 'all'").set_index(["baseline", "policy"])
    for baseline in ("cfs", "round-robin"):
        r = speed.loc[(baseline, "tuna-scatter")]
        assert f"{r['speedup']:.2f} {format_interval(r['ci_low'], r['ci_high'])} (n=8)" in text
    assert html.escape(INTERVALS) in text
    assert "usable CPUs (fewer than" not in text                       # 16 CPUs: the article's scale
    # rewriting replaces the file in place
    write_report(requests, trials, out)
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]


def test_a_sweep_of_the_articles_design_is_reported_beside_the_article(tables, per_trial, tmp_path):
    cpus = 8
    requests, trials = tables
    design = {"cpus": cpus, "pairs": [[2, 2], [4, 8], [2, 16], [4, 2]], "models": ["medium", "small"],
              "batches": [100, 500], "trials": TRIALS, "requests": N, "stage_pairs": [[2, 2], [4, 8]],
              "summary": "budget 1m: requests 1000 -> 40"}
    text = html.unescape(write_report(requests, trials, tmp_path / "a.html", article=design).read_text("utf-8"))
    first = text.index("<h2>")
    assert text[first:].startswith("<h2>The article's experiment on this machine</h2>")
    assert "Cut to its budget: budget 1m: requests 1000 -> 40." in text
    assert "This is the tiny version" in text and "On 8 CPUs the article's pairs scale to T = 2, 8, 16 threads" in text
    # Tuna's speedups with their intervals, each beside the article's number or finding.
    summary = speedup_summary(scenario_stats(per_trial), by=(None,)).set_index(["baseline", "policy"])
    for baseline, article in (("cfs", "1.15x over cfs"), ("round-robin", "1.13x over round-robin")):
        row = summary.loc[(baseline, "tuna-scatter")]
        assert f"{row['speedup']:.2f} {format_interval(row['ci_low'], row['ci_high'])} (n=8)" in text
        assert f"Tuna's average p99 speedup is {article}" in text
    assert "Tuna's gain shrinks as the batch grows" in text
    assert "2x2 for the article's 4x4, 4x8 for the article's 16x16" in text
    assert "At 4x4, Tuna's gain comes mostly from the SHAP stage" in text
    with pytest.raises(AnalysisError, match="article must be a mapping"):
        write_report(requests, trials, tmp_path / "b.html", article=["not", "a", "design"])


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda r, t: trial_stats(r.drop(columns=["server_seconds", "shap"])), "server_seconds, shap"),
    (lambda r, t: trial_stats(r.iloc[:0]), "empty"),
    (lambda r, t: trial_stats(r.to_dict()), "DataFrame"),
    (lambda r, t: trial_stats(r.assign(status=r["status"].astype(str))), "numeric: status"),
    (lambda r, t: trial_stats(r, t.drop(columns="trial_status")), "trial_status"),
    (lambda r, t: scenario_stats(trial_stats(r), confidence=1.5), "confidence"),
    (lambda r, t: scenario_stats(pd.DataFrame({"p99": [0.1]})), "workers"),
    (lambda r, t: speedups(pd.DataFrame()), "empty"),
    (lambda r, t: speedup_summary(scenario_stats(trial_stats(r)), by=("colour",)), "colour"),
    (lambda r, t: compare_policies(scenario_stats(trial_stats(r)), "cfs", "numa"), "numa"),
    (lambda r, t: compare_policies(scenario_stats(trial_stats(r)), "cfs", "cfs"), "different"),
    (lambda r, t: write_report(r, t, "x.html", manifest=["not", "a", "dict"]), "manifest"),
])
def test_bad_inputs_raise_one_line_analysis_error(tables, call, message):
    requests, trials = tables
    with pytest.raises(AnalysisError, match=re.escape(message)) as info:
        call(requests, trials)
    assert isinstance(info.value, TunaError) and "\n" not in str(info.value)


def test_duplicate_scenarios_are_refused():
    rows = hand_scenarios(SPEEDUP_ROWS[:3] + SPEEDUP_ROWS[:1])
    with pytest.raises(AnalysisError, match="duplicate"):
        speedups(rows)


# -- several machines ---------------------------------------------------------------------------------


def test_the_machine_is_a_factor_never_averaged_over(tables, tmp_path):
    requests, trials = tables
    # The same experiment on a second machine where every policy is twice as slow but cfs.
    slow = requests["policy"].ne("cfs")
    other = requests.assign(server_seconds=requests["server_seconds"].where(~slow, requests["server_seconds"] * 2))
    both = pd.concat([requests.assign(machine="a"), other.assign(machine="b")], ignore_index=True)
    both_trials = pd.concat([trials.assign(machine="a"), trials.assign(machine="b")], ignore_index=True)
    per_trial = trial_stats(both, both_trials)
    assert len(per_trial) == 2 * len(trial_stats(requests, trials)) and per_trial.columns[0] == "machine"
    scen = scenario_stats(per_trial)
    one = scenario_stats(trial_stats(requests, trials))
    pd.testing.assert_frame_equal(scen[scen["machine"].eq("a")].drop(columns="machine").reset_index(drop=True),
                                  one)
    by_machine = speedup_summary(scen, baselines="cfs", by=("machine",)).set_index(["machine", "policy"])
    a, b = by_machine.loc[("a", "tuna-scatter"), "speedup"], by_machine.loc[("b", "tuna-scatter"), "speedup"]
    assert b == pytest.approx(a / 2, rel=0.01)               # each machine's policy against its own cfs
    assert compare_policies(scen, "cfs", "tuna-scatter")["n_applications"] == 2 * len(CONFIGS) * len(APPS)
    text = write_report(both, both_trials, tmp_path / "report.html",
                        machines={"a": {"hostname": "node-a", "cpu_model": "Xeon", "cpus": list(range(16))}}
                        ).read_text()
    assert "<h2>Machines</h2>" in text and "node-a" in text and f"{a:.3f} (n=8)" in text
    assert "p99 by configuration - machine a" in text and "p99 by configuration - machine b" in text


# -- the load generator's cost beside the server's -----------------------------------------


def _with_cpu(trials, generator=True):
    """The synthetic trials with the runner's CPU columns, the generator's only if ``generator``."""
    n = len(trials)
    cpu = {"p99": 0.02, "cpu_seconds": 2.0, "cpu_per_request": 0.004, "cpu_main_per_request": 0.001,
           "cpu_openmp_per_request": 0.003, "idle_cpu_share_main": 0.1, "idle_cpu_share_openmp": 0.4,
           "load_seconds": 1.0}
    if generator:
        # each policy's generator at a different cost, so that a mix-up of rows shows
        cpu["generator_cpu_per_request"] = trials["policy"].map(
            {p: 1e-4 * (i + 1) for i, p in enumerate(POLICY_SCALE)}).to_numpy()
        cpu["generator_cpus"] = ["7"] * n
    return trials.assign(**cpu)


def test_cpu_cost_puts_generator_cpu_next_to_server_cpu(tables):
    from tuna_lab.analysis.stats import cpu_cost

    _, trials = tables
    cost = cpu_cost(_with_cpu(trials))
    assert cost["cpu_per_request"].to_numpy() == pytest.approx(0.004)
    for i, policy in enumerate(POLICY_SCALE):
        assert cost.loc[cost["policy"] == policy, "generator_cpu_per_request"].to_numpy() == pytest.approx(
            1e-4 * (i + 1))
    # results recorded before the generator was measured: NaN, not an error
    old = cpu_cost(_with_cpu(trials, generator=False))
    assert old["generator_cpu_per_request"].isna().all() and (old["cpu_per_request"] > 0).all()


def test_the_report_shows_generator_cpu_per_request(tables, tmp_path):
    requests, trials = tables
    text = write_report(requests, _with_cpu(trials), tmp_path / "new.html",
                        manifest={"client_cpus": {"note": "load generator on CPU 7 (--client-cpus)"}}).read_text()
    assert "<th>server CPU ms/req</th>" in text and "<th>generator CPU ms/req</th>" in text
    assert "<td>4.00</td>" in text and "<td>0.10</td>" in text           # server 4 ms, first policy's generator
    assert "load generator on CPU 7 (--client-cpus)" in text
    old = write_report(requests, _with_cpu(trials, generator=False), tmp_path / "old.html").read_text()
    assert "<th>generator CPU ms/req</th>" in old and "<th>server CPU ms/req</th>" in old


def _with_front(trials, share):
    """``_with_cpu``'s trials whose master, helpers and front ends used ``share`` of each policy's workers' CPU."""
    with_cpu = _with_cpu(trials).assign(p50=0.01)       # the runner's trial p50 (run's per-policy table)
    front = with_cpu["cpu_per_request"] * with_cpu["policy"].map(share)
    return with_cpu.assign(front_cpu_per_request=front, front_cpu_seconds=front * with_cpu["ok"])


def test_front_cpu_is_shown_beside_the_workers_and_said_where_it_is_large(tables, tmp_path):
    from tuna_lab.analysis import summarize
    from tuna_lab.live.traffic import FRONT_SHARE

    requests, trials = tables
    # cfs's front: 25% of its workers' CPU (an MLServer master parsing requests); the others' a few per mille.
    large = _with_front(trials, {"cfs": 0.25, "round-robin": 0.002, "tuna-scatter": 0.004})
    s = summarize(requests, large)
    table = s.summary.set_index("policy")
    assert table["front_cpu_per_request"].to_dict() == pytest.approx(
        {"cfs": 0.001, "round-robin": 0.000008, "tuna-scatter": 0.000016})
    header, cfs_row = s.to_text().splitlines()[:2]
    assert "server CPU ms/req" in header and "front CPU ms/req" in header
    assert cfs_row.split()[4:6] == ["4.00", "1.00"]                 # workers 4 ms, front 1 ms per request
    assert s.cpu["front_cpu_per_request"].max() == pytest.approx(0.001)
    line = ("note: the master, helpers and front ends used 25% as much CPU as the workers (1.00 ms against "
            "4.00 ms per request under cfs, ")
    assert [n for n in s.notes if "front ends" in n][0].startswith(line)
    assert line in s.to_text() and s.to_dict()["notes"] == list(s.notes)
    text = write_report(requests, large, tmp_path / "large.html").read_text()
    assert "<th>front CPU ms/req</th>" in text and "<td>1.00</td>" in text
    assert html.escape(line) in text

    # Below FRONT_SHARE of the workers' CPU: the column, and no line.
    small = _with_front(trials, dict.fromkeys(POLICY_SCALE, FRONT_SHARE / 2))
    s = summarize(requests, small)
    assert "front CPU ms/req" in s.to_text() and not any("front ends" in n for n in s.notes)
    assert "front ends used" not in write_report(requests, small, tmp_path / "small.html").read_text()
    # Results recorded before it was: neither the column nor the line.
    s = summarize(requests, _with_cpu(trials).assign(p50=0.01))
    assert "front CPU" not in s.to_text() and s.cpu["front_cpu_per_request"].isna().all()
    assert "<th>front CPU ms/req</th>" not in write_report(requests, _with_cpu(trials), tmp_path / "o.html").read_text()


# -- intervals on the averaged speedups ---------------------------------------------------------

def _scenarios_with_spread():
    import pandas as pd

    rows = []
    for w, base, pinned in ((2, 0.20, 0.16), (4, 0.30, 0.25), (8, 0.50, 0.45)):
        for policy, mean in (("cfs", base), ("tuna-scatter", pinned)):
            rows.append({"workers": w, "threads": 2, "cpus": 8, "model": "small", "batch": 100, "policy": policy,
                         "mean_p99": mean, "std_p99": 0.1 * mean, "n_trials": 5})
    return pd.DataFrame(rows)


def test_one_application_gets_the_very_interval_run_prints():
    from tuna_lab.analysis.stats import compare_policies, speedup_summary

    scen = _scenarios_with_spread()
    one = scen[scen["workers"] == 2]
    row = speedup_summary(one, baselines="cfs", by=(None,)).iloc[0]
    ref = compare_policies(one, "cfs", "tuna-scatter")
    # Equal, not approximately: the table, the figure and the terminal print the same digits.
    assert (row["ci_low"], row["ci_high"]) == (ref["speedup_ci_low"], ref["speedup_ci_high"])


def test_several_applications_get_an_interval_around_their_mean_that_widens_with_the_spread():
    from tuna_lab.analysis.stats import speedup_summary

    scen = _scenarios_with_spread()
    row = speedup_summary(scen, baselines="cfs", by=(None,)).iloc[0]
    assert row["ci_low"] < row["speedup"] < row["ci_high"]
    noisier = scen.assign(std_p99=scen["std_p99"] * 3)
    wide = speedup_summary(noisier, baselines="cfs", by=(None,)).iloc[0]
    assert wide["ci_high"] - wide["ci_low"] > 2.5 * (row["ci_high"] - row["ci_low"])
    # Without the trials' spread there is no interval, and no error bar is drawn.
    bare = speedup_summary(scen.drop(columns=["std_p99", "n_trials"]), baselines="cfs", by=(None,)).iloc[0]
    assert np.isnan(bare["ci_low"]) and np.isnan(bare["ci_high"])


def test_speedup_bars_draw_the_intervals():
    from tuna_lab.analysis.figures import speedup_bars
    from tuna_lab.analysis.stats import speedup_summary

    summary = speedup_summary(_scenarios_with_spread(), baselines="cfs", by=("workers",))
    fig = speedup_bars(summary)
    bars = fig.data[0]
    assert len(bars.error_y.array) == 3 and np.all(np.asarray(bars.error_y.array) > 0)
    np.testing.assert_allclose(np.asarray(bars.y) + np.asarray(bars.error_y.array), summary["ci_high"])


# -- how many requests a p99 needs; trials paired ---------------------------------

def test_quantile_rank_interval_covers_and_says_when_n_is_too_small():
    from scipy.stats import binom

    from tuna_lab.analysis.stats import quantile_rank_interval

    assert quantile_rank_interval(200) == (195, None)     # 200 requests cannot bound a p99 from above
    for n in (500, 1000, 5000):
        lo, hi = quantile_rank_interval(n)
        assert binom.cdf(hi - 1, n, 0.99) - binom.cdf(lo - 1, n, 0.99) >= 0.95
    assert quantile_rank_interval(1000, q=0.5, confidence=0.9)[0] < 500 < quantile_rank_interval(1000, q=0.5)[1]


def test_paired_trials_draws_one_line_per_trial_in_policy_order():
    from tuna_lab.analysis.figures import paired_trials

    t = pd.DataFrame({"workers": [2] * 4 + [3] * 4, "threads": 1,
                      "policy": ["cfs", "tuna-scatter", "tuna-scatter", "cfs"] * 2,
                      "trial": [0, 0, 1, 1] * 2, "p99": [0.01, 0.02, 0.03, 0.04] * 2})
    fig = paired_trials(t, policies=["tuna-scatter", "cfs"])
    assert len(fig.data) == 4
    assert list(fig.data[0].x) == ["tuna-scatter", "cfs"] and list(fig.data[0].y) == [20.0, 10.0]
    assert list(fig.data[1].y) == [30.0, 40.0]


# ------------------------------------------------------------ the run summary
SWEEP_2CPU = Path(__file__).resolve().parent.parent / "notebooks" / "data" / "sweep-2cpu"


def test_summarize_a_stored_cell_gives_what_run_prints():
    from tuna_lab.analysis import RunSummary, summarize
    from tuna_lab.measure.experiment import load_results

    # The first two trials of a stored cell, one fewer than an interval needs; the whole cell has one.
    requests, trials, _ = load_results(SWEEP_2CPU / "w3-t2-medium-b100")
    whole = summarize(requests, trials).speedups.set_index("policy")
    assert (whole["ci_low"] < whole["speedup"]).all() and (whole["speedup"] < whole["ci_high"]).all()
    trials = trials[trials["trial"] < MIN_INTERVAL_TRIALS - 1]
    requests = requests[requests["trial"] < MIN_INTERVAL_TRIALS - 1]
    s = summarize(requests, trials)
    assert isinstance(s, RunSummary)
    ok = trials[trials["trial_status"] == "ok"]
    means = ok.groupby("policy")["p99"].mean()
    table = s.summary.set_index("policy")
    assert table["p99"].to_dict() == pytest.approx(means.to_dict())
    assert table["p99_speedup_vs_cfs"].to_dict() == pytest.approx((means["cfs"] / means).to_dict())
    assert table["trials"].to_dict() == ok.groupby("policy").size().to_dict()
    # Each speedup is compare_policies' ratio of mean p99s, inside its own interval.
    sp = s.speedups.set_index("policy")
    assert sorted(sp.index) == ["round-robin", "tuna-scatter"] and set(sp["baseline"]) == {"cfs"}
    assert sp["speedup"].to_dict() == pytest.approx((means["cfs"] / means).drop("cfs").to_dict(), rel=1e-9)
    assert sp[["ci_low", "ci_high"]].isna().all(axis=None)         # 2 trials per policy: too few for one
    lines = s.to_text().splitlines()
    assert lines[-1].endswith(f"p99 speedup {means['cfs'] / means['tuna-scatter']:.2f}x (too few trials for an "
                              "interval)")
    # The header, a row per policy, the CPU columns said in words once, a line per speedup.
    assert lines[0].split()[:3] == ["policy", "p50", "ms"] and len(lines) == 1 + 3 + 1 + 2
    assert lines[4].startswith("(CPU ms/req: CPU time per request - server: the workers' threads")
    assert lines[-1].startswith("tuna-scatter vs cfs: p99 speedup ")
    assert s.to_dict()["summary"][0]["policy"] == "cfs"


def test_summarize_a_sweep_gives_the_report_headline_and_cpu():
    from tuna_lab.analysis import summarize
    from tuna_lab.analysis.stats import cpu_cost
    from tuna_lab.measure.experiment import load_results

    requests, trials, _ = load_results(SWEEP_2CPU)
    s = summarize(requests, trials)
    expected = speedup_summary(scenario_stats(trial_stats(requests, trials)), by=(None,))
    assert s.headline[["baseline", "policy"]].values.tolist() == expected[["baseline", "policy"]].values.tolist()
    assert s.headline["speedup"].tolist() == pytest.approx(expected["speedup"].tolist())
    assert (s.headline["applications"] == expected["n"]).all() and "machine" not in s.to_dict()["headline"][0]
    assert len(s.cpu) == len(cpu_cost(trials)) and {"server_cpu_per_request", "generator_cpu_per_request"} <= set(
        s.cpu.columns)
    assert s.failed.columns.tolist() == ["policy", "trial", "reason"]


def test_summarize_without_successful_trials_or_a_trial_table():
    from tuna_lab.analysis import summarize

    trials = pd.DataFrame({"policy": ["cfs"], "trial": [0], "trial_status": ["failed"], "reason": ["timeouts"],
                           "p50": [np.nan], "p99": [np.nan]})
    s = summarize(None, trials)
    assert s.summary.empty and s.speedups.empty and s.headline.empty
    assert s.to_text().startswith("no successful trials")
    assert s.failed.to_dict("records") == [{"policy": "cfs", "trial": 0, "reason": "timeouts"}]
    with pytest.raises(AnalysisError, match="trial table"):
        summarize(pd.DataFrame({"policy": ["cfs"]}))


# ------------------------------------------------------------ one way to write an interval


def test_format_interval_writes_every_kind_of_interval_one_way():
    assert format_interval(0.5243, 2.1) == "[0.52, 2.10]"
    assert format_interval(12.25, 80.0, digits=1) == "[12.2, 80.0]"
    assert format_interval(0.0031, 31.69) == "[0.0031, 31.69]"              # a positive bound never reads 0
    assert format_interval(0.0, math.inf, digits=1) == "[0.0, inf]"       # a race's rate without a failing step
    assert format_interval(195, None, digits=0) == "[195, inf]"           # quantile_rank_interval's None
    # fewer than MIN_INTERVAL_TRIALS trials: no interval at all, and the text says why
    assert format_interval(np.float64("nan"), np.float64("nan")) == "(too few trials for an interval)"
    assert format_interval(1.0, float("nan")) == "(too few trials for an interval)"


def test_terminal_report_table_and_figure_show_one_interval(tmp_path):
    """A run of one configuration, as the demo's: the same speedup interval, digit for digit, everywhere."""
    from tuna_lab.analysis import summarize
    from tuna_lab.analysis.figures import speedup_bars
    from tuna_lab.measure.experiment import load_results

    # A stored cell of 5 trials per policy.
    requests, trials, _ = load_results(SWEEP_2CPU.parent / "sched-2cpu" / "w2-t2-medium-b100")
    run = summarize(requests, trials)
    text = run.to_text()
    report = html.unescape(write_report(requests, trials, tmp_path / "r.html").read_text("utf-8"))
    summary = speedup_summary(scenario_stats(trial_stats(requests, trials)))
    finest = summary[summary["group"].eq("subscription+model+batch")]
    hovers = {t.name: t.customdata[0][1] for t in speedup_bars(finest).data}
    for row in run.speedups.itertuples():
        interval = format_interval(row.ci_low, row.ci_high)
        assert interval and 0 < row.ci_low < row.speedup < row.ci_high < math.inf
        assert f"{row.policy} vs cfs: p99 speedup {row.speedup:.2f}x {interval} (95% interval)" in text
        assert f"{row.speedup:.2f} {interval}" in report                # the comparisons table
        assert hovers[f"{row.policy} vs cfs"] == interval              # the bar chart's hover
    shown = text + re.sub(r"<script.*?</script>", "", report, flags=re.DOTALL)     # not plotly.js's code
    # A rank correlation's interval may go below zero (the scheduler evidence's rows say "Spearman").
    shown = re.sub(r"<tr>(?:(?!</tr>).)*Spearman(?:(?!</tr>).)*</tr>", "", shown, flags=re.DOTALL)
    assert "Fieller" not in shown and not re.search(r"\[-\d", shown) and ", -]" not in shown
    # On 2 CPUs the report says, once, what such a run can show.
    assert report.count(scale_note(2)) == 1


def test_scale_note_says_what_a_small_machine_can_show():
    note = scale_note(2)
    assert note.startswith("note: on 2 usable CPUs (fewer than 16)") and "\n" not in note
    assert "demonstrates the method, not the article's effect" in note and "docs/article.md" in note
    assert scale_note(1).startswith("note: on 1 usable CPU (") and scale_note(16) == scale_note(64) == ""


def test_run_json_writes_null_for_an_interval_it_cannot_bound():
    from tuna_lab.cli.options import print_json

    import contextlib
    import io
    import json

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_json({"ci_low": 0.5, "ci_high": math.inf, "none": float("nan")})
    assert json.loads(out.getvalue()) == {"ci_low": 0.5, "ci_high": None, "none": None}


def test_readme_notebook_06_and_the_report_say_one_thing_about_intervals():
    import json

    root = Path(__file__).resolve().parent.parent
    readme = " ".join((root / "README.md").read_text("utf-8").replace("`", "").split())
    assert INTERVALS in readme
    nb = json.loads((root / "notebooks" / "06_sweep_and_analysis.ipynb").read_text("utf-8"))
    printed = ["".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert any(INTERVALS in text for text in printed)
    # The report's sentence is checked where the report is written (test_write_report_is_one_self_contained_file).


@pytest.mark.server
def test_demo_says_under_its_speedups_what_this_machine_can_show(tmp_path):
    """``tuna-lab demo`` live and cut short: its speedups, each interval positive, then the scale line.

    In this process (what the command prints is under test, not its process), and as short as a demo with
    intervals gets: three trials (an interval needs MIN_INTERVAL_TRIALS) of a few requests each, the lab servers' starts
    and warm-ups being most of its time.
    """
    from helpers import main

    from tuna_lab.machine import Limits

    p = main("demo", "--trials", "3", "--requests", "10", "--out", tmp_path, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    speedups = [i for i, line in enumerate(lines) if " vs cfs: p99 speedup " in line]
    assert len(speedups) == 2 and "(95% interval)" in lines[speedups[-1]], p.stdout[-2000:]
    # No interval of a positive quantity below zero; a rank correlation's (the scheduler evidence's) may be.
    positive = "\n".join(line for line in lines if "Spearman" not in line)
    assert not re.search(r"\[-\d", positive) and "Fieller" not in p.stdout
    assert "scheduler evidence per policy" in p.stdout          # after the scale line, not between
    note = scale_note(Limits.read().effective_cpus)
    if note:            # this machine is too small for the article's effect: said once, right there
        assert lines[speedups[-1] + 1] == note and lines.count(note) == 1
    else:
        assert "usable CPUs (fewer than" not in p.stdout
    assert (tmp_path / "demo" / "report.html").is_file()
    # Issue 49: what 3 trials can tell comes first, the verdict in words after the scale line, the next steps last.
    first = next(i for i, line in enumerate(lines) if line.startswith("What this run can tell: "))
    assert lines[first].startswith("What this run can tell: 3 trials x 10 requests per policy on ") and \
        lines[first + 1].split()[:2] == ["policy", "p50"]
    verdict = next(line for line in lines if line.startswith("verdict: "))
    assert lines.index(verdict) > speedups[-1] and "cfs" in verdict
    assert lines[-4] == "Where to go next:" and "`tuna-lab report " in lines[-3]
    assert "`make lab`" in lines[-2] and "notebook 01" in lines[-2]
    assert "step=" not in p.stdout and "scenario 2" not in p.stdout


def test_the_race_chart_writes_each_rate_interval_as_the_tables_do():
    from tuna_lab.analysis.figures import race_rounds
    from tuna_lab.measure.tune.tuner import read_tune

    result = read_tune(str(Path(__file__).resolve().parent.parent / "notebooks" / "data" / "tune-2cpu"))
    fig = race_rounds(result.history, result.sla_p99)
    last = result.history[result.history["round"] == result.history["round"].max()].set_index("candidate")
    shown = dict(zip(fig.data[-1].y, fig.data[-1].customdata, strict=True))
    assert shown == {c: format_interval(r["rate_low"], r["rate_high"], 1) for c, r in last.iterrows()}
    assert any(text.endswith(", inf]") for trace in fig.data for text in trace.customdata)   # no upper bound yet
    assert all(t.hovertemplate.endswith("interval %{customdata}<extra></extra>") for t in fig.data)  # no "inf/s"
