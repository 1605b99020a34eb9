"""Pin a server that is already running, by its master's PID.

A server is a master process and its children. Not every child serves
requests: :func:`server_roles` tells the **workers** (the processes that run
an inference runtime, or accept on the server's socket) from **front ends**
(an API process that answers HTTP and passes requests on over a queue) and
**helpers** (a multiprocessing Manager or resource tracker, a metrics
exporter), each with the reason; only workers get a slot. ``--worker-pids`` and
``--worker-match`` (:class:`WorkerChoice`) name them where the discovery
cannot. :func:`pin_server` gives each worker a *slot* of a
:class:`~tuna_lab.placement.plan.Plan` (workers in start order), finds its
threads and binds them by TID:

* the **main thread** is the thread whose TID is the worker's PID;
* the **pool threads** are the threads that sit in an OpenMP or BLAS runtime,
  or that work while the worker serves requests
  (:func:`~tuna_lab.live.pools.classify_threads`). Pool threads are
  ranked by TID, which is their creation order;
* every other thread (Python threads, Gunicorn's, jemalloc's, a thread that
  never stopped running while we looked) is left alone, and the report says why.

Binding the main thread to a single CPU has a cost this project measured:
without ``OMP_PLACES``, GNU libgomp counts the CPUs of the calling thread's
*current* affinity, and XGBoost runs ``min(nthread, that count)`` threads - a
main thread pinned to one CPU makes every later request single-threaded. So
unless the worker was started with ``OMP_PLACES`` (read from its environment;
not with ``OMP_PROC_BIND=false``) and has loaded its OpenMP runtime, its main
thread is bound to all of its slot's CPUs, which keeps libgomp's pool size;
the pool threads get their own CPUs. Each worker is bound by
:func:`~tuna_lab.live.binding.bind_worker`, as the Gunicorn hooks bind theirs.

Every mask :func:`pin_server` sets is recorded with the mask it replaced;
:func:`unpin_server` gives a thread its old mask back only while it is still
on the one tuna_lab set (a mask someone else set since is theirs), and
:func:`watch_server` re-pins a replacement worker to the slot its predecessor
left. Nothing here pins the master.

Examples
--------
>>> import os
>>> [t.role for t in classify_threads(os.getpid())][:1]
['main']
"""


import contextlib
import dataclasses
import os
from dataclasses import dataclass, field

import psutil

from .._checks import format_cpulist
from ..errors import BindingError, PinError
from ..machine import procfs
from .binding import affinity_of, bind, threads_of
from .ledger import open_pins, pin_records, record_pins
from .pools import RUNNING, active_threads, classify_threads, loaded_runtimes, main_rule, thread_cpu_times
from .roles import server_roles, worker_pids
from .state import hooked_workers
from .threads import bind_threads, planned_for, threading_lines
from .traffic import Activity, activity_of

__all__ = ["worker_slots", "server_threads", "pin_server", "check_front_cpus", "server_cpus", "unpin_server",
           "watch_server", "PinReport"]


# Rounds of --watch that look again at a worker with such a thread: a pool thread busy with
# a request settles within them (then it is bound); one that always spins never does.
_WATCH_RETRIES = 25


