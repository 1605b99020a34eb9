"""Pin a pre-fork server that is already running, by its master's PID.

A pre-fork server (Gunicorn, uvicorn ``--workers``) is a master process whose
children are the workers. :func:`pin_server` gives each worker a *slot* of a
:class:`~tuna_lab.placement.plan.Plan` (workers in start order), finds its
threads and binds them by TID:

* the **main thread** is the thread whose TID is the worker's PID;
* the **pool threads** are the threads that sit in an OpenMP or BLAS runtime,
  or that work while the worker serves requests
  (:func:`~tuna_lab.placement.pools.classify_threads`). Pool threads are
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
:func:`~tuna_lab.placement.binding.bind_worker`, as the Gunicorn hooks bind theirs.

:func:`unpin_server` gives every worker thread back the mask it had before the
pin (the master's, to a thread born since), and
:func:`watch_server` re-pins a replacement worker to the slot its predecessor
left. Nothing here pins the master.

Examples
--------
>>> import os
>>> [t.role for t in classify_threads(os.getpid())][:1]
['main']
"""

import contextlib
import glob
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from .. import _files
from .._checks import format_cpulist
from ..errors import BindingError, PinError
from ..machine.procfs import remove_dead_folders, start_ticks
from .binding import affinity_of, bind, bind_worker, planned_cpus
from .pools import (ACTIVE_FLOOR, ACTIVE_SHARE, RUNNING, ThreadRole, active_threads, classify_threads, main_rule,
                    thread_cpu_times)

__all__ = ["ThreadRole", "Activity", "classify_threads", "thread_cpu_times", "active_threads", "serve_requests",
           "ACTIVE_FLOOR", "ACTIVE_SHARE", "worker_pids", "worker_slots", "server_threads", "pin_server",
           "unpin_server", "watch_server", "PinReport", "check_server", "hook_dir", "hook_mark", "hook_records",
           "hook_dir_problem", "trusted_hook_dir", "write_hook_record", "remove_dead_state", "HOOK_MARK",
           "HOOK_RECORDS"]

# Rounds of --watch that look again at a worker with such a thread: a pool thread busy with
# a request settles within them (then it is bound); one that always spins never does.
_WATCH_RETRIES = 25
# Children of a master that are no workers: uvicorn --workers starts its workers with
# multiprocessing's spawn, which first starts a resource tracker (and forkserver, a fork server).
_HELPER_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


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

    def describe(self, warnings=False):
        """The report as text: one block per worker, one line per thread with the evidence of its role.

        Warnings are left out unless ``warnings``: the CLI prints them once, on stderr.
        """
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
                evidence = f"  [{t['evidence']}]" if t.get("evidence") else ""
                note = f"  - {t['why']}" if t["role"] == "other" else ""
                if t.get("note"):
                    note = f"  - {t['note']}"
                lines.append(f"    {t['role']:>5}{rank:<3} tid {t['tid']:<8} cpus {cpus}{planned}{evidence}{note}")
        if warnings:
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


def check_server(master, force=False):
    """Refuse (:class:`PinError`) to pin ``master`` unless it is a pre-fork server's master, or ``force``.

    PID 1 (init, or a container's first process) is always refused: its
    children are the whole system's (or container's) services. Any other
    process counts as a pre-fork master when every worker (:func:`worker_pids`)
    runs the master's own program - a fork of it (Gunicorn), or the same
    interpreter started again (uvicorn's spawned workers): a shell whose
    children are ``sleep`` processes is not one. A worker whose program
    cannot be read (another user's) is left to the permission check.
    Returns the workers' PIDs.

    Examples
    --------
    >>> check_server(1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: PID 1 is the system's (or container's) first process, not a server's master; ...
    """
    if int(master) == 1 and not force:
        raise PinError("PID 1 is the system's (or container's) first process, not a server's master; "
                       "give --force to pin its children anyway")
    workers = worker_pids(master)
    if force:
        return workers
    try:
        program = psutil.Process(int(master)).exe()
        others = {}
        for pid in workers:
            with contextlib.suppress(psutil.NoSuchProcess):     # a worker that exited meanwhile
                others[pid] = psutil.Process(pid).exe()
    except psutil.AccessDenied:
        return workers
    except psutil.NoSuchProcess:
        raise PinError(f"no process with PID {master}") from None
    strangers = sorted(pid for pid, exe in others.items() if exe != program)
    if strangers:
        name = os.path.basename(others[strangers[0]]) or "?"
        raise PinError(f"PID {master} ({os.path.basename(program) or '?'}) is not a recognised pre-fork server: "
                       f"its child {strangers[0]} runs {name}, not the master's program; give --force to pin "
                       "its children anyway")
    return workers


