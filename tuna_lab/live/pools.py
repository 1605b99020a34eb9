"""Finding a worker's pool threads: the OpenMP, BLAS, ONNX Runtime or PyTorch threads a plan places.

Every part of tuna_lab that binds a worker finds its pool here:

* a worker that wakes its own pool (the lab server's warm-up, or
  :func:`wake_openmp` in the Gunicorn hooks) takes the threads that appeared
  meanwhile under the main thread's name (:func:`new_pool_threads`): a pool
  thread inherits the name of the thread that created it, and Linux hands out
  TIDs in increasing order, so TID order is OpenMP's rank order;
* any other worker - one already running (``tuna-lab pin --pid``), or whose
  pool was up before the hooks ran - is read from ``/proc``
  (:func:`classify_threads`): a thread blocked in a system call shows, in
  ``/proc/<pid>/task/<tid>/syscall``, the user-space address it called from,
  and ``/proc/<pid>/maps`` says which library holds that address (libgomp
  issues its futex waits from its own code); where that says only libc
  (ONNX Runtime's own pool), the CPU time each thread gained while the worker
  served requests tells the pool from helper threads (:func:`active_threads`).

Under requests, what each thread did decides first (:func:`by_activity`): a
worker whose model runs off its main thread (FastAPI's sync endpoints,
Gunicorn's ``gthread``, BentoML) has *calling threads*, each with its
runtime's team, and may hold idle leftovers (a team made while the model
loaded), listed ``idle`` and never ranked above a thread that worked;
:mod:`tuna_lab.live.threads` places such workers.

:func:`main_rule` says whether a worker's main thread may be bound to a single
CPU. This module imports nothing heavier than psutil: a Gunicorn worker loads it.

Examples
--------
>>> import os
>>> [t.role for t in classify_threads(os.getpid())][:1]
['main']
"""

import bisect
import os
import time
from dataclasses import dataclass

import psutil

from ..errors import PinError
from ..machine import procfs
from .runtimes import BLAS, FRAMEWORK, OPENMP, RUNTIMES, helper_thread, places_counted, pool_runtime, runtime_of

__all__ = ["ThreadRole", "classify_threads", "thread_cpu_times", "active_threads", "ACTIVE_FLOOR",
           "ACTIVE_SHARE", "RUNNING", "main_rule", "wake_openmp", "openmp_loaded", "new_pool_threads",
           "pool_threads", "loaded_runtimes", "roles_by_library", "by_activity", "MAIN_CALLS", "MAIN_IDLE",
           "IDLE_FLOOR", "IDLE_SHARE"]

# How a reason names the pool of a runtime found by library (placement/runtimes.py's kinds).
_POOL_WORDS = {OPENMP: "OpenMP", BLAS: "BLAS"}
#: :func:`active_threads`: a pool thread gains at least this much CPU time (s) during the requests ...
ACTIVE_FLOOR = 0.002
#: ... and at least this share of what the worker's busiest thread gained.
ACTIVE_SHARE = 0.1
#: How the reason of a thread never seen waiting starts (it is left alone; the report's words).
RUNNING = "running on every look"


@dataclass(frozen=True)
class ThreadRole:
    """One thread of a worker: its TID, role (``main``, ``pool``, ``other``), rank, why, and the evidence.

    ``evidence`` names what decided the role: ``"tid: the process's PID"``,
    ``"library: libgomp.so.1"`` (the library its blocking system call came
    from), ``"activity: 0.420 s CPU during 8 requests"`` (time it ran while
    the worker served requests) or ``"name: jemalloc_bg_thd"`` (its thread
    name).
    """

    tid: int
    role: str
    rank: object
    why: str
    evidence: str = ""
    #: What the thread does (:mod:`tuna_lab.live.threads`): ``main``, ``caller`` (it ran the model off the
    #: main thread), ``member`` (of a runtime's team), ``busy`` (worked: a caller or a runtime's own pool,
    #: which /proc cannot tell apart), ``idle`` (a runtime's thread that did nothing under requests),
    #: ``helper`` or ``other``; None where no requests were measured.
    kind: str = None
    #: The calling thread whose team it belongs to, where that is known.
    team: int = None
    #: ``"slot"``: placed on all of its slot's CPUs (the worker's whole thread set shares them); None: by
    #: ``role`` and ``rank`` (:func:`tuna_lab.live.threads.planned_for`).
    level: str = None