@dataclass
class PinReport:
    """What a pin, unpin, watch or status did: the server's processes by role, per worker its slot and every
    thread's CPUs; warnings, and a ``note`` (an unpin that found nothing to undo says so there)."""

    master: int
    plan: object
    workers: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    roles: object = None
    note: str = None
    fronts: list = field(default_factory=list)
    front: dict = None
    record: str = None
    failed: bool = False
    repinned: str = None

    def to_dict(self):
        """JSON-able: ``master``, ``policy``, ``workers`` (slot, pid, why, threads), ``warnings``; with the
        roles found, ``processes`` (the master and the helpers, each ``pid``, ``role``, ``why``, ``command``);
        with ``--front-cpus``, ``front_cpus`` (each process bound there: ``pid``, ``role``, ``cpus``,
        ``threads``); with traffic, ``front_work`` (:func:`front_work`)."""
        out = {"master": self.master, "policy": getattr(self.plan, "policy", None),
               "fingerprint": getattr(self.plan, "fingerprint", None),
               "workers": self.workers, "warnings": list(self.warnings)}
        if self.roles is not None:
            out["processes"] = [r.to_dict() for r in (self.roles.master, *self.roles.helpers)]
        if self.fronts:
            out["front_cpus"] = self.fronts
        if self.front is not None:
            out["front_work"] = self.front
        if self.note:
            out["note"] = self.note
        if self.record:
            out["record"] = self.record
        return out

    def add_activity(self, activity, front_cpus=None):
        """Say what the traffic showed: workers that served none of it, and the CPU the master and front ends
        used beside the workers' (:func:`front_work`); where they did real work and ``front_cpus`` is not
        given, one warning suggests ``--front-cpus``."""
        if activity is None:
            return self
        if activity.idle:
            self.warnings.append(f"worker(s) {', '.join(map(str, activity.idle))} served none of the "
                                 f"{activity.requests} requests sent in {activity.seconds:.1f} s")
        self.front = activity.front
        if self.front and self.front["real_work"] and not front_cpus:
            self.warnings.append(f"{self.front['text']}: the master and front ends do real work, on the workers' "
                                 "CPUs; "
                                 "--front-cpus CPULIST keeps them (all their threads) on CPUs of their own and "
                                 "places the workers on the rest")
        return self

    def describe(self, warnings=False):
        """The report as text: the master and helpers, then one block per worker, one line per thread with the
        evidence of its role.

        Warnings are left out unless ``warnings``: the CLI prints them once, on stderr.
        """
        lines = [f"server {self.master}" + (f": {self.plan.policy}, {self.plan.workers} workers x "
                                            f"{self.plan.threads} threads" if self.plan else "")]
        if self.roles is not None:
            lines.append(f"  master {self.roles.master.pid}: {self.roles.master.why}")
            lines += [f"  {h.role} {h.pid}: {h.why}" for h in self.roles.helpers]
        lines += [f"  {f['role']} {f['pid']}: {f['threads']} thread(s) bound to CPUs {format_cpulist(f['cpus'])} "
                  "(--front-cpus)" for f in self.fronts]
        if self.front is not None:
            lines.append(f"  {self.front['text']}")
        why = {w.pid: w.why for w in self.roles.workers} if self.roles is not None else {}
        for w in self.workers:
            reason = w.get("why") or why.get(w["pid"])
            head = (f"  process {w['pid']} (--front-cpus)" if w["slot"] is None else
                    f"  worker {w['pid']} (slot {w['slot']})")
            lines.append(head + (f": {reason}" if reason else ""))
            for t in w["threads"]:
                rank = "" if t["rank"] is None else f" {t['rank']}"
                cpus = format_cpulist(t["cpus"]) if t["cpus"] else "?"
                planned = ""
                if t.get("planned") is not None:
                    planned = f"  plan {format_cpulist(t['planned'])}" + (
                        "" if sorted(t["planned"]) == sorted(t["cpus"] or ()) else "  (differs)")
                evidence = f"  [{t['evidence']}]" if t.get("evidence") else ""
                note = f"  - {t['why']}" if t["role"] == "other" else ""
                if t.get("note"):
                    note = f"  - {t['note']}"
                lines.append(f"    {t['role']:>5}{rank:<3} tid {t['tid']:<8} cpus {cpus}{planned}{evidence}{note}")
        if self.note:
            lines.append(self.note)
        if warnings:
            lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)





def worker_slots(master, workers=None):
    """``[(slot, pid, exact_main)]`` of the running workers of ``master``, by slot.

    A worker the Gunicorn hooks placed keeps the slot it holds (after a
    replacement that is not its start order); the others take the free slots
    in start order. ``exact_main`` says whether the worker's main thread may
    be bound to a single CPU (see :func:`pin_server`).
    """
    workers = worker_pids(master) if workers is None else workers
    hooked = {pid: rec for pid, rec in hooked_workers(master).items() if pid in workers}
    taken = {slot for slot, _ in hooked.values()}
    free = iter(s for s in range(len(workers) + len(taken)) if s not in taken)
    out = [(hooked[pid][0], pid, hooked[pid][1]) if pid in hooked else (next(free), pid, main_rule(pid)[0])
           for pid in workers]
    return sorted(out)


