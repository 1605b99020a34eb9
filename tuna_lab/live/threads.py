"""Threaded workers: the threads that do the work, found by what they do under requests, and where they go.

Most Python model servers call the model from a thread pool, not from the
worker's main thread: FastAPI runs a sync endpoint on anyio's worker threads,
Gunicorn's ``gthread`` worker on its ``--threads`` pool, BentoML on its
thread pool. Each such *calling thread* drives its runtime's team: libgomp
makes one team per thread that opens a parallel region (its members are
created by that thread and take its name), ONNX Runtime shares one intra-op
pool per session among its callers. A team made while the model loaded on
the main thread then idles forever.

With the CPU time every thread gained while the worker served requests
(:class:`~tuna_lab.live.traffic.Activity`), :func:`~tuna_lab.live.pools.by_activity`
is the one rule :func:`~tuna_lab.live.pools.classify_threads` applies for ``status``,
``plan``, ``pin``, ``audit``, ``run``, ``tune`` and the exports:

* the **main thread calls** (it gained at least ``MAIN_CALLS`` of the
  busiest thread's CPU, or no thread off it worked): the plan is by thread,
  as it always was; a runtime's thread that did nothing is listed ``idle``
  and left alone, never ranked above one that worked;
* **one calling thread off the main thread** (BentoML, one gthread or anyio
  thread busy): it takes the main thread's place (rank 0) and its team the
  pool's ranks; the main thread and every other thread of the worker get the
  slot's CPUs, so that a thread they start later stays in the slot;
* **K > 1 calling threads**, or threads /proc cannot tell apart (calling
  threads beside ONNX Runtime's own pool: both wait in libc): the worker's
  whole thread set shares its slot's CPUs (slot-level placement, what a
  cpuset per worker gives). No thread is narrowed while the threads that do
  the work keep every CPU.

:func:`threading_summary` says it in figures (W x K x T threads on C CPUs)
with the knob that removes the oversubscription for the framework found;
``status`` and ``pin`` print it, ``audit`` makes it a ``threaded`` finding.
TID order and the library a thread waits in only break ties: they never
override activity.
"""

import contextlib
import os

import psutil

from ..errors import BindingError
from ..placement.plan import planned_cpus
from .binding import ThreadBinding, affinity_of, bind
from .pools import ACTIVE_FLOOR, ThreadRole, loaded_runtimes

__all__ = ["planned_for", "bind_threads", "worker_shape", "threading_summary", "threading_lines",
           "activity_between", "knobs"]

def planned_for(plan, slot, th, exact_main):
    """The CPUs ``plan`` gives thread ``th`` (a ThreadRole) of ``slot``; None for a thread left alone.

    A thread placed by slot (``th.level == "slot"``) gets all of the slot's
    CPUs; rank 0 (the main thread, or the calling thread that took its place)
    and the pool's ranks get what :func:`~tuna_lab.placement.plan.planned_cpus`
    gives them.

    Examples
    --------
    >>> from tuna_lab.machine import Topology
    >>> from tuna_lab.placement import placement
    >>> plan = placement("round-robin", 2, 2, Topology.synthetic("core:4 pu:1")).plan()
    >>> planned_for(plan, 1, ThreadRole(7, "main", None, "", level="slot"), True)
    (2, 3)
    >>> planned_for(plan, 1, ThreadRole(8, "pool", 1, ""), True), planned_for(plan, 1, ThreadRole(9, "other", None, ""), True)
    ((3,), None)
    """
    if plan is None or slot is None or slot >= plan.workers:
        return None
    if th.level == "slot":
        return tuple(sorted({c for cpus in plan.slots[slot] for c in cpus}))
    if th.role == "other" or th.rank is None:
        return None
    return tuple(planned_cpus(plan, slot, th.rank, exact_main))


