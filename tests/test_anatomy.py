"""Per-request scheduler evidence (issue 50): the worker's reader, the header's round trip, the anatomy of the tail.

The reader and the header are tested in this process (real /proc, real threads); the anatomy on synthetic
request tables whose shares are known by construction; one real lab-server trial checks that the new
columns arrive with plausible values.
"""

import os
import threading
import time

import numpy as np
import pandas as pd
import pytest

from tuna_lab.analysis.anatomy import MEDIAN, NOT_RECORDED, PARTS, TAIL, anatomy, anatomy_line, probe_cost, what_moves
from tuna_lab.analysis.stats import TOO_FEW_TRIALS, format_interval
from tuna_lab.errors import AnalysisError
from tuna_lab.machine.sched import MIGRATIONS_NOTE, KeptCounters, thread_sched
from tuna_lab.measure import records
from tuna_lab.measure.loadgen.server_timing import parse_server_timing, server_timing_metrics
from tuna_lab.measure.records import Records
from tuna_lab.measure.schema import REQUEST_COLUMNS, REQUEST_SCHED_COLUMNS
from tuna_lab.server.app import SCHED_METRICS, sched_delta, sched_timing


# -- the reader -------------------------------------------------------------------------------------------


def _spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_kept_counters_agree_with_the_checked_reader_and_move_with_work():
    kept = KeptCounters()
    me = threading.get_native_id()
    try:
        before = kept.read([me])[me]
        _spin(0.05)
        time.sleep(0.01)     # one voluntary switch at least
        after = kept.read([me])[me]
        checked = thread_sched(os.getpid(), me)
    finally:
        kept.close()
    run, wait, vol, invol, mig, cpu = after
    # On-CPU moved by about the spin (schedstat is brought up to date at switches and ticks).
    assert (run - before[0]) / 1e9 >= 0.04
    assert vol > before[2] and invol >= before[3] and wait >= before[1]
    assert cpu in os.sched_getaffinity(0)
    assert (mig >= 0) == (MIGRATIONS_NOTE is None)
    # The same counters as the checked (slow) reader, read just after.
    assert vol <= checked.voluntary_switches and run / 1e9 <= checked.cpu_seconds + 1e-3
    if MIGRATIONS_NOTE is None:
        assert mig <= checked.migrations


def test_kept_counters_drop_a_thread_that_exited_and_a_tid_that_never_was():
    kept = KeptCounters()
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    tid = t.native_id
    try:
        assert set(kept.read([tid, threading.get_native_id()])) == {tid, threading.get_native_id()}
        done.set()
        t.join()
        # join() returns when Python's thread state is released, a moment before the
        # kernel reaps the task: wait (bounded) until its /proc entry is gone.
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tid not in kept.read([tid]) and kept.read([2 ** 22 + 1]) == {}
        assert tid not in kept._fds        # its descriptors are closed, not leaked
    finally:
        kept.close()
    assert kept._fds == {}


def test_a_kernel_without_proc_sched_reads_the_switches_from_status(monkeypatch):
    # The real files of this kernel, read the way a kernel without CONFIG_SCHED_DEBUG is read.
    from tuna_lab.machine import sched

    monkeypatch.setattr(sched, "MIGRATIONS_NOTE", "no /proc/PID/sched on this kernel")
    kept = KeptCounters()
    me = threading.get_native_id()
    try:
        run, wait, vol, invol, mig, cpu = kept.read([me])[me]
        checked = thread_sched(os.getpid(), me)
    finally:
        kept.close()
    assert mig == -1 and checked.migrations is None
    assert 0 <= vol <= checked.voluntary_switches and 0 <= invol <= checked.involuntary_switches
    assert sched_delta({me: (0, 0, 0, 0, -1, 0)}, {me: (run, wait, vol, invol, mig, cpu)}, me)["migrations"] is None


def test_sched_delta_counts_a_thread_born_during_the_request_from_zero_and_hides_unknown_migrations():
    before = {1: (0, 1_000_000, 1, 1, -1, 0)}
    after = {1: (5, 3_000_000, 2, 4, -1, 1), 7: (1, 500_000, 3, 0, -1, 0)}
    d = sched_delta(before, after, caller=1)
    assert d["wait"] == pytest.approx(2.5e-3) and d["wait_main"] == pytest.approx(2e-3)
    assert (d["voluntary"], d["involuntary"], d["migrations"], d["last_cpu"]) == (4, 3, None, 1)
    # A caller that was not read: no share of its own, no CPU.
    d = sched_delta({}, {}, caller=1)
    assert d["wait_main"] is None and d["last_cpu"] is None and d["migrations"] is None


