"""What the scheduler did: per thread, per CPU, and to a cgroup, as the kernel counts it.

The kernel keeps, for every thread and since the thread started, the
mechanism behind a latency: the CPU time it ran, the time it **waited on a run
queue** for a core (``/proc/PID/task/TID/schedstat``), how often it was moved
to another CPU (``se.nr_migrations`` in ``/proc/PID/task/TID/sched``, where
the kernel exposes it) and how often it gave its core up (voluntary
switches: it slept) or was preempted (involuntary switches), in
``/proc/PID/task/TID/status``. Per CPU, ``/proc/stat`` counts the busy time
of everything that ran there; ``/proc/pressure/cpu`` counts the time some
runnable task waited for a CPU, machine-wide; a cgroup's ``cpu.stat``
counts how often and how long its CFS quota stopped it.

Every value here is a counter since boot (or since the thread started): a
trial records two readings and subtracts. Reads go through
:mod:`tuna_lab._files` (non-blocking, regular file, size-capped) or an
``os`` call, and a thread that exits between two reads gives ``None``, never
an exception: a server's threads come and go while it is measured.

Examples
--------
>>> import threading
>>> me = thread_sched(os.getpid(), threading.get_native_id())
>>> me.tid == threading.get_native_id() and me.cpu_seconds > 0 and me.run_delay_seconds >= 0
True
>>> me.migrations is None or me.migrations >= 0, (me.migrations is None) == (MIGRATIONS_NOTE is not None)
(True, True)
>>> thread_sched(os.getpid(), 2 ** 22 + 1) is None
True
>>> set(cpu_busy_seconds()) >= os.sched_getaffinity(0)
True
"""

import os
import re
from pathlib import Path
from typing import NamedTuple

from .. import _files
from .linuxfs import cgroup_dir, cgroup_quota

__all__ = ["ThreadSched", "thread_sched", "process_sched", "MIGRATIONS_NOTE", "cpu_busy_seconds",
           "cpu_pressure", "cgroup_throttling", "KeptCounters"]

# /proc/PID/task/TID/sched is about 2 KB (more with NUMA balancing), /proc/stat a line per CPU:
# caps well above both, so a copied or hostile file is still bounded.
_SMALL = 64 << 10
_STAT_LIMIT = 16 << 20
_NS = 1e-9
_TICK = 1.0 / os.sysconf("SC_CLK_TCK")
# /proc/stat per-CPU columns: user nice system idle iowait irq softirq steal (guest is inside user).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
_MIGRATIONS = re.compile(rb"^se\.nr_migrations\s*:\s*(\d+)", re.M)
_SWITCHES = re.compile(rb"^(voluntary|nonvoluntary)_ctxt_switches:\s*(\d+)", re.M)
_CGROUP_DEPTH = 64


class ThreadSched(NamedTuple):
    """One thread's scheduler counters at one moment (totals since the thread started)."""

    #: The thread's id.
    tid: int
    #: The thread's name (``/proc/.../comm``).
    comm: str
    #: CPU time it ran, s (``schedstat`` field 1).
    cpu_seconds: float
    #: Time it waited on a run queue, runnable but not running, s (``schedstat`` field 2).
    run_delay_seconds: float
    #: Times it was given a CPU (``schedstat`` field 3).
    timeslices: int
    #: Times it was moved to another CPU (``se.nr_migrations``); None where the
    #: kernel does not expose it (:data:`MIGRATIONS_NOTE` says why).
    migrations: int | None
    #: Times it gave its CPU up (it blocked or slept).
    voluntary_switches: int
    #: Times it was preempted.
    involuntary_switches: int
    #: The CPU it last ran on (``stat`` field 39).
    last_cpu: int
    #: The CPUs it may run on.
    affinity: frozenset


def _read(path, limit=_SMALL):
    return _files.read_bytes(path, limit=limit)


