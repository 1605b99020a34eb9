"""The advisor on synthetic sweeps with a known answer, its grouped split, coverage, errors and CLI.

The synthetic sweep: an 8-cpu machine (4 cores x 2-way SMT), every W in
1, 2, 4, 8 x T in 1, 2, 4 x models small, medium x batches 100, 500, under
cfs, round-robin and tuna-scatter, 3 trials each. The true p99 speedup over
cfs is a bump in the oversubscription ratio ``W*T/cpus`` (pinning pays only
for moderate oversubscription) - a shape no linear model can follow.
"""

import argparse
import json
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuna_lab import Topology
from tuna_lab.analysis.advise import (
    DEFAULT_RESULTS,
    Advisor,
    Recommendation,
    feature_table,
    grouped_folds,
    train,
)
from tuna_lab.cli.commands.advise import add_parser
from tuna_lab.errors import AdviseError, ExperimentError

CPUS = 8
TOPOLOGY = Topology.synthetic("core:4 pu:2")
WORKERS, THREADS, MODELS, BATCHES = (1, 2, 4, 8), (1, 2, 4), ("small", "medium"), (100, 500)
TRIALS = 3


def true_speedup(policy, oversubscription):
    """Pinning pays for moderate oversubscription only: a bump, flat elsewhere."""
    bump = np.exp(-((np.log2(oversubscription) - 1.0) ** 2))   # peaks at W*T/cpus = 2
    return 1.0 + {"tuna-scatter": 0.6, "round-robin": 0.3}.get(policy, 0.0) * bump


def synthetic(workers=WORKERS, threads=THREADS, models=MODELS, batches=BATCHES, wait=None, noise=0.02,
              seed=0, policies=("cfs", "round-robin", "tuna-scatter")):
    """(requests, trials, manifests) shaped like ``experiment.load_results``' output."""
    rng = np.random.default_rng(seed)
    trials, requests, manifests = [], [], []
    topo = {k: v for k, v in TOPOLOGY.to_dict().items() if k != "distance"}
    for w in workers:
        for t in threads:
            for m in models:
                for b in batches:
                    cell = f"w{w}-t{t}-{m}-b{b}" + (f"-{wait}" if wait and wait != "default" else "")
                    manifests.append({"cell": cell, "topology": topo})
                    base = 0.01 * b / 100 * (2 if m == "medium" else 1) * max(1.0, w * t / CPUS)
                    for trial in range(TRIALS):
                        for policy in policies:
                            p99 = base / true_speedup(policy, w * t / CPUS) * rng.lognormal(0, noise)
                            row = {"cell": cell, "policy": policy, "workers": w, "threads": t, "cpus": CPUS,
                                   "model": m, "batch": b, "trial": trial, "trial_status": "ok", "p99": p99}
                            if wait is not None:
                                row["wait_policy"] = wait
                            trials.append(row)
                        for shap in base * 0.5 * rng.lognormal(0, noise, 4):     # 4 cfs requests
                            requests.append({
                                "cell": cell, "policy": "cfs", "workers": w, "threads": t, "cpus": CPUS,
                                "model": m, "batch": b, "trial": trial, "status": 200, "deserialize": 1e-4,
                                "convert": 1e-4, "dmatrix": base * 0.1, "predict": base * 0.2, "shap": shap,
                                "server_seconds": shap + base * 0.3})
    return pd.DataFrame(requests), pd.DataFrame(trials), manifests


@pytest.fixture(scope="module")
def frames():
    return synthetic()


@pytest.fixture(scope="module")
def advisor(frames):
    return train(frames, n_splits=6)


# -- training and evaluation ---------------------------------------------------------------


def test_feature_table_has_one_row_per_configuration_and_pinning_policy(frames):
    table = feature_table(*frames)
    n_configs = len(WORKERS) * len(THREADS) * len(MODELS) * len(BATCHES)
    assert len(table) == n_configs * 2
    assert set(table["policy"]) == {"round-robin", "tuna-scatter"}
    assert (table["wait_policy"] == "default").all()             # no wait_policy column: the default
    row = table[(table["workers"] == 4) & (table["threads"] == 4) & (table["model"] == "small")
                & (table["batch"] == 100) & (table["policy"] == "tuna-scatter")].iloc[0]
    assert row["oversubscription"] == 2.0
    assert row["speedup"] == pytest.approx(true_speedup("tuna-scatter", 2.0), rel=0.05)
    assert (row["cpus"], row["physical_cores"], row["smt_ways"], row["numa_nodes"]) == (8, 4, 2, 1)
    assert row["model_features"] == 29
    # The cfs stage medians, in ms.
    assert row["cfs_dmatrix_ms"] == pytest.approx(0.01 * 2 * 0.1 * 1e3)