# -- the header, server to request table -------------------------------------------------------------------


def test_every_sched_metric_the_server_sends_is_a_column_the_generator_reads():
    read = {name for name, (column, _, _) in records._SCHED_METRICS.items()}
    assert read == set(SCHED_METRICS) - {"app", "cpu"}
    # Named apart from a user's own metrics, which the generator reads from any server.
    assert all(name.startswith("tuna-") for name in read)
    assert {column for column, _, _ in records._SCHED_METRICS.values()} == set(REQUEST_SCHED_COLUMNS) - {
        "backlog_seconds"}
    assert set(REQUEST_SCHED_COLUMNS) <= set(REQUEST_COLUMNS)


def _frame(timings, starts=None, sent=None, origin=100.0):
    n = len(timings)
    rec = Records(n)
    rec.status[:] = 200
    for i in range(n):
        rec.raw[i] = b'{"server_seconds": 0.012, "pid": 7, "started": %r}' % (
            float("nan") if starts is None else starts[i])
        rec.timing[i] = None if timings[i] is None else timings[i].encode("latin-1")
    rec.sent[:] = 0.0 if sent is None else sent
    rec.done[:] = 1.0
    rec.scheduled[:] = rec.sent
    rec.origin = origin
    return rec.frame({})


def test_the_header_round_trips_into_the_request_columns():
    delta = {"wait": 0.0021, "wait_main": 0.0005, "voluntary": 3, "involuntary": 9, "migrations": 2,
             "last_cpu": 1}
    header = sched_timing(0.012, 0.020, delta)
    assert parse_server_timing(header) == pytest.approx(0.012)   # server_seconds stays the app's
    frame = _frame([header, None], starts=[100.25, 100.5], sent=[0.0, 0.25])
    row = frame.iloc[0]
    assert row["rq_wait"] == pytest.approx(0.0021) and row["rq_wait_main"] == pytest.approx(0.0005)
    assert (row["switches_voluntary"], row["switches_involuntary"], row["request_migrations"], row["last_cpu"]) \
        == (3, 9, 2, 1)
    assert row["backlog_seconds"] == pytest.approx(0.25)
    # A response without the header has no evidence (NaN, never 0) but still its backlog.
    assert frame.iloc[1][list(REQUEST_SCHED_COLUMNS[:-1])].isna().all()
    assert frame.iloc[1]["backlog_seconds"] == pytest.approx(0.25)


def test_a_kernel_without_migrations_and_a_bad_header_leave_nan():
    delta = {"wait": 0.001, "wait_main": 0.0, "voluntary": 0, "involuntary": 0, "migrations": None,
             "last_cpu": 0}
    frame = _frame([sched_timing(0.01, 0.01, delta), "tuna-rq;dur=oops, ,;", "tuna-rq;dur=-5"])
    assert np.isnan(frame.iloc[0]["request_migrations"]) and frame.iloc[0]["rq_wait"] == pytest.approx(0.001)
    assert frame.iloc[1][list(REQUEST_SCHED_COLUMNS)].isna().all()
    assert np.isnan(frame.iloc[2]["rq_wait"])          # a negative wait is no wait
    assert frame.attrs["server_timing"]["unparsed"] == 2


def test_a_server_start_on_another_clock_gives_no_backlog():
    frame = _frame([None, None], starts=[50.0, float("nan")], sent=[0.0, 0.0])
    assert frame["backlog_seconds"].isna().all()


def test_server_timing_metrics_keeps_the_first_of_each_name_and_refuses_bad_grammar():
    assert server_timing_metrics('a;dur=1;desc="x, y", a;dur=2, b') == {"a": {"dur": "1", "desc": "x, y"},
                                                                       "b": {}}
    with pytest.raises(ValueError, match="Server-Timing"):
        server_timing_metrics("a;=1")


# -- the anatomy ------------------------------------------------------------------------------------------


