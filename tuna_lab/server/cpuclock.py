"""Per-thread CPU clocks: what each thread of a process has run so far.

A server worker reads its own threads' clocks at the start and end of every
request (:func:`process_thread_cpu`, :func:`request_cpu`) and reports the
difference with the response, so CPU per request is exact rather than sampled.
The experiment's sampler (:mod:`tuna_lab.measure.cpu`) reads the same clocks
from outside the process.

CPU time comes from the thread's own CPU clock inside its process (exact),
and from another process from ``/proc/<pid>/task/<tid>/schedstat``
(nanoseconds, brought up to date at ticks and context switches) where the
kernel has it, else from ``utime + stime`` of ``/proc/<pid>/task/<tid>/stat``
(clock ticks, usually 10 ms).

Examples
--------
>>> import os, threading
>>> thread_cpu_seconds(os.getpid(), threading.get_native_id()) > 0
True
"""

import os
import time

from ..errors import CpuAccountingError
from ..machine import procfs

__all__ = ["thread_cpu_seconds", "process_thread_cpu", "request_cpu"]


def _thread_clock(tid):
    """The clock id of thread ``tid``'s CPU clock (the kernel's CPUCLOCK_SCHED, per thread)."""
    return ((~tid) << 3) | 6


def thread_cpu_seconds(pid, tid):
    """CPU seconds thread ``tid`` of process ``pid`` has run so far.

    Raises
    ------
    CpuAccountingError
        If the thread does not exist (any more) or its files cannot be read.
    """
    pid, tid = int(pid), int(tid)
    if pid == os.getpid():
        try:
            # The thread's own CPU clock: exact to the nanosecond, also for a thread
            # that is running now (schedstat only moves at ticks and context
            # switches). Linux serves it only inside the thread's own process.
            return time.clock_gettime(_thread_clock(tid))
        except (OSError, OverflowError):     # no such thread; a TID beyond the clock id range
            pass
    seconds = procfs.thread_cpu_seconds(pid, tid)
    if seconds is None:
        raise CpuAccountingError(f"cannot read the CPU time of thread {tid} of process {pid}")
    return seconds


def process_thread_cpu(pid=None):
    """CPU seconds of every thread of process ``pid`` (default: this one), as ``{tid: seconds}``.

    Threads that exit while being read are left out.

    Examples
    --------
    >>> import os
    >>> os.getpid() in process_thread_cpu()
    True
    """
    pid = os.getpid() if pid is None else int(pid)
    out = {}
    try:
        # Not psutil.Process.threads(): it also reads every thread's stat for
        # tick-resolution times we do not use, ~10x the cost (~120 us against
        # ~12 us for this whole function with 4 threads), and a worker runs
        # this twice on every request's path (the client sees the second read).
        tids = procfs.thread_ids(pid)
    except OSError:
        raise CpuAccountingError(f"cannot list the threads of process {pid}") from None
    for tid in tids:
        try:
            out[int(tid)] = thread_cpu_seconds(pid, tid)
        except CpuAccountingError:
            continue
    return out


def request_cpu(before, after, pid=None):
    """CPU seconds spent between two :func:`process_thread_cpu` readings, per role.

    The process's own thread is ``"main"``; every other thread of a worker is
    one of its OpenMP pool (a sync Gunicorn worker starts no others). A thread
    born in between counts from zero.

    Examples
    --------
    >>> request_cpu({1: 1.0, 2: 5.0}, {1: 1.5, 2: 5.25, 3: 0.25}, pid=1)
    {'main': 0.5, 'openmp': 0.5}
    """
    pid = os.getpid() if pid is None else int(pid)
    out = {"main": 0.0, "openmp": 0.0}
    for tid, seconds in after.items():
        out["main" if tid == pid else "openmp"] += max(0.0, seconds - before.get(tid, 0.0))
    return out
