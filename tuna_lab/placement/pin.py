"""Pin a pre-fork server that is already running, by its master's PID.

A pre-fork server (Gunicorn, uvicorn ``--workers``) is a master process whose
children are the workers. :func:`pin_server` gives each worker a *slot* of a
:class:`~tuna_lab.placement.plan.Plan` (workers in start order), finds its
threads and binds them by TID:

* the **main thread** is the thread whose TID is the worker's PID;
* the **pool threads** are the threads that sit in an OpenMP or BLAS runtime:
  a thread blocked in a system call shows, in ``/proc/<pid>/task/<tid>/syscall``,
  the user-space address it called from, and ``/proc/<pid>/maps`` says which
  library holds that address (libgomp issues its futex waits from its own code).
  Pool threads are ranked by TID, which is their creation order;
* every other thread (Python threads, Gunicorn's, jemalloc's, a thread that
  never stopped running while we looked) is left alone, and the report says why.

Binding the main thread to a single CPU has a cost this project measured:
without ``OMP_PLACES``, GNU libgomp counts the CPUs of the calling thread's
*current* affinity, and XGBoost runs ``min(nthread, that count)`` threads - a
main thread pinned to one CPU makes every later request single-threaded. So
unless the worker was started with ``OMP_PLACES`` (read from its environment;
not with ``OMP_PROC_BIND=false``) and has loaded its OpenMP runtime, its main
thread is bound to all of its slot's CPUs, which keeps libgomp's pool size;
the pool threads get their own CPUs.

:func:`unpin_server` gives every worker thread the master's affinity back, and
:func:`watch_server` re-pins a replacement worker to the slot its predecessor
left. Nothing here pins the master.

Examples
--------
>>> import os
>>> [t.role for t in classify_threads(os.getpid())][:1]
['main']
"""

import bisect
import glob
import json
import os
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from .._checks import format_cpulist
from ..errors import BindingError, PinError
from .binding import affinity_of, bind

__all__ = ["ThreadRole", "classify_threads", "worker_pids", "worker_slots", "server_threads", "pin_server",
           "unpin_server", "watch_server", "PinReport", "hook_dir", "write_hook_record"]

# Libraries whose threads are an OpenMP team or a BLAS pool (file names as the loader maps them).
_RUNTIMES = (("libgomp", "OpenMP"), ("libiomp", "OpenMP"), ("libomp", "OpenMP"),
             ("libopenblas", "BLAS"), ("libmkl", "BLAS"), ("libblis", "BLAS"))
# Why a thread that never waited while we looked is left alone (the report's words).
_RUNNING = "running on every look"
# Rounds of --watch that look again at a worker with such a thread: a pool thread busy with
# a request settles within them (then it is bound); one that always spins never does.
_WATCH_RETRIES = 25
# Children of a master that are no workers: uvicorn --workers starts its workers with
# multiprocessing's spawn, which first starts a resource tracker (and forkserver, a fork server).
_HELPER_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class ThreadRole:
    """One thread of a worker: its TID, role (``main``, ``pool``, ``other``), rank and why."""

    tid: int
    role: str
    rank: object
    why: str


@dataclass
class PinReport:
    """What a pin, unpin or watch did: per worker, its slot and every thread's CPUs; and warnings."""

    master: int
    plan: object
    workers: list = field(default_factory=list)
    warnings: list = field(default_factory=list)

    def to_dict(self):
        """JSON-able: ``master``, ``policy``, ``workers`` (slot, pid, threads), ``warnings``."""
        return {"master": self.master, "policy": getattr(self.plan, "policy", None),
                "fingerprint": getattr(self.plan, "fingerprint", None),
                "workers": self.workers, "warnings": list(self.warnings)}

    def describe(self):
        """The report as text: one block per worker, one line per thread."""
        lines = [f"server {self.master}" + (f": {self.plan.policy}, {self.plan.workers} workers x "
                                            f"{self.plan.threads} threads" if self.plan else "")]
        for w in self.workers:
            lines.append(f"  worker {w['pid']} (slot {w['slot']})")
            for t in w["threads"]:
                rank = "" if t["rank"] is None else f" {t['rank']}"
                cpus = format_cpulist(t["cpus"]) if t["cpus"] else "?"
                planned = ""
                if t.get("planned") is not None:
                    planned = f"  plan {format_cpulist(t['planned'])}" + (
                        "" if sorted(t["planned"]) == sorted(t["cpus"] or ()) else "  (differs)")
                note = f"  - {t['why']}" if t["role"] == "other" or t.get("note") else ""
                if t.get("note"):
                    note = f"  - {t['note']}"
                lines.append(f"    {t['role']:>5}{rank:<3} tid {t['tid']:<8} cpus {cpus}{planned}{note}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# -- finding workers and threads ---------------------------------------------------------------

def worker_pids(master):
    """The master's worker processes, oldest first (their slot order).

    Every child counts except multiprocessing's helper processes (the
    resource tracker that uvicorn ``--workers`` starts beside its workers).

    Raises
    ------
    PinError
        No process ``master``, or it has no children (not a pre-fork master, or
        its workers have not started).
    """
    try:
        proc = psutil.Process(int(master))
        children = proc.children()
    except (psutil.NoSuchProcess, ValueError, TypeError):
        raise PinError(f"no process with PID {master}") from None
    except psutil.AccessDenied:
        raise PinError(f"permission denied: cannot see the children of PID {master}") from None
    live = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not _is_helper(child):
                live.append((child.create_time(), child.pid))
        except psutil.NoSuchProcess:
            continue
    if not live:
        raise PinError(f"PID {master} has no child processes: not a pre-fork server's master, "
                       "or its workers have not started yet")
    return [pid for _, pid in sorted(live)]


def _is_helper(proc):
    try:
        command = " ".join(proc.cmdline())
    except psutil.AccessDenied:
        return False
    return any(name in command for name in _HELPER_PROCESSES)


def _maps(pid):
    """Sorted ``(start, end, library)`` of a process's file-backed mappings."""
    out = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, os.path.basename(parts[5].strip())))
    out.sort()
    return out