def _main_note(pid, exact, plan, slot):
    """Why worker ``pid``'s main thread is (to be) bound to one CPU or to all of its slot's."""
    rule, why = main_rule(pid)
    if plan is None or slot is None or slot >= plan.workers:
        where = "may be bound to one CPU" if rule else "is bound to all of its slot's CPUs when pinned"
        return f"{where}: {why}"
    if plan.threads == 1:
        return None
    if rule != exact:
        why = "as the Gunicorn hooks placed it"
    if exact:
        return f"bound to CPU {format_cpulist(plan.slots[slot][0])} alone: {why}"
    return f"bound to all of its slot's CPUs, not only CPU {format_cpulist(plan.slots[slot][0])}: {why}"


def _thread_rows(pid, slot, plan, exact_main, activity=None):
    threads, requests = activity_of(activity, pid)
    rows = []
    for th in classify_threads(pid, activity=threads, requests=requests):
        try:
            cpus = sorted(affinity_of(th.tid))
        except BindingError:
            continue
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "evidence": th.evidence,
                     "cpus": cpus, "planned": _planned(plan, slot, th, exact_main), "kind": th.kind,
                     "team": th.team, "level": th.level,
                     "note": _main_note(pid, exact_main, plan, slot) if th.role == "main" and th.level is None
                     else None})
    return rows


def _planned(plan, slot, th, exact_main):
    """The CPUs the plan gives thread ``th`` of ``slot`` (None for threads left alone): live.threads' one rule."""
    planned = planned_for(plan, slot, th, exact_main)
    return None if planned is None else list(planned)


def server_threads(master, plan=None, activity=None, choice=None, roles=None):
    """Worker -> thread (role, TID) -> allowed CPUs of a running pre-fork server, beside the plan.

    Parameters
    ----------
    master : int
        The master's PID.
    plan : Plan, optional
        Adds each thread's ``planned`` CPUs.
    activity : Activity or dict, optional
        What each worker thread ran while the server served requests
        (:func:`serve_requests`, or ``{pid: {tid: cpu_seconds}}``): tells
        pool threads that wait in libc (ONNX Runtime's) from helper threads.
    choice : WorkerChoice, optional
        The workers, when the user names them; else :func:`server_roles` finds them.
    roles : ServerRoles, optional
        The roles found already (then ``choice`` is not used).

    Returns
    -------
    list of dict
        ``{"slot", "pid", "why", "exact_main", "threads": [{"tid", "role", "rank", "why", "evidence", "cpus",
        "planned", "note"}]}`` by slot (:func:`worker_slots`); ``why`` says why the process is a worker,
        ``exact_main`` whether its main thread may be bound to one CPU (:func:`pin_server`).
    """
    roles = roles or server_roles(master, choice)
    why = {w.pid: w.why for w in roles.workers}
    out = []
    for slot, pid, exact in worker_slots(master, roles.worker_pids):
        try:
            out.append({"slot": slot, "pid": pid, "why": why[pid], "exact_main": exact,
                        "threads": _thread_rows(pid, slot, plan, exact, activity)})
        except PinError:
            continue                                   # the worker exited while we looked
    return out


# -- pinning ----------------------------------------------------------------------------------------

def _check_permission(pids):
    for pid in pids:
        try:
            # Setting a thread's own mask again changes nothing, and fails exactly where pinning would.
            os.sched_setaffinity(pid, os.sched_getaffinity(pid))
        except PermissionError:
            raise PinError(f"permission denied: cannot set the CPU affinity of worker {pid} "
                           "(another user's process); run as that user or as root") from None
        except ProcessLookupError:
            continue


