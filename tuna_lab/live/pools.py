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
           "pool_threads", "loaded_runtimes"]

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
    active = active_threads(activity, main=pid) if activity is not None else set()
    during = f"during {requests} request{'' if requests == 1 else 's'}" if requests else "during the traffic"
    main = [ThreadRole(pid, "main", 0, "its TID is the process's PID", "tid: the process's PID")]
    by_library, by_activity, other = [], [], []
    for tid in tids:
        if tid == pid:
            continue
        name = _comm(pid, tid)
        helper = helper_thread(name)
        if helper:
            # Named first: an io_uring kernel thread's syscall file names no user-space caller.
            other.append(ThreadRole(tid, "other", None, f"named {name}: {helper}", f"name: {name}"))
            continue
        try:
            lib = _waiting_in(pid, tid, maps, looks, interval)
        except (FileNotFoundError, ProcessLookupError):
            continue                                   # exited while we looked
        except PermissionError:
            raise PinError(f"permission denied: cannot read thread {tid} of process {pid}") from None
        runtime = pool_runtime(lib)
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