def test_target_is_the_analysis_speedup_ratio_of_mean_p99s(frames):
    _, trials, manifests = frames
    table = feature_table(pd.DataFrame(), trials, manifests)
    t = trials[(trials["cell"] == "w2-t4-medium-b500")]
    expected = t[t["policy"] == "cfs"]["p99"].mean() / t[t["policy"] == "round-robin"]["p99"].mean()
    got = table[(table["cell"] == "w2-t4-medium-b500") & (table["policy"] == "round-robin")]["speedup"]
    assert float(got.iloc[0]) == pytest.approx(expected)
    assert table["cfs_shap_ms"].isna().all()                      # no requests: stage features missing


def test_boosted_regressor_beats_the_linear_baseline_on_held_out_configurations(advisor):
    e = advisor.evaluation.set_index("model")
    assert set(e.index) == {"xgboost", "linear", "constant"}
    assert e.loc["xgboost", "configurations"] == 48 and e.loc["xgboost", "folds"] == 6
    assert e.loc["xgboost", "scheme"] == "6-fold, grouped by configuration"
    assert e.loc["xgboost", "mae"] < e.loc["linear", "mae"]
    assert e.loc["xgboost", "r2"] > 0.8 > e.loc["linear", "r2"]
    # The metrics are those of the stored held-out predictions.
    p = advisor.predictions
    assert e.loc["linear", "mae"] == pytest.approx(np.mean(np.abs(p["speedup"] - p["linear"])))


def test_constant_baseline_is_cross_validated_on_the_regressors_folds(advisor):
    # Recomputed from the stored held-out predictions: each fold's constant is the geometric mean of
    # the speedups of the rows *outside* that fold, never of the rows it is judged on.
    p = advisor.predictions
    for fold in p["fold"].unique():
        test = p["fold"] == fold
        expected = np.exp(np.log(p.loc[~test, "speedup"]).mean())
        assert p.loc[test, "constant"].to_numpy() == pytest.approx(np.full(test.sum(), expected))
    e = advisor.evaluation.set_index("model")
    assert e.loc["constant", "mae"] == pytest.approx(np.mean(np.abs(p["speedup"] - p["constant"])))
    assert e.loc["constant", "folds"] == e.loc["xgboost", "folds"] == 6
    # Not the in-sample spread: held out, a constant predicts worse than the mean of all the rows would.
    in_sample = np.mean(np.abs(p["speedup"] - np.exp(np.log(p["speedup"]).mean())))
    assert e.loc["constant", "mae"] > in_sample
    assert e.loc["constant", "r2"] < 0
    # The planted bump is learnt: XGBoost beats the yardstick by far, and the advice does not warn.
    assert e.loc["xgboost", "mae"] < 0.5 * e.loc["constant", "mae"]
    assert not any("no better than a constant" in n for n in advisor.recommend(2, 4, "small").notes)
    assert "constant" in repr(advisor)


def test_without_an_effect_the_advice_says_xgboost_beats_no_constant():
    # Pinning changes nothing here (every policy's p99 is cfs's, up to noise): nothing to learn.
    requests, trials, manifests = synthetic(noise=0.05, seed=3)
    trials = trials.copy()
    base = trials[trials["policy"] == "cfs"].set_index(["cell", "trial"])["p99"]
    trials["p99"] = [base[(c, t)] * f for c, t, f in
                     zip(trials["cell"], trials["trial"], np.random.default_rng(1).lognormal(0, 0.05, len(trials)))]
    advisor = train((requests, trials, manifests), n_splits=6)
    e = advisor.evaluation.set_index("model")
    assert e.loc["xgboost", "mae"] >= e.loc["constant", "mae"]
    rec = advisor.recommend(2, 4, "small", topology=TOPOLOGY)
    assert any("XGBoost did no better than a constant" in n for n in rec.notes)


