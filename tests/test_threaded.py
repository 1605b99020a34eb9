"""Threaded workers (issue 47): the threads that do the work are found by what they do, and placed, never worse than none.

The rule (``live.pools.by_activity``) is checked on the shapes the issue found in
the field - gthread's calling threads each with its libgomp team, BentoML's one
calling thread beside the main thread's idle team, a lab worker whose main
thread calls, FastAPI's anyio threads beside ONNX Runtime's pool - and once on
this very process, whose thread pool calls XGBoost as a threaded server does.
The servers themselves are ``tests/field/test_threaded.py``'s (``make field``).
"""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tuna_lab.live.pools import ThreadRole, by_activity, classify_threads, thread_cpu_times
from tuna_lab.live.runtimes import pool_runtime
from tuna_lab.live.threads import activity_between, planned_for, threading_summary, worker_shape
from tuna_lab.machine import Topology
from tuna_lab.placement import placement

GOMP = pool_runtime("libgomp.so.1")
MAIN = 100


def libc(tid, name="python"):
    return (tid, name, None, "libc.so.6", None)


def gomp(tid, name="python"):
    return (tid, name, None, "libgomp.so.1", GOMP)


def by_tid(rows):
    return {t.tid: t for t in rows}


@pytest.fixture(scope="module")
def plan():
    """2 workers x 2 threads on 4 CPUs: slot 0 is CPUs 0-1, slot 1 CPUs 2-3."""
    return placement("round-robin", 2, 2, Topology.synthetic("core:4 pu:1")).plan()


def test_gthread_shape_places_the_whole_thread_set_by_slot_and_lists_the_leftover_idle(plan):
    # Without --preload: 99 is the team the main thread made while the model loaded (lowest TID, idle).
    seen = [gomp(99), libc(101), gomp(102), libc(103), libc(104), gomp(105), libc(106)]
    rows = by_tid(by_activity(MAIN, seen, {MAIN: 0.009, 101: 0.04, 102: 0.03, 103: 0.05, 104: 0.0, 105: 0.035,
                                           106: 0.0, 99: 0.0}))
    assert {t: rows[t].kind for t in (101, 103)} == {101: "caller", 103: "caller"}
    assert {t: rows[t].kind for t in (102, 105)} == {102: "member", 105: "member"}
    assert rows[99].kind == "idle" and rows[99].role == "other" and rows[99].rank is None
    # K = 2 calling threads: every thread of the worker shares its slot's CPUs, the main one first.
    assert {t.level for t in rows.values()} == {"slot"}
    assert all(planned_for(plan, 1, t, True) == (2, 3) for t in rows.values())
    shape = worker_shape([{"kind": t.kind, "level": t.level} for t in rows.values()])
    assert (shape["callers"], shape["members"], shape["idle"], shape["slot_level"]) == (2, 2, 1, True)


def test_one_calling_thread_takes_the_main_threads_place_and_the_idle_team_never_outranks_its_team(plan):
    # BentoML: the model loaded on the main thread (its team, 99, idles), called from one pool thread.
    seen = [gomp(99), libc(101), gomp(102), libc(103)]
    rows = by_tid(by_activity(MAIN, seen, {MAIN: 0.0, 99: 0.0, 101: 0.5, 102: 0.4, 103: 0.0}, requests=60))
    assert (rows[101].kind, rows[101].rank) == ("caller", 0)
    assert (rows[102].kind, rows[102].rank, rows[102].team) == ("member", 1, 101)
    assert rows[99].kind == "idle" and rows[99].rank is None
    assert "0.400 s CPU during 60 requests" in rows[102].evidence
    # The caller and its team get a main thread's and a pool thread's CPUs; the rest stays in the slot.
    assert planned_for(plan, 0, rows[101], False) == (0, 1)
    assert planned_for(plan, 0, rows[101], True) == (0,)
    assert planned_for(plan, 0, rows[102], True) == (1,)
    assert all(planned_for(plan, 0, rows[t], True) == (0, 1) for t in (MAIN, 99, 103))


def test_a_busy_event_loop_does_not_hide_the_calling_thread_whose_team_worked():
    # FastAPI's sync endpoint: the event loop parses and validates (busier than the caller); the anyio thread 101
    # calls the model, and its team (102, made after it) did the work, while the main thread's team (99) idled.
    seen = [gomp(99), libc(101), gomp(102)]
    rows = by_tid(by_activity(MAIN, seen, {MAIN: 0.5, 99: 0.0, 101: 0.3, 102: 0.2}))
    assert (rows[101].kind, rows[101].rank, rows[102].kind, rows[99].kind) == ("caller", 0, "member", "idle")
    # The same activity with the working team made before that thread (the main thread's): the main one calls.
    rows = by_tid(by_activity(MAIN, [gomp(99), libc(101), gomp(98)], {MAIN: 0.5, 99: 0.0, 101: 0.3, 98: 0.2}))
    assert (rows[MAIN].rank, rows[98].rank, rows[101].kind) == (0, 1, None)


