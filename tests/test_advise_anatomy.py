"""The advisor's per-request features: the tail's shares of the cfs requests, offered and judged honestly.

The synthetic sweep: a hidden contention ``c`` per configuration, drawn at random so that nothing the
advisor knew before (W, T, model, batch, the machine, the cfs stage times) predicts it. Under cfs the
serving thread waits for a CPU for a share ``c`` of every request's latency; pinning removes that wait,
so tuna-scatter's p99 speedup over cfs is ``1 + c``. With the tail's shares as features the advisor can
see ``c``; without them it cannot: the held-out error must say so.
"""

import json

import numpy as np
import pandas as pd
import pytest

from tuna_lab.analysis.advise import feature_table, train
from tuna_lab.analysis.advise.advisor import NO_TAIL_FEATURES, tail_note
from tuna_lab.analysis.advise.features import ANATOMY_COLUMNS

CPUS = 8
CONFIGS = [(w, t, m, b) for w in (1, 2, 4, 8) for t in (1, 2) for m in ("small", "medium") for b in (100, 500)]
TRIALS, REQUESTS = 3, 100
SCHED = ["rq_wait_main", "backlog_seconds"]


def sweep(seed=0):
    """(requests, trials, contention by cell): per-request evidence on the cfs requests of every trial."""
    rng = np.random.default_rng(seed)
    requests, trials, contention = [], [], {}
    for w, t, m, b in CONFIGS:
        cell = f"w{w}-t{t}-{m}-b{b}"
        c = contention[cell] = float(rng.uniform(0.0, 0.6))
        base = 0.01 * b / 100 * (2 if m == "medium" else 1)
        keys = {"cell": cell, "workers": w, "threads": t, "cpus": CPUS, "model": m, "batch": b}
        for trial in range(TRIALS):
            for policy, speedup in (("cfs", 1.0), ("tuna-scatter", 1.0 + c)):
                trials.append({**keys, "policy": policy, "trial": trial, "trial_status": "ok",
                               "p99": base / speedup * rng.lognormal(0, 0.02)})
            lat = base * rng.uniform(0.5, 1.5, REQUESTS)
            # The stage times do not depend on c: only the scheduler's evidence carries it.
            requests.append(pd.DataFrame({
                **keys, "policy": "cfs", "trial": trial, "status": 200, "client_seconds": lat,
                "cpu_main": 0.3 * lat, "rq_wait_main": c * lat, "backlog_seconds": 0.05 * lat,
                "deserialize": 1e-4, "convert": 1e-4, "dmatrix": base * 0.1, "predict": base * 0.2,
                "shap": base * 0.5, "server_seconds": base * 0.8}))
    return pd.concat(requests, ignore_index=True), pd.DataFrame(trials), contention


@pytest.fixture(scope="module")
def frames():
    return sweep()


@pytest.fixture(scope="module")
def advisor(frames):
    requests, trials, _ = frames
    return train((requests, trials), n_splits=4)


def test_the_tail_shares_are_the_cfs_requests_anatomy(frames):
    requests, trials, contention = frames
    table = feature_table(requests, trials)
    assert set(ANATOMY_COLUMNS) <= set(table.columns)
    got = table.set_index("cell")
    for cell, c in list(contention.items())[:4]:
        # Every request waited c of its latency: the slowest 1% and the median alike.
        assert got.loc[cell, "cfs_tail_cpu_wait"] == pytest.approx(c)
        assert got.loc[cell, "cfs_median_cpu_wait"] == pytest.approx(c)
        assert got.loc[cell, "cfs_tail_running"] == pytest.approx(0.3)
        assert got.loc[cell, "cfs_tail_rest"] == pytest.approx(max(0.0, 1 - 0.35 - c))