def test_a_model_no_better_than_the_constant_never_advises_pinning_on_its_own_word():
    # No effect anywhere but one configuration, where tuna-scatter is measured 1.5x faster with tight trials:
    # XGBoost cannot learn one planted row, so only that configuration's own measurement may advise pinning.
    requests, trials, manifests = synthetic(noise=0.05, seed=3)
    trials = trials.copy()
    base = trials[trials["policy"] == "cfs"].set_index(["cell", "trial"])["p99"]
    trials["p99"] = [base[(c, t)] * f for c, t, f in
                     zip(trials["cell"], trials["trial"], np.random.default_rng(1).lognormal(0, 0.05, len(trials)))]
    planted = (trials["cell"] == "w2-t4-small-b100") & (trials["policy"] == "tuna-scatter")
    trials.loc[planted, "p99"] = base["w2-t4-small-b100"].mean() / 1.5 * np.array([0.99, 1.0, 1.01])
    advisor = train((requests, trials, manifests), n_splits=6)
    e = advisor.evaluation.set_index("model")
    assert e.loc["xgboost", "mae"] >= e.loc["constant", "mae"]
    table = advisor.table

    rec = advisor.recommend(2, 4, "small", topology=TOPOLOGY)
    assert not rec.learnt and rec.pin and rec.best_policy == "tuna-scatter"
    policy, speedup, low, high = rec.measured
    row = table[(table["cell"] == "w2-t4-small-b100") & (table["policy"] == "tuna-scatter")].iloc[0]
    assert (speedup, low, high) == pytest.approx((row["speedup"], row["speedup_low"], row["speedup_high"]))
    assert 1 < low < speedup < high and speedup == pytest.approx(1.5, rel=0.1)
    assert rec.verdict.startswith("pin with tuna-scatter: measured p99 speedup 1.5")
    assert "cannot tell placements apart" in rec.verdict
    assert rec.to_dict()["measured"]["policy"] == "tuna-scatter" and rec.to_dict()["learnt"] is False

    # Every other measured configuration: pin only where its own measured interval lies above 1.
    for cell in ["w1-t1-medium-b500", "w4-t4-small-b100", "w8-t2-medium-b100"]:
        w, t, m, b = cell.split("-")
        rec = advisor.recommend(int(w[1:]), int(t[1:]), m, batch=int(b[1:]), topology=TOPOLOGY)
        above = table[(table["cell"] == cell) & (table["speedup_low"] > 1)]
        assert rec.pin == (not above.empty) and not rec.learnt
        if above.empty:
            assert rec.measured is None and rec.verdict == (
                "do not pin on this evidence: the sweep's data cannot tell placements apart (XGBoost did no better "
                "than a constant), and no policy's measured speedup in this configuration has an interval above 1")
    # A configuration never measured: never pin, whatever XGBoost predicts.
    for w, t in [(3, 1), (3, 3), (6, 2), (2, 3)]:
        rec = advisor.recommend(w, t, "small", topology=TOPOLOGY)
        assert not rec.pin and rec.measured is None
        assert rec.verdict.endswith("and this configuration was not measured")


def test_without_scikit_learn_the_advisor_says_what_to_install():
    import subprocess
    import sys

    code = ("import sys; sys.modules['sklearn'] = None\n"
            "from tuna_lab.analysis.advise import grouped_folds\n"
            "grouped_folds(['a', 'b'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == ("tuna_lab.errors.AdviseError: the advisor needs scikit-learn, "
                                                   "which the slim install leaves out: pip install 'tuna_lab[advise]'")


def test_fit_is_explicit_and_the_constructor_only_stores(frames, advisor):
    table = feature_table(*frames)
    fitted = Advisor.fit(table, n_splits=6)
    pd.testing.assert_frame_equal(fitted.evaluation, advisor.evaluation)     # what train() does
    pd.testing.assert_frame_equal(fitted.predictions, advisor.predictions)
    # Built from its parts, an advisor trains nothing: no regressor, yet its evaluation is there.
    stored = Advisor(table, {}, advisor.evaluation, advisor.predictions)
    assert stored.mae == advisor.mae and stored.policies == ["round-robin", "tuna-scatter"]
    assert stored.features == advisor.features and "speedup" not in stored.features