def test_a_main_thread_that_calls_keeps_todays_plan_but_an_idle_runtime_thread_is_not_ranked():
    # A lab worker (the main thread calls) that also holds a leftover team of lower TID: activity outranks TID.
    seen = [gomp(99), gomp(102), libc(103)]
    rows = by_activity(MAIN, seen, {MAIN: 0.5, 99: 0.0, 102: 0.45, 103: 0.0})
    ranked = [(t.tid, t.role, t.rank) for t in rows if t.role != "other"]
    assert ranked == [(MAIN, "main", 0), (102, "pool", 1)]
    assert by_tid(rows)[99].kind == "idle" and by_tid(rows)[99].level is None   # left alone: the main one calls
    # No idle runtime thread at all: the library rule holds as it always did.
    assert by_activity(MAIN, [gomp(102)], {MAIN: 0.5, 102: 0.45}) is None
    # A worker that served nothing tells nothing.
    assert by_activity(MAIN, seen, {MAIN: 0.0001, 99: 0.0, 102: 0.0, 103: 0.0}) is None


def test_onnx_runtimes_pool_beside_a_calling_main_thread_stays_a_pool_by_activity():
    # ONNX Runtime's pool spins: it may outrun the main thread, which still calls (the lab server's shape).
    seen = [libc(101), libc(102)]
    assert by_activity(MAIN, seen, {MAIN: 0.2, 101: 0.9, 102: 0.0}) is None
    rows = by_tid(classify_shape := by_activity(MAIN, seen, {MAIN: 0.01, 101: 0.3, 102: 0.35}))
    # FastAPI's anyio thread beside ONNX Runtime's pool: both wait in libc, so only slot-level placement is safe.
    assert {rows[101].kind, rows[102].kind} == {"busy"} and {t.level for t in classify_shape} == {"slot"}


@pytest.mark.parametrize("cpus, words", [
    (2, "2 workers x 4 calling threads x 2 threads = 16 threads on 2 CPUs"),
    (32, "the machine has room for each team's own CPUs: make the plan with -t 8"),
])
def test_the_summary_says_the_oversubscription_in_figures_and_the_knob(cpus, words):
    rows = [{"kind": "main", "level": "slot"}] + [{"kind": k, "level": "slot"} for k in ["caller"] * 4 + ["member"] * 4]
    workers = [{"pid": os.getpid(), "threads": rows}, {"pid": os.getpid(), "threads": rows}]
    summary = threading_summary(os.getpid(), workers, cpus=cpus)
    assert words in summary["text"]
    assert summary["oversubscribed"] == (cpus < 16) == ("fewer threads remove it" in summary["text"])
    assert (summary["workers"], summary["callers"], summary["threads"], summary["level"]) == (2, 4, 2, "slot")
    # A server whose main threads call is no threaded one: nothing to say.
    assert threading_summary(os.getpid(), [{"pid": 1, "threads": [{"kind": "main"}, {"kind": None}]}]) is None


def test_audit_reads_activity_only_where_a_worker_thread_worked():
    class Sched:
        def __init__(self, s):
            self.cpu_seconds = s

    first = {7: (5, Sched(1.0)), 8: (5, Sched(2.0)), 9: (6, Sched(0.0))}
    assert activity_between(first, {7: (5, Sched(1.0)), 8: (5, Sched(2.0))}, {5}) is None
    got = activity_between(first, {7: (5, Sched(1.5)), 8: (5, Sched(2.0)), 9: (6, Sched(3.0))}, {5})
    assert got == {5: {7: 0.5, 8: 0.0}}


def test_planned_for_leaves_alone_what_no_plan_places(plan):
    assert planned_for(None, 0, ThreadRole(1, "pool", 1, ""), True) is None
    assert planned_for(plan, 2, ThreadRole(1, "main", 0, ""), True) is None   # a slot beyond the plan's
    assert planned_for(plan, 0, ThreadRole(1, "pool", None, ""), True) is None


@pytest.mark.alone
def test_this_process_calling_xgboost_from_a_thread_pool_is_told_by_what_each_thread_does():
    """Real threads, real /proc: two pool threads call XGBoost (one libgomp team each) beside the main thread's team."""
    xgb = pytest.importorskip("xgboost")
    np = pytest.importorskip("numpy")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs for a team of 2")
    rng = np.random.default_rng(0)
    x = rng.random((4000, 16), dtype=np.float32)
    before_train = set(thread_cpu_times(os.getpid()))
    booster = xgb.train({"nthread": 2, "max_depth": 6}, xgb.DMatrix(x, label=x[:, 0]), 30)
    leftover = set(thread_cpu_times(os.getpid())) - before_train       # the main thread's team: loads, then idles
    rows = rng.random((20000, 16), dtype=np.float32)
    callers = set()

    def call():
        callers.add(threading.get_native_id())
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            booster.inplace_predict(rows)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: call(), range(2)))      # warm: each caller's team exists
        start = thread_cpu_times(os.getpid())
        list(pool.map(lambda _: call(), range(2)))
        end = thread_cpu_times(os.getpid())
        gains = {tid: end[tid] - start.get(tid, 0.0) for tid in end}
        found = by_tid(classify_threads(os.getpid(), activity=gains, requests=4))
    assert len(callers) == 2
    assert {found[t].kind for t in callers} == {"caller"}, {t: found[t].evidence for t in callers}
    members = [t for t in found.values() if t.kind == "member"]
    assert members and all(gains[t.tid] > 0.01 for t in members)
    assert all(found[t].kind == "idle" for t in leftover if t in found and gains.get(t, 0.0) < 0.0005)
    # Every thread that gained CPU is placed by slot with them; none that worked is left alone.
    assert {t.level for t in found.values()} == {"slot"}