def _requests(policy, wait, run, backlog=0.1, trials=3, n=300, seed=0, **extra):
    rng = np.random.default_rng(seed)
    lat = rng.uniform(0.01, 0.03, n * trials)
    frame = pd.DataFrame({"policy": policy, "trial": np.repeat(np.arange(trials), n), "status": 200,
                          "client_seconds": lat, "cpu_main": run * lat, "rq_wait_main": wait * lat,
                          "backlog_seconds": backlog * lat, "workers": 1, "threads": 2, "cpus": 2,
                          "model": "small", "batch": 10})
    return frame.assign(**extra)


def _share(table, policy, group, part):
    row = table[(table["policy"] == policy) & (table["group"] == group) & (table["part"] == part)]
    assert len(row) == 1
    return row.iloc[0]


def test_shares_of_the_tail_and_the_median_are_the_parts_of_their_latency():
    # In the tail the requests waited for a CPU; the median ones ran.
    frame = _requests("cfs", 0.1, 0.6)
    slow = frame["client_seconds"] > frame.groupby("trial")["client_seconds"].transform(lambda s: s.quantile(0.98))
    frame.loc[slow, ["rq_wait_main", "cpu_main"]] = frame.loc[slow, ["client_seconds"]].values * [0.7, 0.1]
    table = anatomy(frame)
    assert _share(table, "cfs", TAIL, "cpu_wait")["share"] == pytest.approx(0.7)
    assert _share(table, "cfs", TAIL, "rest")["share"] == pytest.approx(0.1)
    assert _share(table, "cfs", MEDIAN, "running")["share"] == pytest.approx(0.6)
    for group in (TAIL, MEDIAN):
        total = sum(_share(table, "cfs", group, p)["share"] for p in PARTS)
        assert total == pytest.approx(1.0)


def test_three_trials_give_an_interval_two_do_not():
    rng = np.random.default_rng(3)
    parts = []
    for trial in range(3):
        one = _requests("cfs", 0.2 + rng.uniform(-0.05, 0.05), 0.5, trials=1, seed=trial)
        parts.append(one.assign(trial=trial))
    three = anatomy(pd.concat(parts))
    row = _share(three, "cfs", TAIL, "cpu_wait")
    assert row["trials"] == 3 and row["ci_low"] < row["share"] < row["ci_high"]
    two = anatomy(pd.concat(parts[:2]))
    row = _share(two, "cfs", TAIL, "cpu_wait")
    assert row["trials"] == 2 and format_interval(row["ci_low"], row["ci_high"]) == f"({TOO_FEW_TRIALS})"


def test_what_moves_names_the_share_that_differs_and_whether_the_intervals_are_apart():
    frame = pd.concat([_requests("cfs", 0.3, 0.5), _requests("tuna-scatter", 0.05, 0.6, seed=1)])
    table = anatomy(frame)
    moved = what_moves(table)
    tail = moved[moved["group"] == TAIL].iloc[0]
    assert (tail["part"], tail["low"], tail["high"], bool(tail["apart"])) == ("cpu_wait", "tuna-scatter", "cfs", True)
    line = anatomy_line(table)
    assert line.startswith("Anatomy of the slowest 1%") and "\n" not in line
    assert "cfs 30/50/10/10%" in line and "waiting for a CPU (tuna-scatter 5% [5, 5] vs cfs 30% [30, 30]" in line


def test_a_table_without_the_evidence_says_not_recorded_never_zero():
    frame = _requests("cfs", 0.1, 0.5).drop(columns=["rq_wait_main", "backlog_seconds"])
    table = anatomy(frame)
    missing = table[table["part"].isin(["cpu_wait", "backlog", "rest"])]
    assert missing["share"].isna().all() and (missing["note"] == NOT_RECORDED).all()
    assert table[table["part"] == "running"]["share"].notna().all()
    assert NOT_RECORDED in anatomy_line(table.assign(share=np.nan))
    # Without a server start time the backlog alone is missing: the rest holds it.
    table = anatomy(_requests("cfs", 0.1, 0.5).assign(backlog_seconds=np.nan))
    assert np.isnan(_share(table, "cfs", TAIL, "backlog")["share"])
    assert _share(table, "cfs", TAIL, "rest")["share"] == pytest.approx(0.4)


