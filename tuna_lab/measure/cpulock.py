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

* A folder of the user's own, mode 0700, that no one else may write: the
  first of ``TUNA_LAB_LOCK_DIR``; ``$XDG_RUNTIME_DIR/tuna-lab`` (when that
  runtime folder is the user's and private); ``/run/lock/tuna-lab-<uid>``
  (when ``/run/lock`` is there and writable); ``<tmp>/tuna-lab-<uid>``. It
  is created 0700 if missing, and refused with one line if what is there is
  not the user's private folder (another user's, a link, a file, a folder
  others may write): never used, never followed. **So the locks exclude
  the user's own measurements only**: two users measuring on one machine
  at once are not kept apart (a folder every user could write is a folder
  every user could plant a FIFO or a link in); users who share a machine
  for measurements must take turns, or measure as one user.
* A lock file is opened read-only, ``O_NOFOLLOW`` and ``O_NONBLOCK``, and
  must be a regular file: a symbolic link in its place is refused, and a
  FIFO (which a blocking open would wait on for ever) opens at once and is
  refused. Nothing is ever written to a lock file. Whatever is in the
  folder, a measurement waits at most ``TUNA_LAB_CPU_LOCK_WAIT`` seconds
  (``flock`` is only ever tried without blocking), then fails with one line.

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
from .._files import file_kind, private_dir, trusted_dir
from ..errors import ExperimentError
from ..machine import procfs

__all__ = ["lock_cpus", "lock_dir", "LOCK_WAIT_VAR"]

#: Seconds a measurement waits for CPUs another one holds (default 3600; 0: refuse at once).
LOCK_WAIT_VAR = "TUNA_LAB_CPU_LOCK_WAIT"
_RUN_LOCK = "/run/lock"
_POLL = 0.2


def _candidates():
    """The lock folders to use, best first, as ``(path, where it comes from)``: see the module's text."""
    uid = os.geteuid()
    given = os.environ.get("TUNA_LAB_LOCK_DIR")
    if given:
        return os.path.abspath(given), "TUNA_LAB_LOCK_DIR"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and not trusted_dir(runtime, {uid}):
        return os.path.join(runtime, "tuna-lab"), "XDG_RUNTIME_DIR"
    if os.path.isdir(_RUN_LOCK) and os.access(_RUN_LOCK, os.W_OK | os.X_OK):
        return os.path.join(_RUN_LOCK, f"tuna-lab-{uid}"), _RUN_LOCK
    return os.path.join(tempfile.gettempdir(), f"tuna-lab-{uid}"), "the temporary folder"


def lock_dir():
    """The folder of the per-CPU lock files: the user's own, 0700, created if missing (see the module's text).

    Raises :class:`ExperimentError` when what is there is not this user's
    private folder (another user's, a link, a file, writable by others).

    Examples
    --------
    >>> lock_dir()                           # doctest: +SKIP
    '/run/user/1000/tuna-lab'
    """
    path, origin = _candidates()
    try:
        return private_dir(path, error=ExperimentError)
    except ExperimentError as exc:
        raise ExperimentError(f"the CPU lock folder ({origin}): {exc}; remove it, or set TUNA_LAB_LOCK_DIR to a "
                              "folder of your own") from None


def _open(path):
    """A read-only descriptor of the lock file ``path``, created if missing; never through a link, never waiting.

    ``O_NONBLOCK``: a FIFO planted at ``path`` opens at once (a blocking
    open would wait for a writer for ever), and is then refused.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
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
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ExperimentError(f"CPU lock file {path} is not a regular file ({file_kind(mode)}); refusing to "
                                  "use it")
        return fd
    raise ExperimentError(f"CPU lock file {path} keeps changing; refusing to use it")


def _holders(fds):
    """PIDs that hold a lock on the files of ``fds`` (from ``/proc/locks``; empty where unknown)."""
    found = set(procfs.lock_holders({os.fstat(fd).st_ino for fd in fds}))
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