def _migrations_note():
    """Why ``se.nr_migrations`` cannot be read on this kernel, or None when it can."""
    try:
        data = _read("/proc/self/sched")
    except FileNotFoundError:
        return ("/proc/PID/sched is absent: the kernel was built without CONFIG_SCHED_DEBUG, "
                "so it does not expose a thread's migrations")
    except OSError as exc:
        return f"/proc/self/sched cannot be read ({exc}), so migrations are not recorded"
    if _MIGRATIONS.search(data) is None:
        return "/proc/PID/sched has no se.nr_migrations line on this kernel, so migrations are not recorded"
    return None


#: Why a thread's migrations are None on this kernel (None when the kernel exposes them).
MIGRATIONS_NOTE = _migrations_note()


def thread_sched(pid, tid):
    """The scheduler counters of thread ``tid`` of process ``pid``; None if the thread is gone.

    Parameters
    ----------
    pid, tid : int

    Returns
    -------
    ThreadSched or None

    Examples
    --------
    >>> t = thread_sched(os.getpid(), os.getpid())
    >>> t.last_cpu in t.affinity, t.voluntary_switches >= 0, t.timeslices > 0
    (True, True, True)
    """
    base = f"/proc/{int(pid)}/task/{int(tid)}/"
    try:
        cpu, delay, slices = _read(base + "schedstat").split()[:3]
        stat = _read(base + "stat")
        # The name (field 2) may hold spaces and parentheses: fields count from the last ')'; field 39 is 36 on.
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
        last_cpu = int(stat[stat.rindex(b")") + 2:].split()[36])
        switches = dict(_SWITCHES.findall(_read(base + "status")))
        migrations = None
        if MIGRATIONS_NOTE is None:
            found = _MIGRATIONS.search(_read(base + "sched"))
            migrations = None if found is None else int(found.group(1))
        affinity = frozenset(os.sched_getaffinity(int(tid)))
        return ThreadSched(int(tid), comm, int(cpu) * _NS, int(delay) * _NS, int(slices), migrations,
                           int(switches[b"voluntary"]), int(switches[b"nonvoluntary"]), last_cpu, affinity)
    except (OSError, ValueError, IndexError, KeyError):
        # OSError covers a thread gone between two reads (ENOENT, ESRCH) and a refused file.
        return None


def process_sched(pid):
    """The scheduler counters of every thread of process ``pid`` (``{tid: ThreadSched}``; empty if it is gone).

    Examples
    --------
    >>> import threading
    >>> threading.get_native_id() in process_sched(os.getpid())
    True
    >>> process_sched(2 ** 22 + 1)
    {}
    """
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{int(pid)}/task") if t.isdigit())
    except OSError:
        return {}
    found = {}
    for tid in tids:
        reading = thread_sched(pid, tid)
        if reading is not None:
            found[tid] = reading
    return found


def cpu_busy_seconds():
    """Busy time per CPU since boot, s: user + nice + system + irq + softirq + steal of ``/proc/stat``.

    The resolution is one clock tick (10 ms at the usual 100 Hz); an offline
    CPU is absent.

    Examples
    --------
    >>> all(v >= 0 for v in cpu_busy_seconds().values())
    True
    """
    try:
        text = _read("/proc/stat", _STAT_LIMIT)
    except OSError:
        return {}
    busy = {}
    for line in text.splitlines():
        name, _, rest = line.partition(b" ")
        if name.startswith(b"cpu") and name[3:].isdigit():
            fields = rest.split()
            try:
                busy[int(name[3:])] = sum(int(fields[i]) for i in _BUSY_COLUMNS if i < len(fields)) * _TICK
            except ValueError:
                continue
    return busy