def bind_threads(plan, slot, threads, exact_main, dry_run=False):
    """Bind each of ``threads`` (ThreadRoles, in order) to what :func:`planned_for` gives it.

    Returns
    -------
    list of ThreadBinding
        One per thread placed; a thread not bound has ``error`` set. With
        ``dry_run`` nothing is bound and ``cpus`` is its mask now.
    """
    out = []
    for th in threads:
        planned = planned_for(plan, slot, th, exact_main)
        if planned is None:
            continue
        try:
            got = affinity_of(th.tid) if dry_run else bind(th.tid, planned)
        except BindingError as exc:
            out.append(ThreadBinding(th.tid, th.role, th.rank, planned, None, str(exc)))
            continue
        out.append(ThreadBinding(th.tid, th.role, th.rank, planned, tuple(sorted(got))))
    return out


def worker_shape(rows):
    """``{"callers", "members", "busy", "idle", "slot_level", "off_main"}`` of one worker's thread rows.

    ``rows`` are the dicts of :func:`~tuna_lab.live.pin.server_threads` (or
    of a pin report), each with its ``kind``.

    Examples
    --------
    >>> worker_shape([{"kind": "main"}, {"kind": "caller"}, {"kind": "member"}])["off_main"]
    True
    """
    count = {k: sum(1 for t in rows if t.get("kind") == k) for k in ("caller", "member", "busy", "idle")}
    return {"callers": count["caller"], "members": count["member"], "busy": count["busy"], "idle": count["idle"],
            "slot_level": any(t.get("level") == "slot" and t.get("kind") != "main" for t in rows),
            "off_main": bool(count["caller"] or count["busy"])}


def _cmdline(pid):
    with contextlib.suppress(psutil.Error):
        return " ".join(psutil.Process(pid).cmdline())
    return ""


def knobs(master, pid):
    """The settings that set how many threads worker ``pid`` of server ``master`` runs the model with.

    Read from the master's and the worker's command lines (the framework) and
    the runtimes the worker loaded (:func:`~tuna_lab.live.pools.loaded_runtimes`).

    Examples
    --------
    >>> import os
    >>> isinstance(knobs(os.getpid(), os.getpid()), list)
    True
    """
    cmd = f"{_cmdline(master)} {_cmdline(pid)}".lower()
    out = []
    if "gunicorn" in cmd and ("gthread" in cmd or "--threads" in cmd or "uvicorn" not in cmd):
        out.append("Gunicorn's --threads (calling threads per worker)")
    if "uvicorn" in cmd or "fastapi" in cmd:
        out.append("anyio's thread limiter for FastAPI's sync endpoints "
                   "(anyio.to_thread.current_default_thread_limiter().total_tokens, 40 by default)")
    if "bentoml" in cmd:
        out.append("BentoML's threads (@bentoml.service(threads=N))")
    runtimes = loaded_runtimes(pid)
    if "XGBoost" in runtimes:
        out.append("XGBoost's nthread (or OMP_NUM_THREADS)")
    if "ONNX Runtime" in runtimes:
        out.append("ONNX Runtime's intra-op threads (SessionOptions.intra_op_num_threads)")
    if "PyTorch" in runtimes:
        out.append("torch.set_num_threads (or OMP_NUM_THREADS)")
    if "LightGBM" in runtimes:
        out.append("LightGBM's num_threads")
    if not any(k in runtimes for k in ("XGBoost", "PyTorch", "LightGBM", "ONNX Runtime")) and "OpenMP" in runtimes:
        out.append("OMP_NUM_THREADS")
    return out