def test_importance_finds_the_feature_the_speedup_depends_on(advisor):
    imp = advisor.importance()
    assert imp.iloc[0]["feature"] == "oversubscription"
    assert sorted(imp["feature"]) == sorted(advisor.features)
    assert imp["share"].sum() == pytest.approx(1.0)


def test_held_out_predictions_never_saw_their_configuration(frames):
    # A configuration measured with a wildly different speedup than the rest:
    # a model that saw it in training would predict it; held out, it cannot.
    requests, trials, manifests = frames
    trials = trials.copy()
    odd = (trials["cell"] == "w4-t1-small-b100") & (trials["policy"] == "tuna-scatter")
    trials.loc[odd, "p99"] /= 5
    advisor = train((requests, trials, manifests), n_splits=6)
    p = advisor.predictions.set_index(["cell", "policy"])
    assert p.loc[("w4-t1-small-b100", "tuna-scatter"), "speedup"] > 4
    assert p.loc[("w4-t1-small-b100", "tuna-scatter"), "xgboost"] < 2


def test_leave_one_configuration_out_with_few_configurations():
    advisor = train(synthetic(workers=(1, 2, 4, 8), threads=(2,), models=("small",), batches=(100,)))
    e = advisor.evaluation.set_index("model")
    assert e.loc["xgboost", "scheme"] == "leave one configuration out"
    assert e.loc["xgboost", "folds"] == 4 and e.loc["xgboost", "rows"] == 8
    # More features than rows: the ridge-penalised baseline still predicts finite, sane speedups.
    assert len(advisor.features) > 8
    assert advisor.predictions["linear"].between(0.5, 2).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=2, max_size=60).filter(lambda g: len(set(g)) >= 2),
       st.data())
def test_grouped_split_never_puts_a_configuration_on_both_sides(groups, data):
    k = len(set(groups))
    n_splits = data.draw(st.one_of(st.none(), st.integers(2, k)))
    folds = grouped_folds(groups, n_splits, seed=data.draw(st.integers(0, 5)))
    assert len(folds) == (n_splits or (k if k <= 12 else 10))
    labels = np.asarray(groups)
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested.tolist()) == list(range(len(groups)))          # every row held out exactly once
    for train_idx, test_idx in folds:
        assert len(test_idx) and len(train_idx)
        assert not set(labels[train_idx]) & set(labels[test_idx])
        assert sorted(np.r_[train_idx, test_idx].tolist()) == list(range(len(groups)))


def test_grouped_folds_reject_bad_arguments():
    with pytest.raises(AdviseError, match="at least 2 configurations"):
        grouped_folds(["a", "a"])
    with pytest.raises(AdviseError, match="n_splits"):
        grouped_folds(["a", "b", "c"], n_splits=4)


# -- recommendations ---------------------------------------------------------------------------


def test_recommends_pinning_where_it_pays_and_not_where_it_does_not(advisor):
    rec = advisor.recommend(4, 4, "small", batch=100, topology=TOPOLOGY)      # W*T/cpus = 2: the bump
    assert isinstance(rec, Recommendation)
    assert rec.covered and rec.coverage == []
    assert rec.best_policy == "tuna-scatter" and rec.pin
    assert rec.predicted_speedup == pytest.approx(1.6, abs=0.15)
    assert list(rec.predictions["policy"]) == ["tuna-scatter", "round-robin", "cfs"]
    assert rec.predictions.set_index("policy").loc["cfs", "xgboost"] == 1.0
    # The constant baseline beside it: every pinning policy gets the training rows' geometric-mean speedup.
    constant = rec.predictions.set_index("policy")["constant"]
    assert constant.drop("cfs").to_numpy() == pytest.approx(np.exp(np.log(advisor.table["speedup"]).mean()))
    assert "(xgboost; baselines: linear, constant)" in str(rec)
    # The evidence: the configuration itself first (it was measured), with its measured speedups.
    first = rec.evidence.iloc[0]
    assert first["cell"] == "w4-t4-small-b100" and first["distance"] == 0
    assert first["measured tuna-scatter"] == pytest.approx(1.6, rel=0.05)
    assert "was measured" in rec.notes[0]

    flat = advisor.recommend(1, 1, "medium", batch=500, topology=TOPOLOGY)    # W*T/cpus = 1/8: flat
    assert not flat.pin and flat.verdict.startswith("do not pin")


