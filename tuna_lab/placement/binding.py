"""Find a process's threads by TID and bind each one to its CPUs.

Linux schedules threads, not processes: ``sched_setaffinity`` takes a thread
id (TID), and ``/proc/<pid>/task`` lists a process's TIDs (the main thread's
TID is the PID). Binding is done per TID and always read back: a thread that
exited between discovery and binding, or a mask the kernel trimmed (a CPU
outside the cgroup's cpuset), is reported, never silently accepted.

Examples
--------
>>> import os
>>> tids = threads_of(os.getpid())
>>> os.getpid() in tids
True
"""

import os
import time

from .._checks import parse_cpulist
from ..errors import BindingError

__all__ = ["threads_of", "affinity_of", "bind", "bind_all", "describe_threads"]


def threads_of(pid):
    """Sorted TIDs of process ``pid`` (``/proc/<pid>/task``); empty if the process is gone."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return []


def affinity_of(tid):
    """The CPUs thread ``tid`` may run on, read from ``/proc/<tid>/status`` (``Cpus_allowed_list``).

    Reading /proc works for any thread we can see, including other users'
    where ``sched_getaffinity`` would need privileges.
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
    different raises :class:`BindingError`.
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
    """
    return {tid: bind(tid, cpus) for tid, cpus in assignments.items()}


def describe_threads(pid):
    """``[(tid, name, allowed cpus)]`` for every thread of ``pid`` (from /proc)."""
    out = []
    for tid in threads_of(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                name = fh.read().strip()
            out.append((tid, name, affinity_of(tid)))
        except (OSError, BindingError):
            continue                      # the thread exited while we looked
    return out
