"""Find a process's threads by TID and bind each one to its CPUs.

Linux schedules threads, not processes: ``sched_setaffinity`` takes a thread
id (TID), and :func:`threads_of` lists a process's TIDs (with psutil; the
main thread's TID is the PID). Binding is done per TID and always read back:
a thread that exited between discovery and binding, or a mask the kernel
trimmed (a CPU outside the cgroup's cpuset), is reported, never silently
accepted. This module imports nothing heavier than psutil and numpy: a
Gunicorn master loads it before it forks.

Examples
--------
>>> import os
>>> tids = threads_of(os.getpid())
>>> os.getpid() in tids
True
"""

import os
import time

import psutil

from .._checks import parse_cpulist
from ..errors import BindingError

__all__ = ["threads_of", "affinity_of", "bind", "bind_all", "describe_threads"]


def threads_of(pid):
    """Sorted TIDs of process ``pid``; empty if the process is gone.

    Raises
    ------
    BindingError
        If the process's threads may not be read (another user's, under a
        restrictive ``hidepid``).

    Examples
    --------
    >>> threads_of(os.getpid())[0] == os.getpid()
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
        with open(f"/proc/{tid}/status") as fh:
            for line in fh:
                if line.startswith("Cpus_allowed_list:"):
                    return frozenset(parse_cpulist(line.split(":", 1)[1], f"/proc/{tid}/status", BindingError))
    except (FileNotFoundError, ProcessLookupError):
        pass
    raise BindingError(f"thread {tid} does not exist")


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


def bind_all(assignments):
    """Bind several threads ``{tid: cpus}``; on any failure, undo nothing silently: raise.

    Returns ``{tid: cpus}`` as read back.

    Examples
    --------
    >>> bind_all({})
    {}
    """
    return {tid: bind(tid, cpus) for tid, cpus in assignments.items()}


def describe_threads(pid):
    """``[(tid, name, allowed cpus)]`` for every thread of ``pid``.

    Examples
    --------
    >>> describe_threads(os.getpid())[0][0] == os.getpid()
    True
    """
    out = []
    for tid in threads_of(pid):
        try:
            # psutil names processes, not threads: the thread's name is its comm.
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                name = fh.read().strip()
            out.append((tid, name, affinity_of(tid)))
        except (OSError, BindingError):
            continue                      # the thread exited while we looked
    return out