def _is_helper(proc):
    try:
        command = " ".join(proc.cmdline())
    except psutil.AccessDenied:
        return False
    return any(name in command for name in _HELPER_PROCESSES)




@dataclass
class Activity:
    """CPU time every worker thread gained while a server served requests.

    ``threads[pid][tid]`` is seconds gained by thread ``tid`` of worker
    ``pid``; ``requests`` how many requests were sent over ``seconds`` wall
    seconds; ``idle`` the workers that gained (next to) no CPU time, i.e.
    served none of them.
    """

    threads: dict
    requests: int = 0
    seconds: float = 0.0
    idle: tuple = ()


# What a worker must gain in CPU time (s) over the requests to count as having served some.
_SERVED = 0.005
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _check_loopback(url):
    from urllib.parse import urlsplit
    import ipaddress

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        loopback = host in _LOOPBACK_NAMES or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme not in ("http", "https") or not loopback:
        raise PinError(f"--url must be an http:// URL on this machine's loopback (127.0.0.1, localhost, ::1), "
                       f"got {url!r}")


def _send(opener, url, method, headers, body, timeout):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with opener.open(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise PinError(f"{method} {url} answered {exc.code} {exc.reason}: give the URL (and --method, --header, "
                       "--body) of a request that runs the model") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise PinError(f"cannot send {method} {url}: {getattr(reason, 'strerror', None) or reason}") from None


def serve_requests(master, url, method=None, headers=(), body=None, requests=8, max_requests=64,
                   max_seconds=15.0, timeout=10.0):
    """Send a few requests to the running server ``master`` and measure what each worker thread ran meanwhile.

    Requests go ``len(workers)`` at a time, so that every worker gets some,
    until at least ``requests`` were sent and every worker gained CPU time,
    or ``max_requests`` were sent, or ``max_seconds`` passed. Only loopback
    URLs are accepted, and no proxy is used.

    Parameters
    ----------
    master : int
        The server's master PID.
    url : str
        An ``http://127.0.0.1:PORT/...`` (or ``localhost``, ``[::1]``) URL of a request that runs the model.
    method : str, optional
        Default ``POST`` when there is a ``body``, else ``GET``.
    headers : iterable of (str, str)
        Request headers.
    body : bytes, optional
        The request body, the same for every request.
    requests, max_requests, max_seconds, timeout : int, int, float, float
        The bounds above; ``timeout`` is per request.

    Returns
    -------
    Activity
        Per worker, per thread, the CPU seconds gained; pass it to
        :func:`pin_server` or :func:`server_threads`.

    Raises
    ------
    PinError
        Not a loopback URL, a request that fails (connection refused, an
        HTTP error status, a timeout), or no such server. Nothing is bound.

    Examples
    --------
    >>> serve_requests(1, "http://example.com/")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: --url must be an http:// URL on this machine's loopback ...
    """
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    _check_loopback(url)
    method = (method or ("POST" if body is not None else "GET")).upper()
    headers = list(headers or ())
    workers = worker_pids(master)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    before = {pid: thread_cpu_times(pid) for pid in workers}
    start, sent = time.monotonic(), 0
    gains = {}
    with ThreadPoolExecutor(len(workers)) as pool:
        while True:
            list(pool.map(lambda _: _send(opener, url, method, headers, body, timeout), range(len(workers))))
            sent += len(workers)
            gains = {}
            for pid in workers:
                try:
                    now = thread_cpu_times(pid)
                except PinError:
                    continue                           # the worker exited meanwhile
                gains[pid] = {tid: now[tid] - before[pid].get(tid, 0.0) for tid in now}
            idle = tuple(pid for pid in workers if sum(gains.get(pid, {}).values()) < _SERVED)
            elapsed = time.monotonic() - start
            if (sent >= requests and not idle) or sent >= max_requests or elapsed >= max_seconds:
                return Activity(gains, sent, elapsed, idle)


def _activity_of(activity, pid):
    """``({tid: s} or None, requests)`` of worker ``pid`` from an :class:`Activity` or a plain dict."""
    if activity is None:
        return None, None
    if isinstance(activity, Activity):
        return activity.threads.get(pid), activity.requests
    return activity.get(pid), None




def hook_dir(master):
    """Where the Gunicorn hooks (:mod:`tuna_lab.integrations.gunicorn`) of server ``master`` keep their state.

    Keyed by the master's owner, PID and start time: a later master with a
    recycled PID (PID 1 in a restarted container) must not inherit an old
    plan, old slots or an old refusal. The start time is the kernel's, in
    clock ticks since boot: a wall-clock time would change when the clock is
    stepped, and a replacement worker would then look for another folder.
    Only a folder :func:`hook_dir_problem` accepts is ever used.
    """
    proc = psutil.Process(int(master))
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-gunicorn-{proc.uids().real}-{master}-{_started(master)}")


#: The file in the hooks' state folder that says which server made it (:func:`hook_mark`).
HOOK_MARK = "server"
#: The subfolder of the hooks' state folder the workers write their slot records in, after
#: Gunicorn's ``user =`` dropped them to that user: theirs, while the folder above stays the master's.
HOOK_RECORDS = "records"
# Size caps of the small files the hooks and `pin --pid` read back.
_MARK_BYTES, _RECORD_BYTES, _MASKS_BYTES = 512, 4096, 16 << 20


def hook_mark(master):
    """What the marker of ``master``'s state folder says: the master's PID and start time, and the boot.

    The folder's name holds the first two; the boot tells a folder of this
    server from one a temporary folder kept across a reboot holds under the
    same name.
    """
    boot = _files.read_text("/proc/sys/kernel/random/boot_id", limit=64).strip()
    return f"tuna_lab hooks of master {int(master)} started {_started(master)} boot {boot}\n"


def hook_dir_problem(path, master, owner):
    """Why the hooks' state folder ``path`` of ``master`` cannot be trusted; None when it can.

    Trusted only if it is a real folder of ``owner`` (the master's effective
    user, who made it: never the workers' user of Gunicorn's ``user =``) that
    no one else may write, holding the marker its maker wrote before giving it
    its name (:func:`hook_mark`). A folder someone made at the name before
    the server's first worker did is refused, whoever owns it.

    Examples
    --------
    >>> hook_dir_problem("/proc/nonexistent", os.getpid(), os.geteuid())
    'it is missing'
    """
    why = _files.trusted_dir(path, {owner})
    if why:
        return f"it {why}"
    try:
        mark = _files.read_text(os.path.join(path, HOOK_MARK), limit=_MARK_BYTES, follow=False)
    except OSError:
        mark = None
    if mark != hook_mark(master):
        return "this server did not make it (it holds no marker of this server's)"
    return None


def hook_records(master):
    """The folder of ``master``'s hook records if it and the state folder above it are trusted; else None."""
    try:
        proc = psutil.Process(int(master))
        owner = proc.uids().effective
        # The records are written by the workers, under Gunicorn's `user =` as that user.
        writers = {owner} | {child.uids().effective for child in proc.children()}
        if hook_dir_problem(hook_dir(master), master, owner):
            return None
    except (psutil.Error, OSError):
        return None
    records = os.path.join(hook_dir(master), HOOK_RECORDS)
    return None if _files.trusted_dir(records, writers) else records


def remove_dead_state(kind, uid):
    """Remove ``tuna_lab-KIND-UID-PID-START`` folders of this user in the temporary folder whose process is gone.

    Such folders are named after a process (a Gunicorn master, a pinned
    server's master) and its kernel start time; they outlive it when it is
    killed. One is removed only if it is this user's and private (another
    user's is never touched) and no process of that PID and start time runs.
    A name with a suffix (``.XXXXXX``: a folder being made) counts as its process's.
    """
    remove_dead_folders(tempfile.gettempdir(), rf"tuna_lab-{re.escape(kind)}-{int(uid)}-(\d+)-(\d+)(?:\..*)?",
                        lambda path, match: [(int(match[1]), int(match[2]))])


def _started(master):
    """The kernel's start time of process ``master``, in clock ticks since boot (NoSuchProcess if gone)."""
    ticks = start_ticks(master)
    if ticks is None:
        raise psutil.NoSuchProcess(int(master))
    return ticks


def _pin_dir(master):
    """Where ``pin --pid`` keeps, for ``unpin``, every worker thread's mask from before it was first bound.

    Keyed like :func:`hook_dir`, by the user who pins rather than the server's:
    only a folder of theirs that no one else may write is ever read or written.
    """
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-pin-{os.geteuid()}-{int(master)}-{_started(master)}")


def _saved_masks(master):
    """``{tid: cpus}`` saved by earlier pins of ``master``; empty if none (or not in a trusted folder)."""
    try:
        folder = _pin_dir(master)
    except psutil.Error:
        return {}
    if _files.trusted_dir(folder, {os.geteuid()}):
        return {}
    try:
        saved = _files.read_json(os.path.join(folder, "masks.json"), limit=_MASKS_BYTES, follow=False)
        return {int(tid): sorted(int(c) for c in cpus) for tid, cpus in saved.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _remember_masks(master, pids):
    """Save the current mask of every thread of ``pids`` not saved yet: what ``unpin`` gives back."""
    # Threads that exited since are dropped; a thread already saved keeps its first mask.
    live = {tid: cpus for tid, cpus in _saved_masks(master).items() if os.path.exists(f"/proc/{tid}")}
    for pid in pids:
        try:
            for tid in sorted(t.id for t in psutil.Process(pid).threads()):
                live.setdefault(tid, sorted(affinity_of(tid)))
        except (psutil.NoSuchProcess, BindingError):
            continue                                   # gone while we looked
    folder = _pin_dir(master)
    if not os.path.lexists(folder):
        remove_dead_state("pin", os.geteuid())         # the folders of servers pinned before, now gone
    _files.private_dir(folder, error=PinError)
    _files.write_json(os.path.join(folder, "masks.json"), {str(tid): cpus for tid, cpus in live.items()},
                      mode=0o600, durable=False, error=PinError)


def trusted_hook_dir(path, owners):
    """Whether ``path`` is a real folder (no symlink) owned by one of ``owners`` that no one else may write.

    Examples
    --------
    >>> trusted_hook_dir("/proc/nonexistent", {os.getuid()})
    False
    """
    return _files.trusted_dir(path, owners) is None


def write_hook_record(records, slot, pid, exact_main):
    """Record in the folder ``records`` that worker ``pid`` holds ``slot`` and how its main thread is bound."""
    # A new file renamed into place: never written through a link or into a file someone else made.
    _files.write_json(os.path.join(records, f"slot-{slot}.json"),
                      {"slot": slot, "pid": pid, "exact_main": bool(exact_main)}, mode=0o600, durable=False)


def _hooked(master):
    """``{pid: (slot, exact_main)}`` of the workers the Gunicorn hooks placed (none for other servers)."""
    records = hook_records(master)
    if records is None:
        return {}
    out = {}
    for path in glob.glob(os.path.join(glob.escape(records), "slot-*.json")):
        try:
            rec = _files.read_json(path, limit=_RECORD_BYTES, follow=False)
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
    threads, requests = _activity_of(activity, pid)
    rows = []
    for th in classify_threads(pid, activity=threads, requests=requests):
        try:
            cpus = sorted(affinity_of(th.tid))
        except BindingError:
            continue
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "evidence": th.evidence,
                     "cpus": cpus, "planned": _planned(plan, slot, th, exact_main),
                     "note": _main_note(pid, exact_main, plan, slot) if th.role == "main" else None})
    return rows