def _maps(pid):
    """Sorted ``(start, end, library)`` of a process's file-backed mappings."""
    return [(lo, hi, os.path.basename(path)) for lo, hi, path in procfs.mappings(pid)]


def _library_at(maps, address):
    i = bisect.bisect_right(maps, (address, float("inf"), "")) - 1
    return maps[i][2] if i >= 0 and maps[i][0] <= address < maps[i][1] else None


def _waiting_in(pid, tid, maps, looks, interval):
    """The library a thread's current system call was made from; None if it kept running."""
    for attempt in range(looks):
        fields = procfs.thread_syscall(pid, tid)
        if fields and fields[0] != "running":
            return _library_at(maps, int(fields[-1], 16)) or "an anonymous mapping"
        if attempt + 1 < looks:
            time.sleep(interval)
    return None


def thread_cpu_times(pid):
    """CPU time every thread of process ``pid`` has run so far, in seconds, by TID.

    Read from the first field of ``/proc/<pid>/task/<tid>/schedstat`` (ns,
    not rounded to clock ticks as ``stat`` is). A thread that exits while
    it is read is left out.

    Raises
    ------
    PinError
        The process is gone, or its threads cannot be read.

    Examples
    --------
    >>> import os
    >>> times = thread_cpu_times(os.getpid())
    >>> os.getpid() in times and times[os.getpid()] > 0
    True
    """
    try:
        return procfs.thread_cpu(pid)
    except ProcessLookupError:
        raise PinError(f"process {pid} is gone") from None
    except PermissionError:
        raise PinError(f"permission denied: cannot read the threads of process {pid}") from None


def active_threads(activity, main=None, floor=ACTIVE_FLOOR, share=ACTIVE_SHARE):
    """The threads that worked while a worker served requests: its pool, told from helper threads.

    A pool thread runs while its worker serves a request and sleeps
    otherwise; a helper thread (a Python thread, a server's, an allocator's,
    a pool of a library the model does not use) barely runs. A thread counts
    as active when it gained at least ``floor`` seconds and at least
    ``share`` of what the busiest thread of the worker gained.

    Parameters
    ----------
    activity : dict
        ``{tid: cpu_seconds}`` each thread gained during the requests (from
        two :func:`thread_cpu_times` readings around them).
    main : int, optional
        The worker's main thread (its PID): it is measured with the others
        (it serves the request, and its time sets the scale) but never
        returned.
    floor, share : float
        The thresholds above.

    Returns
    -------
    set of int
        The active TIDs, ``main`` excluded.

    Examples
    --------
    >>> sorted(active_threads({100: 0.40, 101: 0.35, 102: 0.0004, 103: 0.0}, main=100))
    [101]
    >>> active_threads({100: 0.0005, 101: 0.0003}, main=100)   # served nothing: nothing to tell
    set()
    """
    if not activity:
        return set()
    top = max(activity.values())
    return {tid for tid, gained in activity.items()
            if tid != main and gained >= floor and gained >= share * top}


def _comm(pid, tid):
    return procfs.thread_name(pid, tid) or ""


