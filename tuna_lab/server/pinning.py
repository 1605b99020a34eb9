"""What a lab server's worker does between loading the app and serving: warm up, find, bind, report.

Runs inside the worker (the ``post_worker_init`` hook), so every TID it binds
is one of its own. The binding itself is :func:`~tuna_lab.live.binding.bind_worker`,
the same as the Gunicorn integration's and ``tuna-lab pin --pid``'s; the pool
threads are the ones the warm-up started (:func:`~tuna_lab.live.pools.new_pool_threads`).

A worker's *slot* (0..W-1) is the one it took in the integration's
``post_fork`` (:func:`tuna_lab.integrations.gunicorn.worker_slot`: a lock
file held for its life); a replacement worker takes the slot its
predecessor freed, so it is re-pinned to the same cores as soon as it is warm -
the first caveat of the article's closing remarks.

Every mask a worker sets is written first in tuna_lab's ledger
(:func:`~tuna_lab.live.ledger.bind_recorded`: the record ``hooks-MASTER-START``
in this user's state folder, the Gunicorn hooks' own), and given back by its one
rule when the worker exits or the server stops (the hooks' ``child_exit`` and
``on_exit``, which the lab server's config takes). ``worker-SLOT.json`` in the
server's state folder is the launcher's report of the binding (roles, read-back,
readiness), not a record to give masks back by.
"""

import logging
import os
import sys
import time

from .._files import write_json
from ..errors import BindingError
from ..live.binding import affinity_of, bind_worker, threads_of
from ..live.ledger import bind_recorded
from ..placement.plan import PinnedBy, Plan

__all__ = ["pin_worker", "drop_record", "read_plan", "record_path", "PLAN_FILE"]

log = logging.getLogger("tuna_lab.server")

#: The launcher's :class:`~tuna_lab.placement.plan.Plan`, in the server's state directory.
PLAN_FILE = "plan.json"
#: Gunicorn stops the whole server when a worker exits with this code at
#: boot: better no server than a half-pinned one reported as pinned.
WORKER_BOOT_ERROR = 3


def read_plan(state_dir):
    """The :class:`~tuna_lab.placement.plan.Plan` the launcher wrote to ``<state_dir>/plan.json``.

    Raises
    ------
    PlanError
        No plan there, or not one.

    Examples
    --------
    >>> read_plan("/nonexistent")                      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PlanError: cannot read plan /nonexistent/plan.json: ...
    """
    return Plan.read(os.path.join(state_dir, PLAN_FILE))


def record_path(state_dir, slot):
    """Where the worker of ``slot`` writes its binding record.

    Examples
    --------
    >>> record_path("/tmp/state", 1)
    '/tmp/state/worker-1.json'
    """
    return os.path.join(state_dir, f"worker-{slot}.json")


def drop_record(state_dir, workers, pid):
    """Remove the binding record of worker ``pid`` (it exited), whichever of the ``workers`` slots it held.

    Examples
    --------
    >>> drop_record("/nonexistent", 2, 12345)
    """
    from .._files import read_json

    for slot in range(workers):
        path = record_path(state_dir, slot)
        try:
            record = read_json(path, limit=1 << 16, follow=False)
            if isinstance(record, dict) and record.get("pid") == pid:
                os.remove(path)
        except OSError:
            continue


def _write_json(path, obj):
    write_json(path, obj, indent=None, durable=False)


def pin_worker(app, slot, plan, state_dir):
    """Warm ``app`` up, bind this worker's threads to ``plan``'s slot, record it, mark ready.

    ``plan`` is a :class:`~tuna_lab.placement.plan.Plan`; ``slot`` None (every
    slot taken) stops the worker. Returns the record written to ``worker-<slot>.json``.
    """
    pid = os.getpid()
    if slot is None:
        log.error("worker %s: no free slot of the plan's %s (more workers than the plan's?)", pid,
                  plan.workers if plan else "?")
        sys.exit(WORKER_BOOT_ERROR)
    t0 = time.time()
    pool = sorted(app.warm_up())
    warm = time.time()
    # Only tuna_lab's placements are bound here; the OpenMP runtime binds its own, and cfs nothing.
    dry = plan.pinned_by != PinnedBy.TUNA_LAB
    master = os.getppid()                   # the Gunicorn master: the ledger's record is its
    if dry:
        bound = bind_worker(plan, slot, pool, pid, dry_run=True)
    else:
        bound, problem = bind_recorded(master, plan, slot, pool)
        if problem:
            log.warning("worker %s (slot %s): %s; pinned all the same (its threads end with it)", pid, slot, problem)
    if not dry and any(b.error for b in bound):
        # A pool thread may have been replaced: bind the live ones once more.
        live = set(threads_of(pid))
        bound, _ = bind_recorded(master, plan, slot, [t for t in pool if t in live])
        failed = [b.error for b in bound if b.error]
        if failed:
            _fail(state_dir, slot, pid, f"binding failed: {failed[0]}")
    roles = {b.tid: b for b in bound}
    threads = []
    for tid in threads_of(pid):
        b = roles.get(tid)
        try:
            cpus = sorted(affinity_of(tid))
        except BindingError:
            continue
        expected = list(b.planned) if b is not None and b.rank < plan.threads else None
        threads.append({"tid": tid, "role": "other" if b is None else "main" if b.rank == 0 else "openmp",
                        "rank": None if b is None else b.rank, "cpus": cpus, "expected": expected})
    if not dry:
        wrong = [t for t in threads if t["expected"] is not None and t["cpus"] != t["expected"]]
        if wrong:
            _fail(state_dir, slot, pid, f"read-back differs for TIDs {[t['tid'] for t in wrong]}")
    record = {"pid": pid, "slot": slot, "policy": plan.policy, "pinned_by": plan.pinned_by.value,
              "threads": threads, "omp_threads": len(pool), "warm_seconds": warm - t0,
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
