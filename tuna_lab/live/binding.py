"""Find a process's threads by TID and bind each one to its CPUs; bind a worker to a plan's slot.

Linux schedules threads, not processes: ``sched_setaffinity`` takes a thread
id (TID), and :func:`threads_of` lists a process's TIDs (with psutil; the
main thread's TID is the PID). Binding is done per TID and always read back:
a thread that exited between discovery and binding, or a mask the kernel
trimmed (a CPU outside the cgroup's cpuset), is reported, never silently
accepted. :func:`bind_worker` is the one way tuna_lab binds a server worker -
its main thread and its pool threads (found by :mod:`tuna_lab.live.pools`) -
to a slot of a :class:`~tuna_lab.placement.plan.Plan`: the lab server's hooks,
the Gunicorn integration and ``tuna-lab pin --pid`` all call it. This module
imports nothing heavier than psutil: a Gunicorn master loads it before it forks.

Examples
--------
>>> import os
>>> tids = threads_of(os.getpid())
>>> os.getpid() in tids
True
"""

import os
import time
from dataclasses import dataclass

import psutil

from .._checks import parse_cpulist
from ..errors import BindingError
from ..machine import procfs
from ..placement.plan import planned_cpus

__all__ = ["threads_of", "affinity_of", "bind", "ThreadBinding", "bind_worker"]


def threads_of(pid):
    """Sorted TIDs of process ``pid``; empty if the process is gone.

    Raises
    ------
    BindingError
        If the process's threads may not be read (another user's, under a
        restrictive ``hidepid``).

    Examples
    --------
    >>> os.getpid() in threads_of(os.getpid())
    True
    """
    try:
        return sorted(t.id for t in psutil.Process(pid).threads())
    except psutil.NoSuchProcess:          # ZombieProcess included: it has no threads to bind
        return []
    except psutil.AccessDenied:
        raise BindingError(f"no permission to list the threads of process {pid}") from None


def affinity_of(tid):
    """The CPUs thread ``tid`` may run on, read from ``/proc/<tid>/status`` (``Cpus_allowed_list``).

    Reading /proc works for any thread we can see, including other users'
    where ``sched_getaffinity`` would need privileges.

    Examples
    --------
    >>> affinity_of(os.getpid()) == frozenset(os.sched_getaffinity(0))
    True
    """
    try:
        # /proc/TID names a thread as /proc/PID names a process (a TID is not listed, but it resolves)
        allowed = procfs.status_fields(tid).get("Cpus_allowed_list")
    except (FileNotFoundError, ProcessLookupError):
        allowed = None
    if allowed is None:
        raise BindingError(f"thread {tid} does not exist")
    return frozenset(parse_cpulist(allowed, f"the status of thread {tid}", BindingError))


def bind(tid, cpus, retries=3):
    """Bind thread ``tid`` to ``cpus`` and check the kernel kept exactly that set.

    Transient failures (``EINTR``-like races while a thread is being created)
    are retried a few times; a thread that is gone or a mask that comes back
    different raises :class:`~tuna_lab.errors.BindingError`.

    Examples
    --------
    >>> import threading
    >>> bind(threading.get_native_id(), os.sched_getaffinity(0)) == frozenset(os.sched_getaffinity(0))
    True
    """
    cpus = frozenset(int(c) for c in cpus)
    if not cpus:
        raise BindingError(f"no CPUs given for thread {tid}")
    last = None
    for attempt in range(retries):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            raise BindingError(f"thread {tid} exited before it could be bound") from None
        except PermissionError:
            raise BindingError(f"no permission to set the affinity of thread {tid}") from None
        except OSError as exc:            # EINVAL: cpus outside the allowed set
            last = exc
            time.sleep(0.01 * (attempt + 1))
            continue
        got = frozenset(os.sched_getaffinity(tid))
        if got == cpus:
            return got
        last = f"kernel kept {sorted(got)}"
        time.sleep(0.01 * (attempt + 1))
    raise BindingError(f"thread {tid} could not be bound to {sorted(cpus)}: {last}")


@dataclass(frozen=True)
class ThreadBinding:
    """One thread of a worker bound to a plan: TID, ``role`` (``main``/``pool``), rank, the CPUs planned and got.

    ``cpus`` is the mask read back after binding (or without binding, for a
    dry run); ``error`` says why the thread could not be bound (it exited, no
    permission, a mask the kernel trimmed), else None.
    """

    tid: int
    role: str
    rank: int
    planned: tuple
    cpus: tuple = None
    error: str = None


def bind_worker(plan, slot, pool, pid=None, *, exact_main=True, dry_run=False):
    """Bind worker ``pid``'s main thread and its ``pool`` threads to slot ``slot`` of ``plan``.

    Parameters
    ----------
    plan, slot : Plan, int
        The plan (:class:`~tuna_lab.placement.plan.Plan`) and the worker's slot in it.
    pool : sequence of int
        The worker's pool threads in rank order (:func:`tuna_lab.live.pools.pool_threads`).
    pid : int, optional
        The worker (its main thread's TID); default this process.
    exact_main, dry_run : bool
        Bind the main thread to its own CPUs only (:func:`~tuna_lab.placement.plan.planned_cpus`); bind nothing, read masks back.

    Returns
    -------
    list of ThreadBinding
        The main thread first, then the pool by rank; a thread not bound has ``error`` set.

    Raises
    ------
    BindingError
        ``slot`` is not one of the plan's.

    Notes
    -----
    See docs/your-server.md, section "The binder".

    Examples
    --------
    >>> from tuna_lab.placement import placement
    >>> plan = placement("cfs", 1, 1, f"core:{len(os.sched_getaffinity(0))} pu:1").plan()
    >>> [(b.role, b.error) for b in bind_worker(plan, 0, [], dry_run=True)]
    [('main', None)]
    """
    if not 0 <= slot < len(plan.slots):
        raise BindingError(f"slot {slot} is not one of the plan's {len(plan.slots)} slots")
    pid = os.getpid() if pid is None else int(pid)
    out = []
    for rank, tid in enumerate([pid, *pool]):
        planned = planned_cpus(plan, slot, rank, exact_main)
        role = "main" if rank == 0 else "pool"
        try:
            got = affinity_of(tid) if dry_run else bind(tid, planned)
        except BindingError as exc:
            out.append(ThreadBinding(tid, role, rank, planned, None, str(exc)))
            continue
        out.append(ThreadBinding(tid, role, rank, planned, tuple(sorted(got))))
    return out