def _pin_worker(record, pid, slot, plan, report, dry_run, exact=None, activity=None, keep=()):
    """Bind worker ``pid`` to ``slot`` of ``plan`` and add its rows to ``report``; threads in ``keep`` (masks
    someone else set since tuna_lab's) are left as they are. Every mask is recorded in ``record`` (the
    ledger's record of the server) before it is set; None with ``dry_run``."""
    exact = main_rule(pid)[0] if exact is None else exact
    gains, requests = activity_of(activity, pid)
    threads = classify_threads(pid, activity=gains, requests=requests)
    pool = [t for t in threads if t.role == "pool"]
    if len(pool) < plan.threads - 1:
        if isinstance(activity, Activity) and pid in activity.idle:
            hint = f"it served none of the {activity.requests} requests, so its activity tells nothing"
        elif gains is None:
            hint = ("its pool may not exist yet - OpenMP starts it at the first parallel region - or wait in "
                    "libc, as ONNX Runtime's does: --url URL tells pool threads by their activity")
        else:
            hint = "its pool may not exist yet, or be smaller than T"
        report.warnings.append(f"worker {pid} (slot {slot}) has {len(pool)} pool thread(s), fewer than "
                               f"T-1={plan.threads - 1}: pinned as far as it goes ({hint})")
    # A worker the hooks placed beyond the plan's slots (another plan's) is only reported.
    bound = {}
    if slot < plan.workers:
        now = bind_threads(plan, slot, threads, exact, dry_run=True)
        if not dry_run:
            intent = {b.tid: (b.cpus, b.planned) for b in now if b.error is None}
            intent = {tid: masks for tid, masks in intent.items() if tid not in keep}
            record_pins(record, pid, slot, intent)
            if keep and any(b.tid in keep for b in now):
                now = [b if b.tid in keep or b.error else _bound(b) for b in now]
            else:
                now = bind_threads(plan, slot, threads, exact)
            _forget(record, {b.tid for b in now if b.error is not None})
        bound = {b.tid: b for b in now}
    rows = []
    for th in threads:
        b = bound.get(th.tid)
        if b is not None and b.error:
            if not dry_run:
                report.warnings.append(f"worker {pid}: {b.error}")
            continue
        if b is None:
            try:
                got = sorted(affinity_of(th.tid))
            except BindingError:
                continue
        note = _main_note(pid, exact, plan, slot) if th.role == "main" and th.level is None else None
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "evidence": th.evidence,
                     "kind": th.kind, "team": th.team, "level": th.level,
                     "cpus": list(b.cpus) if b is not None else got,
                     "planned": list(b.planned) if b is not None else None, "note": note})
    report.workers.append({"slot": slot, "pid": pid, "threads": rows})


def _forget(record, failed):
    """Drop from ``record`` the threads whose binding failed (their mask is not tuna_lab's)."""
    if failed:
        record.forget([key for key, c in record.changes.items() if c.kind == "thread" and int(c.target) in failed])
        record.save()


def _pin_front(record, roles, cpus, report, dry_run):
    """Bind every thread of the master, the helpers and the front ends to ``cpus`` (``--front-cpus``).

    Recorded as the workers' masks are (slot None), so that :func:`unpin_server` gives back exactly these.
    """
    cpus = sorted(cpus)
    for proc in (roles.master, *roles.helpers):
        tids = threads_of(proc.pid)
        if not tids:
            continue                                   # it exited meanwhile
        if not dry_run:
            intent = {}
            for tid in tids:
                with contextlib.suppress(BindingError):
                    intent[tid] = (sorted(affinity_of(tid)), cpus)
            record_pins(record, proc.pid, None, intent)
            failed = set()
            for tid in intent:
                try:
                    bind(tid, cpus)
                except BindingError as exc:
                    failed.add(tid)
                    if procfs.thread_exists(proc.pid, tid):
                        report.warnings.append(f"{proc.role} {proc.pid}: {exc}")
            _forget(record, failed)
        report.fronts.append({"pid": proc.pid, "role": proc.role, "cpus": cpus, "threads": len(tids)})


def check_front_cpus(plan, front_cpus):
    """Refuse (:class:`PinError`) a plan that places a worker thread on one of ``front_cpus``; returns them sorted."""
    front = sorted({int(c) for c in front_cpus})
    shared = sorted(set(front) & {c for row in plan.slots for cpus in row for c in cpus})
    if shared:
        raise PinError(f"the plan places worker threads on CPU {format_cpulist(shared)}, which --front-cpus "
                       f"{format_cpulist(front)} keeps for the master and front ends: make the plan with "
                       f"`tuna-lab plan --front-cpus {format_cpulist(front).replace(' ', '')}`")
    return front


def server_cpus(master):
    """The CPUs server ``master`` may use: its master's mask, or the one it had before tuna_lab bound it.

    After ``pin --front-cpus`` the master sits on the front CPUs; a later
    pin (or plan) of the same server is made for the server's CPUs, not those.

    Raises
    ------
    PinError
        No such process.
    """
    try:
        now = sorted(affinity_of(int(master)))
    except (BindingError, ValueError, TypeError):
        raise PinError(f"no process with PID {master}") from None
    rec = pin_records(master)["threads"].get(int(master))
    return rec["before"] if rec is not None and rec["set"] == now else now