def classify_threads(pid, looks=5, interval=0.02, activity=None, requests=None):
    """Every thread of process ``pid`` as a :class:`ThreadRole`, main thread first, pool by rank.

    A thread is a pool thread by the first evidence that says so:

    1. **name**: a thread name of a known helper (``jemalloc_bg_thd``, an
       io_uring kernel thread ``iou-sqp-*``/``iou-wrk-*``:
       :data:`~tuna_lab.live.runtimes.HELPER_THREADS`) makes it no pool thread;
    2. **library**: it is blocked in a system call made from an OpenMP or BLAS
       runtime's code (the records of :mod:`~tuna_lab.live.runtimes`
       found by library: libgomp, libiomp, libomp, OpenBLAS, MKL, BLIS);
    3. **activity**: where the library says only ``libc`` (ONNX Runtime's own
       pool, a BLAS pool waiting on a pthread condition) or the thread kept
       running, the CPU time it gained while the worker served requests
       (``activity``, see :func:`active_threads`) tells the pool from helper
       threads.

    Pool threads found by library are ranked first, by TID (creation order),
    then those found by activity, by TID: in a PyTorch worker the libgomp
    intra-op team takes ranks 1..T-1 and an inter-op thread that worked
    during the requests comes after it.

    Parameters
    ----------
    pid : int
        A worker process.
    looks, interval : int, float
        A thread that is running (not in a system call) is looked at again,
        up to ``looks`` times ``interval`` seconds apart, until it waits.
    activity : dict, optional
        ``{tid: cpu_seconds}`` each thread gained while the worker served
        requests. Without it, threads that wait in libc are left alone.
    requests : int, optional
        How many requests ``activity`` was measured over (for the evidence text).

    Raises
    ------
    PinError
        The process is gone, or its threads cannot be read (another user's).

    Examples
    --------
    >>> import os
    >>> main = classify_threads(os.getpid())[0]
    >>> main.role, main.evidence
    ('main', "tid: the process's PID")
    """
    try:
        tids = sorted(t.id for t in psutil.Process(pid).threads())
        maps = _maps(pid)
    except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
        raise PinError(f"process {pid} is gone") from None
    except (psutil.AccessDenied, PermissionError):
        raise PinError(f"permission denied: cannot read the threads of process {pid}") from None
    seen = []
    for tid in tids:
        if tid == pid:
            continue
        name = _comm(pid, tid)
        helper = helper_thread(name)
        lib = None
        if not helper:
            # Named first: an io_uring kernel thread's syscall file names no user-space caller.
            try:
                lib = _waiting_in(pid, tid, maps, looks, interval)
            except (FileNotFoundError, ProcessLookupError):
                continue                               # exited while we looked
            except PermissionError:
                raise PinError(f"permission denied: cannot read thread {tid} of process {pid}") from None
        seen.append((tid, name, helper, lib, pool_runtime(lib)))
    if activity is not None:
        # Under requests, what each thread did decides (one rule for every command; the module says how).
        found = by_activity(pid, seen, activity, requests)
        if found is not None:
            return found
    return roles_by_library(pid, seen, activity, requests)


def roles_by_library(pid, seen, activity=None, requests=None):
    """:func:`classify_threads` where the main thread is the one calling thread: pool by library, then activity.

    ``seen`` holds ``(tid, name, helper, library, runtime)`` of every thread
    but the main one (``helper`` the words of a known helper's name,
    ``runtime`` the :func:`pool_runtime` of the library it waits in).
    """
    active = active_threads(activity, main=pid) if activity is not None else set()
    during = f"during {requests} request{'' if requests == 1 else 's'}" if requests else "during the traffic"
    main = [ThreadRole(pid, "main", 0, "its TID is the process's PID", "tid: the process's PID")]
    by_library, by_activity, other = [], [], []
    for tid, name, helper, lib, runtime in seen:
        if helper:
            other.append(ThreadRole(tid, "other", None, f"named {name}: {helper}", f"name: {name}"))
            continue
        gained = None if activity is None else activity.get(tid, 0.0)
        spent = "" if gained is None else f"{gained:.3f} s CPU {during}"
        if runtime:
            by_library.append((tid, f"waiting in {lib} ({_POOL_WORDS[runtime.kind]} pool)", f"library: {lib}"))
        elif tid in active:
            where = f"waiting in {lib}" if lib else RUNNING
            by_activity.append((tid, f"{where}, busy while the worker served requests (pool thread)",
                                f"activity: {spent}"))
        elif gained is not None:
            where = f"waiting in {lib}" if lib else RUNNING
            other.append(ThreadRole(tid, "other", None, f"{where}, (nearly) idle while the worker served requests "
                                    "(a Python, server or library helper thread)", f"activity: {spent}"))
        elif lib is None:
            other.append(ThreadRole(tid, "other", None, f"{RUNNING}: cannot tell which library "
                                    "it belongs to (an OpenMP thread that spins, OMP_WAIT_POLICY=active?; "
                                    "--url tells by activity)", "library: none seen"))
        else:
            other.append(ThreadRole(tid, "other", None, f"waiting in {lib}: not an OpenMP/BLAS pool thread "
                                    "(a Python, server or library helper thread; --url tells an ONNX Runtime "
                                    "or other pool by its activity)", f"library: {lib}"))
    ranked = [ThreadRole(tid, "pool", k + 1, why, ev) for k, (tid, why, ev) in enumerate(by_library + by_activity)]
    return main + ranked + other