def _library_at(maps, address):
    i = bisect.bisect_right(maps, (address, float("inf"), "")) - 1
    return maps[i][2] if i >= 0 and maps[i][0] <= address < maps[i][1] else None


def _waiting_in(pid, tid, maps, looks, interval):
    """The library a thread's current system call was made from; None if it kept running."""
    for attempt in range(looks):
        with open(f"/proc/{pid}/task/{tid}/syscall") as fh:
            fields = fh.read().split()
        if fields and fields[0] != "running":
            return _library_at(maps, int(fields[-1], 16)) or "an anonymous mapping"
        if attempt + 1 < looks:
            time.sleep(interval)
    return None


def classify_threads(pid, looks=5, interval=0.02):
    """Every thread of process ``pid`` as a :class:`ThreadRole`, main thread first, pool by rank.

    Parameters
    ----------
    pid : int
        A worker process.
    looks, interval : int, float
        A thread that is running (not in a system call) is looked at again,
        up to ``looks`` times ``interval`` seconds apart, until it waits.

    Raises
    ------
    PinError
        The process is gone, or its threads cannot be read (another user's).
    """
    try:
        tids = sorted(t.id for t in psutil.Process(pid).threads())
        maps = _maps(pid)
    except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
        raise PinError(f"process {pid} is gone") from None
    except (psutil.AccessDenied, PermissionError):
        raise PinError(f"permission denied: cannot read the threads of process {pid}") from None
    main, pool, other = [ThreadRole(pid, "main", 0, "its TID is the process's PID")], [], []
    for tid in tids:
        if tid == pid:
            continue
        try:
            lib = _waiting_in(pid, tid, maps, looks, interval)
        except (FileNotFoundError, ProcessLookupError):
            continue                                   # exited while we looked
        except PermissionError:
            raise PinError(f"permission denied: cannot read thread {tid} of process {pid}") from None
        kind = next((k for prefix, k in _RUNTIMES if lib and lib.startswith(prefix)), None)
        if kind:
            pool.append((tid, f"waiting in {lib} ({kind} pool)"))
        elif lib is None:
            other.append(ThreadRole(tid, "other", None, f"{_RUNNING}: cannot tell which library "
                                    "it belongs to (an OpenMP thread that spins, OMP_WAIT_POLICY=active?)"))
        else:
            other.append(ThreadRole(tid, "other", None, f"waiting in {lib}: not an OpenMP/BLAS pool thread "
                                    "(a Python, server or library helper thread)"))
    ranked = [ThreadRole(tid, "pool", k + 1, why) for k, (tid, why) in enumerate(pool)]
    return main + ranked + other