def _planned(plan, slot, th, exact_main):
    """The CPUs the plan gives thread ``th`` of ``slot`` (None for threads left alone)."""
    if plan is None or slot is None or slot >= plan.workers or th.role == "other":
        return None
    return list(planned_cpus(plan, slot, th.rank, exact_main))


def server_threads(master, plan=None, activity=None):
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

    Returns
    -------
    list of dict
        ``{"slot", "pid", "threads": [{"tid", "role", "rank", "why", "evidence", "cpus", "planned",
        "note"}]}`` by slot (:func:`worker_slots`).
    """
    out = []
    for slot, pid, exact in worker_slots(master):
        try:
            out.append({"slot": slot, "pid": pid, "threads": _thread_rows(pid, slot, plan, exact, activity)})
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


def _pin_worker(pid, slot, plan, report, dry_run, exact=None, activity=None):
    exact = main_rule(pid)[0] if exact is None else exact
    gains, requests = _activity_of(activity, pid)
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
    bound = {b.tid: b for b in bind_worker(plan, slot, [t.tid for t in pool], pid, exact_main=exact,
                                           dry_run=dry_run)} if slot < plan.workers else {}
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
        note = _main_note(pid, exact, plan, slot) if th.role == "main" else None
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "evidence": th.evidence,
                     "cpus": list(b.cpus) if b is not None else got,
                     "planned": list(b.planned) if b is not None else None, "note": note})
    report.workers.append({"slot": slot, "pid": pid, "threads": rows})


def pin_server(master, plan, dry_run=False, activity=None):
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

    Returns
    -------
    PinReport

    Raises
    ------
    PinError
        No such process, no workers, a plan for another number of workers, no
        permission, or no worker whose threads could be read. Nothing is
        pinned then.
    """
    workers = worker_pids(master)
    if len(workers) != plan.workers:
        raise PinError(f"server {master} has {len(workers)} workers but the plan has {plan.workers} slots: "
                       f"make the plan with -w {len(workers)}")
    _check_permission(workers)
    if not dry_run:
        _remember_masks(master, workers)
    report = PinReport(int(master), plan)
    skipped = []
    for slot, pid, exact in worker_slots(master, workers):
        try:
            _pin_worker(pid, slot, plan, report, dry_run, exact, activity)
        except PinError as exc:
            skipped.append(f"worker {pid} (slot {slot}): {exc}")
            report.warnings.append(f"worker {pid} (slot {slot}) skipped: {exc}")
    if skipped and not report.workers:
        # Not one worker could be read or bound (ptrace rules, all exited): that is a failure, not a warning.
        raise PinError(f"pinned nothing: {skipped[0]}" + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1
                                                          else ""))
    return report