#: Beside a runtime team, the main thread calls the model when it gained at least this share of the CPU of the
#: busiest thread off it that waits in no runtime (a calling thread does the model's share and more) ...
MAIN_CALLS = 1.0
#: ... and, where no team is found by library (a pool that waits in libc), at least this share of the busiest's.
MAIN_IDLE = 0.1
#: A runtime's thread (found by the library it waits in) worked when it gained at least this much (s) ...
IDLE_FLOOR = 0.0005
#: ... and this share of the busiest thread's CPU; else it is an idle leftover.
IDLE_SHARE = 0.02


def _spent(gained, requests):
    during = f"during {requests} request{'' if requests == 1 else 's'}" if requests else "during the traffic"
    return f"{gained:.3f} s CPU {during}"


def by_activity(pid, seen, activity, requests=None):
    """Every thread of worker ``pid`` as a :class:`ThreadRole`, told by what it did.

    Parameters
    ----------
    pid : int
        The worker (its main thread's TID).
    seen : list of tuple
        ``(tid, name, helper, library, runtime)`` of every other thread
        (:func:`classify_threads` reads them).
    activity : dict
        ``{tid: cpu_seconds}`` each thread gained while the worker served requests.
    requests : int, optional
        How many requests that was (for the evidence).

    Returns
    -------
    list of ThreadRole or None
        None where the library rule holds unchanged (the main thread calls and
        no runtime thread idled, or the worker served nothing).

    Examples
    --------
    >>> gomp = pool_runtime("libgomp.so.1")
    >>> seen = [(11, "w", None, "libc.so.6", None), (12, "w", None, "libgomp.so.1", gomp),
    ...         (13, "w", None, "libc.so.6", None), (14, "w", None, "libgomp.so.1", gomp)]
    >>> rows = by_activity(10, seen, {10: 0.01, 11: 0.40, 12: 0.0, 13: 0.0, 14: 0.38})
    >>> [(t.tid, t.role, t.rank, t.kind) for t in rows]
    [(11, 'pool', 0, 'caller'), (14, 'pool', 1, 'member'), (10, 'main', None, 'main'), (12, 'other', None, 'idle'), (13, 'other', None, 'other')]
    """
    gains = {tid: max(0.0, activity.get(tid, 0.0)) for tid, *_ in seen}
    main_gain = max(0.0, activity.get(pid, 0.0))
    top = max([main_gain, *gains.values()])
    if top < ACTIVE_FLOOR:
        return None                                    # served nothing: nothing to tell by
    worked = active_threads({pid: main_gain, **gains}, main=pid)
    lib = [s for s in seen if s[4] is not None and not s[2]]
    lib_worked = [s for s in lib if gains[s[0]] >= IDLE_FLOOR and gains[s[0]] >= IDLE_SHARE * top]
    # A runtime's thread that did nothing is an idle leftover only where another one worked: with no team at
    # work at all there is no evidence against any of them (the request was too small to wake it).
    lib_idle = [s for s in lib if s not in lib_worked] if lib_worked else []
    off_main = [s for s in seen if s[0] in worked and s[4] is None and not s[2]]
    busiest = max((gains[s[0]] for s in off_main), default=0.0)
    # Teams are OpenMP's (a BLAS pool, which every NumPy process holds, idles beside any runtime).
    if any(s[4].kind == OPENMP for s in lib):
        # A runtime team beside threads off the main one that worked. libgomp makes a team per calling thread,
        # after that thread started: a team member that worked and was made after a busy thread off the main one
        # (a higher TID: Linux hands them out in increasing order) is that caller's, so the model ran off the
        # main thread - whatever an event loop that parses the requests gained. Else the model runs where more
        # work was done: a main thread that calls does more than any helper of its, one that only polls less.
        first_off = min((s[0] for s in off_main), default=None)
        made_by_callers = first_off is not None and any(s[0] > first_off for s in lib_worked
                                                         if s[4].kind == OPENMP)
        calls_off = bool(off_main) and (made_by_callers or main_gain < MAIN_CALLS * busiest)
    else:
        # No team found by library: ONNX Runtime's own pool waits in libc and spins, so it may outrun the main
        # thread that calls it; only a main thread that barely ran leaves the model to another thread.
        calls_off = bool(off_main) and main_gain < MAIN_IDLE * top
    idle = {s[0] for s in lib_idle}
    if not calls_off:
        if not idle:
            return None
        rows = roles_by_library(pid, [s for s in seen if s[0] not in idle], activity, requests)
        return rows + [_idle(s, gains[s[0]], requests, None) for s in lib_idle]
    return _threaded(pid, seen, gains, main_gain, requests, off_main, lib_worked, idle)