def test_only_ok_requests_of_valid_trials_count():
    frame = _requests("cfs", 0.1, 0.5)
    frame.loc[frame["trial"] == 2, "rq_wait_main"] = frame["client_seconds"] * 0.9
    trials = pd.DataFrame({"policy": "cfs", "trial": [0, 1, 2], "p99": 0.03, "trial_status": ["ok", "ok", "failed"],
                           "workers": 1, "threads": 2, "cpus": 2, "model": "small", "batch": 10})
    row = _share(anatomy(frame, trials), "cfs", TAIL, "cpu_wait")
    assert row["trials"] == 2 and row["share"] == pytest.approx(0.1)
    failed = frame.assign(status=np.where(frame["trial"] == 0, 500, 200))
    assert _share(anatomy(failed), "cfs", TAIL, "cpu_wait")["trials"] == 2


@pytest.mark.parametrize("bad, message", [
    ("not a table", "request table"),
    (pd.DataFrame({"policy": ["cfs"]}), "lacks the column"),
    (pd.DataFrame({"policy": ["cfs"], "trial": [0], "client_seconds": [0.1], "status": [500]}), "no successful"),
])
def test_bad_input_is_one_clear_error(bad, message):
    with pytest.raises(AnalysisError, match=message):
        anatomy(bad)


@pytest.mark.alone
def test_the_readers_cost_is_bounded():
    cost = probe_cost(threads=2, requests=500)
    # About 90 us on this busy 2-CPU machine; an order above means the kept descriptors are not kept.
    assert 0 < cost["seconds_per_request"] < 1e-3


# -- one real trial -------------------------------------------------------------------------------------------


@pytest.mark.server
def test_a_lab_server_trial_writes_plausible_per_request_evidence():
    from tuna_lab.measure.loadgen.load import closed_loop, payload
    from tuna_lab.server.launch import Server

    with Server(1, 2, model="small", policy="cfs") as srv:
        frame = closed_loop(srv.url + "/predict", payload("small", 50), requests=40, concurrency=2)
    ok = frame[frame["status"] == 200]
    assert len(ok) == 40 and frame.attrs["server_timing"]["parsed"] == 40
    assert (ok["cpu_main"] > 0).all()
    assert (ok["rq_wait"] >= ok["rq_wait_main"] - 1e-9).all() and (ok["rq_wait_main"] >= 0).all()
    # Run-queue wait of the calling thread fits in the request's time in the worker.
    assert (ok["rq_wait_main"] <= ok["client_seconds"]).all()
    assert ok["switches_involuntary"].ge(0).all() and ok["switches_voluntary"].ge(0).all()
    assert ok["last_cpu"].isin(sorted(os.sched_getaffinity(0))).all()
    assert ok["request_migrations"].isna().all() == (MIGRATIONS_NOTE is not None)
    # Two requests in flight on one worker: the second waits for the first, in the backlog.
    assert (ok["backlog_seconds"] >= 0).all() and (ok["backlog_seconds"] < ok["client_seconds"]).all()
    assert ok["backlog_seconds"].median() > 0.2 * ok["server_seconds"].median()
    table = anatomy(ok.assign(policy="cfs", trial=0))
    assert table["share"].notna().all()


def test_the_run_summary_and_the_report_say_it_in_one_line(tmp_path):
    from tuna_lab.analysis.report import write_report
    from tuna_lab.analysis.stats import trial_stats
    from tuna_lab.analysis.summary import summarize

    stages = {"server_seconds": 0.01, "sent_at": 0.0, "deserialize": 0.001, "convert": 0.001, "dmatrix": 0.001,
              "predict": 0.002, "shap": 0.005}
    requests = pd.concat([_requests("cfs", 0.3, 0.5, n=60), _requests("tuna-scatter", 0.05, 0.6, n=60, seed=1)])
    requests = requests.assign(**stages)
    trials = trial_stats(requests).assign(trial_status="ok")
    summary = summarize(requests, trials)
    # Printed with the scheduler evidence, after the speedups and the line on the machine's scale.
    lines = [n for n in summary.mechanism_text().splitlines() if n.startswith("Anatomy of the slowest 1%")]
    assert lines == [anatomy_line(anatomy(requests, trials))] == [summary.to_dict()["anatomy"]]
    assert "Anatomy" not in summary.to_text()
    write_report(requests, trials, tmp_path / "report.html")
    assert lines[0].split(";")[0] in (tmp_path / "report.html").read_text()
    # Results without the evidence: no line at all.
    old = requests.drop(columns=["rq_wait_main", "backlog_seconds"])
    assert summarize(old, trials).anatomy == "" and "Anatomy" not in summarize(old, trials).mechanism_text()