def threading_summary(master, workers, plan=None, cpus=None):
    """What a server's threaded workers are and how they are placed, in figures; None where none is threaded.

    Parameters
    ----------
    master : int
        The server's master PID.
    workers : list of dict
        ``{"pid", "threads": [row with "kind", "level"]}`` per worker
        (:func:`~tuna_lab.live.pin.server_threads` or a pin report's).
    plan : Plan, optional
        Its ``threads`` is T; else T is the team size found (members per caller + 1).
    cpus : int, optional
        C, the CPUs the server may use; default read from the master's mask.

    Returns
    -------
    dict or None
        ``workers`` (W), ``callers`` (K, the most in a worker; None where
        callers and a runtime's pool cannot be told apart), ``threads`` (T),
        ``total`` (W x K x T, or the threads that worked), ``cpus`` (C),
        ``level`` (``"thread"`` or ``"slot"``), ``oversubscribed``,
        ``knobs`` and ``text`` (one line).
    """
    shapes = [(w, worker_shape(w["threads"])) for w in workers]
    threaded = [(w, s) for w, s in shapes if s["off_main"]]
    if not threaded:
        return None
    if cpus is None:
        # The server's CPUs: its master's and every worker thread's mask together (after a pin by slot, the
        # slots; the master may sit on --front-cpus, which the server may use too).
        known = {c for w in workers for t in w["threads"] for c in (t.get("cpus") or ())}
        with contextlib.suppress(OSError):
            known |= os.sched_getaffinity(int(master))
        cpus = len(known) or None
    W = len(workers)
    known = all(s["callers"] for _, s in threaded)
    K = max(s["callers"] for _, s in threaded) if known else None
    if plan is not None:
        T = plan.threads
    else:
        # The team size found in the worker with the most callers (a short look may miss a caller or two).
        most = max((s for _, s in threaded), key=lambda s: (s["callers"], s["members"]))
        T = 1 + round(most["members"] / max(most["callers"], 1))
    if known:
        total = W * K * T
        figures = (f"{W} worker{'s' if W != 1 else ''} x {K} calling thread{'s' if K != 1 else ''} x {T} "
                   f"thread{'s' if T != 1 else ''} = {total} threads on {cpus} CPUs")
    else:
        total = sum(s["busy"] + s["callers"] + s["members"] for _, s in threaded) + (W - len(threaded))
        figures = (f"{total} threads worked in {W} worker{'s' if W != 1 else ''} (calling threads and the runtime's "
                   f"own pool, which /proc cannot tell apart: both wait in libc) on {cpus} CPUs")
    slot = any(s["slot_level"] for _, s in threaded)
    if slot:
        how = ("pin places them by slot: each worker's whole thread set shares its slot's CPUs (what a cpuset per worker "
               "gives)")
        if known and cpus and total <= cpus and K > 1:
            how += (f"; the machine has room for each team's own CPUs: make the plan with -t {K * T} so that each "
                    f"worker's slot holds its {K} teams")
        elif known and K > 1:
            how += f"; each team its own CPUs would need {total} CPUs"
    else:
        how = ("pin places them by thread: the one calling thread per worker and its team take the main thread's and the "
               "pool's CPUs; the main thread and the other threads keep to the slot's CPUs")
    over = bool(cpus) and total > cpus
    found = knobs(master, threaded[0][0]["pid"])
    knob = ", ".join(found) or "the framework's thread-pool size and the runtime's thread count"
    text = f"threaded workers (the model runs off the main thread): {figures}; {how}"
    if over:
        text += f"; oversubscribed {total / cpus:.1f}x: fewer threads remove it: {knob}"
    return {"workers": W, "callers": K, "threads": T, "total": total, "cpus": cpus,
            "level": "slot" if slot else "thread", "oversubscribed": over, "knobs": found, "text": text}


def threading_lines(master, workers, plan=None):
    """The :func:`threading_summary` line, as a list of none or one (for a report's warnings)."""
    summary = threading_summary(master, workers, plan)
    return [] if summary is None else [summary["text"]]


def activity_between(first, second, workers):
    """``{pid: {tid: seconds}}`` the threads of ``workers`` gained between two readings; None if none worked.

    ``first`` and ``second`` are ``{tid: (pid, ThreadSched)}`` (audit's
    readings): an audit taken while the server serves requests tells the
    threads by what they do, as ``pin --url`` does.

    Examples
    --------
    >>> activity_between({}, {}, [1]) is None
    True
    """
    out = {}
    for tid, (pid, now) in second.items():
        if pid not in workers:
            continue
        before = first.get(tid)
        gained = now.cpu_seconds - before[1].cpu_seconds if before is not None else 0.0
        out.setdefault(pid, {})[tid] = max(0.0, gained)
    if not any(g >= ACTIVE_FLOOR for threads in out.values() for g in threads.values()):
        return None
    return out
