"""What a Gunicorn worker does between loading the app and serving: warm up, find, bind, report.

Runs inside the worker (the ``post_worker_init`` hook), so every TID it binds
is one of its own. A worker's *slot* (0..W-1) is chosen by the master before
it forks (``pre_fork``) and inherited; a replacement worker takes the slot
its predecessor freed, so it is re-pinned to the same cores as soon as it is
warm - the first caveat of the article's closing remarks.
"""

import json
import logging
import os
import sys
import time

from ..errors import BindingError
from ..placement.binding import affinity_of, bind_all, threads_of

__all__ = ["pick_slot", "pin_worker", "read_plan", "record_path", "PLAN_FILE"]

log = logging.getLogger("tuna_lab.server")

PLAN_FILE = "placement.json"
#: Gunicorn stops the whole server when a worker exits with this code at
#: boot: better no server than a half-pinned one reported as pinned.
WORKER_BOOT_ERROR = 3


def read_plan(state_dir):
    """The placement the launcher wrote to ``<state_dir>/placement.json``, as a dict."""
    with open(os.path.join(state_dir, PLAN_FILE)) as fh:
        return json.load(fh)


def record_path(state_dir, slot):
    """Where the worker of ``slot`` writes its binding record.

    Examples
    --------
    >>> record_path("/tmp/state", 1)
    '/tmp/state/worker-1.json'
    """
    return os.path.join(state_dir, f"worker-{slot}.json")


def pick_slot(live_slots, workers, age):
    """Lowest slot no live worker holds; a spare worker (during a reload) shares by age.

    Examples
    --------
    >>> pick_slot([0, 2], workers=3, age=7), pick_slot([0, 1], workers=2, age=3)
    (1, 1)
    """
    free = [s for s in range(workers) if s not in set(live_slots)]
    return free[0] if free else age % workers


def _write_json(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def pin_worker(app, slot, plan, state_dir):
    """Warm ``app`` up, bind this worker's threads to ``plan``'s slot, record it, mark ready.

    Returns the record written to ``worker-<slot>.json``.
    """
    pid = os.getpid()
    T = plan["threads"]
    allowed = plan["allowed"][slot]
    t0 = time.time()
    omp_tids = sorted(app.warm_up())
    warm = time.time()
    # OpenMP numbers its threads in creation order, and Linux hands out TIDs
    # in increasing order: the k-th new TID is OpenMP thread k+1.
    roles = {pid: ("main", 0)}
    for k, tid in enumerate(omp_tids):
        roles[tid] = ("openmp", k + 1)
    if plan["pinned_by"] == "tuna_lab":
        union = sorted({c for cpus in allowed for c in cpus})
        wanted = {pid: allowed[0]}
        for tid in omp_tids:
            rank = roles[tid][1]
            # more pool threads than T (should not happen) get the worker's cores
            wanted[tid] = allowed[rank] if rank < T else union
        for attempt in range(2):
            try:
                bind_all(wanted)
                break
            except BindingError as exc:
                if attempt == 1:
                    _fail(state_dir, slot, pid, f"binding failed: {exc}")
                # a pool thread may have been replaced: rediscover and retry once
                live = set(threads_of(pid))
                wanted = {t: c for t, c in wanted.items() if t in live}
    threads = []
    for tid in threads_of(pid):
        role, rank = roles.get(tid, ("other", None))
        try:
            cpus = sorted(affinity_of(tid))
        except BindingError:
            continue
        expected = sorted(allowed[rank]) if rank is not None and rank < T else None
        threads.append({"tid": tid, "role": role, "rank": rank, "cpus": cpus, "expected": expected})
    if plan["pinned_by"] == "tuna_lab":
        wrong = [t for t in threads if t["expected"] is not None and t["cpus"] != t["expected"]]
        if wrong:
            _fail(state_dir, slot, pid, f"read-back differs for TIDs {[t['tid'] for t in wrong]}")
    record = {"pid": pid, "slot": slot, "policy": plan["policy"], "pinned_by": plan["pinned_by"],
              "threads": threads, "omp_threads": len(omp_tids), "warm_seconds": warm - t0,
              "pinned_at": time.time(), "pin_seconds": time.time() - warm, "ready": True}
    _write_json(record_path(state_dir, slot), record)
    app.mark_ready()
    log.info("worker %s (slot %s) pinned: %s", pid, slot,
             ", ".join(f"{t['role']}:{t['tid']}->{t['cpus']}" for t in threads))
    return record


def _fail(state_dir, slot, pid, message):
    log.error("worker %s (slot %s): %s", pid, slot, message)
    try:
        _write_json(record_path(state_dir, slot), {"pid": pid, "slot": slot, "ready": False, "error": message})
    finally:
        sys.exit(WORKER_BOOT_ERROR)
