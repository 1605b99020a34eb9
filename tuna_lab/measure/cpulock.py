"""One measurement per CPU on a machine: a lock per CPU a measurement's server and load generator use.

Two measurements on one host that share a CPU measure each other: the
latencies of both are wrong, and nothing in their records says so. So a
measurement (:func:`~tuna_lab.measure.experiment.run`, and a tune for its
whole race) holds, from its first server start to its last stop, an exclusive ``flock`` on one file per CPU
it uses - its server's and its load generator's. Measurements on disjoint
CPUs (cluster workers each confined with ``taskset`` to their own CPUs)
run side by side; one that shares a CPU with a running one **waits**, with
one line saying for whom, for at most ``TUNA_LAB_CPU_LOCK_WAIT`` seconds
(default 3600; ``0``: refuse at once), then fails with
:class:`~tuna_lab.errors.ExperimentError`. All of a measurement's CPUs are
taken at once or none is (never some held while waiting for the rest), so
two waiting measurements cannot block each other for ever.

Where the lock files live, and why they cannot be used against us:

* ``/run/lock/tuna-lab/`` (shared by every user, so that two users'
  measurements exclude each other too): created world-writable and sticky,
  like ``/tmp``; a folder there that another user owns, or that others may
  write without the sticky bit, is refused rather than used.
* Where ``/run/lock`` is missing or not writable, a folder of the user's
  own: ``$XDG_RUNTIME_DIR/tuna-lab``, else ``<tmp>/tuna-lab-<uid>``, mode
  0700 and checked to be the user's. Its locks exclude the user's own
  measurements only.
* A lock file is opened read-only with ``O_NOFOLLOW`` and must be a regular
  file: a symbolic link planted in its place is refused, and since nothing is
  ever written to a lock file, a hard link to some other file gains nothing.
  A lock file another user created (or holds locked) can at worst make a
  measurement wait, then refuse - never write, follow or delete anything.
  ``TUNA_LAB_LOCK_DIR`` names another folder (checked the same way).

Examples
--------
>>> from tuna_lab.measure.cpulock import lock_cpus
>>> with lock_cpus({0, 1}):                 # doctest: +SKIP
...     pass                                # measure on CPUs 0 and 1
"""

import contextlib
import errno
import os
import stat
import tempfile
import time
import warnings

from .._checks import format_cpulist
from ..errors import ExperimentError

__all__ = ["lock_cpus", "lock_dir", "LOCK_WAIT_VAR"]

#: Seconds a measurement waits for CPUs another one holds (default 3600; 0: refuse at once).
LOCK_WAIT_VAR = "TUNA_LAB_CPU_LOCK_WAIT"
_SHARED = "/run/lock"
_POLL = 0.2


def _trusted(path, shared):
    """Why the folder ``path`` may not hold our locks (None when it may)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder (a symbolic link, or a file)"
    if st.st_uid not in (0, os.getuid()):
        return f"belongs to another user (uid {st.st_uid})"
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if others_write and not (shared and st.st_mode & stat.S_ISVTX):
        return "may be written by others and is not sticky"
    return None


def _make(path, shared):
    """Create the lock folder ``path`` if missing; raise if what is there cannot be trusted."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
        if shared:
            # Every user's measurements meet here: writable by all, and sticky so none can remove another's files.
            os.chmod(path, 0o1777)
    why = _trusted(path, shared)
    if why:
        raise ExperimentError(f"the CPU lock folder {path} {why}; remove it, or set TUNA_LAB_LOCK_DIR to a "
                              "folder of your own")
    return path


def lock_dir():
    """The folder of the per-CPU lock files (created if missing); see the module's text for the choice.

    Raises :class:`ExperimentError` when the folder found cannot be trusted
    (another user's, or writable by others without the sticky bit).

    Examples
    --------
    >>> lock_dir()                           # doctest: +SKIP
    '/run/lock/tuna-lab'
    """
    given = os.environ.get("TUNA_LAB_LOCK_DIR")
    if given:
        return _make(os.path.abspath(given), shared=False)
    if os.path.isdir(_SHARED) and os.access(_SHARED, os.W_OK | os.X_OK) and not _trusted(_SHARED, True):
        return _make(os.path.join(_SHARED, "tuna-lab"), shared=True)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and not _trusted(runtime, False):
        return _make(os.path.join(runtime, "tuna-lab"), shared=False)
    return _make(os.path.join(tempfile.gettempdir(), f"tuna-lab-{os.getuid()}"), shared=False)