def _bound(planned):
    """A :class:`~tuna_lab.live.binding.ThreadBinding` of a dry run, bound now (or with its error)."""
    try:
        return dataclasses.replace(planned, cpus=tuple(sorted(bind(planned.tid, planned.planned))))
    except BindingError as exc:
        return dataclasses.replace(planned, cpus=None, error=str(exc))


def pin_server(master, plan, dry_run=False, activity=None, choice=None, front_cpus=None):
    """Bind every worker of the running server ``master`` to ``plan`` (slots: :func:`worker_slots`).

    Parameters
    ----------
    master : int
        The master's PID.
    plan : Plan
        Checked against this machine by the caller (:meth:`Plan.check_machine`).
    dry_run : bool
        Find and report, bind nothing.
    activity : Activity or dict, optional
        What each worker thread ran while the server served requests
        (:func:`serve_requests`, or ``{pid: {tid: cpu_seconds}}``): pool
        threads that wait in libc (ONNX Runtime's) are found by it.
    choice : WorkerChoice, optional
        The workers, when the user names them; else :func:`server_roles` finds them.
    front_cpus : iterable of int, optional
        Bind every thread of the master, the helpers and the front ends to
        these CPUs (``--front-cpus``); the plan must use none of them
        (:func:`check_front_cpus`).

    Returns
    -------
    PinReport
        With the roles found; every mask set is recorded (with the one it
        replaced) for :func:`unpin_server`. With ``activity``, what the
        master and front ends ran beside the workers (:meth:`PinReport.add_activity`).

    Raises
    ------
    PinError
        No such process, no workers, a plan for another number of workers
        (the message names the helpers left out), no permission, or no worker
        whose threads could be read. Nothing is pinned then.
    """
    front = None if front_cpus is None else check_front_cpus(plan, front_cpus)
    roles = server_roles(master, choice)
    workers = roles.worker_pids
    if len(workers) != plan.workers:
        raise PinError(f"server {master} has {len(workers)} worker{'' if len(workers) == 1 else 's'} "
                       f"({', '.join(map(str, workers))}) but the plan has {plan.workers} slots: make the plan "
                       f"with -w {len(workers)}; left out as no workers: {roles.left_out()} (--worker-pids PID,PID or "
                       "--worker-match REGEX names them yourself)")
    _check_permission(workers if front is None else [*workers, roles.master.pid, *(h.pid for h in roles.helpers)])
    report = PinReport(int(master), plan, roles=roles)
    why = {w.pid: w.why for w in roles.workers}
    skipped = []
    # Locked: two pins (or a pin and an unpin) of one server take turns, so that the record ends as the kernel.
    with (contextlib.nullcontext(None) if dry_run else open_pins(master)) as record:
        if record is not None and record.changes:
            # A pin over a pin: every "before" stays the one recorded before the first, never a mask we set.
            report.repinned = record.path
            report.note = (f"server {master} was pinned by tuna_lab already (record {record.path}): each thread "
                           "keeps, for unpin, its mask from before the first pin")
        for slot, pid, exact in worker_slots(master, workers):
            try:
                _pin_worker(record, pid, slot, plan, report, dry_run, exact, activity)
                report.workers[-1]["why"] = why[pid]
            except PinError as exc:
                skipped.append(f"worker {pid} (slot {slot}): {exc}")
                report.warnings.append(f"worker {pid} (slot {slot}) skipped: {exc}")
        if skipped and not report.workers:
            # Not one worker could be read or bound (ptrace rules, all exited): that is a failure, not a warning.
            raise PinError(f"pinned nothing: {skipped[0]}" + (f" (and {len(skipped) - 1} more)"
                                                              if len(skipped) > 1 else ""))
        if front is not None:
            _pin_front(record, roles, front, report, dry_run)
    # Threaded workers (the model runs off the main thread): how they are placed, in figures, and the knob.
    report.warnings += threading_lines(master, report.workers, plan)
    return report.add_activity(activity if isinstance(activity, Activity) else None, front)