def cpu_pressure():
    """Machine-wide CPU pressure: ``{"some_total_seconds", "some_avg10"}``; None where the kernel has no PSI.

    ``some_total_seconds`` is the time, since boot, during which at least one
    runnable task waited for a CPU; ``some_avg10`` the share of the last 10 s
    it did (in %).

    Examples
    --------
    >>> p = cpu_pressure()
    >>> p is None or (p["some_total_seconds"] >= 0 and 0 <= p["some_avg10"] <= 100)
    True
    """
    try:
        text = _read("/proc/pressure/cpu").decode()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        kind, *pairs = line.split()
        if kind == "some":
            values = dict(p.split("=", 1) for p in pairs if "=" in p)
            try:
                return {"some_total_seconds": int(values["total"]) * 1e-6, "some_avg10": float(values["avg10"])}
            except (KeyError, ValueError):
                return None
    return None


def _cgroup_path(pid, version):
    """The cgroup path of ``pid`` in the cpu controller's hierarchy (v1) or the unified one (v2)."""
    try:
        text = _read(f"/proc/{pid}/cgroup").decode()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if (version == "v2" and controllers == "") or (version == "v1" and "cpu" in controllers.split(",")):
            return path
    return None


def cgroup_throttling(pid="self"):
    """CFS throttling of process ``pid``'s cpu cgroup and its ancestors; None where no ``cpu.stat`` can be read.

    The kernel throttles at every level that has a quota, and each level
    counts its own throttling in its ``cpu.stat``: the counts are summed from
    the process's cgroup up to the hierarchy's root (a process outside this
    process's view of the hierarchy is not followed).

    Returns
    -------
    dict or None
        ``{"nr_throttled": int, "throttled_seconds": float, "version": 1 or 2,
        "quota_cpus": float or None}``: periods in which the quota ran out,
        time the cgroup was stopped for it (s, since the cgroup was made), the
        cgroup version, and the tightest quota on the way up in CPUs' worth
        (None: no quota).

    Examples
    --------
    >>> t = cgroup_throttling()
    >>> t is None or (t["nr_throttled"] >= 0 and t["throttled_seconds"] >= 0 and t["version"] in (1, 2))
    True
    >>> cgroup_throttling(2 ** 22 + 1) is None
    True
    """
    found = cgroup_dir("/", "cpu")
    if found is None:
        return None
    kind, mine = found
    here = _cgroup_path("self", kind)
    there = _cgroup_path(str(pid) if pid == "self" else int(pid), kind)
    if here is None or there is None:
        return None
    # Our own cgroup's directory is known (linuxfs found it as hwloc does); another process's is
    # the same walk from its path to ours, inside the same mount.
    directory = Path(os.path.normpath(mine / os.path.relpath(there, here)))
    nr, throttled, quotas, levels = 0, 0.0, [], 0
    # Up to the hierarchy's root: above it there is no cpu.stat, which ends the walk.
    while levels < _CGROUP_DEPTH:
        try:
            text = _read(directory / "cpu.stat").decode()
            values = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
            nr += int(values.get("nr_throttled", 0))
            # v2 counts microseconds, v1 nanoseconds.
            throttled += (int(values["throttled_usec"]) * 1e-6 if "throttled_usec" in values
                          else int(values.get("throttled_time", 0)) * _NS)
        except (OSError, UnicodeDecodeError, ValueError):
            break
        levels += 1
        if (quota := cgroup_quota(directory, kind)) is not None:
            quotas.append(quota)
        if directory.parent == directory:
            break
        directory = directory.parent
    if not levels:
        return None
    return {"nr_throttled": nr, "throttled_seconds": throttled, "version": 2 if kind == "v2" else 1,
            "quota_cpus": min(quotas) if quotas else None}


# The head of /proc/PID/task/TID/sched holds se.nr_migrations and the switch counts (its 4th-7th lines):
# copying only this much out costs less than the whole file (6 against 9 us here).
_SCHED_HEAD = 768