def _open(path):
    """A read-only descriptor of the lock file ``path``, created if missing; never through a link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(5):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                # O_EXCL: created by us, now; another process creating it meanwhile is simply opened next time.
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
        except OSError as exc:
            reason = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise ExperimentError(f"CPU lock file {path} {reason}; refusing to use it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ExperimentError(f"CPU lock file {path} is not a regular file; refusing to use it")
        return fd
    raise ExperimentError(f"CPU lock file {path} keeps changing; refusing to use it")


def _holders(fds):
    """PIDs that hold a lock on the files of ``fds`` (from ``/proc/locks``; empty where unknown)."""
    inodes = {os.fstat(fd).st_ino for fd in fds}
    found = set()
    try:
        with open("/proc/locks") as fh:
            for line in fh:
                parts = line.split()
                if "->" in parts:           # a waiter, not a holder
                    continue
                with contextlib.suppress(ValueError, IndexError):
                    if int(parts[5].rsplit(":", 1)[1]) in inodes:
                        found.add(int(parts[4]))
    except OSError:
        pass
    found.discard(os.getpid())
    return sorted(found)


def _try_all(fds):
    """Lock every descriptor of ``fds`` or none; the ones that were busy."""
    import fcntl

    got, busy = [], []
    for cpu, fd in fds.items():
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            got.append(fd)
        except BlockingIOError:
            busy.append(cpu)
    if busy:
        for fd in got:
            fcntl.flock(fd, fcntl.LOCK_UN)
    return busy


def _wait_limit():
    text = os.environ.get(LOCK_WAIT_VAR, "")
    if not text:
        return 3600.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ExperimentError(f"{LOCK_WAIT_VAR} must be a number of seconds >= 0, got {text!r}")
    return value


@contextlib.contextmanager
def lock_cpus(cpus, say=None):
    """Hold the CPUs ``cpus`` of this machine for one measurement (see the module's text).

    Parameters
    ----------
    cpus : iterable of int
        Every CPU the measurement's server and load generator may run on.
    say : callable, optional
        Called with one line when the CPUs are busy and the measurement waits
        (default: a :class:`UserWarning` with that line).

    Raises
    ------
    ExperimentError
        The CPUs stayed busy for ``TUNA_LAB_CPU_LOCK_WAIT`` seconds, or the
        lock folder or a lock file cannot be trusted.

    Examples
    --------
    >>> with lock_cpus(os.sched_getaffinity(0)):   # doctest: +SKIP
    ...     pass
    """
    cpus = sorted({int(c) for c in cpus})
    limit = _wait_limit()
    folder = lock_dir()
    fds = {}
    try:
        for cpu in cpus:
            fds[cpu] = _open(os.path.join(folder, f"cpu{cpu}.lock"))
        deadline = time.monotonic() + limit
        busy = _try_all(fds)
        if busy:
            holders = _holders([fds[c] for c in busy])
            who = f"process {', '.join(map(str, holders))}" if holders else "another measurement"
            line = (f"CPU{'s' if len(busy) > 1 else ''} {format_cpulist(busy)} in use by {who} on this machine "
                    f"(locks in {folder})")
            if limit == 0:
                raise ExperimentError(f"{line}; two measurements on one CPU would measure each other")
            message = f"waiting up to {limit:g} s ({LOCK_WAIT_VAR}): {line}"
            if say:
                say(message)
            else:
                # Never a silent wait: a caller without a progress line gets a warning.
                warnings.warn(message, stacklevel=3)
        while busy:
            if time.monotonic() >= deadline:
                raise ExperimentError(f"CPUs {format_cpulist(busy)} still in use by another measurement after "
                                      f"{limit:g} s ({LOCK_WAIT_VAR}); locks in {folder}")
            time.sleep(_POLL)
            busy = _try_all(fds)
        yield cpus
    finally:
        # Closing the descriptors releases the locks; the kernel does the same if this process dies.
        for fd in fds.values():
            os.close(fd)