def test_a_configuration_outside_the_results_is_said_to_be_so(advisor):
    rec = advisor.recommend(16, 4, "large", batch=100, wait_policy="active", topology=TOPOLOGY)
    assert not rec.covered
    text = "\n".join(rec.coverage)
    assert "W = 16 is outside the measured range 1-8" in text
    assert "W*T/cpus = 8 is outside the measured range 0.125-4" in text
    assert "model 'large' was not measured" in text
    assert "wait policy 'active' was not measured" in text
    assert "outside what the results cover" in rec.verdict
    assert "OUTSIDE what the results cover" in str(rec)
    assert "nearest measured configuration" in rec.notes[0]

    other = advisor.recommend(2, 2, "small", topology="xeon-8272cl")      # another machine
    assert not other.covered
    assert any("the machine (32 cpus" in c and "was not measured" in c for c in other.coverage)


def test_recommendation_is_json_able(advisor):
    out = json.loads(json.dumps(advisor.recommend(2, 4, "medium", batch=100, topology=TOPOLOGY).to_dict()))
    assert out["best_policy"] in ("round-robin", "tuna-scatter")
    assert {p["policy"] for p in out["predictions"]} == {"cfs", "round-robin", "tuna-scatter"}
    assert out["covered"] is True and out["evidence"][0]["distance"] == 0


def test_given_stage_times_are_used(advisor):
    rec = advisor.recommend(4, 2, "small", topology=TOPOLOGY,
                            stages={"shap": 0.01, "server_seconds": 0.02})
    assert rec.notes[0].startswith("cfs stage times as given")
    with pytest.raises(AdviseError, match="unknown stage"):
        advisor.recommend(4, 2, "small", topology=TOPOLOGY, stages={"shapp": 0.01})


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": 0}, "workers must be a positive integer"),
    ({"batch": -5}, "batch must be a positive integer"),
    ({"model": "huge"}, "unknown model 'huge'"),
    ({"wait_policy": "spin"}, "unknown wait policy 'spin'"),
    ({"topology": "no-such-machine"}, "no-such-machine"),
])
def test_malformed_questions_are_errors(advisor, kwargs, match):
    question = {"workers": 2, "threads": 2, "model": "small", "topology": TOPOLOGY, **kwargs}
    with pytest.raises(AdviseError, match=match):
        advisor.recommend(**question)


def test_wait_policies_are_configurations_of_their_own():
    # The same W x T x model x batch under two wait policies: two configurations
    # (not pooled), with different speedups the advisor can tell apart.
    req_a, tri_a, man_a = synthetic(models=("small",), batches=(100,), wait="passive")
    req_b, tri_b, man_b = synthetic(models=("small",), batches=(100,), wait="active", seed=1)
    tri_b = tri_b.copy()
    tri_b.loc[tri_b["policy"] != "cfs", "p99"] *= 2            # under "active", pinning halves the speed
    advisor = train((pd.concat([req_a, req_b]), pd.concat([tri_a, tri_b]), man_a + man_b), n_splits=4)
    assert set(advisor.table["wait_policy"]) == {"passive", "active"}
    assert advisor.evaluation.set_index("model").loc["xgboost", "configurations"] == 24
    passive = advisor.recommend(4, 4, "small", wait_policy="passive", topology=TOPOLOGY)
    active = advisor.recommend(4, 4, "small", wait_policy="active", topology=TOPOLOGY)
    assert passive.pin and not active.pin
    assert advisor.recommend(4, 4, "small", topology=TOPOLOGY).coverage == [
        "wait policy 'default' was not measured (measured: active, passive)"]