class KeptCounters:
    """Cheap repeated readings of this process's threads' scheduler counters, on descriptors kept open.

    A server worker reads them at the start and end of every request, so each
    reading must cost microseconds: the files of each thread are opened once
    and re-read with ``pread`` at offset 0 (``/proc``'s files regenerate their
    text on each read from the start), not through :mod:`tuna_lab._files`'
    checked open. The paths are built from this process's own PID and its
    threads' TIDs, never from input. Per thread it reads ``schedstat`` (on-CPU
    and run-queue wait), ``stat`` (the last CPU) and the head of ``sched``
    (migrations and switches) where the kernel has it, else ``status``
    (switches; migrations then -1, :data:`MIGRATIONS_NOTE` says why).

    Descriptors opened before a ``fork`` belong to the parent's threads: the
    first reading in a new process drops them. With ``pid``, the threads are
    another process's (a running server sampled from outside, issue 50): the
    paths are built from that PID and the TIDs given, still never from text.

    Examples
    --------
    >>> import threading
    >>> kept = KeptCounters()
    >>> me = threading.get_native_id()
    >>> run, wait, vol, invol, mig, cpu = kept.read([me])[me]
    >>> run > 0 and wait >= 0 and invol >= 0 and cpu in os.sched_getaffinity(0)
    True
    >>> kept.read([2 ** 22 + 1])
    {}
    >>> kept.close()
    """

    def __init__(self, pid=None):
        self._pid = None
        self._fds = {}
        self._owner = None if pid is None else int(pid)

    def read(self, tids):
        """``{tid: (on_cpu_ns, run_queue_ns, voluntary, involuntary, migrations, last_cpu)}`` of threads ``tids``.

        ``migrations`` is -1 where the kernel does not expose it. A thread that
        is gone (or whose files cannot be read) is left out.
        """
        pid = os.getpid() if self._owner is None else self._owner
        if pid != self._pid:
            self.close()
            self._pid = pid
        fds, out = self._fds, {}
        for tid in tids:
            kept = fds.get(tid)
            try:
                if kept is None:
                    kept = fds[tid] = self._open(pid, tid)
                out[tid] = self._reading(kept)
            except (OSError, ValueError, IndexError, KeyError):
                # A thread gone between two requests (ESRCH), or a file it never had: forget it.
                self._forget(tid)
        if len(fds) > 2 * len(out) + 16:
            # Threads that exited: their descriptors are kept no longer than needed.
            for tid in [t for t in fds if t not in out]:
                self._forget(tid)
        return out

    @staticmethod
    def _open(pid, tid):
        base = f"/proc/{int(pid)}/task/{int(tid)}/"
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
        names = ("schedstat", "stat", "sched" if MIGRATIONS_NOTE is None else "status")
        fds = []
        try:
            for name in names:
                fds.append(os.open(base + name, flags))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return tuple(fds)

    @staticmethod
    def _reading(kept):
        schedstat, stat, counts = kept
        run, wait = os.pread(schedstat, 128, 0).split()[:2]
        text = os.pread(stat, 1024, 0)
        # Field 39 counts from the last ')' (the name may hold one): it is the 36th field after it.
        last_cpu = int(text[text.rindex(b")") + 2:].split(None, 37)[36])
        if MIGRATIONS_NOTE is None:
            text = os.pread(counts, _SCHED_HEAD, 0)
            # Three find()s, not a multi-line regex: a third of the reading's cost went to re.findall.
            mig, vol, invol = (int(text[text.index(b":", at) + 1:text.index(b"\n", at + 1)])
                               for at in (text.index(b"\nse.nr_migrations"), text.index(b"\nnr_voluntary_switches"),
                                          text.index(b"\nnr_involuntary_switches")))
        else:
            found = dict(_SWITCHES.findall(os.pread(counts, 4096, 0)))
            vol, invol, mig = found[b"voluntary"], found[b"nonvoluntary"], -1
        return int(run), int(wait), int(vol), int(invol), mig, last_cpu

    def _forget(self, tid):
        for fd in self._fds.pop(tid, ()):
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self):
        """Close every kept descriptor."""
        for tid in list(self._fds):
            self._forget(tid)