def _idle(s, gained, requests, level):
    tid, name, _, lib, _ = s
    return ThreadRole(tid, "other", None, f"waiting in {lib}, idle while the worker served requests: a runtime "
                      "team no calling thread uses (one made while the model loaded?); never ranked above a thread "
                      "that worked", f"idle: {_spent(gained, requests)}", kind="idle", level=level)


def _threaded(pid, seen, gains, main_gain, requests, callers, members, idle):
    """The roles of a worker whose model runs off its main thread (see the module)."""
    caller_ids = [s[0] for s in callers]
    if members:
        level = None if len(callers) == 1 else "slot"
    else:
        # No team found by library: one busy thread is the caller; more are callers and a runtime's own pool
        # (ONNX Runtime's waits in libc, as a Python thread does), which only slot-level placement never confuses.
        level = None if len(callers) == 1 else "slot"
    busy_kind = "caller" if members or len(callers) == 1 else "busy"
    names = {}
    for s in callers:
        names.setdefault(s[1], []).append(s[0])
    out = []
    if level is None:
        c = callers[0]
        out.append(ThreadRole(c[0], "pool", 0, f"the calling thread: it ran the model off the main thread "
                              f"({'waiting in ' + c[3] if c[3] else RUNNING}); placed where a main thread is",
                              f"caller: {_spent(gains[c[0]], requests)}", kind="caller"))
        for rank, s in enumerate(sorted(members), start=1):
            out.append(ThreadRole(s[0], "pool", rank, f"waiting in {s[3]}: of the calling thread {c[0]}'s team",
                                  f"team of {c[0]}: {_spent(gains[s[0]], requests)}", kind="member", team=c[0]))
    else:
        for s in callers:
            what = ("a calling thread: it ran the model off the main thread" if busy_kind == "caller" else
                    "busy: a calling thread or the runtime's own pool (both wait in libc; /proc cannot tell them "
                    "apart)")
            out.append(ThreadRole(s[0], "pool", None, f"{what}; the worker's threads share its slot's CPUs",
                                  f"{busy_kind}: {_spent(gains[s[0]], requests)}", kind=busy_kind, level="slot"))
        for s in sorted(members):
            # A member takes its caller's name: with callers of distinct names, the name says whose team it is.
            own = names.get(s[1], [])
            team = own[0] if len(own) == 1 and len(names) > 1 else None
            whose = f"the calling thread {team}'s team" if team else f"the team of one of {len(callers)} callers"
            out.append(ThreadRole(s[0], "pool", None, f"waiting in {s[3]}: of {whose}; the worker's threads share "
                                  "its slot's CPUs", f"team{' of ' + str(team) if team else ''}: "
                                  f"{_spent(gains[s[0]], requests)}", kind="member", team=team, level="slot"))
    out.insert(0 if level == "slot" else len(out), ThreadRole(
        pid, "main", None, f"the main thread: the model runs on {len(callers)} thread(s) off it; on all of its "
        "slot's CPUs, so that a thread it starts stays in the slot", f"main: {_spent(main_gain, requests)}",
        kind="main", level="slot"))
    placed = {t.tid for t in out}
    for s in seen:
        if s[0] in placed:
            continue
        if s[0] in idle:
            out.append(_idle(s, gains[s[0]], requests, "slot"))
        elif s[2]:
            out.append(ThreadRole(s[0], "other", None, f"named {s[1]}: {s[2]}", f"name: {s[1]}", kind="helper",
                                  level="slot"))
        else:
            where = f"waiting in {s[3]}" if s[3] else RUNNING
            out.append(ThreadRole(s[0], "other", None, f"{where}, (nearly) idle while the worker served requests; "
                                  "kept in the slot with the threads that work", f"activity: "
                                  f"{_spent(gains[s[0]], requests)}", kind="other", level="slot"))
    return out