def _places_in_effect(pid):
    """Whether the OpenMP runtime of process ``pid`` counts its CPUs from an ``OMP_PLACES`` list.

    Only then may its main thread be pinned to a single CPU. That needs
    ``OMP_PLACES`` in the environment it was started with, without
    ``OMP_PROC_BIND=false`` (libgomp ignores the places then), and the
    runtime loaded already: libgomp builds its places when it loads, from the
    CPUs the main thread may use at that moment - a main thread pinned to one
    CPU before (a replacement worker that ``--watch`` catches while it
    starts) leaves one place and no pool at all.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(v.partition(b"=")[::2] for v in fh.read().split(b"\0") if v)
        loaded = any(lib.startswith(prefix) for _, _, lib in _maps(pid)
                     for prefix, kind in _RUNTIMES if kind == "OpenMP")
    except OSError:
        return False
    unbound = env.get(b"OMP_PROC_BIND", b"").split(b",")[0].strip().lower() == b"false"
    return b"OMP_PLACES" in env and not unbound and loaded


def hook_dir(master):
    """Where the Gunicorn hooks (:mod:`tuna_lab.integrations.gunicorn`) of server ``master`` keep their state.

    Keyed by the master's owner, PID and start time: a later master with a
    recycled PID (PID 1 in a restarted container) must not inherit an old
    plan, old slots or an old refusal.
    """
    proc = psutil.Process(int(master))
    started = int(proc.create_time() * 100)
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-gunicorn-{proc.uids().real}-{master}-{started}")


def write_hook_record(run_dir, slot, pid, exact_main):
    """Record that worker ``pid`` holds ``slot`` and whether its main thread is bound to one CPU."""
    path = os.path.join(run_dir, f"slot-{slot}.json")
    with open(f"{path}.{pid}.tmp", "w") as fh:
        json.dump({"slot": slot, "pid": pid, "exact_main": bool(exact_main)}, fh)
    os.replace(f"{path}.{pid}.tmp", path)


def _hooked(master):
    """``{pid: (slot, exact_main)}`` of the workers the Gunicorn hooks placed (none for other servers)."""
    try:
        paths = glob.glob(os.path.join(hook_dir(master), "slot-*.json"))
    except psutil.Error:
        return {}
    out = {}
    for path in paths:
        try:
            with open(path) as fh:
                rec = json.load(fh)
            out[int(rec["pid"])] = (int(rec["slot"]), bool(rec["exact_main"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def worker_slots(master, workers=None):
    """``[(slot, pid, exact_main)]`` of the running workers of ``master``, by slot.

    A worker the Gunicorn hooks placed keeps the slot it holds (after a
    replacement that is not its start order); the others take the free slots
    in start order. ``exact_main`` says whether the worker's main thread may
    be bound to a single CPU (see :func:`pin_server`).
    """
    workers = worker_pids(master) if workers is None else workers
    hooked = {pid: rec for pid, rec in _hooked(master).items() if pid in workers}
    taken = {slot for slot, _ in hooked.values()}
    free = iter(s for s in range(len(workers) + len(taken)) if s not in taken)
    out = [(hooked[pid][0], pid, hooked[pid][1]) if pid in hooked else (next(free), pid, _places_in_effect(pid))
           for pid in workers]
    return sorted(out)


def _thread_rows(pid, slot, plan, exact_main):
    rows = []
    for th in classify_threads(pid):
        try:
            cpus = sorted(affinity_of(th.tid))
        except BindingError:
            continue
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "cpus": cpus,
                     "planned": _planned(plan, slot, th, exact_main)})
    return rows


def _planned(plan, slot, th, exact_main):
    """The CPUs the plan gives thread ``th`` of ``slot`` (None for threads left alone)."""
    if plan is None or slot is None or slot >= plan.workers or th.role == "other":
        return None
    row = plan.slots[slot]
    union = sorted({c for cpus in row for c in cpus})
    if th.role == "main":
        return list(row[0]) if exact_main else union
    return list(row[th.rank]) if th.rank < plan.threads else union


def server_threads(master, plan=None):
    """Worker -> thread (role, TID) -> allowed CPUs of a running pre-fork server, beside the plan.

    Returns a list of ``{"slot", "pid", "threads": [{"tid", "role", "rank", "why", "cpus", "planned"}]}``,
    by slot (:func:`worker_slots`).
    """
    out = []
    for slot, pid, exact in worker_slots(master):
        try:
            out.append({"slot": slot, "pid": pid, "threads": _thread_rows(pid, slot, plan, exact)})
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


def _pin_worker(pid, slot, plan, report, dry_run, exact=None):
    exact = _places_in_effect(pid) if exact is None else exact
    threads = classify_threads(pid)
    pool = [t for t in threads if t.role == "pool"]
    if len(pool) < plan.threads - 1:
        report.warnings.append(f"worker {pid} (slot {slot}) has {len(pool)} pool thread(s), fewer than "
                               f"T-1={plan.threads - 1}: pinned as far as it goes (its pool may not exist yet: "
                               "OpenMP starts it at the first parallel region)")
    rows = []
    for th in threads:
        want = _planned(plan, slot, th, exact)
        note = None
        if th.role == "main" and not exact and plan.threads > 1:
            note = ("bound to all of its slot's CPUs, not only CPU " + format_cpulist(plan.slots[slot][0])
                    + ": no OMP_PLACES in effect (not in its environment, or OpenMP not loaded yet), "
                    "libgomp would count one CPU and shrink the pool")
        if want is not None and not dry_run:
            try:
                got = sorted(bind(th.tid, want))
            except BindingError as exc:
                report.warnings.append(f"worker {pid}: {exc}")
                continue
        else:
            try:
                got = sorted(affinity_of(th.tid))
            except BindingError:
                continue
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "cpus": got,
                     "planned": want, "note": note})
    report.workers.append({"slot": slot, "pid": pid, "threads": rows})


def pin_server(master, plan, dry_run=False):
    """Bind every worker of the running server ``master`` to ``plan`` (slots: :func:`worker_slots`).

    Parameters
    ----------
    master : int
        The master's PID.
    plan : Plan
        Checked against this machine by the caller (:meth:`Plan.check_machine`).
    dry_run : bool
        Find and report, bind nothing.

    Returns
    -------
    PinReport

    Raises
    ------
    PinError
        No such process, no workers, a plan for another number of workers, or
        no permission. Nothing is pinned then.
    """
    workers = worker_pids(master)
    if len(workers) != plan.workers:
        raise PinError(f"server {master} has {len(workers)} workers but the plan has {plan.workers} slots: "
                       f"make the plan with -w {len(workers)}")
    _check_permission(workers)
    report = PinReport(int(master), plan)
    for slot, pid, exact in worker_slots(master, workers):
        try:
            _pin_worker(pid, slot, plan, report, dry_run, exact)
        except PinError as exc:
            report.warnings.append(f"worker {pid} (slot {slot}) skipped: {exc}")
    return report


def unpin_server(master):
    """Give every thread of every worker of ``master`` the master's own CPU affinity back."""
    workers = worker_pids(master)
    _check_permission(workers)
    cpus = sorted(os.sched_getaffinity(int(master)))
    report = PinReport(int(master), None)
    for slot, pid, _ in worker_slots(master, workers):
        rows = []
        try:
            tids = sorted(t.id for t in psutil.Process(pid).threads())
        except psutil.NoSuchProcess:
            continue
        for tid in tids:
            try:
                rows.append({"tid": tid, "role": "main" if tid == pid else "thread", "rank": None, "why": "",
                             "cpus": sorted(bind(tid, cpus)), "planned": None})
            except BindingError as exc:
                report.warnings.append(f"worker {pid}: {exc}")
        report.workers.append({"slot": slot, "pid": pid, "threads": rows})
    return report


