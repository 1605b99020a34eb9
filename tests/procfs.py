"""Reading thread placement from ``/proc``, independently of tuna_lab: what the pinning tests check against.

The tests of ``pin``, of the runtimes' pools and of measured servers read
every mask and CPU time here, never through the library under test.
"""

import os

import psutil

__all__ = ["cpus_of", "tids_of", "affinities", "cpu_seconds", "masks"]


def cpus_of(tid):
    """``Cpus_allowed_list`` of a thread, as a sorted list of CPU ids."""
    with open(f"/proc/{tid}/status") as fh:
        text = next(line for line in fh if line.startswith("Cpus_allowed_list:")).split(":", 1)[1]
    out = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def tids_of(pid):
    """The TIDs of ``pid``'s threads, sorted."""
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def affinities(pids):
    """``{tid: cpus}`` of every thread of the processes ``pids`` (threads that end meanwhile are left out)."""
    out = {}
    for pid in pids:
        try:
            tids = tids_of(pid)
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                out[tid] = cpus_of(tid)
            except (FileNotFoundError, StopIteration):
                pass
    return out


def cpu_seconds(pid):
    """``{tid: seconds}`` every thread of ``pid`` has run (first field of schedstat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                out[int(tid)] = int(fh.read().split()[0]) / 1e9
        except FileNotFoundError:
            pass
    return out


def masks(master):
    """``{tid: Cpus_allowed_list text}`` of every thread of ``master`` and its children."""
    procs = [master] + [c.pid for c in psutil.Process(master).children()]
    return {tid: _cpulist(cpus) for tid, cpus in affinities(procs).items()}


def _cpulist(cpus):
    """Sorted CPU ids as the kernel writes them: ``0-3,6``."""
    runs, out = [], []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    for lo, hi in runs:
        out.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return ",".join(out)