def test_spin_count_and_cpu_columns_from_newer_results():
    requests, trials, manifests = synthetic(workers=(1, 2, 4, 8), threads=(2,), models=("small",), batches=(100,))
    trials = trials.assign(spincount=1000, cpu_main_per_request=0.01, idle_cpu_share_openmp=0.2)
    trials.loc[trials["workers"] == 1, "idle_cpu_share_openmp"] = np.nan     # e.g. no OpenMP thread there
    trials["cell"] += "-spin1000"
    requests = requests.assign(cell=requests["cell"] + "-spin1000")
    for m in manifests:
        m["cell"] += "-spin1000"
    advisor = train((requests, trials, manifests))
    assert {"spincount", "cfs_cpu_main_per_request", "cfs_idle_cpu_share_openmp"} <= set(advisor.features)
    assert advisor.table["physical_cores"].eq(4).all()             # manifests matched by the spin cells' keys
    assert advisor.table["cfs_idle_cpu_share_openmp"].isna().sum() == 2  # w1's two policies: missing, kept
    rec = advisor.recommend(4, 2, "small", spincount=1000, topology=TOPOLOGY)
    assert rec.covered and rec.evidence.iloc[0]["cell"] == "w4-t2-small-b100-spin1000"
    unset = advisor.recommend(4, 2, "small", topology=TOPOLOGY)
    assert unset.coverage == ["spin count default was not measured (measured: 1000)"]
    with pytest.raises(AdviseError, match="spincount must be"):
        advisor.recommend(4, 2, "small", spincount=-3, topology=TOPOLOGY)


# -- what the results must hold -------------------------------------------------------------------


def test_results_without_cfs_say_what_is_needed():
    requests, trials, manifests = synthetic(policies=("round-robin", "tuna-scatter"))
    with pytest.raises(AdviseError, match="no cfs runs.*--policies cfs"):
        train((requests, trials, manifests))
    requests, trials, manifests = synthetic(policies=("cfs",))
    with pytest.raises(AdviseError, match="only cfs runs"):
        train((requests, trials, manifests))


def test_too_few_configurations_say_what_is_needed():
    frames = synthetic(workers=(1, 2, 4), threads=(1,), models=("small",), batches=(100,))
    with pytest.raises(AdviseError, match="3 configuration.*at least 4"):
        train(frames)


def _write_sweep(root, frames):
    requests, trials, manifests = frames
    for m in manifests:
        cell = root / m["cell"]
        cell.mkdir(parents=True)
        trials[trials["cell"] == m["cell"]].to_parquet(cell / "trials.parquet", index=False)
        requests[requests["cell"] == m["cell"]].to_parquet(cell / "requests.parquet", index=False)
        (cell / "manifest.json").write_text(json.dumps(m))
    return root


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    frames = synthetic(workers=(1, 2, 4, 8), threads=(1, 2), models=("small",), batches=(100,))
    return _write_sweep(tmp_path_factory.mktemp("sweep"), frames)


def test_trains_from_a_results_folder(sweep_dir):
    advisor = train(sweep_dir)
    assert advisor.evaluation.set_index("model").loc["xgboost", "configurations"] == 8
    assert advisor.table["physical_cores"].eq(4).all()            # the manifests' topology


def test_missing_or_corrupt_results_folder_is_one_clear_error(tmp_path):
    with pytest.raises(AdviseError, match=r"no results folder at .*nope.*tuna-lab sweep"):
        train(tmp_path / "nope")
    with pytest.raises(ExperimentError, match="no finished tuna-lab results"):
        train(tmp_path)
    bad = tmp_path / "w1-t1-small-b100"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ExperimentError, match="not a readable tuna-lab result"):
        train(tmp_path)


# -- the command line ------------------------------------------------------------------------------


def _cli(argv, capsys):
    """``tuna-lab ARGV`` through the real entry point: status, stdout, stderr."""
    from tuna_lab import cli

    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_advises_as_text_and_json(sweep_dir, capsys):
    code, out, err = _cli(["advise", "-w", "4", "-t", "1", "--model", "small", str(sweep_dir)],
                          capsys)
    assert code == 0 and err == ""
    assert out.startswith("Should I pin? W=4 x T=1, model small, batch 100")
    assert "held out (leave one configuration out)" in out
    # The yardstick is shown beside the regressors, with the very numbers of the evaluation.
    e = train(sweep_dir).evaluation.set_index("model")
    assert f"constant MAE {e.loc['constant', 'mae']:.3f}" in out and f"xgboost MAE {e.loc['xgboost', 'mae']:.3f}" in out
    code, out, err = _cli(["advise", "-w", "4", "-t", "1", "--model", "small", str(sweep_dir),
                           "--json"], capsys)
    info = json.loads(out)
    assert code == 0 and info["model"] == "small" and info["evaluation"]["configurations"] == 8
    assert set(info["evaluation"]) >= {"xgboost", "linear", "scheme"}


