"""Processes and threads as ``/proc`` tells them: the one reader of ``/proc`` outside the scheduler's counters.

Everything tuna_lab learns about a process from ``/proc`` comes through here
(:mod:`~tuna_lab.machine.sched` reads the scheduler's counters,
:mod:`~tuna_lab.machine.irqs` the interrupts): its threads and their CPU
time, names, system calls and allowed CPUs, its mappings and environment,
the machine's boot id, the TCP tables and the file locks. No other package
opens ``/proc`` (tests/test_layers.py checks it).

A PID alone does not name a process: the kernel gives it to another once
the first exits. A PID with its start time (field 22 of
``/proc/PID/stat``, clock ticks since boot) names one process for the
machine's uptime, and is what every record of tuna_lab that names a process
(a server's pidfile sidecar, a state folder's name or owner record) keeps.

Every read goes through :mod:`tuna_lab._files` (non-blocking, regular file,
size-capped), so a ``root`` copied from another machine cannot hang or
exhaust a reader.

Examples
--------
>>> start_ticks(os.getpid()) > 0
True
>>> alive(os.getpid(), start_ticks(os.getpid())), alive(os.getpid(), -1)
(True, False)
"""

import errno
import os
import re
import shutil

from .. import _files

__all__ = ["start_ticks", "alive", "process_age", "remove_dead_folders", "pids", "thread_ids", "thread_exists",
           "thread_cpu_seconds", "thread_cpu", "thread_name", "processes_named", "thread_syscall", "status_fields",
           "mappings",
           "environ", "boot_id", "schedstat_available", "tcp_sockets", "lock_holders", "SampledThreads"]

_STAT_LIMIT = 4096
# A process's maps, environment and the TCP tables can be long; none is read whole beyond these.
_MAPS_LIMIT = 64 * 1024 * 1024
_ENVIRON_LIMIT = 4 * 1024 * 1024
_TABLE_LIMIT = 64 * 1024 * 1024
_TICK = os.sysconf("SC_CLK_TCK")