def unpin_server(master):
    """Give every worker thread of ``master`` back the mask it had when ``pin --pid`` first bound it.

    A thread born after the pin (or a server never pinned by :func:`pin_server`)
    gets the master's own CPU affinity. The saved masks are forgotten
    afterwards: a later pin saves the masks of that moment.
    """
    workers = worker_pids(master)
    _check_permission(workers)
    cpus = sorted(os.sched_getaffinity(int(master)))
    saved = _saved_masks(master)
    report = PinReport(int(master), None)
    for slot, pid, _ in worker_slots(master, workers):
        rows = []
        try:
            tids = sorted(t.id for t in psutil.Process(pid).threads())
        except psutil.NoSuchProcess:
            continue
        for tid in tids:
            mask, why = (saved[tid], "its mask before the pin") if tid in saved else (cpus, "the master's mask")
            try:
                rows.append({"tid": tid, "role": "main" if tid == pid else "thread", "rank": None, "why": why,
                             "cpus": sorted(bind(tid, mask)), "planned": None})
            except BindingError as exc:
                report.warnings.append(f"worker {pid}: {exc}")
        report.workers.append({"slot": slot, "pid": pid, "threads": rows})
    with contextlib.suppress(OSError, psutil.Error):
        folder = _pin_dir(master)
        if not _files.trusted_dir(folder, {os.geteuid()}):
            shutil.rmtree(folder)
    return report