@pytest.mark.parametrize("argv, match", [
    (["RESULTS", "{missing}"], "no results folder at"),
    (["--model", "huge"], "unknown model 'huge'"),
    (["-w", "0"], "workers must be a positive integer"),
])
def test_cli_bad_input_is_one_line_and_status_2(sweep_dir, tmp_path, capsys, argv, match):
    argv = [a.format(missing=tmp_path / "missing") for a in argv]
    base = {"-w": "2", "-t": "1", "--model": "small", "RESULTS": str(sweep_dir)}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    results = base.pop("RESULTS")      # the folder is a positional
    code, out, err = _cli(["advise", results, *[x for kv in base.items() for x in kv]], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and match in err


def test_cli_default_results_folder():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["advise", "-w", "1", "-t", "1", "--model", "small"])
    assert args.results == DEFAULT_RESULTS == os.path.join("results", "sweep")
    assert args.func.__module__ == "tuna_lab.cli.commands.advise" and args.wait_policy == "default" and args.batch is None


def test_cli_wired_into_tuna_lab(sweep_dir, capsys):
    from tuna_lab import cli

    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["advise", "-h"])
    assert exc.value.code == 0 and "RESULTS" in capsys.readouterr().out
    assert cli.main(["advise", "-w", "2", "-t", "1", "--model", "huge", str(sweep_dir)]) == 2
    assert "unknown model 'huge'" in capsys.readouterr().err


# -- results from several machines (a sweep on a cluster) -------------------------------------------


def two_machines():
    """The synthetic sweep measured on two machines of different shapes: machine ``b`` has no SMT."""
    parts = []
    shapes = {"a-1111aaaa": TOPOLOGY, "b-2222bbbb": Topology.synthetic("core:8 pu:1")}
    for seed, (name, topo) in enumerate(shapes.items()):
        requests, trials, manifests = synthetic(workers=(1, 2, 4), threads=(1, 2), models=("small",),
                                                batches=(100,), seed=seed)
        shape = {k: v for k, v in topo.to_dict().items() if k != "distance"}
        parts.append((requests.assign(machine=name), trials.assign(machine=name),
                      [{**m, "machine": name, "topology": shape} for m in manifests]))
    return (pd.concat([p[0] for p in parts], ignore_index=True), pd.concat([p[1] for p in parts], ignore_index=True),
            parts[0][2] + parts[1][2])


def test_each_machine_brings_its_own_rows_topology_and_cfs_measurements():
    from tuna_lab.analysis.advise.features import feature_columns

    requests, trials, manifests = two_machines()
    table = feature_table(requests, trials, manifests)
    assert len(table) == 2 * 6 * 2                           # machines x configurations x pinning policies
    assert list(table.columns[:2]) == ["cell", "machine"] and "machine" not in feature_columns(table)
    shape = table.groupby("machine")[["physical_cores", "smt_ways"]].first()
    assert shape.loc["a-1111aaaa"].tolist() == [4, 2] and shape.loc["b-2222bbbb"].tolist() == [8, 1]
    # The cfs stage medians of one machine's cell are its own, not the two machines' together.
    cell = requests[(requests["cell"] == "w2-t2-small-b100") & (requests["machine"] == "b-2222bbbb")]
    row = table[(table["cell"] == "w2-t2-small-b100") & (table["machine"] == "b-2222bbbb")].iloc[0]
    assert row["cfs_shap_ms"] == pytest.approx(cell["shap"].median() * 1e3)


def test_the_advice_says_which_machines_its_evidence_comes_from():
    advisor = train(two_machines())
    assert advisor.machines == ["a-1111aaaa", "b-2222bbbb"]
    rec = advisor.recommend(2, 2, "small", topology=Topology.synthetic("core:8 pu:1"))
    assert rec.evidence.iloc[0]["machine"] == "b-2222bbbb" and rec.evidence.iloc[0]["distance"] == 0
    assert any(n.startswith("learnt from 2 machine(s): a-1111aaaa, b-2222bbbb") for n in rec.notes)
    assert "b-2222bbbb: w2-t2-small-b100" in str(rec)
    assert rec.to_dict()["evidence"][0]["machine"] == "b-2222bbbb"