def _read(path, limit=_STAT_LIMIT):
    """The bytes of the kernel's file ``path`` under /proc, at most ``limit``; its OSError as the kernel gives it.

    Not :func:`tuna_lab._files.read_bytes`, which turns every refusal into
    one UnsafeFileError: here a thread that is gone (FileNotFoundError,
    ProcessLookupError) and one that may not be read (PermissionError: another
    user's, or a worker that changed its user) must stay apart. The path is
    built from integers under the kernel's /proc, which no user can plant a
    FIFO or a link in; the size is still bounded.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"{path} holds more than {limit} bytes")
    finally:
        os.close(fd)


def start_ticks(pid):
    """When process ``pid`` started, in clock ticks since boot; None if it is gone (or ``pid`` is no PID).

    Examples
    --------
    >>> start_ticks(2 ** 22 + 1) is None
    True
    """
    try:
        data = _files.read_bytes(f"/proc/{int(pid)}/stat", limit=_STAT_LIMIT)
        # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, TypeError, IndexError):
        return None


def alive(pid, ticks):
    """Whether the process of PID ``pid`` that started at ``ticks`` still runs (a reused PID does not count)."""
    return ticks is not None and start_ticks(pid) == ticks


def process_age(pid="self"):
    """Seconds since process ``pid`` started (0.0 where ``/proc`` does not say).

    Examples
    --------
    >>> 0 <= process_age() < 3600 * 24 * 365
    True
    """
    try:
        ticks = start_ticks(os.getpid() if pid == "self" else pid)
        uptime = float(_files.read_text("/proc/uptime", limit=_STAT_LIMIT).split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return 0.0 if ticks is None else max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def remove_dead_folders(root, pattern, users_of):
    """Remove the folders in ``root`` named ``pattern`` that are ours and whose processes have all exited.

    tuna_lab's state folders in the shared temporary folder (a server's
    state, the Gunicorn hooks', a pin's saved masks) outlive their process
    when it is killed. A folder is removed only when it is this user's and
    private (:func:`~tuna_lab._files.trusted_dir`: another user's is never
    touched) and ``users_of`` names processes, none of which runs.

    Parameters
    ----------
    root : str
        The folder to look in.
    pattern : str
        A regular expression the whole entry name must match.
    users_of : callable
        ``(path, match) -> [(pid, start ticks), ...]``: the processes that
        keep the folder in use; an empty list leaves it alone.

    Returns
    -------
    list of str
        The folders removed.

    Examples
    --------
    >>> remove_dead_folders("/proc/nonexistent", r"x", lambda path, m: [])
    []
    """
    name = re.compile(pattern)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = name.fullmatch(entry)
        path = os.path.join(root, entry)
        if not match or _files.trusted_dir(path, {os.geteuid()}) is not None:
            continue
        users = users_of(path, match)
        if users and not any(alive(pid, ticks) for pid, ticks in users):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def pids():
    """The PIDs of every process this user may see, ascending.

    Examples
    --------
    >>> os.getpid() in pids()
    True
    """
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


def thread_ids(pid):
    """The TIDs of process ``pid``, ascending (the main thread's TID is the PID).

    Raises
    ------
    ProcessLookupError
        The process is gone (or ``pid`` is no PID).
    PermissionError
        Its threads may not be listed (another user's, under ``hidepid``).

    Examples
    --------
    >>> os.getpid() in thread_ids(os.getpid())
    True
    """
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{int(pid)}/task"))
    except (FileNotFoundError, NotADirectoryError, ValueError, TypeError):
        raise ProcessLookupError(f"no process {pid}") from None


def thread_exists(pid, tid):
    """Whether thread ``tid`` of process ``pid`` still exists.

    Examples
    --------
    >>> thread_exists(os.getpid(), os.getpid()), thread_exists(os.getpid(), 2 ** 22 + 1)
    (True, False)
    """
    return os.path.exists(f"/proc/{int(pid)}/task/{int(tid)}")


def thread_cpu_seconds(pid, tid):
    """CPU seconds thread ``tid`` of process ``pid`` has run so far; None if it is gone or unreadable.

    From ``schedstat`` (nanoseconds), else ``stat``'s ``utime + stime``
    (clock ticks) where the kernel has no schedstat.

    Examples
    --------
    >>> thread_cpu_seconds(os.getpid(), os.getpid()) > 0
    True
    """
    base = f"/proc/{int(pid)}/task/{int(tid)}"
    try:
        return int(_read(f"{base}/schedstat").split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        # The command name may hold spaces and parentheses: split after the last ")".
        fields = _read(f"{base}/stat").rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK      # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu(pid):
    """``{tid: CPU seconds}`` of every thread of process ``pid``; threads that exit meanwhile are left out.

    Raises
    ------
    ProcessLookupError, PermissionError
        As :func:`thread_ids`.

    Examples
    --------
    >>> os.getpid() in thread_cpu(os.getpid())
    True
    """
    out = {}
    for tid in thread_ids(pid):
        seconds = thread_cpu_seconds(pid, tid)
        if seconds is not None:
            out[tid] = seconds
    return out


def thread_name(pid, tid):
    """The name (``comm``) of thread ``tid`` of process ``pid``; None if it is gone.

    Examples
    --------
    >>> isinstance(thread_name(os.getpid(), os.getpid()), str)
    True
    """
    try:
        return _read(f"/proc/{int(pid)}/task/{int(tid)}/comm", 256).decode(errors="replace").strip()
    except (OSError, ValueError):
        return None


def processes_named(name):
    """The PIDs of the processes whose name (``/proc/PID/comm``) is ``name``, ascending.

    ``comm`` is the kernel's name of the process: its program's file name
    (cut to 15 bytes), not an ``argv[0]`` a process can rewrite. Processes
    that exit meanwhile, or may not be read, are left out.

    Examples
    --------
    >>> processes_named(thread_name(os.getpid(), os.getpid())) != []
    True
    """
    found = []
    for pid in pids():
        try:
            comm = _read(f"/proc/{pid}/comm", 256).decode(errors="replace").rstrip("\n")
        except OSError:
            continue
        if comm == name:
            found.append(pid)
    return found


def thread_syscall(pid, tid):
    """The fields of ``/proc/PID/task/TID/syscall``: ``["running"]``, or the call's number, arguments, sp, pc.

    Raises
    ------
    OSError
        The thread is gone, or its system call may not be read.

    Examples
    --------
    >>> fields = thread_syscall(os.getpid(), os.getpid())     # reading it, the thread is in read(2)
    >>> fields == ["running"] or len(fields) == 9
    True
    """
    return _read(f"/proc/{int(pid)}/task/{int(tid)}/syscall").decode().split()


def status_fields(pid, tid=None):
    """The fields of ``/proc/PID/status`` (or of one of its threads) as ``{name: text}``.

    Raises
    ------
    OSError
        The process or thread is gone, or its status may not be read.

    Examples
    --------
    >>> status_fields(os.getpid())["Pid"] == str(os.getpid())
    True
    """
    path = f"/proc/{int(pid)}/status" if tid is None else f"/proc/{int(pid)}/task/{int(tid)}/status"
    out = {}
    for line in _read(path, 64 * 1024).decode(errors="replace").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name] = value.strip()
    return out


def mappings(pid):
    """Sorted ``(start, end, path)`` of the file-backed mappings of process ``pid``.

    Raises
    ------
    OSError
        The process is gone, or its maps may not be read.

    Examples
    --------
    >>> any(path.endswith(".so") or ".so." in path for _, _, path in mappings(os.getpid()))
    True
    """
    out = []
    for line in _read(f"/proc/{int(pid)}/maps", _MAPS_LIMIT).decode(errors="replace").splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[5].strip()))
    out.sort()
    return out


def environ(pid):
    """The environment process ``pid`` was started with, as ``{name: value}``.

    Raises
    ------
    OSError
        The process is gone, or its environment may not be read (another user's).

    Examples
    --------
    >>> environ(os.getpid()).get("PATH") is not None or "PATH" not in os.environ
    True
    """
    out = {}
    for item in _read(f"/proc/{int(pid)}/environ", _ENVIRON_LIMIT).split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


def boot_id():
    """This boot's id (``/proc/sys/kernel/random/boot_id``): a record from before a reboot names nothing.

    Examples
    --------
    >>> len(boot_id()) == 36
    True
    """
    return _files.read_text("/proc/sys/kernel/random/boot_id", limit=64).strip()


def schedstat_available():
    """Whether the kernel keeps per-thread ``schedstat`` (CPU time to the nanosecond).

    Examples
    --------
    >>> isinstance(schedstat_available(), bool)
    True
    """
    return os.path.exists("/proc/self/schedstat")


def tcp_sockets():
    """Every TCP socket of this network namespace as ``(local port, state, rx queue)``, IPv4 and IPv6.

    ``state`` is the kernel's hex code (``"0A"`` is LISTEN); a listening
    socket's receive queue is its accept backlog.

    Examples
    --------
    >>> all(isinstance(port, int) for port, _, _ in tcp_sockets())
    True
    """
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = _files.read_text(table, limit=_TABLE_LIMIT).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 5:
                out.append((int(fields[1].rsplit(":", 1)[1], 16), fields[3], int(fields[4].split(":")[1], 16)))
    return out


def lock_holders(inodes):
    """PIDs that hold a lock (not wait for one) on a file of ``inodes``, from ``/proc/locks``; empty where unknown.

    Examples
    --------
    >>> lock_holders(set())
    []
    """
    found = set()
    try:
        lines = _files.read_text("/proc/locks", limit=_TABLE_LIMIT).splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if "->" in parts:           # a waiter, not a holder
            continue
        try:
            if int(parts[5].rsplit(":", 1)[1]) in inodes:
                found.add(int(parts[4]))
        except (ValueError, IndexError):
            continue
    return sorted(found)


# -- a sampler's reader: other threads' scheduler counters, many times a second (issue 50) ----------------

# The head of /proc/PID/task/TID/sched holds se.nr_migrations and the switch counts (its 4th-7th lines).
_SCHED_HEAD = 768
# One search for the three counts: half the CPU of three index()es and their slices (1.4 against 2.8 us here).
_SCHED_COUNTS = re.compile(rb"\nse\.nr_migrations +: *(\d+)\nnr_switches +: *\d+\n"
                           rb"nr_voluntary_switches +: *(\d+)\nnr_involuntary_switches +: *(\d+)")
_STATUS_SWITCHES = re.compile(rb"\nvoluntary_ctxt_switches:\s*(\d+)\nnonvoluntary_ctxt_switches:\s*(\d+)")
_NO_CPU = float("nan")


class SampledThreads:
    """Other threads' scheduler counters, read at a sampler's rate on descriptors kept open (issue 50).

    Each :meth:`read` costs what a sample of a busy server may take from it,
    so each reads only what the sampler uses: ``schedstat`` (on-CPU time and
    run-queue wait), the head of ``sched`` (migrations and switches; with
    ``migrations=False``, where the kernel has no ``se.nr_migrations``,
    ``status``'s switches and migrations -1), and ``stat`` (the CPU it ran
    on last) only for the threads asked for it, and of those only when its
    migrations changed (the kernel changes a thread's CPU only by a migration,
    which it counts) or are not known. A thread whose ``schedstat`` reads as
    it did at the last :meth:`read` (it has not run since) keeps its last
    reading without its other files being read: every switch happens in the
    scheduler, which first adds the time the thread ran. (A thread moved to
    another CPU at its wake-up and still waiting there shows the move at the
    first reading after it ran, as a sampled count always lands in the
    interval it is read in.) Each skipped read matters: on a busy 2-CPU
    machine a read after the sampler's wake-up costs 10-20 us, not the 1-4 us
    of a tight loop. The files are opened once and re-read with ``pread`` at
    offset 0; the paths are built from integers.

    Parameters
    ----------
    threads : list of (int, int, bool)
        ``(pid, tid, last_cpu)`` per thread; ``last_cpu``: read its ``stat`` too.
    migrations : bool
        Whether ``/proc/PID/task/TID/sched`` has ``se.nr_migrations`` (the
        scheduler's ``MIGRATIONS_NOTE`` is None).

    Examples
    --------
    >>> import threading
    >>> me = threading.get_native_id()
    >>> with SampledThreads([(os.getpid(), me, True), (os.getpid(), 2 ** 22 + 1, False)]) as sampled:
    ...     mine, gone = sampled.read()
    >>> run, wait, vol, invol, mig, cpu = mine
    >>> run > 0 and wait >= 0 and invol >= 0 and cpu in os.sched_getaffinity(0), gone
    (True, None)
    """

    def __init__(self, threads, migrations=True):
        self._migrations = bool(migrations)
        counts = "sched" if self._migrations else "status"
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
        self._fds = []
        for pid, tid, last_cpu in threads:
            base = f"/proc/{int(pid)}/task/{int(tid)}/"
            fds = []
            try:
                for name in ("schedstat", counts, "stat") if last_cpu else ("schedstat", counts):
                    fds.append(os.open(base + name, flags))
            except OSError:
                # Gone already, or not ours to read: no reading of it, as of a thread that ends later.
                for fd in fds:
                    os.close(fd)
                fds = None
            self._fds.append(fds)
        self._raw = [None] * len(self._fds)          # each thread's last schedstat text
        self._last = [None] * len(self._fds)         # and its last reading (None: none, or gone)
        self._index()

    def _index(self):
        # The threads still read, and their schedstat descriptors in one list: a sample's first pass is one
        # comprehension of preads (after a sleep each read costs several times what it does in a tight loop).
        self._live = [k for k, fds in enumerate(self._fds) if fds is not None]
        self._schedstat = [self._fds[k][0] for k in self._live]

    def read(self):
        """Per thread, ``(on_cpu_ns, run_queue_ns, voluntary, involuntary, migrations, last_cpu)``, or None once gone.

        ``last_cpu`` is NaN for a thread not asked for it, ``migrations`` -1
        without the kernel's count.
        """
        pread, live = os.pread, self._live
        try:
            texts = [pread(fd, 128, 0) for fd in self._schedstat]
        except OSError:
            texts = self._one_by_one()           # a thread ended: it is found and dropped (None in texts)
        raw, last = self._raw, self._last
        for k, text in zip(live, texts):
            if text is not None and (text != raw[k] or text.startswith(b"0 ")):
                self._update(k, text)
        return list(last)

    def _one_by_one(self):
        texts = []
        for k in self._live:
            try:
                texts.append(os.pread(self._fds[k][0], 128, 0))
            except OSError:
                texts.append(None)
                self._close(k)
        self._index()
        return texts

    def _update(self, k, text):
        """Thread ``k``'s new reading from its ``schedstat`` ``text`` and its other files."""
        fds, pread = self._fds[k], os.pread
        try:
            run, wait = text.split()[:2]
            counts = pread(fds[1], _SCHED_HEAD if self._migrations else 4096, 0)
            if self._migrations:
                mig, vol, invol = _SCHED_COUNTS.search(counts).groups()
                mig = int(mig)
            else:
                vol, invol = _STATUS_SWITCHES.search(counts).groups()
                mig = -1
            before = self._last[k]
            if len(fds) < 3:
                cpu = _NO_CPU
            elif before is not None and mig >= 0 and mig == before[4]:
                # The kernel moves a thread to another CPU only by a migration, which it counts: none since the
                # last reading, the same CPU (and a stat read saved: each read costs ~15 us on a busy machine).
                cpu = before[5]
            else:
                stat = pread(fds[2], 1024, 0)
                # Field 39 counts from the last ')' (the name may hold one): it is the 36th field after it.
                cpu = int(stat[stat.rindex(b")") + 2:].split(None, 37)[36])
            self._last[k] = (int(run), int(wait), int(vol), int(invol), mig, cpu)
            self._raw[k] = text
        except (OSError, ValueError, AttributeError, IndexError):
            # The thread ended (ESRCH), or its file says what it cannot be read as: no more readings.
            self._close(k)
            self._index()

    def _close(self, k):
        for fd in self._fds[k] or ():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds[k] = None
        self._last[k] = None

    def close(self):
        """Close every descriptor; later readings are None."""
        for k in range(len(self._fds)):
            self._close(k)
        self._index()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