# The runtimes whose pools a worker serves with (a BLAS library alone, which every NumPy process maps, is none).
_INFERENCE = tuple(r for r in RUNTIMES if r.kind in (FRAMEWORK, OPENMP))


def loaded_runtimes(pid):
    """``{name: sizes_from_affinity}`` of the inference runtimes process ``pid`` has loaded (none if unreadable).

    The runtimes are those whose pools tuna_lab places (XGBoost, ONNX
    Runtime, PyTorch, LightGBM, an OpenMP runtime), named by the libraries
    mapped in ``/proc/<pid>/maps``; ``sizes_from_affinity`` says whether the
    runtime sizes its pool from the calling thread's *current* CPUs at every
    call (:func:`main_rule`). A BLAS library alone (every NumPy process maps
    one) is no inference runtime.

    Examples
    --------
    >>> loaded_runtimes(os.getpid()).get("XGBoost") in (None, True)
    True
    """
    try:
        libs = {lib for _, _, lib in _maps(pid)}
    except OSError:
        return {}
    return {r.label: r.sizes_from_affinity for r in _INFERENCE if any(r.maps(lib) for lib in libs)}


def main_rule(pid):
    """``(exact, why)``: may worker ``pid``'s main thread be bound to one CPU, and why (or why not).

    Examples
    --------
    >>> import os
    >>> exact, why = main_rule(os.getpid())
    >>> isinstance(exact, bool) and bool(why)
    True

    Measured (docs/your-server.md): only XGBoost, on libgomp without
    ``OMP_PLACES``, counts the main thread's current CPUs at every call.
    ONNX Runtime, PyTorch, LightGBM and scikit-learn's libgomp size their
    pools when they load (or from their own settings) - but a runtime that
    loads *after* the main thread was bound to one CPU counts that one, so a
    worker with no runtime loaded yet keeps its slot's CPUs.
    """
    if _places_in_effect(pid):
        return True, "OMP_PLACES in effect: OpenMP counts its places, not the main thread's CPUs"
    loaded = loaded_runtimes(pid)
    per_call = sorted(name for name, sizes_from_affinity in loaded.items() if sizes_from_affinity)
    if per_call:
        return False, (f"{', '.join(per_call)} loaded: without OMP_PLACES it counts the main thread's current "
                       "CPUs at every call, and one CPU would shrink its pool to one thread")
    if not loaded:
        return False, ("no inference runtime loaded yet: one loaded after the main thread is bound to one CPU "
                       "would size its pool from that CPU")
    openmp = {r.label for r in RUNTIMES if r.kind == OPENMP}
    names = sorted(set(loaded) - openmp) or sorted(openmp)
    return True, (f"{', '.join(names)} loaded: sized {'its' if len(names) == 1 else 'their'} pool when loaded "
                  "or from its own setting, not from the main thread's current CPUs")


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
        env = procfs.environ(pid)
        loaded = _openmp_mapped(_maps(pid))
    except OSError:
        return False
    return places_counted(env) and loaded