def unpin_server(master):
    """Give back the masks ``pin --pid`` (or ``run --pid``) set on server ``master``, by the ledger's one rule.

    A mask goes back only to the same thread (PID, TID and both start times
    match) whose mask is still the one tuna_lab set; a thread born since under
    a mask tuna_lab set gets its process's mask from before the first pin
    (:meth:`~tuna_lab.live.ledger.Record.give_back`). Anything else is said
    in ``warnings`` and kept in the record; a malformed entry too, and
    ``report.failed`` is then set (the CLI exits 1). With nothing recorded
    nothing is changed, and the report's ``note`` says so.
    """
    report = PinReport(int(master), None)
    with open_pins(master) as record:
        if not record.changes and not record.malformed:
            report.note = (f"nothing to unpin: tuna_lab has no record of a pin of server {master} (never pinned by "
                           "`pin --pid`, or unpinned already); no mask was changed")
            return report
        procs = {c.pid: c.slot for c in record.changes.values() if c.kind == "thread"}
        _check_permission(sorted(pid for pid in procs if psutil.pid_exists(pid)))
        given = record.give_back()
    report.warnings += given.left + given.malformed
    report.record = given.path
    report.failed = not given.ok
    for pid, slot in sorted(procs.items(), key=lambda kv: (kv[1] is not None, kv[1] or 0, kv[0])):
        rows = []
        for tid in threads_of(pid):
            with contextlib.suppress(BindingError):
                rows.append({"tid": tid, "role": "main" if tid == pid else "thread", "rank": None, "why": "",
                             "cpus": sorted(affinity_of(tid)), "planned": None, "note": None})
        if rows:
            report.workers.append({"slot": slot, "pid": pid, "threads": rows})
    if not given.done:
        report.note = "no mask was changed: no thread tuna_lab pinned is still on the mask tuna_lab set"
    if given.path:
        report.warnings.append(f"what could not be given back is kept in {given.path}")
    return report


def _signature(worker):
    """What a report shows of a worker: its slot and every thread's role and CPUs (a change is shown again)."""
    return worker["slot"], tuple((t["tid"], t["role"], tuple(t["cpus"] or ())) for t in worker["threads"])


def _changed_by_others(master, pids, enforce, report):
    """The TIDs of ``pids`` whose mask is no longer the one tuna_lab set (someone else changed it).

    Each is reported in ``report.warnings``; with ``enforce`` it gets the
    mask tuna_lab set back (and is not returned).
    """
    changed = set()
    for tid, rec in pin_records(master)["threads"].items():
        if rec["pid"] not in pids:
            continue
        try:
            now = sorted(affinity_of(tid))
        except BindingError:
            continue                                   # it ended
        if now == rec["set"]:
            continue
        where = (f"worker {rec['pid']} thread {tid} is on CPUs {format_cpulist(now)}, not the "
                 f"{format_cpulist(rec['set'])} tuna_lab set: someone else changed its mask")
        if enforce:
            try:
                bind(tid, rec["set"])
                report.warnings.append(f"{where}; put back (--enforce)")
                continue
            except BindingError as exc:
                report.warnings.append(f"{where}; could not put it back: {exc}")
        else:
            report.warnings.append(f"{where}; left as it is (--enforce puts it back)")
        changed.add(tid)
    return changed