def test_where_the_shares_carry_the_signal_the_error_with_them_is_lower(advisor):
    e = advisor.evaluation.set_index("model")["mae"]
    w = advisor.without_tail.set_index("model")["mae"]
    assert "cfs_tail_cpu_wait" in advisor.features
    assert e["xgboost"] < w["xgboost"] and e["xgboost"] < e["constant"]
    # The constant ignores the features: the same folds give it the same error both ways.
    assert w["constant"] == pytest.approx(e["constant"])
    note = advisor.tail_note
    assert note.startswith(f"held-out MAE (xgboost) {e['xgboost']:.3f} with the tail's shares, "
                           f"{w['xgboost']:.3f} without, constant {e['constant']:.3f}")
    assert note.endswith("the tail's shares help on these data")


def test_the_advice_says_it_in_one_line(advisor):
    rec = advisor.recommend(2, 2, "medium", batch=100, topology="core:4 pu:2")
    assert advisor.tail_note in rec.notes and "\n" not in advisor.tail_note
    assert advisor.tail_note in str(rec)
    assert advisor.tail_note in json.loads(json.dumps(rec.to_dict()))["notes"]


def test_without_per_request_columns_the_old_features_and_one_line_saying_so(frames):
    requests, trials, _ = frames
    old = requests.drop(columns=SCHED)
    table = feature_table(old, trials)
    assert not set(ANATOMY_COLUMNS) & set(table.columns)
    adv = train((old, trials), n_splits=4)
    assert adv.without_tail is None and adv.tail_note == NO_TAIL_FEATURES
    assert not [f for f in adv.features if f.startswith(("cfs_tail_", "cfs_median_"))]
    assert NO_TAIL_FEATURES in adv.recommend(2, 2, "medium", topology="core:4 pu:2").notes


def test_columns_present_but_empty_are_no_shares(frames):
    # A user's app sends no evidence: the columns exist (NaN), and must not become features of 0.
    requests, trials, _ = frames
    table = feature_table(requests.assign(rq_wait_main=np.nan, backlog_seconds=np.nan), trials)
    assert not set(ANATOMY_COLUMNS) & set(table.columns)


def test_cells_recorded_before_the_evidence_get_missing_shares_not_zeros(frames):
    requests, trials, _ = frames
    older = requests["cell"].isin(["w1-t1-small-b100", "w8-t2-medium-b500"])
    mixed = requests.assign(rq_wait_main=requests["rq_wait_main"].mask(older),
                            backlog_seconds=requests["backlog_seconds"].mask(older))
    table = feature_table(mixed, trials).set_index("cell")
    assert table.loc[["w1-t1-small-b100", "w8-t2-medium-b500"], "cfs_tail_cpu_wait"].isna().all()
    assert table.drop(index=["w1-t1-small-b100", "w8-t2-medium-b500"])["cfs_tail_cpu_wait"].notna().all()


@pytest.mark.parametrize("with_, without, constant, end", [
    (0.5, 0.8, 0.9, "the tail's shares help on these data"),
    (0.81, 0.89, 0.75, "neither beats the constant: nothing is learnt on these data"),
    (0.9, 0.89, 0.75, "the tail's shares do not help on these data"),
    (0.89, 0.89, 0.95, "the tail's shares do not help on these data"),
])
def test_the_note_says_only_what_the_errors_show(with_, without, constant, end):
    e = pd.DataFrame({"model": ["xgboost", "linear", "constant"], "mae": [with_, 1.0, constant]})
    note = tail_note(e, e.assign(mae=[without, 1.0, constant]))
    assert note.endswith(end)
    assert f"{with_:.3f} with the tail's shares, {without:.3f} without, constant {constant:.3f}" in note


def test_no_successful_cfs_request_gives_no_shares_and_no_crash(frames):
    # Evidence recorded, but every cfs request failed: nothing to take apart, and no share of 0 made up.
    requests, trials, _ = frames
    table = feature_table(requests.assign(status=503), trials)
    assert not set(ANATOMY_COLUMNS) & set(table.columns)