def openmp_loaded(pid=None):
    """Whether process ``pid`` (default this one) has an OpenMP runtime loaded.

    Examples
    --------
    >>> isinstance(openmp_loaded(), bool)
    True
    """
    try:
        return _openmp_mapped(_maps(pid or os.getpid()))
    except OSError:
        return False


def _openmp_mapped(maps):
    """Whether the mappings ``maps`` (:func:`_maps`) hold an OpenMP runtime's library."""
    openmp = [r for r in RUNTIMES if r.kind == OPENMP]
    return any(r.maps(lib) for _, _, lib in maps for r in openmp)


def wake_openmp(threads):
    """Run one empty parallel region of ``threads`` threads in every libgomp this process has loaded.

    libgomp starts its pool at the first parallel region; this starts it
    without running the app. Returns the paths of the libgomp copies woken
    (none if no libgomp is loaded).

    Examples
    --------
    >>> isinstance(wake_openmp(2), list)
    True
    """
    import ctypes

    # GOMP_parallel is GNU libgomp's entry point: the libgomp record's files only.
    paths = {path for _, _, path in procfs.mappings(os.getpid())
             if getattr(runtime_of(os.path.basename(path)), "name", None) == "libgomp"}
    libc = ctypes.CDLL(None)
    # The region's body is libc's getpid: it ignores its argument and needs no GIL.
    body = ctypes.cast(libc.getpid, ctypes.c_void_p)
    for path in sorted(paths):
        gomp = ctypes.CDLL(path)
        gomp.GOMP_parallel.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
        gomp.GOMP_parallel(body, None, threads, 0)
    return sorted(paths)


def new_pool_threads(pid, before):
    """The threads of ``pid`` that appeared since ``before`` (a set of TIDs) under the main thread's name, by TID.

    Called after the worker woke its pool: those are the pool's threads,
    ranked by creation (TID) order. A library helper that started meanwhile
    (jemalloc's background thread) names itself, and is not counted.

    Examples
    --------
    >>> before = set(t.id for t in psutil.Process().threads())
    >>> new_pool_threads(os.getpid(), before)
    []
    """
    names = {}
    for tid in _tids(pid):
        if tid == pid or tid not in before:
            names[tid] = _comm(pid, tid)
    main = names.get(pid)
    return sorted(tid for tid, name in names.items() if tid != pid and name == main)


def pool_threads(pid, before=None):
    """The pool threads of worker ``pid``, ranked 1, 2, ... : new since ``before``, else read from /proc.

    With ``before`` (TIDs taken before the worker woke its pool), the threads
    :func:`new_pool_threads` finds; when there are none (the pool was up
    already), or without ``before``, the pool threads :func:`classify_threads`
    finds. Returns a list of TIDs, rank order.

    Examples
    --------
    >>> all(tid != os.getpid() for tid in pool_threads(os.getpid()))   # never the main thread
    True
    """
    if before is not None:
        new = new_pool_threads(pid, before)
        if new:
            return new
    try:
        return [t.tid for t in classify_threads(pid) if t.role == "pool"]
    except PinError:
        return []


def _tids(pid):
    try:
        return sorted(t.id for t in psutil.Process(pid).threads())
    except psutil.NoSuchProcess:
        return []