def watch_server(master, plan, stop, interval=0.2, on_pin=None):
    """Keep ``master``'s workers pinned to ``plan`` until ``stop.is_set()`` (a :class:`threading.Event`).

    A new worker (a replacement of one that exited) takes the lowest slot no
    live worker holds, which is its predecessor's; pool threads that appear
    later in any worker (OpenMP starts its pool at the first parallel region)
    are bound when they are first seen waiting (a worker whose thread kept
    running is looked at again for a few rounds). ``on_pin(report)`` is called
    after each round that bound something. Pins stay in place when it returns.
    """
    slots = {pid: slot for slot, pid, _ in worker_slots(master)}
    seen, busy = {}, {}
    while not stop.is_set():
        try:
            live = worker_pids(master)
        except PinError:
            if not psutil.pid_exists(int(master)):
                return
            live = []
        for pid in [p for p in slots if p not in live]:
            del slots[pid]
            seen.pop(pid, None)
            busy.pop(pid, None)
        hooked = _hooked(master) if any(pid not in slots for pid in live) else {}
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
        for pid, slot in sorted(slots.items(), key=lambda kv: kv[1]):
            try:
                tids = {t.id for t in psutil.Process(pid).threads()}
            except psutil.NoSuchProcess:
                continue
            if seen.get(pid) == tids:
                continue
            exact = _hooked(master).get(pid, (None, None))[1]
            try:
                _pin_worker(pid, slot, plan, report, dry_run=False, exact=exact)
            except PinError:
                continue
            if any(t["why"].startswith(_RUNNING) for t in report.workers[-1]["threads"]):
                busy[pid] = busy.get(pid, 0) + 1
                if busy[pid] < _WATCH_RETRIES:
                    continue                           # perhaps a pool thread at work: look again
            seen[pid], busy[pid] = tids, 0
        if report.workers and on_pin is not None:
            on_pin(report)
        stop.wait(interval)