def watch_server(master, plan, stop, interval=0.2, on_pin=None, activity=None, choice=None, enforce=False,
                 pinned=None):
    """Keep ``master``'s workers pinned to ``plan`` until ``stop.is_set()`` (a :class:`threading.Event`).

    A new worker (a replacement of one that exited) takes the lowest slot no
    live worker holds, which is its predecessor's; pool threads that appear
    later in any worker (OpenMP starts its pool at the first parallel region)
    are bound when they are first seen waiting (a worker whose thread kept
    running is looked at again for a few rounds). A worker with fewer pool
    threads than ``T-1`` is watched under the live traffic: threads that gain
    CPU time while it serves requests (:func:`active_threads`, counted from
    when the watch first saw the worker) are bound as pool threads.
    ``activity`` (from :func:`serve_requests`) is used for the workers it
    measured until they change. ``choice`` (:class:`WorkerChoice`) names the
    workers when the user does. Pins stay in place when it returns.

    A thread tuna_lab pinned whose mask someone else changed is reported
    and left as it is - also when its worker is pinned again - unless
    ``enforce``: then it gets its planned mask back.

    ``on_pin(report)`` is called after each round that changed something:
    the report holds only the workers whose threads or masks changed since
    they were last shown, and only warnings not given before (each is given
    once). ``pinned`` is the :class:`PinReport` of the pin the watch
    follows: its workers are not shown again, nor its warnings repeated.
    """
    slots = {pid: slot for slot, pid, _ in worker_slots(master, worker_pids(master, choice))}
    seen, busy, short, known = {}, {}, {}, {}
    base = {}
    said = set(pinned.warnings) if pinned is not None else set()
    shown = {w["pid"]: _signature(w) for w in pinned.workers} if pinned is not None else {}
    for w in pinned.workers if pinned is not None else ():
        rows = w["threads"]
        pool = {t["tid"] for t in rows if t["role"] == "pool"}
        if w["pid"] in slots and not any(t["why"].startswith(RUNNING) for t in rows):
            # What the pin saw: looked at again only when the worker's threads change, as any other.
            seen[w["pid"]] = ({t["tid"] for t in rows}, tuple(sorted(loaded_runtimes(w["pid"]))))
            short[w["pid"]], known[w["pid"]] = len(pool) < plan.threads - 1, pool
    while not stop.is_set():
        try:
            live = worker_pids(master, choice)
        except PinError:
            if not psutil.pid_exists(int(master)):
                return
            live = []
        for pid in [p for p in slots if p not in live]:
            del slots[pid]
            for state in (seen, busy, short, known, base, shown):
                state.pop(pid, None)
        hooked = hooked_workers(master) if any(pid not in slots for pid in live) else {}
        for pid in live:
            if pid not in slots:
                # A worker the Gunicorn hooks placed holds its slot already; any other
                # takes the lowest slot no live worker holds: its predecessor's.
                free = [s for s in range(plan.workers) if s not in slots.values()]
                if pid in hooked:
                    slots[pid] = hooked[pid][0]
                elif free:
                    slots[pid] = free[0]
        report = PinReport(int(master), plan)
        theirs = _changed_by_others(master, set(slots), enforce, report)
        for pid, slot in sorted(slots.items(), key=lambda kv: kv[1]):
            try:
                # A worker is looked at again when its threads change, or the runtimes it loaded: one caught
                # while it loads libgomp before XGBoost had its main thread bound by the first one's rule.
                tids = ({t.id for t in psutil.Process(pid).threads()}, tuple(sorted(loaded_runtimes(pid))))
                now = thread_cpu_times(pid)
            except (psutil.NoSuchProcess, PinError):
                continue
            base.setdefault(pid, now)
            gains = {tid: now[tid] - base[pid].get(tid, 0.0) for tid in now}
            measured = activity_of(activity, pid)[0] if seen.get(pid) is None else None
            active = active_threads(gains, main=pid)
            if seen.get(pid) == tids and not (short.get(pid) and active - known.get(pid, set())):
                continue
            # Live traffic decides once it shows something; until then a measurement given to us does.
            use = gains if active else measured
            exact = hooked_workers(master).get(pid, (None, None))[1]
            try:
                with open_pins(master) as record:
                    _pin_worker(record, pid, slot, plan, report, dry_run=False, exact=exact,
                                activity=None if use is None else {pid: use}, keep=theirs)
            except PinError:
                continue
            rows = report.workers[-1]["threads"]
            pool = {t["tid"] for t in rows if t["role"] == "pool"}
            short[pid] = len(pool) < plan.threads - 1
            known[pid] = pool | active                 # an active thread its name rules out is not tried again
            if _signature(report.workers[-1]) == shown.get(pid):
                report.workers.pop()                   # pinned again as it was: nothing new to show
            else:
                shown[pid] = _signature(report.workers[-1])
            if any(t["why"].startswith(RUNNING) for t in rows):
                busy[pid] = busy.get(pid, 0) + 1
                if busy[pid] < _WATCH_RETRIES:
                    continue                           # perhaps a pool thread at work: look again
            seen[pid], busy[pid] = tids, 0
        new = [w for w in dict.fromkeys(report.warnings) if w not in said]
        said.update(new)
        report.warnings = new
        if (report.workers or report.warnings) and on_pin is not None:
            on_pin(report)
        stop.wait(interval)