def watch_server(master, plan, stop, interval=0.2, on_pin=None, activity=None):
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
    measured until they change. ``on_pin(report)`` is called after each round
    that bound something. Pins stay in place when it returns.
    """
    slots = {pid: slot for slot, pid, _ in worker_slots(master)}
    seen, busy, short, known = {}, {}, {}, {}
    base = {}
    while not stop.is_set():
        try:
            live = worker_pids(master)
        except PinError:
            if not psutil.pid_exists(int(master)):
                return
            live = []
        for pid in [p for p in slots if p not in live]:
            del slots[pid]
            for state in (seen, busy, short, known, base):
                state.pop(pid, None)
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
                now = thread_cpu_times(pid)
            except (psutil.NoSuchProcess, PinError):
                continue
            base.setdefault(pid, now)
            gains = {tid: now[tid] - base[pid].get(tid, 0.0) for tid in now}
            measured = _activity_of(activity, pid)[0] if seen.get(pid) is None else None
            active = active_threads(gains, main=pid)
            if seen.get(pid) == tids and not (short.get(pid) and active - known.get(pid, set())):
                continue
            # Live traffic decides once it shows something; until then a measurement given to us does.
            use = gains if active else measured
            exact = _hooked(master).get(pid, (None, None))[1]
            try:
                _remember_masks(master, [pid])
                _pin_worker(pid, slot, plan, report, dry_run=False, exact=exact,
                            activity=None if use is None else {pid: use})
            except PinError:
                continue
            rows = report.workers[-1]["threads"]
            pool = {t["tid"] for t in rows if t["role"] == "pool"}
            short[pid] = len(pool) < plan.threads - 1
            known[pid] = pool | active                 # an active thread its name rules out is not tried again
            if any(t["why"].startswith(RUNNING) for t in rows):
                busy[pid] = busy.get(pid, 0) + 1
                if busy[pid] < _WATCH_RETRIES:
                    continue                           # perhaps a pool thread at work: look again
            seen[pid], busy[pid] = tids, 0
        if report.workers and on_pin is not None:
            on_pin(report)
        stop.wait(interval)
